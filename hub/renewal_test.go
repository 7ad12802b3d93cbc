package hub

import (
	"context"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/nodeconn"
)

// hostCertOf parses the host certificate of a trust push.
func hostCertOf(t *testing.T, r *pushRecorder) *gossh.Certificate {
	t.Helper()
	_, trust := r.last()
	k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(trust.HostCert))
	if err != nil {
		t.Fatalf("host certificate %q: %v", trust.HostCert, err)
	}
	cert, ok := k.(*gossh.Certificate)
	if !ok || cert.CertType != gossh.HostCert {
		t.Fatalf("pushed host key is not a host certificate: %T", k)
	}
	return cert
}

func connNamed(t *testing.T, s *Server, name string) *nodeconn.Conn {
	t.Helper()
	c, ok := s.conns.Get(name)
	if !ok {
		t.Fatalf("%s is not connected", name)
	}
	return c
}

// TestHostCertRenewal: the renewal sweep re-issues a host certificate once
// two thirds of its lifetime have passed and pushes it to that node only;
// a node whose certificate is not due is sent nothing.
func TestHostCertRenewal(t *testing.T) {
	const ttl = time.Hour // the hub's own sweep (every minute) stays out of the way
	s, c := testHubConfig(t, func(c *Config) { c.HostCertTTL = ttl })
	ctx := context.Background()
	berlin := connectRecording(t, c, "berlin-1", nil)
	munich := connectRecording(t, c, "munich-1", nil)
	first := hostCertOf(t, berlin)
	if d := time.Until(time.Unix(int64(first.ValidBefore), 0)); d < ttl-time.Minute || d > ttl+time.Minute {
		t.Fatalf("certificate at connect valid for %v more, want about %v", d, ttl)
	}
	due := connNamed(t, s, "berlin-1").HostCertRenew.Load()
	if want := time.Now().Add(ttl * 2 / 3); time.Unix(0, due).Before(want.Add(-time.Minute)) ||
		time.Unix(0, due).After(want) {
		t.Fatalf("renewal due at %v, want about %v", time.Unix(0, due), want)
	}

	if n := s.nodes.RenewDue(ctx, time.Now()); n != 0 {
		t.Fatalf("a sweep right after connect renewed %d certificates", n)
	}
	// Munich's certificate is not due yet; berlin's is.
	connNamed(t, s, "berlin-1").HostCertRenew.Store(time.Now().Add(-time.Second).UnixNano())
	if n := s.nodes.RenewDue(ctx, time.Now()); n != 1 {
		t.Fatalf("sweep renewed %d certificates, want 1 (berlin's)", n)
	}
	waitFor(t, "berlin's renewed certificate", func() bool { _, tr := berlin.counts(); return tr == 2 })
	renewed := hostCertOf(t, berlin)
	if renewed.Serial == first.Serial || renewed.ValidBefore < first.ValidBefore {
		t.Errorf(
			"renewal pushed serial %d valid before %d; the first was %d valid before %d",
			renewed.Serial,
			renewed.ValidBefore,
			first.Serial,
			first.ValidBefore,
		)
	}
	if string(renewed.Key.Marshal()) != string(first.Key.Marshal()) {
		t.Error("the renewed certificate is for another host key")
	}
	if k, tr := berlin.counts(); k != 1 || tr != 2 {
		t.Errorf("berlin got %d key and %d trust pushes, want 1 (connect) and 2 (connect, renewal)", k, tr)
	}
	if k, tr := munich.counts(); k != 1 || tr != 1 {
		t.Errorf("munich got %d key and %d trust pushes, want 1 and 1: another node's renewal reached it", k, tr)
	}
	if at := connNamed(t, s, "berlin-1").HostCertRenew.Load(); time.Until(time.Unix(0, at)) < ttl*2/3-time.Minute {
		t.Errorf("after renewal the next is due in %v, want about %v", time.Until(time.Unix(0, at)), ttl*2/3)
	}
}

// TestHostCertRenewalSweepRuns: a running hub renews on its own, at two
// thirds of a short lifetime.
func TestHostCertRenewalSweepRuns(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	_, c := testHubConfig(t, func(c *Config) { c.HostCertTTL = ttl })
	start := time.Now()
	r := connectRecording(t, c, "berlin-1", nil)
	first := hostCertOf(t, r)
	waitFor(t, "a renewed certificate", func() bool { _, tr := r.counts(); return tr >= 2 })
	if took := time.Since(start); took < ttl*2/3-100*time.Millisecond {
		t.Errorf("renewed after %v, before two thirds of %v", took, ttl)
	}
	if hostCertOf(t, r).Serial == first.Serial {
		t.Error("the second trust push carries the first certificate")
	}
}
