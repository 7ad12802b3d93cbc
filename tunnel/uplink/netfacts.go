package uplink

import (
	"bufio"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
)

// managementInterface fills the facts' interface, address and MAC from the
// interface the default route leaves by: on a multi-homed edge machine that
// is the address its neighbours (and a Kubernetes install) reach it on.
// Without a default route the three stay empty, never guessed.
func managementInterface() (name, addr, mac string) {
	name = defaultRouteInterface("/proc/net/route", "/proc/net/ipv6_route")
	if name == "" {
		return "", "", ""
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return name, "", ""
	}
	if len(ifc.HardwareAddr) > 0 {
		mac = ifc.HardwareAddr.String()
	}
	addrs, _ := ifc.Addrs()
	return name, firstGlobalAddress(addrs), mac
}

// firstGlobalAddress picks the first global unicast IPv4 address, else the
// first global unicast IPv6 one.
func firstGlobalAddress(addrs []net.Addr) string {
	var v6 string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || !ipn.IP.IsGlobalUnicast() {
			continue
		}
		if ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
		if v6 == "" {
			v6 = ipn.IP.String()
		}
	}
	return v6
}

// defaultRouteInterface names the interface of the IPv4 default route with
// the lowest metric, else of the IPv6 one; "" when there is none.
func defaultRouteInterface(v4Table, v6Table string) string {
	if f, err := os.Open(v4Table); err == nil {
		name := parseRouteV4(f)
		f.Close()
		if name != "" {
			return name
		}
	}
	if f, err := os.Open(v6Table); err == nil {
		defer f.Close()
		return parseRouteV6(f)
	}
	return ""
}

const rtfUp = 0x1

// parseRouteV4 reads /proc/net/route: a header, then "Iface Destination
// Gateway Flags RefCnt Use Metric Mask …" in hex.
func parseRouteV4(r io.Reader) string {
	best, bestMetric := "", uint64(1<<63)
	sc := bufio.NewScanner(r)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil || flags&rtfUp == 0 {
			continue
		}
		metric, err := strconv.ParseUint(f[6], 10, 32)
		if err != nil {
			continue
		}
		if metric < bestMetric {
			best, bestMetric = f[0], metric
		}
	}
	return best
}

// parseRouteV6 reads /proc/net/ipv6_route: "dest destlen src srclen
// nexthop metric refcnt use flags iface" in hex.
func parseRouteV6(r io.Reader) string {
	best, bestMetric := "", uint64(1<<63)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[0] != strings.Repeat("0", 32) || f[1] != "00" || f[9] == "lo" {
			continue
		}
		flags, err := strconv.ParseUint(f[8], 16, 32)
		if err != nil || flags&rtfUp == 0 {
			continue
		}
		metric, err := strconv.ParseUint(f[5], 16, 32)
		if err != nil {
			continue
		}
		if metric < bestMetric {
			best, bestMetric = f[9], metric
		}
	}
	return best
}
