package identity

import (
	"os"
	"slices"
	"testing"
)

func TestServingNames(t *testing.T) {
	host, _ := os.Hostname()
	tests := []struct {
		listen    string
		advertise []string
		want      []string // must be present
		not       []string // must be absent
	}{
		{listen: "127.0.0.1:7443", want: []string{"127.0.0.1"}, not: []string{"localhost", "hub.tether.internal"}},
		{
			listen:    "127.0.0.1:7443",
			advertise: []string{"hub.example.com:7443", "[2001:db8::1]:7443"},
			want:      []string{"hub.example.com", "2001:db8::1", "127.0.0.1"},
		},
		{listen: ":7443", want: []string{"localhost", "127.0.0.1", "::1", host}},
		{listen: "[::]:7443", advertise: []string{"10.0.0.5:7443"}, want: []string{"10.0.0.5", "127.0.0.1"}},
	}
	for _, tt := range tests {
		got := ServingNames(tt.listen, tt.advertise)
		for _, w := range tt.want {
			if !slices.Contains(got, w) {
				t.Errorf("ServingNames(%q, %q) = %q, missing %q", tt.listen, tt.advertise, got, w)
			}
		}
		for _, n := range tt.not {
			if slices.Contains(got, n) {
				t.Errorf("ServingNames(%q, %q) = %q, has %q", tt.listen, tt.advertise, got, n)
			}
		}
	}
}
