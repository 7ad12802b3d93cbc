package faultproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

func init() {
	toxics.Register(stallType, new(stallToxic))
	toxics.Register(retransmitType, new(retransmitToxic))
}

const (
	stallType      = "tether_stall"
	retransmitType = "tether_retransmit"
)

// TCP is a toxiproxy proxy with our toxics for latency, retransmissions,
// bandwidth and stalls.
type TCP struct {
	mu    sync.Mutex // serializes toxic changes and restarts
	srv   *toxiproxy.ApiServer
	proxy *toxiproxy.Proxy
	names map[string]bool // toxics installed

	stallGen  string        // current stall generation, see stalls
	stallDone chan struct{} // closed when that generation's connections are reset
}

// NewTCP starts a TCP proxy on listen (host:port, port 0 for any) to upstream.
func NewTCP(listen, upstream string) (*TCP, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "tether", listen, upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("faultproxy: tcp listen %s: %w", listen, err)
	}
	return &TCP{srv: srv, proxy: p, names: map[string]bool{}}, nil
}

// Addr is the proxy's listen address.
func (p *TCP) Addr() string {
	p.proxy.Lock()
	defer p.proxy.Unlock()
	return p.proxy.Listen
}

func streams(dir Direction) []string {
	var out []string
	if dir.has(Upstream) {
		out = append(out, "upstream")
	}
	if dir.has(Downstream) {
		out = append(out, "downstream")
	}
	return out
}

// setToxic installs (or replaces) the toxic name on stream.
func (p *TCP) setToxic(name, typ, stream string, attrs any) error {
	p.removeToxic(name)
	body, err := json.Marshal(
		map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs},
	)
	if err != nil {
		return err
	}
	if _, err := p.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		return fmt.Errorf("faultproxy: add %s toxic: %w", typ, err)
	}
	p.names[name] = true
	return nil
}

func (p *TCP) removeToxic(name string) {
	if p.names[name] {
		_ = p.proxy.Toxics.RemoveToxic(context.Background(), name)
		delete(p.names, name)
	}
}

// SetFaults replaces the latency, loss and bandwidth toxics in dir.
func (p *TCP) SetFaults(dir Direction, f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range streams(dir) {
		for _, k := range []string{"latency", "loss", "bandwidth"} {
			p.removeToxic(k + "_" + s)
		}
		if f.Latency > 0 {
			if err := p.setToxic("latency_"+s, "latency", s, map[string]int64{
				"latency": f.Latency.Milliseconds(), "jitter": f.Jitter.Milliseconds()}); err != nil {
				return err
			}
		}
		if f.Loss > 0 {
			if err := p.setToxic("loss_"+s, retransmitType, s, retransmitToxic{
				Probability: f.Loss, DelayMS: f.retransmitDelay().Milliseconds()}); err != nil {
				return err
			}
		}
		if f.Bandwidth > 0 {
			if err := p.setToxic(
				"bandwidth_"+s, "bandwidth", s, map[string]int64{"rate": max(1, f.Bandwidth/1024)},
			); err != nil {
				return err
			}
		}
	}
	return nil
}

// Stall stops forwarding in dir: bytes are held (TCP retransmits, nothing
// is lost), connections stay open, the sender's window fills. New
// connections are accepted but stall too.
func (p *TCP) Stall(dir Direction) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stallDone == nil {
		p.stallDone = make(chan struct{})
		p.stallGen = fmt.Sprintf("%p-%d", p, time.Now().UnixNano())
		stalls.Store(p.stallGen, p.stallDone)
	}
	for _, s := range streams(dir) {
		if p.names["stall_"+s] {
			continue
		}
		if err := p.setToxic("stall_"+s, stallType, s, stallToxic{Gen: p.stallGen}); err != nil {
			return err
		}
	}
	return nil
}

// Resume ends every stall; held bytes flow on.
func (p *TCP) Resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range streams(Both) {
		p.removeToxic("stall_" + s)
	}
	p.endStalls()
	return nil
}

// endStalls makes stalls of connections that are no longer part of the
// proxy drop what they hold, so their goroutines end.
func (p *TCP) endStalls() {
	if p.stallDone != nil {
		close(p.stallDone)
		stalls.Delete(p.stallGen)
		p.stallDone = nil
	}
}

// ResetConnections closes every connection through the proxy (both ends
// see the connection end; what a stall held is dropped) and keeps
// accepting new ones.
func (p *TCP) ResetConnections() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Stop()
	p.endStalls()
	for _, s := range streams(Both) {
		p.removeToxic("stall_" + s)
	}
	// Start listens on the same address (Listen holds the bound port).
	var err error
	for range 50 {
		if err = p.proxy.Start(); err == nil || errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("faultproxy: restart tcp proxy: %w", err)
}

// Refuse closes every connection and stops listening (connects are
// refused) until Accept.
func (p *TCP) Refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Stop()
	p.endStalls()
	for _, s := range streams(Both) {
		p.removeToxic("stall_" + s)
	}
}

// Accept listens again after Refuse.
func (p *TCP) Accept() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.proxy.Start(); err != nil && !errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
		return fmt.Errorf("faultproxy: restart tcp proxy: %w", err)
	}
	return nil
}

// Close stops the proxy, closing its connections, and ends the stalls
// (which release what they hold). It does not remove the toxics: toxiproxy
// removes a toxic with its collection locked while waiting for every link's
// chain to let go, and a link that is closing waits for that same lock to
// unregister itself, so removing toxics while links close can deadlock
// (seen in TestFaultFlapLatencyLoss's cleanup). The chains end with their
// connections anyway.
func (p *TCP) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Stop()
	p.endStalls()
	clear(p.names)
}

// stalls maps a stall generation to the channel closed when its stalled
// connections are reset: toxiproxy builds toxics from JSON, so this is how
// a stall learns that its connection is gone.
var stalls sync.Map // string -> chan struct{}

// stallToxic forwards nothing until it is removed (toxiproxy then passes on
// what queued up behind it), or until its generation ends with a reset: then
// it drops what it holds and ends its part of the chain.
type stallToxic struct {
	Gen string `json:"gen"`
}

func (t *stallToxic) Pipe(stub *toxics.ToxicStub) {
	var done <-chan struct{}
	if v, ok := stalls.Load(t.Gen); ok {
		done = v.(chan struct{})
	}
	select {
	case <-stub.Interrupt:
		return
	case <-done:
	}
	stub.Close()
	for c := range stub.Input {
		if c == nil {
			return
		}
	}
}

// retransmitToxic models TCP loss: with Probability a chunk is held back for
// DelayMS (the retransmission timeout), and with it everything behind it,
// as TCP delivers in order.
type retransmitToxic struct {
	Probability float64 `json:"probability"`
	DelayMS     int64   `json:"delay_ms"`
}

func (t *retransmitToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if rand.Float64() < t.Probability {
				select {
				case <-time.After(time.Duration(t.DelayMS) * time.Millisecond):
				case <-stub.Interrupt:
					stub.Output <- c // never drop bytes of a TCP stream
					return
				}
			}
			select {
			case stub.Output <- c:
			case <-stub.Interrupt:
				stub.Output <- c
				return
			}
		}
	}
}
