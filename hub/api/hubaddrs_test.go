package api

import (
	"context"
	"slices"
	"testing"
)

// TestHubAddrs: join strings and new nodes' configs name every live
// replica when the hub is one, else its own advertised addresses.
func TestHubAddrs(t *testing.T) {
	own := []string{"a.example:7443"}
	for _, tc := range []struct {
		name string
		hubs func(context.Context) []string
		want []string
	}{
		{"a hub alone", nil, own},
		{"a replica", func(context.Context) []string { return []string{"a.example:7443", "b.example:7443"} },
			[]string{"a.example:7443", "b.example:7443"}},
		{"a replica that has not listed its peers yet", func(context.Context) []string { return nil }, own},
	} {
		h := &handler{Deps{Advertise: own, Hubs: tc.hubs}}
		if got := h.hubAddrs(context.Background()); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
