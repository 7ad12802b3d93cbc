package resume

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// TestAnswered: a plain stream is carried as it is; a Pending is kept in
// its set once answered, and carries frames from then on; one whose ID its
// set already holds is refused, and its peer hears why.
func TestAnswered(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pending bool
		dup     bool
	}{
		{"plain stream", false, false},
		{"pending", true, false},
		{"duplicate id", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tcpPair(t)
			set := NewSet()
			id := NewID()
			if tc.dup {
				c, _ := tcpPair(t)
				other := New(id, c, Config{})
				t.Cleanup(func() { other.Abort("test over") })
				if err := set.Add(other); err != nil {
					t.Fatal(err)
				}
			}
			var st tunnel.Stream = a
			if tc.pending {
				st = NewPending(id, a, set, Config{})
			}
			got, err := Answered(st)
			peer := New(id, b, Config{})
			t.Cleanup(func() { peer.Abort("test over") })
			switch {
			case !tc.pending:
				if err != nil || got != tunnel.Stream(a) {
					t.Fatalf("Answered(plain) = %v, %v; want the stream itself", got, err)
				}
				peer.Abort("not used")
			case tc.dup:
				if err == nil {
					t.Fatal("a stream with an ID the set holds was kept")
				}
				_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, rerr := peer.Read(make([]byte, 1))
				if !errors.Is(rerr, ErrAborted) {
					t.Fatalf("the peer of a refused stream reads %v, want it aborted", rerr)
				}
			default:
				rs, ok := got.(*Stream)
				if err != nil || !ok || rs.ID() != id {
					t.Fatalf("Answered(pending) = %v, %v; want a Stream of id %v", got, err, id)
				}
				t.Cleanup(func() { rs.Abort("test over") })
				if s, ok := set.Get(id); !ok || s != rs {
					t.Fatal("the kept stream is not in its set")
				}
				if _, err := rs.Write([]byte("framed")); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, len("framed"))
				_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(peer, buf); err != nil || string(buf) != "framed" {
					t.Fatalf("the peer reads %q, %v", buf, err)
				}
			}
		})
	}
}
