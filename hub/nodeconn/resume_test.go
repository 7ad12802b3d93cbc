package nodeconn

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/resume"
)

// halfPipe is one end of net.Pipe as a tunnel.Stream.
type halfPipe struct{ net.Conn }

func (p halfPipe) CloseWrite() error { return p.Close() }

// keptStream adds a resumable stream to node id's set, kept for uplink
// process instance.
func keptStream(t *testing.T, tb *Table, id, instance string) *resume.Stream {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	n := tb.resumable(id, instance)
	rs := resume.New(resume.NewID(), halfPipe{a}, resume.Config{Window: time.Minute, Budget: n.budget})
	if err := n.set.Add(rs); err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestUplinkInstance: the streams kept for a node's uplink process end at
// once, with the reason, when the node says hello from another process;
// the same process (a reconnect), an older uplink that names none, or
// another node leave them be.
func TestUplinkInstance(t *testing.T) {
	const first, second = "00000000000000000000000000000001", "00000000000000000000000000000002"
	tb := &Table{}
	kept := keptStream(t, tb, "n1", first)
	other := keptStream(t, tb, "n2", first)
	for _, tc := range []struct{ node, instance string }{{"n1", first}, {"n1", ""}, {"n2", first}, {"n3", second}} {
		if n := tb.uplinkInstance(tc.node, tc.instance, "restarted"); n != 0 {
			t.Fatalf("uplinkInstance(%s, %q) ended %d streams, want none", tc.node, tc.instance, n)
		}
	}
	if n := tb.uplinkInstance("n1", second, "node n1's agent restarted; session ended"); n != 1 {
		t.Fatalf("another process of n1 ended %d streams, want 1", n)
	}
	_, err := kept.Read(make([]byte, 1))
	var ended *resume.EndedError
	if !errors.As(err, &ended) || !errors.Is(err, resume.ErrAborted) ||
		ended.Reason != "node n1's agent restarted; session ended" {
		t.Fatalf("n1's stream after its agent restarted: %v, want aborted with the reason", err)
	}
	if all, _ := tb.ResumeStreams(); all != 1 {
		t.Errorf("%d streams kept after n1's ended, want n2's only", all)
	}
	select {
	case <-other.Done():
		t.Error("n2's stream ended with n1's restart")
	default:
	}
	// The new process's streams are kept for it.
	keptStream(t, tb, "n1", second)
	if n := tb.uplinkInstance("n1", second, "restarted"); n != 0 {
		t.Errorf("a reconnect of the same process ended %d streams", n)
	}
}
