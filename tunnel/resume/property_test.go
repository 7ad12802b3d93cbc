package resume

import (
	"bytes"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-dev/tether/tunnel"
)

// link is the current session pair of a test, replaced when the test cuts
// the whole session. Resume requests are served on both sides (the hub's
// Set for the agent's resumes, the agent's for the hub's: see finish).
type link struct {
	t        testing.TB
	l        *tunnel.Listener
	tr       tunnel.Transport
	p        *pair
	mu       sync.Mutex
	agent    tunnel.Session
	hub      tunnel.Session
	sessions int
}

func newLink(t testing.TB, tr tunnel.Transport, hubCfg, agentCfg Config) *link {
	k := &link{t: t, l: startListener(t), tr: tr}
	k.agent, k.hub = dial(t, k.l, tr)
	k.p = newPair(t, k.agent, k.hub, hubCfg, agentCfg)
	serveResumes(t, k.hub, k.p.hubSet)
	serveResumes(t, k.agent, k.p.agentSet)
	k.sessions = 1
	return k
}

// redial closes the session pair, as a dead link, and makes a new one.
func (k *link) redial() {
	k.mu.Lock()
	defer k.mu.Unlock()
	_ = k.agent.Close()
	_ = k.hub.Close()
	k.agent, k.hub = dial(k.t, k.l, k.tr)
	serveResumes(k.t, k.hub, k.p.hubSet)
	serveResumes(k.t, k.agent, k.p.agentSet)
	k.sessions++
}

func (k *link) sessionPair() (agent, hub tunnel.Session) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.agent, k.hub
}

// endpoint is one side of the property test: what it writes, what it read.
type endpoint struct {
	s       *Stream
	data    []byte
	written atomic.Int64
	got     []byte
	readErr error
	wrErr   error
}

// writeAll writes e.data in random pieces, then half-closes.
func (e *endpoint) writeAll(rng *rand.Rand) {
	for off := 0; off < len(e.data); {
		n := min(len(e.data)-off, 1+rng.IntN(96<<10))
		if _, err := e.s.Write(e.data[off : off+n]); err != nil {
			e.wrErr = err
			return
		}
		off += n
		e.written.Store(int64(off))
		if rng.IntN(8) == 0 {
			time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
		}
	}
	e.wrErr = e.s.CloseWrite()
}

// readAll reads until EOF in random pieces.
func (e *endpoint) readAll(rng *rand.Rand) {
	var buf bytes.Buffer
	p := make([]byte, 80<<10)
	for {
		n, err := e.s.Read(p[:1+rng.IntN(len(p))])
		buf.Write(p[:n])
		if err != nil {
			if err != io.EOF {
				e.readErr = err
			}
			break
		}
		if rng.IntN(16) == 0 {
			time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
		}
	}
	e.got = buf.Bytes()
}

// TestPropertyCuts writes random data both ways with random cuts of the
// underlying stream (one side's tunnel stream closed, the whole session
// closed, or a re-attachment while still attached), and checks that each
// side read exactly what the other wrote, then EOF, and that both streams
// end normally and leave their sets.
func TestPropertyCuts(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			opts := goleak.IgnoreCurrent()
			t.Cleanup(func() { goleak.VerifyNone(t, opts) })
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 1))
			cfg := Config{Buffer: 128 << 10, Window: time.Minute}
			k := newLink(t, tr, cfg, cfg)
			hub := &endpoint{s: k.p.hub, data: randBytes(rng, 1<<20+rng.IntN(1<<20))}
			agent := &endpoint{s: k.p.agent, data: randBytes(rng, 1<<20+rng.IntN(1<<20))}
			total := int64(len(hub.data) + len(agent.data))

			var wg sync.WaitGroup
			for i, e := range []*endpoint{hub, agent} {
				wr := rand.New(rand.NewPCG(seed, uint64(10+i)))
				rd := rand.New(rand.NewPCG(seed, uint64(20+i)))
				wg.Go(func() { e.writeAll(wr) })
				wg.Go(func() { e.readAll(rd) })
			}
			readersDone := make(chan struct{})
			go func() { wg.Wait(); close(readersDone) }()

			// Cut at random points of the transfer, each followed by a
			// resume, as the agent's integration does on reconnect.
			const cuts = 12
			points := make([]int64, cuts)
			for i := range points {
				points[i] = rng.Int64N(total + total/8) // some after the last byte: the Fins in flight
			}
			slices.Sort(points)
			made := [4]int{}
			for _, at := range points {
				// Points past the total fall once both writers have half-closed.
				last, lastMove := int64(-1), time.Now()
				for {
					sum := hub.written.Load() + agent.written.Load()
					if sum >= min(at, total) {
						break
					}
					if sum != last {
						last, lastMove = sum, time.Now()
					} else if time.Since(lastMove) > 10*time.Second {
						t.Fatalf("the transfer stalled at %d of %d bytes written", sum, total)
					}
					time.Sleep(200 * time.Microsecond)
				}
				if done(k.p.agent) || done(k.p.hub) {
					break
				}
				kind := rng.IntN(4)
				made[kind]++
				switch kind {
				case 0:
					cut(k.p.hub)
				case 1:
					cut(k.p.agent)
				case 2:
					k.redial()
				case 3: // re-attach while attached
				}
				agentSess, _ := k.sessionPair()
				if err := resumeOver(t, agentSess, k.p.agent); err != nil && !done(k.p.agent) {
					t.Fatalf("resume after cut %d: %v", kind, err)
				}
			}
			waitClosed(t, readersDone, 20*time.Second, "readers and writers after the last cut")
			for name, e := range map[string]*endpoint{"hub": hub, "agent": agent} {
				if e.wrErr != nil || e.readErr != nil {
					t.Fatalf("%s: write error %v, read error %v", name, e.wrErr, e.readErr)
				}
			}
			checkSame(t, "hub to agent", hub.data, agent.got)
			checkSame(t, "agent to hub", agent.data, hub.got)
			_ = k.p.hub.Close()
			_ = k.p.agent.Close()
			finish(t, k)
			t.Logf("cuts: %d hub stream, %d agent stream, %d session, %d re-attach while attached; %d sessions",
				made[0], made[1], made[2], made[3], k.sessions)
		})
	}
}

// finish waits for both streams of k to end normally and leave their sets.
// A cut can land after one side finished but before the other heard the
// last Ack: the agent side then resumes as usual (the hub's Set answers
// from what it remembers of the finished stream), and a hub side left
// waiting is resumed from the hub, which the agent's Set answers the same
// way.
func finish(t *testing.T, k *link) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !done(k.p.hub) || !done(k.p.agent) {
		if time.Now().After(deadline) {
			t.Fatalf("streams not ended: hub %v, agent %v", done(k.p.hub), done(k.p.agent))
		}
		time.Sleep(20 * time.Millisecond)
		agentSess, hubSess := k.sessionPair()
		if s := k.p.agent; !done(s) && isDetached(s) {
			_ = resumeOver(t, agentSess, s)
		}
		if s := k.p.hub; !done(s) && isDetached(s) && done(k.p.agent) {
			t.Logf("the agent finished first; resuming the hub's stream from the hub")
			_ = resumeOver(t, hubSess, s)
		}
	}
	for name, s := range map[string]*Stream{"hub": k.p.hub, "agent": k.p.agent} {
		if err := s.Err(); err != nil {
			t.Errorf("%s stream ended with %v, want a normal end", name, err)
		}
	}
	if n := k.p.hubSet.Len() + k.p.agentSet.Len(); n != 0 {
		t.Errorf("%d streams left in the sets", n)
	}
}

func done(s *Stream) bool {
	select {
	case <-s.Done():
		return true
	default:
		return false
	}
}

func isDetached(s *Stream) bool {
	attached, _ := s.State()
	return !attached
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func checkSame(t *testing.T, what string, sent, got []byte) {
	t.Helper()
	if sha256.Sum256(sent) != sha256.Sum256(got) {
		i := 0
		for i < len(sent) && i < len(got) && sent[i] == got[i] {
			i++
		}
		t.Fatalf("%s: sent %d bytes, received %d; first difference at byte %d", what, len(sent), len(got), i)
	}
}
