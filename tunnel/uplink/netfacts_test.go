package uplink

import (
	"net"
	"strings"
	"testing"
)

func TestParseRouteV4(t *testing.T) {
	const header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
	tests := []struct {
		name, table, want string
	}{
		{"one default", header + "eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n" +
			"eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n", "eth0"},
		{"lowest metric wins", header + "wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n" +
			"eth1\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n", "eth1"},
		{"down route ignored", header + "eth0\t00000000\t0100A8C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n", ""},
		{"no default", header + "eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n", ""},
		{"garbage", header + "eth0 zz\n\n", ""},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		if got := parseRouteV4(strings.NewReader(tt.table)); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestParseRouteV6(t *testing.T) {
	zero := strings.Repeat("0", 32)
	tests := []struct {
		name, table, want string
	}{
		{
			"default",
			zero + " 00 " + zero + " 00 fe800000000000000000000000000001 00000400 00000001 00000000 00450003     eth0\n",
			"eth0",
		},
		{
			"loopback unreachable ignored",
			zero + " 00 " + zero + " 00 " + zero + " ffffffff 00000001 00000000 00200200       lo\n",
			"",
		},
		{
			"prefix route ignored",
			"20010db8000000000000000000000000 40 " + zero + " 00 " + zero + " 00000100 00000001 00000000 00000001     eth0\n",
			"",
		},
	}
	for _, tt := range tests {
		if got := parseRouteV6(strings.NewReader(tt.table)); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestFirstGlobalAddress(t *testing.T) {
	ipnet := func(s string) net.Addr {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return n
	}
	tests := []struct {
		addrs []net.Addr
		want  string
	}{
		{[]net.Addr{ipnet("fe80::1/64"), ipnet("2001:db8::5/64"), ipnet("192.168.1.7/24")}, "192.168.1.7"},
		{[]net.Addr{ipnet("fe80::1/64"), ipnet("2001:db8::5/64")}, "2001:db8::5"},
		{[]net.Addr{ipnet("127.0.0.1/8"), ipnet("fe80::1/64")}, ""},
		{nil, ""},
	}
	for _, tt := range tests {
		if got := firstGlobalAddress(tt.addrs); got != tt.want {
			t.Errorf("firstGlobalAddress(%v) = %q, want %q", tt.addrs, got, tt.want)
		}
	}
}
