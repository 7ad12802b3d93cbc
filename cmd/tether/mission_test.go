package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/mission"
)

// TestPrintMission: the show table has the hub's own line, a line per
// site (stale ones with how long, unreported ones dashed) and a line per
// node named from the hub asked.
func TestPrintMission(t *testing.T) {
	now := time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)
	d := apitype.MissionDetail{
		Mission: apitype.Mission{Name: "pos", Origin: strings.Repeat("a", 64), Local: true, Generation: 2,
			Total: apitype.MissionCounts{Nodes: 2, Applied: 1, Failed: 1, CheckOK: 1}},
		Spec: apitype.MissionSpec{Script: "x", ScriptName: "deploy.sh", StateCheck: "y",
			Placement: apitype.MissionPlacement{Sites: []string{"berlin"}, MatchLabels: map[string]string{"role": "pos"}}},
		Sites: []apitype.MissionSiteRow{
			{
				Path:               "berlin",
				Connected:          true,
				Reported:           true,
				Generation:         2,
				ObservedGeneration: 2,
				Placed:             true,
				Own:                apitype.MissionCounts{Nodes: 1, Applied: 1, CheckOK: 1},
			},
			{Path: "munich", Stale: true, StaleFor: 4 * time.Minute},
			{
				Path:               "sub.berlin",
				Connected:          true,
				Reported:           true,
				Generation:         2,
				ObservedGeneration: 1,
				Placed:             true,
				Own:                apitype.MissionCounts{Nodes: 1, Failed: 1},
			},
		},
		Nodes: []apitype.MissionNodeRow{
			{Site: "berlin", MissionNodeState: apitype.MissionNodeState{
				Node:       "n1.berlin",
				Generation: 2,
				Phase:      "applied",
				Check:      "ok",
				CheckedAt:  now.Add(-10 * time.Second),
			}},
			{Site: "sub.berlin", MissionNodeState: apitype.MissionNodeState{
				Node:       "n2.sub.berlin",
				Generation: 2,
				Phase:      "failed",
				Error:      mission.InterruptedReason,
			}},
		},
	}
	var b bytes.Buffer
	if err := printMission(&b, d, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"mission pos: generation 2 (created here), sites berlin, labels role=pos",
		"deploy.sh, state check every 1m0s; 2 nodes: 1 applied, 1 failed",
		"(this hub)", "munich      stale, silent 4m ago", "sub.berlin", "n1.berlin", "10s ago  ", "n2.sub.berlin",
		"interrupted",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
