package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// connectTimeout bounds opening a service connect stream and waiting for
// the hub's answer (the hub reaches the target meanwhile, possibly through
// several hubs).
const connectTimeout = 30 * time.Second

// serviceBinder runs the local listeners of the service tunnels this node
// consumes (siteproto.TypeServiceBindings): one per binding, on a loopback
// address only. Each connection it accepts becomes a tunnel.ServiceConnect
// stream to the hub, which carries it to the service's target. It lives as
// long as one hub session: the hub pushes the bindings again on the next.
// On a session whose streams are resumable (keep), a connection once
// answered is held by the agent (held) rather than by the session, and so
// outlives it.
type serviceBinder struct {
	ctx  context.Context // the session's: ends listeners and connections
	open func(ctx context.Context) (tunnel.Stream, error)
	log  *slog.Logger
	wg   sync.WaitGroup // every listener's accept loop and every connection
	// held and keep make the connections resumable; keep is nil on a
	// session whose hub does not keep streams.
	held *uplink.Held
	keep *resume.Config

	mu        sync.Mutex // guards listeners
	listeners map[string]*serviceListener
}

// serviceListener is one binding's listener.
type serviceListener struct {
	name, addr string
	ln         net.Listener
}

// newServiceBinder returns a binder whose streams open is opens on the
// session; everything it starts ends when ctx does (Wait waits for it),
// but for the connections held (keep non-nil), which end with held's Run.
func newServiceBinder(
	ctx context.Context, open func(ctx context.Context) (tunnel.Stream, error), held *uplink.Held,
	keep *resume.Config, log *slog.Logger,
) *serviceBinder {
	b := &serviceBinder{ctx: ctx, open: open, held: held, keep: keep, log: log,
		listeners: map[string]*serviceListener{}}
	context.AfterFunc(ctx, func() { b.apply(nil) })
	return b
}

// Wait blocks until every listener and connection has ended (after the
// binder's context is done).
func (b *serviceBinder) Wait() { b.wg.Wait() }

// Listening returns the bound addresses by service name.
func (b *serviceBinder) Listening() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]string, len(b.listeners))
	for name, l := range b.listeners {
		out[name] = l.addr
	}
	return out
}

// apply makes the listeners match bindings: it closes those no longer
// listed (or listed on another address) and opens the new ones. A binding
// whose address cannot be listened on is logged and skipped; the others
// still apply. Connections already carried are not touched.
func (b *serviceBinder) apply(bindings []siteproto.ServiceBinding) {
	want := map[string]string{}
	if b.ctx.Err() == nil {
		for _, sb := range bindings {
			want[sb.Name] = sb.Listen
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for name, l := range b.listeners {
		if want[name] != l.addr {
			l.ln.Close()
			delete(b.listeners, name)
			b.log.Info("service listener closed", "service", name, "listen", l.addr)
		}
	}
	for name, addr := range want {
		if _, ok := b.listeners[name]; ok {
			continue
		}
		if err := checkLoopback(addr); err != nil {
			b.log.Warn("service binding refused", "service", name, "err", err)
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			b.log.Warn("service listener not opened", "service", name, "listen", addr, "err", err)
			continue
		}
		l := &serviceListener{name: name, addr: addr, ln: ln}
		b.listeners[name] = l
		b.log.Info("service listener open", "service", name, "listen", addr)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.accept(l)
		}()
	}
}

// checkLoopback refuses anything but a loopback address with a port: the
// hub decides what a node listens on, and it may never open the node to
// its network (the control layer checks this too; this is the agent's own
// word on it).
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("listen address %q is not a loopback address", addr)
	}
	return nil
}

func (b *serviceBinder) accept(l *serviceListener) {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				b.log.Warn("service listener failed", "service", l.name, "err", err)
			}
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.carry(l.name, c)
		}()
	}
}

// carry opens a service connect stream for one accepted connection, waits
// for the hub's answer, then relays both ways (half-closes passed on): on
// this goroutine, which the session waits for, or for a resumable stream on
// one of the held streams', which outlives the session (the consumer's
// connection stays open while the link is down).
func (b *serviceBinder) carry(name string, c net.Conn) {
	log := b.log.With("service", name, "client", c.RemoteAddr().String())
	ctx, cancel := context.WithTimeout(b.ctx, connectTimeout)
	st, err := b.connect(ctx, name)
	cancel()
	if err != nil {
		log.Info("service connection refused", "err", err)
		c.Close()
		return
	}
	relay := func(ctx context.Context, st tunnel.Stream) {
		stop := context.AfterFunc(ctx, func() { st.Close(); c.Close() })
		defer stop()
		n := tunnel.Pipe(c, st, nil)
		log.Debug("service connection ended", "bytes_out", n.AtoB, "bytes_in", n.BtoA)
	}
	if _, ok := st.(*resume.Stream); ok {
		b.held.Go(func(ctx context.Context) { relay(ctx, st) })
		return
	}
	relay(b.ctx, st)
}

func (b *serviceBinder) connect(ctx context.Context, name string) (tunnel.Stream, error) {
	st, err := b.open(ctx)
	if err != nil {
		return nil, fmt.Errorf("open a stream to the hub: %w", err)
	}
	// ctx ending (timeout, session end) unblocks the exchange below.
	stop := context.AfterFunc(ctx, func() { st.Close() })
	fail := func(err error) (tunnel.Stream, error) {
		stop()
		st.Close()
		return nil, err
	}
	if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceConnect}); err != nil {
		return fail(err)
	}
	var answered tunnel.Stream = st // what to carry the bytes on once answered
	if b.keep != nil {
		p, err := b.held.Open(st, *b.keep)
		if err != nil {
			return fail(err)
		}
		answered = p
	}
	if err := siteproto.WriteServiceConnect(st, &siteproto.ServiceConnectRequest{Name: name}); err != nil {
		return fail(err)
	}
	rep, err := tunnel.ReadReply(st)
	if err != nil {
		return fail(fmt.Errorf("waiting for the hub's answer: %w", err))
	}
	if !rep.OK {
		return fail(fmt.Errorf("hub refused: %s", rep.Reason))
	}
	if !stop() {
		return fail(ctx.Err())
	}
	kept, err := resume.Answered(answered)
	if err != nil {
		st.Close()
		return nil, err
	}
	return kept, nil
}
