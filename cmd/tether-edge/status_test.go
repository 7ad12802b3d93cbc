package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge"
)

func TestPrintStatus(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	cert := now.Add(24 * time.Hour)
	for _, tc := range []struct {
		name    string
		st      edge.Status
		gone    bool
		want    []string
		notWant []string
	}{
		{"never ran", edge.Status{State: stateNeverRan}, false,
			[]string{"state:        not running (no agent has run with this state dir yet"}, []string{"0001", "since"}},
		{
			"connected",
			edge.Status{State: "connected", Since: now.Add(-90 * time.Second), Hub: "hub:7443", Transport: "quic"},
			false,
			[]string{
				"state:        connected since " + now.Add(-90*time.Second).Local().Format(time.RFC3339) + " (1m30s ago)",
				"connected to: hub:7443 over quic",
			},
			nil,
		},
		{
			"agent killed",
			edge.Status{State: "connected", PID: 4242, Since: now.Add(-time.Hour), Hub: "hub:7443", Transport: "quic"},
			true,
			[]string{"state:        not running (agent pid 4242 exited; it was connected since " +
				now.Add(-time.Hour).Local().Format(time.RFC3339) + " (1h0m0s ago))"},
			[]string{"connected to:"},
		},
		{
			// The hub answers nothing: the status must not say connected.
			"hub silent",
			edge.Status{State: "hub-silent", Since: now.Add(-4 * time.Second), Hub: "hub:7443", Transport: "quic"},
			false,
			[]string{
				"state:        hub-silent since " + now.Add(-4*time.Second).Local().Format(time.RFC3339) + " (4s ago) " +
					"(no answer from the hub",
				"session:      hub:7443 over quic, not answering",
			},
			[]string{"connected"},
		},
		{"zero since", edge.Status{State: "stopped"}, false, []string{"state:        stopped since an unknown time"},
			[]string{"0001"}},
		{
			"refused",
			edge.Status{State: "refused", Since: now, LastError: "hub refused this node: revoked; to bring this node back: …"},
			false,
			[]string{"state:        refused since", "last error:   hub refused this node: revoked; to bring this node back"},
			nil,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.st.Name, tc.st.NodeID, tc.st.CertExpires = "n1", "abc", cert
			var b bytes.Buffer
			printStatus(&b, tc.st, []string{"hub-a:7443", "hub-b:7443"}, tc.gone, now)
			out := b.String()
			for _, w := range append(tc.want, "node:         n1 (id abc)", "hubs:         hub-a:7443, hub-b:7443",
				"certificate:  valid until "+cert.Local().Format(time.RFC3339)) {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, nw := range tc.notWant {
				if strings.Contains(out, nw) {
					t.Errorf("output has %q:\n%s", nw, out)
				}
			}
		})
	}
}
