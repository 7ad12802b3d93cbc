package control

import (
	"errors"
	"testing"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// A node's upgrade records and its updater's section of the hello ride on
// the control stream: Message.Validate checks them with the upgrade
// contract's rules.

func TestUpgradeStateMessage(t *testing.T) {
	ok := upgradeproto.NodeState{
		Name:      "edge-1.4",
		Kind:      upgradeproto.KindAgent,
		Digest:    upgradeproto.DigestOf(nil),
		ToVersion: "v1.4.0",
		Step:      upgradeproto.StepAwaitingConfirmation,
	}
	for _, m := range []*Message{
		{Type: upgradeproto.TypeState, UpgradeStates: []upgradeproto.NodeState{ok}},
		{Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "n1",
			Upgrade: &upgradeproto.Support{Exe: "/usr/bin/tether-edge"}}},
	} {
		if err := m.Validate(); err != nil {
			t.Errorf("%s: %v", m.Type, err)
		}
	}
	bad := ok
	bad.Step = "exploded"
	for name, m := range map[string]*Message{
		"empty":        {Type: upgradeproto.TypeState},
		"unknown step": {Type: upgradeproto.TypeState, UpgradeStates: []upgradeproto.NodeState{bad}},
		"relative exe": {Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "n1",
			Upgrade: &upgradeproto.Support{Exe: "tether-edge"}}},
		"exe traversal": {Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "n1",
			Upgrade: &upgradeproto.Support{Exe: "/usr/../bin/sh"}}},
	} {
		if err := m.Validate(); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: err = %v, want ErrBadMessage", name, err)
		}
	}
}
