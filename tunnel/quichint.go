package tunnel

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
)

// A QUIC refusal has no room for a retry hint: quic-go answers a
// ConnContext refusal with a stateless CONNECTION_CLOSE (CONNECTION_REFUSED)
// without a reason phrase, and it strips the reason phrase of crypto errors
// and of application closes sent before the handshake completes. So the
// hub sends the hint in a datagram of its own, just before the refusal, to
// the address the refused Initial came from: quicBusyMagic and the hint in
// whole seconds (1 byte). Its first byte has the two high bits clear, which
// makes quic-go on the agent hand it to Transport.ReadNonQUICPacket instead
// of parsing it as QUIC. The hub's cost per refusal is one 6-byte sendto
// (no connection state, no cryptography: cheaper than the refusal itself),
// and the answer is smaller than the 1200-byte Initial that caused it, so
// it cannot amplify a spoofed flood.
//
// Like the TCP hint it is not authenticated: the agent bounds it by its own
// backoff cap (see BusyError).
var quicBusyMagic = [5]byte{0x00, 'T', 'B', 'S', 'Y'}

// quicHintWait bounds how long a refused dial waits for the hint datagram
// (sent before the refusal, so normally already there): a hub that sends
// none (an older one) costs a refused agent this much. At 200 ms a
// simulated agent on a CPU-starved bench box sometimes read its hint too
// late and waited out its own backoff instead (up to 30 s).
const quicHintWait = time.Second

// quicHintMaxAge drops hints nobody took in time (on a socket shared by many
// dials, a hint meant for a dial that has given up).
const quicHintMaxAge = 2 * time.Second

// quicBusyRecord is the hint datagram for a refusal asking to come back
// after secs seconds.
func quicBusyRecord(secs byte) []byte {
	return append(quicBusyMagic[:], secs)
}

// parseQUICBusy reads a hint datagram; ok is false for anything else.
func parseQUICBusy(b []byte) (time.Duration, bool) {
	if len(b) != len(quicBusyMagic)+1 || [5]byte(b[:5]) != quicBusyMagic || b[5] == 0 {
		return 0, false
	}
	return min(time.Duration(b[5])*time.Second, retryHintMax), true
}

// After a restart the hub sends each agent whose QUIC session its previous
// run held (ListenConfig.PeersFile) a poke: quicPokeMagic and the session's
// poke token, from the port the agent talks to. Without it, a restarted hub
// hears an agent only when its next keepalive is due (25 s at the
// defaults), and a PING is too small to draw a stateless reset. The token
// is keying material exported from the session's TLS (RFC 8446 section
// 7.5): only the two ends of that session know it, so a valid poke proves
// the session is gone on the hub, and the agent closes it and reconnects at
// once. A poke without the right token is dropped (a map lookup); one
// replayed by an eavesdropper names a session already dead. Like the busy
// hint, its first byte keeps quic-go from parsing it as QUIC, and it is
// smaller than a QUIC packet: the hub sends it only after a restart, once a
// second at most three times per agent, to the addresses it wrote down.
var quicPokeMagic = [5]byte{0x00, 'T', 'P', 'O', 'K'}

const (
	pokeTokenLen   = 16
	pokeTokenLabel = "EXPORTER-tether-hub-restarted"
)

// quicPokeRecord is the poke datagram for a session's token.
func quicPokeRecord(token [pokeTokenLen]byte) []byte {
	return append(quicPokeMagic[:], token[:]...)
}

// parseQUICPoke reads a poke datagram; ok is false for anything else,
// including the zero token of a session without one.
func parseQUICPoke(b []byte) (token [pokeTokenLen]byte, ok bool) {
	if len(b) != len(quicPokeMagic)+pokeTokenLen || [5]byte(b[:5]) != quicPokeMagic {
		return token, false
	}
	copy(token[:], b[5:])
	return token, token != [pokeTokenLen]byte{}
}

type quicHint struct {
	from netip.AddrPort
	d    time.Duration
	at   time.Time
}

// hintBox collects the hub's hint datagrams arriving on one quic.Transport.
// Only one goroutine may read a Transport's non-QUIC packets, so a socket
// shared by many dials has one box; each refused dial takes one hint.
//
// The queue grows with the hints waiting, up to room: a socket shared by a
// thousand simulated agents needs room for a thousand at once, but a
// channel that size cost 64 KiB per socket while idle (213 MiB of a bench
// simulator's heap at 40,000 agents, 12 to a socket).
type hintBox struct {
	room   int
	mu     sync.Mutex
	queue  []quicHint
	signal chan struct{} // a token when a hint was queued (capacity 1)
	done   chan struct{} // closed when the reader has returned
	// pokes are the live sessions on the socket, by poke token (watch).
	pokes map[[pokeTokenLen]byte]*quicSession
}

// watchHints reads tr's non-QUIC packets until ctx ends or tr closes; the
// caller ends one of them, then may wait on done. room is how many hints
// may wait to be taken (one per dial refused at once on tr).
//
// quic-go drops the non-QUIC packets that reach a Transport before its first
// ReadNonQUICPacket call. So the first call is made here, with a context
// already ended, before watchHints returns: a dial started after it cannot
// lose its hint to a reader goroutine the scheduler has not run yet (on a
// loaded box, a refused dial in the tests once read no hint this way).
func watchHints(ctx context.Context, tr *quic.Transport, room int) *hintBox {
	b := &hintBox{room: room, signal: make(chan struct{}, 1), done: make(chan struct{})}
	buf := make([]byte, 64)
	ended, end := context.WithCancel(ctx)
	end()
	if n, from, err := tr.ReadNonQUICPacket(ended, buf); err == nil {
		b.keep(buf[:n], from)
	}
	go func() {
		defer close(b.done)
		if testHookHintReader != nil {
			testHookHintReader()
		}
		for {
			n, from, err := tr.ReadNonQUICPacket(ctx, buf)
			if err != nil {
				return
			}
			b.keep(buf[:n], from)
		}
	}()
	return b
}

// testHookHintReader, when set, runs before watchHints' reader goroutine
// reads: a test holds the reader back with it, as a busy scheduler would.
var testHookHintReader func()

// keep queues datagram p from if it is a hint, and ends the session a poke
// names; anything else, or a hint beyond room, is dropped.
func (b *hintBox) keep(p []byte, from net.Addr) {
	if token, ok := parseQUICPoke(p); ok {
		b.mu.Lock()
		s := b.pokes[token]
		b.mu.Unlock()
		if s != nil {
			go s.poked() // closing waits for the connection's loop
		}
		return
	}
	d, ok := parseQUICBusy(p)
	ua, isUDP := from.(*net.UDPAddr)
	if !ok || !isUDP {
		return
	}
	b.mu.Lock()
	if len(b.queue) < b.room {
		b.queue = append(b.queue, quicHint{from: ua.AddrPort(), d: d, at: time.Now()})
	}
	b.mu.Unlock()
	b.wake()
}

// watch lets a poke with s's token end s, until s ends.
func (b *hintBox) watch(s *quicSession) {
	token := s.pokeToken()
	b.mu.Lock()
	if b.pokes == nil {
		b.pokes = map[[pokeTokenLen]byte]*quicSession{}
	}
	b.pokes[token] = s
	b.mu.Unlock()
	context.AfterFunc(s.conn.Context(), func() {
		b.mu.Lock()
		delete(b.pokes, token)
		b.mu.Unlock()
	})
}

// wake hands a waiting take the token, if none holds one yet.
func (b *hintBox) wake() {
	select {
	case b.signal <- struct{}{}:
	default:
	}
}

// take returns a hint from hub that arrived at most quicHintMaxAge ago,
// waiting up to wait for one (0: only one that has already arrived).
func (b *hintBox) take(hub *net.UDPAddr, wait time.Duration) (time.Duration, bool) {
	want := unmap(hub.AddrPort())
	var expired <-chan time.Time // nil: no wait has started
	for {
		if d, ok := b.pop(want); ok {
			return d, true
		}
		if wait <= 0 {
			return 0, false
		}
		if expired == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-b.signal:
		case <-expired:
			return 0, false
		}
	}
}

// pop takes the oldest hint from want that is fresh enough, dropping the
// stale and foreign ones before it; hints left behind wake the next take.
func (b *hintBox) pop(want netip.AddrPort) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.queue) > 0 {
		h := b.queue[0]
		b.queue[0] = quicHint{}
		b.queue = b.queue[1:]
		if unmap(h.from) == want && time.Since(h.at) <= quicHintMaxAge {
			if len(b.queue) > 0 {
				b.wake()
			}
			return h.d, true
		}
	}
	b.queue = nil // let the emptied array go
	return 0, false
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
