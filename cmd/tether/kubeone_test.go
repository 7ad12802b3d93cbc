package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// TestKubeOneStatusTable: the status summary and one line per member,
// with the tunnel as up, down or revoked and last seen as `tether nodes`
// shows it.
func TestKubeOneStatusTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := apitype.KubeOneStatus{
		Name: "edge1", Kubernetes: "1.30.5", Status: "created", BastionUser: "kubeone-edge1", MembersUp: 1,
		Members: []apitype.KubeOneMemberStatus{
			{
				Node:      "n1",
				Role:      "control-plane",
				Online:    true,
				Transport: "quic",
				LastSeen:  now.Add(-time.Hour),
				Address:   "10.0.0.1",
			},
			{Node: "n2", Role: "worker", Transport: "tcp", LastSeen: now.Add(-90 * time.Second)},
			{Node: "n3", Role: "worker", Revoked: true},
		},
		LastApply: &apitype.KubeOneApply{Job: "j1", Result: "succeeded", At: now.Add(-3 * time.Minute)},
	}
	var b bytes.Buffer
	if err := printKubeOneStatus(&b, st, now); err != nil {
		t.Fatal(err)
	}
	want := `cluster edge1: Kubernetes 1.30.5, status created, 1/3 members up, bastion user kubeone-edge1
last apply: job j1 succeeded, 3m ago
NODE  ROLE           TUNNEL   TRANSPORT  LAST SEEN  ADDRESS
n1    control-plane  up       quic       now        10.0.0.1
n2    worker         down     tcp        1m ago     -
n3    worker         revoked  -          never      -
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
