package edge

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
)

// The hub's streams outlive the agent's session when the hub keeps them too
// (control.HubCapResume): the agent holds the local side (the connection to
// sshd or to an allowed port, or the embedded server's session) while its
// link is down, and once it is welcomed again it re-attaches every stream
// it holds, one tunnel.ServiceResume stream each. The hub says for how long
// a stream may wait (Welcome.ResumeWindowSeconds).

// resumeAgentBudget bounds the bytes the agent keeps unacknowledged for all
// its streams together: what a node's output can have in flight towards a
// hub it cannot reach, before its writes wait.
const resumeAgentBudget = 64 << 20

// resumeTimeout bounds re-attaching one stream after a reconnect.
const resumeTimeout = 15 * time.Second

// resumeParallel bounds how many streams are re-attached at once.
const resumeParallel = 8

// heldStreams are the agent's resumable streams and the goroutines that
// serve them: those outlive the session the stream came on, so Run, not
// the session, waits for them.
type heldStreams struct {
	set    *resume.Set
	budget *resume.Budget
	wg     sync.WaitGroup

	mu  sync.Mutex
	ctx context.Context // Run's: what served streams live under
}

func newHeldStreams() *heldStreams {
	return &heldStreams{set: resume.NewSet(), budget: resume.NewBudget(resumeAgentBudget), ctx: context.Background()}
}

// run is Run's part: streams are served under ctx; when it ends, every
// held stream ends and run waits for their goroutines.
func (h *heldStreams) run(ctx context.Context) (stop func()) {
	h.mu.Lock()
	h.ctx = ctx
	h.mu.Unlock()
	return func() {
		h.set.CloseAll("the node's agent is stopping")
		h.wg.Wait()
	}
}

func (h *heldStreams) runCtx() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ctx
}

// resumeConfig is a held stream's configuration for a hub that keeps
// streams for window.
func (a *Agent) resumeConfig(window time.Duration, log *slog.Logger) resume.Config {
	return resume.Config{
		Window: window,
		Budget: a.held.budget,
		ExpiredReason: func(down time.Duration) string {
			return fmt.Sprintf("the link to the hub was down for %s; session ended", down.Round(time.Second))
		},
		OnDetach: func(st *resume.Stream, err error) {
			log.Info("stream waits for the hub link", "stream", st.ID().String(), "window", window, "err", err)
		},
		OnAttach: func(st *resume.Stream) {
			log.Info("stream resumed", "stream", st.ID().String())
		},
	}
}

// hold wraps st, whose reply has been written, as a resumable stream with
// the id the hub gave it.
func (a *Agent) hold(id resume.ID, st tunnel.Stream, cfg resume.Config) (tunnel.Stream, error) {
	rs := resume.New(id, st, cfg)
	if err := a.held.set.Add(rs); err != nil {
		rs.Abort("the agent could not keep this stream")
		return nil, fmt.Errorf("hold stream %s: %w", id, err)
	}
	return rs, nil
}

// resumeHeld re-attaches, over sess, every stream the agent held when sess
// was welcomed (held): each on a stream of its own. A stream the hub no
// longer knows (it restarted, or this is another hub) ends with the hub's
// reason.
func (a *Agent) resumeHeld(ctx context.Context, sess tunnel.Session, held []*resume.Stream, log *slog.Logger) {
	if len(held) == 0 {
		return
	}
	log.Info("resuming streams held across the reconnect", "streams", len(held))
	sem := make(chan struct{}, resumeParallel)
	var wg sync.WaitGroup
	for _, rs := range held {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := a.resumeOne(ctx, sess, rs); err != nil {
				log.Info("stream not resumed", "stream", rs.ID().String(), "err", err)
			}
		})
	}
	wg.Wait()
}

func (a *Agent) resumeOne(ctx context.Context, sess tunnel.Session, rs *resume.Stream) error {
	ctx, cancel := context.WithTimeout(ctx, resumeTimeout)
	defer cancel()
	st, err := sess.OpenStream(ctx)
	if err != nil {
		return fmt.Errorf("open a stream to resume on: %w", err)
	}
	if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceResume}); err != nil {
		st.Close()
		return fmt.Errorf("send resume header: %w", err)
	}
	return rs.Resume(ctx, st)
}
