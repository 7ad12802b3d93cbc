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
