// Package sim runs many Tether agents in one process for load tests: each is
// a real edge.Agent (real TLS or QUIC handshake, session resumption, control
// stream, keepalives, certificate renewal, stream services, the reconnect
// back-off and the hub's retry hints), with its identity kept in memory
// instead of a state dir.
//
// What is simulated, and why (so that 100k agents fit beside the hub):
//   - identities come from one fleet file, and all share one parsed copy of
//     the hub's CA certificates;
//   - QUIC agents may share UDP sockets (Config.PerSocket): a real fleet
//     behind NATs has a socket per agent, but one process cannot hold 100k
//     sockets in its port range and open-files limit. The hub tells
//     sessions apart by connection ID, but refused attempts by address (its
//     retry queue), so a storm of agents sharing a socket is paced less
//     well than a real fleet's: P5 gives each agent a socket where it can;
//   - every agent (or socket) dials from a loopback address of its own
//     (Config.IPBase), so TCP agents do not exhaust one address's ports;
//   - no SSH server unless the scenario asks for one (Config.SSHTarget).
//
// Measured on 2,000 idle QUIC agents (bench/RESULTS.md, "issue 18 (fleet)"),
// what is left per agent is the real code path's: quic-go's client
// connection and the TLS state it keeps after the handshake (~55 KiB of
// heap), and eight goroutines (~44 KiB of stacks: the agent's session,
// heartbeat, control reader, stream acceptor, renewal loop, quic-go's two;
// with a hub that takes transport liveness there is no heartbeat goroutine).
//
// A Fleet is a set of node identities enrolled through the hub's real join
// endpoint (edge.Enroll), stored in one file so that a large fleet is
// enrolled once and reused by every scenario of a run.
package sim

import (
	"context"
	"crypto/x509"
	"encoding/gob"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/pki"
)

// Member is one enrolled node.
type Member struct {
	Name, NodeID string
	Hubs         []string
	Chain        [][]byte // node certificate chain, DER
	KeyPEM       []byte
}

// Fleet is a set of nodes enrolled on one hub.
type Fleet struct {
	CAPEM, NodeCAPEM []byte
	Members          []Member

	caOnce     sync.Once
	ca, nodeCA *x509.Certificate // parsed once, shared by every identity
}

// Identity builds member i's edge identity. Every identity shares one
// parsed copy of the hub's CA certificates (a real agent parses its own:
// the simulator holds 100k of them, and two parsed roots are some 5 KiB).
func (f *Fleet) Identity(i int) (*edge.Identity, error) {
	id, err := f.identity(i)
	if err != nil {
		return nil, err
	}
	f.caOnce.Do(func() { f.ca, f.nodeCA = id.CA, id.NodeCA })
	if id.CA.Equal(f.ca) && id.NodeCA.Equal(f.nodeCA) {
		id.CA, id.NodeCA = f.ca, f.nodeCA
	}
	return id, nil
}

func (f *Fleet) identity(i int) (*edge.Identity, error) {
	m := f.Members[i]
	var certPEM []byte
	for _, der := range m.Chain {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	id, err := edge.ParseIdentity(edge.NodeConfig{NodeID: m.NodeID, Name: m.Name, Hubs: m.Hubs}, certPEM, m.KeyPEM,
		f.CAPEM, f.NodeCAPEM)
	if err != nil {
		return nil, fmt.Errorf("sim: identity of %s: %w", m.Name, err)
	}
	return id, nil
}

// Save writes the fleet to path (gob), atomically.
func (f *Fleet) Save(path string) error {
	tmp := path + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("sim: save fleet: %w", err)
	}
	if err := gob.NewEncoder(out).Encode(f); err != nil {
		out.Close()
		return fmt.Errorf("sim: save fleet: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("sim: save fleet: %w", err)
	}
	return os.Rename(tmp, path)
}

// LoadFleet reads a fleet written by Save.
func LoadFleet(path string) (*Fleet, error) {
	in, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sim: load fleet: %w", err)
	}
	defer in.Close()
	var f Fleet
	if err := gob.NewDecoder(in).Decode(&f); err != nil {
		return nil, fmt.Errorf("sim: load fleet %s: %w", path, err)
	}
	return &f, nil
}

// EnrollOptions configures Enroll.
type EnrollOptions struct {
	JoinString string // a token with at least Count uses
	Prefix     string // node names are PREFIX-000001...
	From       int    // first index (names continue an existing fleet)
	Count      int
	Parallel   int            // concurrent joins; default 8
	Progress   func(done int) // called now and then, may be nil
}

// Enroll joins Count nodes through the hub's join endpoint, Parallel at a
// time, exactly as `tether-edge join` does (key generated locally, CSR,
// pinned TLS), and returns them as a Fleet.
func Enroll(ctx context.Context, o EnrollOptions) (*Fleet, error) {
	if o.Parallel <= 0 {
		o.Parallel = 8
	}
	f := &Fleet{Members: make([]Member, o.Count)}
	var (
		next, done atomic.Int64
		firstErr   error
		errOnce    sync.Once
		caOnce     sync.Once
		wg         sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := func(err error) { errOnce.Do(func() { firstErr = err; cancel() }) }
	for range o.Parallel {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= o.Count || ctx.Err() != nil {
					return
				}
				name := fmt.Sprintf("%s-%06d", o.Prefix, o.From+i+1)
				var id *edge.Identity
				var err error
				// A busy hub may time out a join; retry a few times.
				for attempt := range 5 {
					jctx, jcancel := context.WithTimeout(ctx, 60*time.Second)
					id, err = edge.Enroll(jctx, edge.JoinOptions{JoinString: o.JoinString, Name: name, Timeout: 60 * time.Second})
					jcancel()
					if err == nil || errors.Is(err, edge.ErrJoinRefused) || ctx.Err() != nil {
						break
					}
					time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
				}
				if err != nil {
					fail(fmt.Errorf("sim: enroll %s: %w", name, err))
					return
				}
				keyPEM, err := id.KeyPEM()
				if err != nil {
					fail(err)
					return
				}
				caOnce.Do(func() {
					f.CAPEM = pki.EncodeCerts(id.CA)
					f.NodeCAPEM = pki.EncodeCerts(id.NodeCA)
				})
				f.Members[i] = Member{Name: id.Config.Name, NodeID: id.Config.NodeID, Hubs: id.Config.Hubs,
					Chain: id.Cert.Certificate, KeyPEM: keyPEM}
				if d := done.Add(1); o.Progress != nil && d%1000 == 0 {
					o.Progress(int(d))
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return f, nil
}

// Append adds other's members (enrolled on the same hub) to f.
func (f *Fleet) Append(other *Fleet) {
	if f.CAPEM == nil {
		f.CAPEM, f.NodeCAPEM = other.CAPEM, other.NodeCAPEM
	}
	f.Members = append(f.Members, other.Members...)
}

// SetHub makes every member dial addr (the hub of a later run may listen on
// another port than the one the fleet enrolled with).
func (f *Fleet) SetHub(addr string) {
	for i := range f.Members {
		f.Members[i].Hubs = []string{addr}
	}
}
