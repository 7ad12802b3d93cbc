package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRegisterAdmission: the listener's admission reading is exported
// under its names and labels, read at each scrape.
func TestRegisterAdmission(t *testing.T) {
	m := New()
	a := Admission{
		RefusedQUIC:       7,
		RefusedTCPHinted:  5,
		RefusedTCPPlain:   2,
		RatePerSecond:     640,
		HandshakesFailed:  3,
		FailedHeldSeconds: 4.5,
	}
	m.RegisterAdmission(func() Admission { return a })
	want := `
# HELP tether_tunnel_admission_rate_per_second Sessions per second the hub is estimated to admit at ` +
		`its handshake limit; refused agents are asked back in a queue drained at this rate (0: not measured yet).
# TYPE tether_tunnel_admission_rate_per_second gauge
tether_tunnel_admission_rate_per_second 640
# HELP tether_tunnel_busy_refusals_total Tunnel connections refused at the hub's handshake limit ` +
		`before any cryptography, by transport and whether the refusal carried a retry hint (hinted=no: ` +
		`too many refusals at once; the agent waits out its own backoff).
# TYPE tether_tunnel_busy_refusals_total counter
tether_tunnel_busy_refusals_total{hinted="no",transport="tcp"} 2
tether_tunnel_busy_refusals_total{hinted="yes",transport="quic"} 7
tether_tunnel_busy_refusals_total{hinted="yes",transport="tcp"} 5
# HELP tether_tunnel_handshake_failed_slot_seconds_total Time the failed handshakes held their ` +
		`handshake slots, in all: slots that admitted nobody.
# TYPE tether_tunnel_handshake_failed_slot_seconds_total counter
tether_tunnel_handshake_failed_slot_seconds_total 4.5
# HELP tether_tunnel_handshakes_failed_total Tunnel connections that took one of the hub's ` +
		`handshake slots and ended without a session (both transports).
# TYPE tether_tunnel_handshakes_failed_total counter
tether_tunnel_handshakes_failed_total 3
`
	names := []string{"tether_tunnel_admission_rate_per_second", "tether_tunnel_busy_refusals_total",
		"tether_tunnel_handshake_failed_slot_seconds_total", "tether_tunnel_handshakes_failed_total"}
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	a.RefusedQUIC = 9 // read again at the next scrape
	if err := testutil.GatherAndCompare(
		m.Registry, strings.NewReader(strings.Replace(want, `transport="quic"} 7`, `transport="quic"} 9`, 1)), names...,
	); err != nil {
		t.Fatal(err)
	}
}
