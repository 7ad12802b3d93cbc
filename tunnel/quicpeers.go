package tunnel

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// A listener with ListenConfig.PeersFile remembers there where each of its
// QUIC sessions' agents is (address, poke token, key), and a listener that
// starts and finds the file of a run that ended less than an idle timeout
// ago pokes those agents (quicPokeMagic), so that they reconnect at once
// instead of at their next keepalive. The file is rewritten (whole, then
// renamed over the old one) at most every peersWriteEvery while sessions
// come and go, and only touched otherwise, so its time says when the hub
// last ran: a hub killed outright leaves a file at most peersWriteEvery
// behind.
const (
	peersWriteEvery = time.Second
	// peersTouchEvery bounds how stale the file's time is while nothing
	// changes; a file older than the idle timeout and this names no
	// session an agent can still hold.
	peersTouchEvery = 5 * time.Second
	// pokeRounds is how often an agent that has not come back is poked, a
	// second apart (a poke may be lost like any datagram).
	pokeRounds     = 3
	pokeRoundEvery = time.Second
	// pokeRate bounds the pokes per second: a restarted hub takes the
	// reconnects at the pace of its handshakes anyway (MaxHandshakes),
	// and its refusals ask the rest back later.
	pokeRate = 5000
	// maxPeers bounds the entries a file may name.
	maxPeers = 1 << 22
)

// peersMagic starts the file; the version is its last byte.
var peersMagic = [8]byte{'T', 'Q', 'P', 'E', 'E', 'R', 'S', 1}

// peerEntry is one agent in the file: who it is (a digest of its key, so
// that its return is seen whatever certificate it renewed to), its
// session's poke token, and the address its packets came from.
type peerEntry struct {
	key   [16]byte
	token [pokeTokenLen]byte
	addr  netip.AddrPort
}

const peerEntryLen = 16 + pokeTokenLen + 16 + 2

// peerKey identifies a session's agent: its public key, as the hub's node
// identity survives certificate renewals.
func peerKey(s Session) ([16]byte, bool) {
	certs := s.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return [16]byte{}, false
	}
	sum := sha256.Sum256(certs[0].RawSubjectPublicKeyInfo)
	return [16]byte(sum[:16]), true
}

// quicPeers is a listener's part of the above: the live QUIC sessions it
// writes down, and the agents of the previous run still to be poked.
type quicPeers struct {
	path   string
	maxAge time.Duration
	log    *slog.Logger

	mu    sync.Mutex
	live  map[*quicSession]peerEntry
	dirty bool
	// pending are the previous run's sessions whose agents are not back
	// yet, by agent (an agent may have held two at once, moving).
	pending map[[16]byte][]peerEntry
}

// openQUICPeers reads the previous run's file at path, keeping its agents
// to poke if it was written less than maxAge ago. A file that cannot be
// read costs the pokes only (logged).
func openQUICPeers(path string, maxAge time.Duration, log *slog.Logger) *quicPeers {
	p := &quicPeers{path: path, maxAge: maxAge, log: log, live: map[*quicSession]peerEntry{},
		pending: map[[16]byte][]peerEntry{}}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return p
	case err != nil:
		log.Warn("agents of the previous run not poked: their file cannot be read", "err", err)
		return p
	case time.Since(fi.ModTime()) > maxAge:
		log.Debug("agents of the previous run not poked: it ended longer than an idle timeout ago", "file", path,
			"written", fi.ModTime())
		return p
	}
	b, err := os.ReadFile(path)
	if err == nil {
		var entries []peerEntry
		if entries, err = decodePeers(b); err == nil {
			for _, e := range entries {
				p.pending[e.key] = append(p.pending[e.key], e)
			}
			return p
		}
	}
	log.Warn("agents of the previous run not poked; the file is rewritten as sessions come", "file", path, "err", err)
	return p
}

// add writes down a session the listener delivers, and stops poking its
// agent.
func (p *quicPeers) add(s *quicSession) {
	key, ok := peerKey(s)
	addr, aok := s.conn.RemoteAddr().(*net.UDPAddr)
	if !ok || !aok {
		return
	}
	e := peerEntry{key: key, token: s.pokeToken(), addr: unmap(addr.AddrPort())}
	p.mu.Lock()
	p.live[s], p.dirty = e, true
	delete(p.pending, key)
	p.mu.Unlock()
}

// remove forgets a session that ended.
func (p *quicPeers) remove(s *quicSession) {
	p.mu.Lock()
	if _, ok := p.live[s]; ok {
		delete(p.live, s)
		p.dirty = true
	}
	p.mu.Unlock()
}

// keep writes the file while sessions change, and touches it otherwise,
// until done closes. A hub at rest costs a stat-sized write every
// peersTouchEvery.
func (p *quicPeers) keep(done <-chan struct{}) {
	t := time.NewTicker(peersWriteEvery)
	defer t.Stop()
	var written, scanned time.Time
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			if now.Sub(scanned) >= peersTouchEvery {
				scanned = now
				p.rescan()
			}
			if err := p.sync(now, &written); err != nil {
				p.log.Warn("agents' addresses not written down: a restart of this hub waits for their keepalives",
					"err", err)
				written = now // not again each second
			}
		}
	}
}

// rescan notes the agents that moved (a NAT rebinding QUIC followed).
func (p *quicPeers) rescan() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s, e := range p.live {
		if a, ok := s.conn.RemoteAddr().(*net.UDPAddr); ok && unmap(a.AddrPort()) != e.addr {
			e.addr = unmap(a.AddrPort())
			p.live[s], p.dirty = e, true
		}
	}
}

// sync rewrites the file if a session came or went or an agent moved, or
// touches it if it was last written peersTouchEvery ago.
func (p *quicPeers) sync(now time.Time, written *time.Time) error {
	p.mu.Lock()
	var b []byte
	if p.dirty {
		entries := make([]peerEntry, 0, len(p.live))
		for _, e := range p.live {
			entries = append(entries, e)
		}
		b, p.dirty = encodePeers(entries), false
	}
	p.mu.Unlock()
	switch {
	case b != nil:
		*written = now
		return writeFileAtomic(p.path, b)
	case now.Sub(*written) >= peersTouchEvery:
		*written = now
		if err := os.Chtimes(p.path, now, now); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// poke sends the previous run's agents that are not back their pokes on
// send, pokeRounds times a second apart at most pokeRate a second, until
// done closes.
func (p *quicPeers) poke(send func(b []byte, to net.Addr) error, done <-chan struct{}) {
	for round := range pokeRounds {
		p.mu.Lock()
		todo := make([]peerEntry, 0, len(p.pending))
		for _, es := range p.pending {
			todo = append(todo, es...)
		}
		p.mu.Unlock()
		if len(todo) == 0 {
			return
		}
		if round == 0 {
			p.log.Info("poking the agents of the previous run so that they reconnect now", "sessions", len(todo))
		}
		start, failed := time.Now(), 0
		for i, e := range todo {
			if i > 0 && i%(pokeRate/100) == 0 {
				// Paced in steps of a hundredth of a second.
				if !sleepUntil(start.Add(time.Duration(i)*time.Second/pokeRate), done) {
					return
				}
			}
			if err := send(quicPokeRecord(e.token), net.UDPAddrFromAddrPort(e.addr)); err != nil {
				failed++
			}
		}
		if failed > 0 {
			p.log.Debug("pokes not sent", "failed", failed, "of", len(todo))
		}
		if !sleepUntil(start.Add(pokeRoundEvery), done) {
			return
		}
	}
}

// sleepUntil waits until t, or reports false if done closes first.
func sleepUntil(t time.Time, done <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-done:
		return false
	}
}

// encodePeers is the file: peersMagic, the count, the entries (key, token,
// IPv6 or IPv4-mapped address, port), and a CRC-32 of all that.
func encodePeers(entries []peerEntry) []byte {
	b := make([]byte, 0, len(peersMagic)+4+len(entries)*peerEntryLen+4)
	b = append(b, peersMagic[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(entries)))
	for _, e := range entries {
		ip := e.addr.Addr().As16()
		b = append(b, e.key[:]...)
		b = append(b, e.token[:]...)
		b = append(b, ip[:]...)
		b = binary.BigEndian.AppendUint16(b, e.addr.Port())
	}
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// decodePeers reads what encodePeers wrote, and refuses anything else.
func decodePeers(b []byte) ([]peerEntry, error) {
	head := len(peersMagic) + 4
	if len(b) < head+4 || !bytes.Equal(b[:len(peersMagic)], peersMagic[:]) {
		return nil, errors.New("not a peers file of this version")
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return nil, errors.New("checksum mismatch (truncated or damaged)")
	}
	n := binary.BigEndian.Uint32(b[len(peersMagic):head])
	if n > maxPeers || len(body) != head+int(n)*peerEntryLen {
		return nil, fmt.Errorf("%d bytes cannot hold the %d entries it announces", len(b), n)
	}
	entries := make([]peerEntry, 0, n)
	for rest := body[head:]; len(rest) > 0; rest = rest[peerEntryLen:] {
		var e peerEntry
		copy(e.key[:], rest[:16])
		copy(e.token[:], rest[16:32])
		ip := netip.AddrFrom16([16]byte(rest[32:48])).Unmap()
		e.addr = netip.AddrPortFrom(ip, binary.BigEndian.Uint16(rest[48:50]))
		if !e.addr.IsValid() || e.addr.Port() == 0 {
			return nil, fmt.Errorf("entry %d has no address", len(entries))
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// writeFileAtomic replaces path with b, mode 0600: whoever reads the
// tokens can make the agents of live sessions reconnect (the data dir that
// holds the file holds the hub's keys too).
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
