package sim

import (
	"slices"
	"testing"

	"github.com/tether-dev/tether/tunnel/control"
)

func keysMsg(keys ...string) *control.Message {
	return &control.Message{Type: control.TypeAuthorizedKeys, AuthorizedKeys: keys}
}

func trustMsg(hostCert string, revoked ...string) *control.Message {
	return &control.Message{Type: control.TypeSSHTrust,
		SSHTrust: &control.SSHTrust{HostCert: hostCert, UserCAs: []string{"ca"},
			RevokedKeys: revoked, Principals: map[string][]string{"root": {"tether:all:root"}}}}
}

// pushTo is one control message to agent i.
type pushTo struct {
	agent int
	msg   *control.Message
}

func TestPushWatch(t *testing.T) {
	hasB := func(ks []string) bool { return slices.Contains(ks, "b") }
	tests := []struct {
		name   string
		before []pushTo // before Watch: the state agents hold
		want   func([]string) bool
		after  []pushTo
		check  func(t *testing.T, ps PushStats)
	}{
		{name: "new key reaches both agents; trust re-signed only is not needed",
			before: []pushTo{{0, keysMsg("a")}, {0, trustMsg("c1")}, {1, keysMsg("a")}, {1, trustMsg("c1")}},
			want:   hasB,
			after:  []pushTo{{0, keysMsg("a", "b")}, {0, trustMsg("c2")}, {1, keysMsg("a", "b")}, {1, trustMsg("c3")}},
			check: func(t *testing.T, ps PushStats) {
				if ps.Have != 2 || ps.Keys != 2 || ps.KeysUnchanged != 0 || ps.Trust != 2 || ps.TrustUnchanged != 2 ||
					ps.AgentsPushed != 2 || ps.AgentsNeedless != 0 || ps.Last.IsZero() || ps.LastPush.IsZero() {
					t.Errorf("got %+v", ps)
				}
			}},
		{name: "one agent left without the key; the other got only a copy of what it had",
			before: []pushTo{{0, keysMsg("a")}, {1, keysMsg("a")}, {1, trustMsg("c1")}},
			want:   hasB,
			after:  []pushTo{{0, keysMsg("a", "b")}, {1, keysMsg("a")}, {1, trustMsg("c1")}},
			check: func(t *testing.T, ps PushStats) {
				if ps.Have != 1 || ps.KeysUnchanged != 1 || ps.TrustUnchanged != 1 || ps.AgentsPushed != 2 ||
					ps.AgentsNeedless != 1 {
					t.Errorf("got %+v", ps)
				}
			}},
		{name: "a changed revocation list is a needed trust push",
			before: []pushTo{{0, trustMsg("c1")}},
			after:  []pushTo{{0, trustMsg("c1", "revoked")}},
			check: func(t *testing.T, ps PushStats) {
				if ps.Trust != 1 || ps.TrustUnchanged != 0 || ps.AgentsNeedless != 0 || ps.Have != 0 {
					t.Errorf("got %+v", ps)
				}
			}},
		{name: "an agent that already holds the key counts at once; counts restart at Watch",
			before: []pushTo{{0, keysMsg("b")}, {1, keysMsg("b")}},
			want:   hasB,
			check: func(t *testing.T, ps PushStats) {
				if ps.Have != 2 || ps.Keys != 0 || ps.AgentsPushed != 0 || !ps.LastPush.IsZero() {
					t.Errorf("got %+v", ps)
				}
			}},
		{name: "other control messages are not pushes",
			after: []pushTo{{0, &control.Message{Type: control.TypeHeartbeat}},
				{1, &control.Message{Type: control.TypeSSHTrust}}},
			check: func(t *testing.T, ps PushStats) {
				if ps.Keys+ps.Trust != 0 || !ps.LastPush.IsZero() {
					t.Errorf("got %+v", ps)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Sim{}
			s.pushes.agents = make([]agentPushes, 2)
			for _, p := range tt.before {
				s.pushes.onControl(p.agent)(p.msg)
			}
			s.Watch(tt.want)
			for _, p := range tt.after {
				s.pushes.onControl(p.agent)(p.msg)
			}
			tt.check(t, s.Pushes())
			merged := MergePushes(s.Pushes(), s.Pushes())
			if got := s.Pushes(); merged.Keys != 2*got.Keys || merged.Have != 2*got.Have || !merged.Last.Equal(got.Last) {
				t.Errorf("MergePushes of twice %+v = %+v", got, merged)
			}
		})
	}
}
