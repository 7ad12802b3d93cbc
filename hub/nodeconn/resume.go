package nodeconn

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
)

// A node's streams outlive its sessions when its agent keeps them too
// (control.CapResume): every stream the hub opens to it is a resume.Stream
// kept in the node's set, which a reconnected agent re-attaches stream by
// stream (tunnel.ServiceResume). The sets hang off the Table, not the
// Conn, because they must survive the session that opened the streams.

// DefaultResumeWindow is how long a stream whose node's link went down
// waits for the node to reconnect.
const DefaultResumeWindow = 60 * time.Second

// resumeNodeBudget bounds the bytes kept unacknowledged for all of one
// node's streams together (each stream keeps at most resume's Buffer):
// what an operator's copy can have in flight towards a node whose link is
// down, before its writes wait.
const resumeNodeBudget = 64 << 20

// resumeAcceptTimeout bounds a reconnected agent's resume request.
const resumeAcceptTimeout = 10 * time.Second

// ResumeEvents counts what happens to resumable streams, for metrics
// (hub/metrics: tether_resume_events_total).
type ResumeEvents interface {
	// Event is one of "detached", "resumed", "expired", "refused", "ended"
	// (kept for an uplink process that restarted since).
	Event(kind string)
}

// nodeResume is one node's resumable streams.
type nodeResume struct {
	set    *resume.Set
	budget *resume.Budget
	// instance is the uplink process whose streams these are (its hello's
	// ResumeInstance; guarded by resumeSets.mu).
	instance string
}

// resumeSets holds every node's resumable streams, by node ID.
type resumeSets struct {
	mu     sync.Mutex
	byNode map[string]*nodeResume
}

// resumable returns the resumable streams of node id, made on first use,
// for uplink process instance.
func (r *Table) resumable(id, instance string) *nodeResume {
	r.resume.mu.Lock()
	defer r.resume.mu.Unlock()
	if r.resume.byNode == nil {
		r.resume.byNode = map[string]*nodeResume{}
	}
	n := r.resume.byNode[id]
	if n == nil {
		n = &nodeResume{set: resume.NewSet(), budget: resume.NewBudget(resumeNodeBudget)}
		r.resume.byNode[id] = n
	}
	if n.instance == "" {
		n.instance = instance
	}
	return n
}

// uplinkInstance records that node id's uplink process is instance (a
// session's hello): if its streams were kept for another one, that process
// is gone with their other side, and they end now for reason rather than
// at the end of their window. An empty instance (an older uplink) changes
// nothing. It reports how many streams it ended.
func (r *Table) uplinkInstance(id, instance, reason string) int {
	if instance == "" {
		return 0
	}
	r.resume.mu.Lock()
	n := r.resume.byNode[id]
	var ended *nodeResume
	switch {
	case n == nil:
	case n.instance == "" || n.instance == instance:
		n.instance = instance
	default:
		ended = n
		delete(r.resume.byNode, id)
	}
	r.resume.mu.Unlock()
	if ended == nil {
		return 0
	}
	count := ended.set.Len()
	ended.set.CloseAll(reason)
	return count
}

// endResumable ends the resumable streams of node id, for reason (the
// node was removed or revoked: its streams must not wait for it).
func (r *Table) endResumable(id, reason string) {
	r.resume.mu.Lock()
	n := r.resume.byNode[id]
	delete(r.resume.byNode, id)
	r.resume.mu.Unlock()
	if n != nil {
		n.set.CloseAll(reason)
	}
}

// ResumeBuffered is how many bytes the hub keeps unacknowledged for
// resumable streams, all nodes together (tether_resume_buffered_bytes).
func (r *Table) ResumeBuffered() int64 {
	r.resume.mu.Lock()
	defer r.resume.mu.Unlock()
	var sum int64
	for _, n := range r.resume.byNode {
		sum += n.budget.InUse()
	}
	return sum
}

// ResumeStreams counts the resumable streams the hub holds, and of them
// those waiting for their node to come back.
func (r *Table) ResumeStreams() (all, detached int) {
	r.resume.mu.Lock()
	sets := make([]*resume.Set, 0, len(r.resume.byNode))
	for _, n := range r.resume.byNode {
		sets = append(sets, n.set)
	}
	r.resume.mu.Unlock()
	for _, s := range sets {
		all += s.Len()
		detached += len(s.Detached())
	}
	return all, detached
}

// connResume is a Conn's side of resumable streams: nil on a session
// whose agent does not keep them. The node's set is looked up (and made)
// only when a stream needs it, so an idle node costs nothing here.
type connResume struct {
	table    *Table
	nodeID   string
	instance string // the uplink process's (Hello.ResumeInstance)
	// connects: the agent's service connects are resumable too
	// (control.CapResumeConnect); an agent that announced CapResume alone
	// sends them without an Open frame.
	connects bool
	cfg      resume.Config // without Budget: the node's is added per stream
	event    func(kind string)
	log      *slog.Logger
}

// node is the node's resumable streams and the configuration of a new one.
func (c *connResume) node() (*nodeResume, resume.Config) {
	n := c.table.resumable(c.nodeID, c.instance)
	cfg := c.cfg
	cfg.Budget = n.budget
	return n, cfg
}

// enableResume makes c's streams resumable, for window. A site hub's
// streams are its uplink's (what names it in the reason a stream ends with).
//
// instance is the uplink process's (its hello's ResumeInstance): streams the
// node's set kept for an earlier process end now, with the reason that it
// restarted.
func (s *Server) enableResume(c *Conn, window time.Duration, site bool, instance string) {
	events := s.cfg.ResumeEvents
	name := c.Name
	event := func(kind string) {
		if events != nil {
			events.Event(kind)
		}
	}
	link, restarted := fmt.Sprintf("node %s's link", name), fmt.Sprintf("node %s's agent restarted", name)
	if site {
		link, restarted = fmt.Sprintf("site %s's uplink", name), fmt.Sprintf("site hub %s restarted", name)
	}
	if n := s.cfg.Table.uplinkInstance(c.NodeID, instance, restarted+"; session ended"); n > 0 {
		for range n {
			event("ended")
		}
		s.log.Info("streams kept for the node's previous uplink process ended: it restarted", "node", name,
			"streams", n)
	}
	c.resume = &connResume{table: s.cfg.Table, nodeID: c.NodeID, instance: instance, event: event, log: s.log,
		cfg: resume.Config{
			Window: window,
			ExpiredReason: func(down time.Duration) string {
				event("expired")
				return fmt.Sprintf("%s was down for %s; session ended", link, down.Round(time.Second))
			},
			OnDetach: func(st *resume.Stream, err error) {
				event("detached")
				s.log.Info("stream waits for its node to reconnect", "node", name, "stream", st.ID().String(),
					"window", window, "err", err)
			},
			OnAttach: func(st *resume.Stream) {
				event("resumed")
				s.log.Info("stream resumed", "node", name, "stream", st.ID().String())
			},
		}}
}

// Resumable says whether streams to this session's node outlive the
// session.
func (c *Conn) Resumable() bool { return c.resume != nil }

// OpenResumable starts a resumable stream on st, a stream just opened to c
// whose header has been written: it writes the resume Open frame and
// returns a resume.Pending, kept in the node's set once the node's reply
// has been read (resume.Answered). On a session whose streams are not
// resumable it returns st.
func (c *Conn) OpenResumable(st tunnel.Stream) (tunnel.Stream, error) {
	if c.resume == nil {
		return st, nil
	}
	id := resume.NewID()
	if err := resume.WriteOpen(st, id); err != nil {
		return nil, fmt.Errorf("send stream id to %s: %w", c.Name, err)
	}
	n, cfg := c.resume.node()
	return resume.NewPending(id, st, n.set, cfg), nil
}

// acceptResumable reads the resume Open frame of st, a stream c's agent
// opened (header read), and returns it as a resume.Pending, kept in the
// node's set once the hub's reply is written (resume.Answered). An ID the
// node's set holds already is refused: a stream is never handed to another
// by a reused ID.
func (c *Conn) acceptResumable(st tunnel.Stream) (*resume.Pending, error) {
	id, err := resume.ReadOpen(st)
	if err != nil {
		return nil, err
	}
	n, cfg := c.resume.node()
	if _, dup := n.set.Get(id); dup {
		return nil, fmt.Errorf("stream id %s is already in use by another of this node's streams", id)
	}
	return resume.NewPending(id, st, n.set, cfg), nil
}

// AcceptResume re-attaches one of the node's streams to st, a stream its
// reconnected agent (or site hub) opened for it (tunnel.ServiceResume,
// header read).
func (c *Conn) AcceptResume(ctx context.Context, st tunnel.Stream) {
	ctx, cancel := context.WithTimeout(ctx, resumeAcceptTimeout)
	defer cancel()
	n, _ := c.resume.node()
	if err := n.set.Accept(ctx, st); err != nil {
		c.resume.event("refused")
		c.resume.log.Info("stream not resumed", "node", c.Name, "err", err)
	}
}
