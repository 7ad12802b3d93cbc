package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("%w: this node was revoked on the hub", ErrRefused), true},
		{fmt.Errorf("%w: it expired", ErrRejoinNeeded), true},
		{errors.New("hub closed the control stream"), false},
		{ErrNotJoined, false},
		{nil, false},
	} {
		if got := Refused(tc.err); got != tc.want {
			t.Errorf("Refused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestRunExpiredSaysHowToComeBack: Run with a certificate that expired
// offline ends at once, refused for good, and says what to do on the hub
// and here.
func TestRunExpiredSaysHowToComeBack(t *testing.T) {
	dir := t.TempDir()
	a := &Agent{
		cfg:   Config{StateDir: dir},
		log:   slog.New(slog.DiscardHandler),
		state: StateConnecting,
		id: &Identity{Config: NodeConfig{Name: "n1"},
			Cert: tls.Certificate{Leaf: &x509.Certificate{NotAfter: time.Now().Add(-time.Hour)}}},
	}
	err := a.Run(context.Background())
	if !Refused(err) || !errors.Is(err, ErrRejoinNeeded) {
		t.Fatalf("Run = %v, want ErrRejoinNeeded", err)
	}
	for _, want := range []string{"`tether nodes rm n1`", "`tether token create`", "delete " + dir, "--join JOIN_STRING"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if st, _ := ReadStatus(dir); st.State != "rejoin-needed" || st.LastError != err.Error() {
		t.Errorf("status %+v", st)
	}
}

// TestHinted: a hub's retry-after hint is honoured within ±20 % (spread, so
// agents handed the same second do not come back together) and never past
// the backoff cap, which bounds a forged hint.
func TestHinted(t *testing.T) {
	for _, tc := range []struct {
		hint, cap, lo, hi time.Duration
	}{
		{10 * time.Second, 30 * time.Second, 8 * time.Second, 12 * time.Second},
		{time.Second, 30 * time.Second, 800 * time.Millisecond, 1200 * time.Millisecond},
		{255 * time.Second, 30 * time.Second, 24 * time.Second, 30 * time.Second},
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			w := hinted(tc.hint, tc.cap)
			if w < tc.lo || w > tc.hi {
				t.Fatalf("hinted(%v, cap %v) = %v, want %v..%v", tc.hint, tc.cap, w, tc.lo, tc.hi)
			}
			seen[w] = true
		}
		if len(seen) < 2 {
			t.Errorf("hinted(%v) is not jittered", tc.hint)
		}
	}
}
