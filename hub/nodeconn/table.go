package nodeconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/resume"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// ErrRefused: the agent answered a stream request with a refusal.
var ErrRefused = errors.New("node refused the stream")

// Conn is one node's live session.
type Conn struct {
	NodeID    string
	Name      string
	Session   tunnel.Session
	Connected time.Time
	// HostKey is the node SSH server's host key as the agent reported it
	// (authorized_keys format), for re-issuing its certificate.
	HostKey string
	// StateDir is the agent's state directory as it reported it ("" if not).
	StateDir string
	// Upgrade is how the hub runs the agent's node-side updater (hello
	// capability upgradeproto.CapUpgrade); nil for an agent without one.
	// AgentVersion and Arch are the hello's, for the upgrade controller.
	Upgrade      *upgradeproto.Support
	AgentVersion string
	Arch         string
	// ReportsLogins: the agent's embedded SSH server reports every login's
	// outcome (hello capability control.CapSSHLoginEvents).
	ReportsLogins bool
	// Labels are the node's labels when it connected: what access pushes
	// decide on, without a store read per node.
	Labels map[string]string
	// Heard is when the agent was last heard (unix nanoseconds; 0 before
	// its first heartbeat): from its heartbeats, or for TransportLive
	// sessions from the hub's presence sweep. The web console shows a
	// session whose agent fell silent as stale.
	Heard atomic.Int64
	// TransportLive: the transport's keepalives are the agent's liveness
	// (control.CapTransportLiveness), and it sends no heartbeats.
	TransportLive bool
	// SeenMu orders the hub's last_seen writes for this session: the
	// presence sweep writes "online" only while the session is registered,
	// and the disconnect writes "offline" as it unregisters it.
	SeenMu sync.Mutex
	// PushMu serializes building and sending key and trust updates, so
	// they reach the node in the order of the changes.
	PushMu sync.Mutex
	// Pushed is what the hub last sent the node (guarded by PushMu).
	Pushed Pushed
	// HostCertRenew is when the node's SSH host certificate is to be
	// re-issued (unix nanoseconds; 0: it has none to renew), for the hub's
	// renewal sweep.
	HostCertRenew atomic.Int64

	sendMu sync.Mutex // guards writes to the control stream
	ctrl   tunnel.Stream
	// resume: the node's streams outlive this session (resume.go); nil
	// if its agent does not keep them.
	resume *connResume
}

// Pushed records the access state a node last received, so a change pushes
// only to the nodes it changes something for.
type Pushed struct {
	// HostCert is the node's current SSH host certificate (authorized_keys
	// format); re-sent with every trust update, re-signed only on renewal.
	HostCert string
	// KeysSum and TrustSum are SHA-256 sums of the last authorized-keys and
	// SSH-trust messages sent.
	KeysSum, TrustSum [32]byte
}

// NewConn wraps a registered session; ctrl is its control stream.
func NewConn(nodeID, name string, s tunnel.Session, ctrl tunnel.Stream) *Conn {
	return &Conn{NodeID: nodeID, Name: name, Session: s, ctrl: ctrl, Connected: time.Now()}
}

// Send writes a control message to the node.
func (c *Conn) Send(m *control.Message) error {
	return c.write(func(w io.Writer) error { return control.Write(w, m) })
}

// SendHeartbeat sends a heartbeat (control.WriteHeartbeat).
func (c *Conn) SendHeartbeat() error { return c.write(control.WriteHeartbeat) }

func (c *Conn) write(f func(io.Writer) error) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	_ = c.ctrl.SetWriteDeadline(time.Now().Add(10 * time.Second))
	defer c.ctrl.SetWriteDeadline(time.Time{})
	return f(c.ctrl)
}

// noticeGrace is how long a session may live after a notice, so the agent
// can read it before the connection closes (QUIC drops unread stream data on
// close).
const noticeGrace = time.Second

// CloseWithNotice tells the agent why its session ends, gives it a moment to
// read that (an agent closes the session itself on such a notice), then
// closes the session.
func (c *Conn) CloseWithNotice(notice string, fatal bool) {
	_ = c.Send(&control.Message{Type: control.TypeNotice, Notice: notice, Fatal: fatal})
	CloseAfterGrace(c.Session)
}

// CloseAfterGrace closes s once the peer has closed it or noticeGrace has passed.
func CloseAfterGrace(s tunnel.Session) {
	t := time.NewTimer(noticeGrace)
	defer t.Stop()
	select {
	case <-s.Done():
	case <-t.C:
	}
	s.Close()
}

// Table maps node names to live connections. A node that reconnects
// replaces its old connection, which is closed.
type Table struct {
	mu     sync.Mutex // guards byName and draining
	byName map[string]*Conn
	// draining holds, per node, the session a transport move replaced
	// (PutMoved): it carries the streams it had, gets no new ones, and
	// ends when the agent closes it. One per node, so an agent cannot pile
	// up sessions by moving again and again.
	draining map[string]*Conn
	// resume holds the nodes' resumable streams (resume.go).
	resume resumeSets
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{byName: map[string]*Conn{}, draining: map[string]*Conn{}} }

// PutMoved registers c, which moves its node to another transport: the
// session it replaces is not closed but drains (its live streams go on;
// Get and All return c from now on, so new streams go over c) until the
// agent closes it. A session still draining from an earlier move is closed.
func (r *Table) PutMoved(c *Conn) (draining *Conn) {
	r.mu.Lock()
	old := r.byName[c.Name]
	r.byName[c.Name] = c
	prev := r.draining[c.Name]
	if old != nil && old != c {
		r.draining[c.Name] = old
	}
	r.mu.Unlock()
	if prev != nil && prev != old && prev != c {
		go prev.CloseWithNotice("replaced by a newer session of the same node", false)
	}
	if old == c {
		return nil
	}
	return old
}

// Put registers c and returns the session it replaced, if any (already closed).
func (r *Table) Put(c *Conn) (replaced *Conn) {
	r.mu.Lock()
	old := r.byName[c.Name]
	r.byName[c.Name] = c
	r.mu.Unlock()
	if old != nil && old != c {
		go old.CloseWithNotice("replaced by a newer session of the same node", false)
		return old
	}
	return nil
}

// Remove drops c if it is still the registered session for its name, and
// reports whether it was.
func (r *Table) Remove(c *Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining[c.Name] == c {
		delete(r.draining, c.Name)
	}
	if r.byName[c.Name] == c {
		delete(r.byName, c.Name)
		return true
	}
	return false
}

// Get returns the live session of node name.
func (r *Table) Get(name string) (*Conn, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.byName[name]
	return c, ok
}

// Len is how many nodes have a live session.
func (r *Table) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byName)
}

// All returns a snapshot of the live sessions.
func (r *Table) All() []*Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Conn, 0, len(r.byName))
	for _, c := range r.byName {
		out = append(out, c)
	}
	return out
}

// Dial opens a stream to service h on this node.
func (c *Conn) Dial(ctx context.Context, h tunnel.Header) (tunnel.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	st, err := c.Session.OpenStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("open stream to %s: %w", c.Name, err)
	}
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	if err := tunnel.WriteHeader(st, h); err != nil {
		st.Close()
		return nil, fmt.Errorf("send stream header to %s: %w", c.Name, err)
	}
	p, err := c.OpenResumable(st)
	if err != nil {
		st.Close()
		return nil, err
	}
	st = p
	rep, err := tunnel.ReadReply(st)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("read answer from %s: %w", c.Name, err)
	}
	_ = st.SetDeadline(time.Time{})
	if !rep.OK {
		st.Close()
		return nil, fmt.Errorf("%w: %s: %s", ErrRefused, c.Name, rep.Reason)
	}
	kept, err := resume.Answered(st)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Name, err)
	}
	return kept, nil
}

// ReportsLogins says whether node's connected agent reports the outcome of
// every SSH login, so a jump's audit row may wait for it.
func (r *Table) ReportsLogins(node string) bool {
	c, ok := r.Get(node)
	return ok && c.ReportsLogins
}

// CloseNode ends, with notice, the session of the node with this ID if it
// is here, and the streams it would resume.
func (r *Table) CloseNode(nodeID, notice string) {
	r.endResumable(nodeID, notice)
	for _, c := range r.All() {
		if c.NodeID == nodeID {
			go c.CloseWithNotice(notice, true)
		}
	}
}
