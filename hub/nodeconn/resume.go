package nodeconn

import (
	"context"
	"fmt"
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
	// Event is one of "detached", "resumed", "expired", "refused".
	Event(kind string)
}

// nodeResume is one node's resumable streams.
type nodeResume struct {
	set    *resume.Set
	budget *resume.Budget
}

// resumeSets holds every node's resumable streams, by node ID.
type resumeSets struct {
	mu     sync.Mutex
	byNode map[string]*nodeResume
}

// resumable returns the resumable streams of node id, made on first use.
func (r *Table) resumable(id string) *nodeResume {
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
	return n
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
	table  *Table
	nodeID string
	cfg    resume.Config // without Budget: the node's is added per stream
}

// node is the node's resumable streams and the configuration of a new one.
func (c *connResume) node() (*nodeResume, resume.Config) {
	n := c.table.resumable(c.nodeID)
	cfg := c.cfg
	cfg.Budget = n.budget
	return n, cfg
}

// enableResume makes c's streams resumable, for window.
func (s *Server) enableResume(c *Conn, window time.Duration) {
	events := s.cfg.ResumeEvents
	name := c.Name
	event := func(kind string) {
		if events != nil {
			events.Event(kind)
		}
	}
	c.resume = &connResume{table: s.cfg.Table, nodeID: c.NodeID, cfg: resume.Config{
		Window: window,
		ExpiredReason: func(down time.Duration) string {
			event("expired")
			return fmt.Sprintf("node %s's link was down for %s; session ended", name, down.Round(time.Second))
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

// openResumable sends the resume Open frame on a stream just opened to c
// (after its header), before the agent's reply.
func (c *Conn) openResumable(st tunnel.Stream) (resume.ID, error) {
	id := resume.NewID()
	return id, resume.WriteOpen(st, id)
}

// keepResumable wraps an accepted stream as a resumable one under c's
// node.
func (c *Conn) keepResumable(id resume.ID, st tunnel.Stream) (tunnel.Stream, error) {
	n, cfg := c.resume.node()
	rs := resume.New(id, st, cfg)
	if err := n.set.Add(rs); err != nil {
		rs.Abort("the hub could not keep this stream")
		return nil, fmt.Errorf("keep stream %s to %s: %w", id, c.Name, err)
	}
	return rs, nil
}

// acceptResume re-attaches one of the node's streams to st, a stream its
// reconnected agent opened for it (tunnel.ServiceResume, header read).
func (s *Server) acceptResume(ctx context.Context, c *Conn, st tunnel.Stream) {
	ctx, cancel := context.WithTimeout(ctx, resumeAcceptTimeout)
	defer cancel()
	n, _ := c.resume.node()
	if err := n.set.Accept(ctx, st); err != nil {
		if s.cfg.ResumeEvents != nil {
			s.cfg.ResumeEvents.Event("refused")
		}
		s.log.Info("stream not resumed", "node", c.Name, "err", err)
	}
}
