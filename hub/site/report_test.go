package site

import (
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
)

// TestSeqsGrowAcrossRestarts: a restarted site never reuses a status
// sequence number, so its parent never drops a fresh status as a duplicate.
func TestSeqsGrowAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	var last uint64
	for restart := 0; restart < 3; restart++ {
		s, err := loadSeqs(dir)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < seqBlock+5; i++ { // across a reservation
			n, err := s.take()
			if err != nil {
				t.Fatal(err)
			}
			if n <= last {
				t.Fatalf("restart %d: seq %d after %d", restart, n, last)
			}
			last = n
		}
	}
}

func TestSameStatus(t *testing.T) {
	base := control.SiteStatus{Seq: 1, At: time.Unix(1, 0), Health: control.SiteHealthy, NodesOnline: 1, NodesTotal: 2}
	for _, tc := range []struct {
		name   string
		change func(*control.SiteStatus)
		same   bool
	}{
		{"seq and time", func(s *control.SiteStatus) { s.Seq, s.At = 2, time.Unix(2, 0) }, true},
		{"queued since", func(s *control.SiteStatus) { s.QueuedSince = time.Unix(3, 0) }, true},
		{"a node came online", func(s *control.SiteStatus) { s.NodesOnline = 2 }, false},
		{"health", func(s *control.SiteStatus) { s.Health = control.SiteDegraded }, false},
		{"a sub-site", func(s *control.SiteStatus) { s.Sites = []control.SubSite{{Name: "sub"}} }, false},
		{"missions", func(s *control.SiteStatus) { s.ActiveMissions = []string{"o/m"} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := base
			tc.change(&b)
			if got := sameStatus(&base, &b); got != tc.same {
				t.Fatalf("sameStatus = %v, want %v", got, tc.same)
			}
		})
	}
}
