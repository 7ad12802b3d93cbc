package siteproto

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

var testHubID = strings.Repeat("ab", 32)

func TestRouteRequestRoundTrip(t *testing.T) {
	for _, r := range []RouteRequest{
		{Target: "n7", Service: 1, Purpose: PurposeJump, Operator: "alice", Origin: testHubID},
		{
			Target: "n7.sub.berlin", Service: 2, Port: 5432, Purpose: PurposeService, ServiceName: "berlin-db",
			Origin: testHubID, Trace: "t1", WaitMillis: 7000,
		},
	} {
		var b bytes.Buffer
		if err := WriteRouteRequest(&b, &r); err != nil {
			t.Fatalf("write %+v: %v", r, err)
		}
		b.WriteString("payload")
		got, err := ReadRouteRequest(&b)
		if err != nil {
			t.Fatalf("read %+v: %v", r, err)
		}
		if *got != r {
			t.Errorf("round trip: got %+v, want %+v", *got, r)
		}
		if b.String() != "payload" {
			t.Errorf("reader consumed payload bytes: %q left", b.String())
		}
	}
}

func TestRouteRequestInvalid(t *testing.T) {
	ok := RouteRequest{Target: "n7", Service: 1, Purpose: PurposeJump, Origin: testHubID}
	for name, mut := range map[string]func(*RouteRequest){
		"empty target":        func(r *RouteRequest) { r.Target = "" },
		"upper-case target":   func(r *RouteRequest) { r.Target = "N7" },
		"empty label":         func(r *RouteRequest) { r.Target = "n7..berlin" },
		"too deep":            func(r *RouteRequest) { r.Target = "n" + strings.Repeat(".s", MaxDepth+1) },
		"ssh with port":       func(r *RouteRequest) { r.Port = 22 },
		"tcp without port":    func(r *RouteRequest) { r.Service = 2 },
		"route service":       func(r *RouteRequest) { r.Service = 3 },
		"unknown purpose":     func(r *RouteRequest) { r.Purpose = "exfiltrate" },
		"service unnamed":     func(r *RouteRequest) { r.Purpose = PurposeService },
		"origin not a hub id": func(r *RouteRequest) { r.Origin = "root" },
		"negative wait":       func(r *RouteRequest) { r.WaitMillis = -1 },
		"wait too long":       func(r *RouteRequest) { r.WaitMillis = MaxRouteWaitMillis + 1 },
	} {
		r := ok
		mut(&r)
		if err := r.Validate(); !errors.Is(err, ErrBadSite) || !errors.Is(err, wirecheck.ErrBadMessage) {
			t.Errorf("%s: Validate = %v, want ErrBadSite", name, err)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
}

// TestWelcomeLiveness: a site's liveness is both fields or neither, a
// heartbeat of at least MinHeartbeatMillis and a dead-peer time of at least
// two heartbeats.
func TestWelcomeLiveness(t *testing.T) {
	for _, tc := range []struct {
		name            string
		every, deadPeer int
		ok              bool
	}{
		{"none (a parent without)", 0, 0, true},
		{"a second, dead after three", 1000, 3000, true},
		{"dead after two heartbeats", 500, 1000, true},
		{"only a heartbeat", 1000, 0, false},
		{"only a dead-peer time", 0, 3000, false},
		{"dead after less than two heartbeats", 1000, 1999, false},
		{"heartbeat too fast", MinHeartbeatMillis - 1, 1000, false},
		{"dead-peer time too long", 1000, MaxLivenessMillis + 1, false},
		{"negative", -1000, 3000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := Welcome{Path: "berlin", Ancestors: []string{testHubID}, HeartbeatMillis: tc.every,
				DeadPeerMillis: tc.deadPeer}
			err := w.Validate()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadSite)) {
				t.Fatalf("Validate = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

func TestReadRouteRequestBadFrames(t *testing.T) {
	for name, in := range map[string][]byte{
		"zero length": {0, 0},
		"oversize":    {0xff, 0xff},
		"truncated":   {0, 10, '{'},
		"not json":    append([]byte{0, 3}, "abc"...),
		"invalid":     append([]byte{0, 2}, "{}"...),
	} {
		if _, err := ReadRouteRequest(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: read a bad frame without error", name)
		}
	}
}

func FuzzReadRouteRequest(f *testing.F) {
	var b bytes.Buffer
	_ = WriteRouteRequest(
		&b,
		&RouteRequest{Target: "n7.berlin", Service: 2, Port: 80, Purpose: PurposeJob, Origin: testHubID},
	)
	f.Add(b.Bytes())
	f.Add([]byte{0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ReadRouteRequest(bytes.NewReader(in))
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("read a request that does not validate: %v", err)
		}
		var out bytes.Buffer
		if err := WriteRouteRequest(&out, r); err != nil {
			t.Fatalf("cannot write back a request that was read: %v", err)
		}
	})
}
