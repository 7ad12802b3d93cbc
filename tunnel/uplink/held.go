package uplink

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/resume"
)

// Streams outlive an uplink's session when the hub above keeps them too
// (its welcome lists control.HubCapResume for a hello that announced
// control.CapResume): both the streams the hub opens (an agent's ssh and
// tcp streams, a site's route streams) and those the uplink opens (an
// agent's service connects) carry a resume Open frame after their header,
// and once answered the uplink holds them rather than the session: it
// keeps their local side (a connection to sshd, to a port, to a consumer,
// or the route on below a site) while its link is down, and re-attaches
// every one of them, one tunnel.ServiceResume stream each, on the next
// session that is welcomed. The hub says for how long a stream may wait
// (Welcome.ResumeWindowSeconds).

// ResumeTimeout bounds re-attaching one stream after a reconnect.
const ResumeTimeout = 15 * time.Second

// resumeParallel bounds how many streams are re-attached at once.
const resumeParallel = 8

// Held are the resumable streams of one uplink and the goroutines that
// carry them: those outlive the session the stream came on, so the
// uplink's Run, not the session, waits for them (Run).
type Held struct {
	set      *resume.Set
	budget   *resume.Budget
	wg       sync.WaitGroup
	instance string // Instance

	mu  sync.Mutex
	ctx context.Context // Run's: what held streams are carried under
}

// NewHeld returns an empty Held whose streams keep at most budget bytes
// unacknowledged all together: what the uplink's side can have in flight
// towards a hub it cannot reach, before its writes wait.
func NewHeld(budget int64) *Held {
	return &Held{set: resume.NewSet(), budget: resume.NewBudget(budget), ctx: context.Background(),
		instance: resume.NewID().String()}
}

// Instance names these held streams for the hello (control.Hello's
// ResumeInstance): a hub that kept streams for another instance of the
// uplink, one that restarted since, ends them at once.
func (h *Held) Instance() string { return h.instance }

// Run is the uplink's Run's part: held streams are carried under ctx; the
// returned stop ends every held stream, for reason (the peer reads it),
// and waits for what carries them.
func (h *Held) Run(ctx context.Context, reason string) (stop func()) {
	h.mu.Lock()
	h.ctx = ctx
	h.mu.Unlock()
	return func() {
		h.set.CloseAll(reason)
		h.wg.Wait()
	}
}

// Go runs f, which carries a held stream, under Run's context; Run's stop
// waits for it.
func (h *Held) Go(f func(ctx context.Context)) {
	h.mu.Lock()
	ctx := h.ctx
	h.mu.Unlock()
	h.wg.Go(func() { f(ctx) })
}

// Buffered is how many bytes the held streams keep unacknowledged.
func (h *Held) Buffered() int64 { return h.budget.InUse() }

// Streams are the streams held now; the streams to re-attach on a new
// session are those held before it serves any stream (Resume).
func (h *Held) Streams() []*resume.Stream { return h.set.Streams() }

// Keep is the configuration of the streams of a session welcomed with w:
// nil unless the hub keeps streams (control.HubCapResume, a window > 0).
// expired words the end of a stream whose window passed; log is the
// session's.
func (h *Held) Keep(w *control.Welcome, expired func(down time.Duration) string, log *slog.Logger) *resume.Config {
	if w == nil || !slices.Contains(w.Capabilities, control.HubCapResume) || w.ResumeWindowSeconds <= 0 {
		return nil
	}
	window := time.Duration(w.ResumeWindowSeconds) * time.Second
	return &resume.Config{
		Window:        window,
		Budget:        h.budget,
		ExpiredReason: expired,
		OnDetach: func(st *resume.Stream, err error) {
			log.Info("stream waits for the uplink to come back", "stream", st.ID().String(), "window", window,
				"err", err)
		},
		OnAttach: func(st *resume.Stream) {
			log.Info("stream resumed", "stream", st.ID().String())
		},
	}
}

// Open starts a resumable stream on st, a stream the uplink opened whose
// header it has written: it writes the Open frame with a fresh ID. The
// stream is held once its reply is read (resume.Answered).
func (h *Held) Open(st tunnel.Stream, cfg resume.Config) (*resume.Pending, error) {
	id := resume.NewID()
	if err := resume.WriteOpen(st, id); err != nil {
		return nil, fmt.Errorf("send stream id: %w", err)
	}
	return resume.NewPending(id, st, h.set, cfg), nil
}

// Accept reads the Open frame of st, a stream the hub opened whose header
// has been read. The stream is held once its reply is written
// (resume.Answered).
func (h *Held) Accept(st tunnel.Stream, cfg resume.Config) (*resume.Pending, error) {
	id, err := resume.ReadOpen(st)
	if err != nil {
		return nil, fmt.Errorf("read stream id: %w", err)
	}
	return resume.NewPending(id, st, h.set, cfg), nil
}

// Resume re-attaches, over sess, the streams held (Streams, taken before
// sess served any stream of its own): each on a tunnel.ServiceResume
// stream of its own, a few at a time. A stream the hub no longer knows (it
// restarted, or this is another hub) ends with the hub's reason. It
// returns when every one has been tried or ctx ends.
func (h *Held) Resume(ctx context.Context, sess tunnel.Session, held []*resume.Stream, log *slog.Logger) {
	if len(held) == 0 {
		return
	}
	log.Info("resuming streams held across the reconnect", "streams", len(held))
	sem := make(chan struct{}, resumeParallel)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, rs := range held {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := resumeOne(ctx, sess, rs); err != nil {
				log.Info("stream not resumed", "stream", rs.ID().String(), "err", err)
			}
		})
	}
}

func resumeOne(ctx context.Context, sess tunnel.Session, rs *resume.Stream) error {
	ctx, cancel := context.WithTimeout(ctx, ResumeTimeout)
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
