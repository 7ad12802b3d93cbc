package tunnel

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// A listener with ListenConfig.PeersFile remembers there where each of its
// QUIC sessions' agents is (address, poke token, key), and a listener that
// starts and finds the file of a run that ended less than an idle timeout
// ago pokes those agents (quicPokeMagic), so that they reconnect at once
// instead of at their next keepalive. The file is rewritten (whole, then
// renamed over the old one) as soon as a session comes or goes, at most
// every peersWriteEvery while they keep coming (a fleet of 100,000 QUIC
// agents reconnecting makes a 5 MB file: 25 MB/s of writes during the
// storm), and only touched otherwise, so its time says when the hub last
// ran: a hub killed outright leaves a file at most peersWriteEvery behind,
// even when it is killed right after its agents reconnected (a crash
// loop).
const (
	peersWriteEvery = 200 * time.Millisecond
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

// PokeTarget is one QUIC session's agent as a poke needs it: who it is (a
// digest of its key, so that its return is seen whatever certificate it
// renewed to), its session's poke token, and the address its packets came
// from. A listener writes its sessions' targets in its peers file, and a
// hub replica records them with its nodes' presence, so that the
// replicas that survive it poke its agents over to themselves
// (Listener.Poke).
type PokeTarget struct {
	Key   [16]byte
	Token [pokeTokenLen]byte
	Addr  netip.AddrPort
}

// peerEntry is the file's name for a target.
type peerEntry = PokeTarget

const peerEntryLen = 16 + pokeTokenLen + 16 + 2

// PokeTargetOf is the target of s, a QUIC session a Listener accepted; ok
// is false for any other session.
func PokeTargetOf(s Session) (t PokeTarget, ok bool) {
	qs, isQUIC := s.(*quicSession)
	if !isQUIC || qs.watch != nil { // a dialed session's peer is a hub
		return PokeTarget{}, false
	}
	key, kok := peerKey(qs)
	addr, aok := qs.conn.RemoteAddr().(*net.UDPAddr)
	if !kok || !aok {
		return PokeTarget{}, false
	}
	t = PokeTarget{Key: key, Token: qs.pokeToken(), Addr: unmap(addr.AddrPort())}
	return t, t.Token != [pokeTokenLen]byte{}
}

// String is the target as text: key and token in hex, then the address
// ("<32 hex>.<32 hex>@192.0.2.7:41000"); ParsePokeTarget reads it back.
func (t PokeTarget) String() string {
	return hex.EncodeToString(t.Key[:]) + "." + hex.EncodeToString(t.Token[:]) + "@" + t.Addr.String()
}

// ParsePokeTarget reads what PokeTarget.String wrote, and refuses anything
// else (a zero token, an address without a port).
func ParsePokeTarget(s string) (PokeTarget, error) {
	ids, addr, ok := strings.Cut(s, "@")
	key, token, ok2 := strings.Cut(ids, ".")
	var t PokeTarget
	if !ok || !ok2 || hex.DecodedLen(len(key)) != len(t.Key) || hex.DecodedLen(len(token)) != len(t.Token) {
		return PokeTarget{}, fmt.Errorf("tunnel: poke target %.80q: want KEY.TOKEN@HOST:PORT", s)
	}
	if _, err := hex.Decode(t.Key[:], []byte(key)); err != nil {
		return PokeTarget{}, fmt.Errorf("tunnel: poke target key: %w", err)
	}
	if _, err := hex.Decode(t.Token[:], []byte(token)); err != nil {
		return PokeTarget{}, fmt.Errorf("tunnel: poke target token: %w", err)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || ap.Port() == 0 || t.Token == [pokeTokenLen]byte{} {
		return PokeTarget{}, fmt.Errorf("tunnel: poke target %.80q: no token or no address with a port", s)
	}
	t.Addr = unmap(ap)
	return t, nil
}

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
	// pending are the agents to poke that are not back yet (the previous
	// run's, or another replica's), by agent (an agent may have held two
	// sessions at once, moving), each with the rounds it has left.
	pending map[[16]byte]*pokeDue
	// kick wakes the poke loop when agents were added to pending.
	kick chan struct{}
	// changed wakes keep when a session came or went.
	changed chan struct{}
}

// pokeDue is one agent's sessions to poke and the rounds left.
type pokeDue struct {
	targets []PokeTarget
	left    int
}

// openQUICPeers reads the previous run's file at path, keeping its agents
// to poke if it was written less than maxAge ago. A file that cannot be
// read costs the pokes only (logged).
func openQUICPeers(path string, maxAge time.Duration, log *slog.Logger) *quicPeers {
	p := &quicPeers{path: path, maxAge: maxAge, log: log, live: map[*quicSession]peerEntry{},
		pending: map[[16]byte]*pokeDue{}, kick: make(chan struct{}, 1), changed: make(chan struct{}, 1)}
	if path == "" {
		return p
	}
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
			p.enqueue(entries)
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
	e := peerEntry{Key: key, Token: s.pokeToken(), Addr: unmap(addr.AddrPort())}
	p.mu.Lock()
	p.live[s], p.dirty = e, true
	delete(p.pending, key)
	p.mu.Unlock()
	p.change()
}

// change wakes keep.
func (p *quicPeers) change() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// remove forgets a session that ended.
func (p *quicPeers) remove(s *quicSession) {
	p.mu.Lock()
	_, ok := p.live[s]
	if ok {
		delete(p.live, s)
		p.dirty = true
	}
	p.mu.Unlock()
	if ok {
		p.change()
	}
}

// keep writes the file when sessions change, and touches it otherwise,
// until done closes. A hub at rest costs a stat-sized write every
// peersTouchEvery.
func (p *quicPeers) keep(done <-chan struct{}) {
	t := time.NewTicker(peersTouchEvery / 2)
	defer t.Stop()
	var (
		written time.Time
		soon    *time.Timer
		soonC   <-chan time.Time
	)
	defer func() {
		if soon != nil {
			soon.Stop()
		}
	}()
	write := func(now time.Time) {
		if err := p.sync(now, &written); err != nil {
			p.log.Warn("agents' addresses not written down: a restart of this hub waits for their keepalives",
				"err", err)
			written = now // not again at once
		}
	}
	for {
		select {
		case <-done:
			return
		case <-p.changed:
			if soonC == nil {
				soon = time.NewTimer(max(peersWriteEvery-time.Since(written), 0))
				soonC = soon.C
			}
		case now := <-soonC:
			soonC = nil
			write(now)
		case now := <-t.C:
			p.rescan()
			write(now)
		}
	}
}

// rescan notes the agents that moved (a NAT rebinding QUIC followed).
func (p *quicPeers) rescan() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s, e := range p.live {
		if a, ok := s.conn.RemoteAddr().(*net.UDPAddr); ok && unmap(a.AddrPort()) != e.Addr {
			e.Addr = unmap(a.AddrPort())
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

// enqueue adds targets to poke, pokeRounds times each, unless their agent
// is here already; it reports how many it added.
func (p *quicPeers) enqueue(targets []PokeTarget) int {
	p.mu.Lock()
	here := make(map[[16]byte]bool, len(p.live))
	for _, e := range p.live {
		here[e.Key] = true
	}
	added := 0
	for _, t := range targets {
		if here[t.Key] || t.Token == [pokeTokenLen]byte{} {
			continue
		}
		d := p.pending[t.Key]
		if d == nil {
			d = &pokeDue{}
			p.pending[t.Key] = d
		}
		if !slices.ContainsFunc(d.targets, func(o PokeTarget) bool { return o.Token == t.Token }) {
			d.targets = append(d.targets, t)
		}
		d.left = pokeRounds
		added++
	}
	p.mu.Unlock()
	if added > 0 {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	return added
}

// due takes one round of pokes: every pending target, each agent's rounds
// counted down (and forgotten at zero).
func (p *quicPeers) due() []PokeTarget {
	p.mu.Lock()
	defer p.mu.Unlock()
	var todo []PokeTarget
	for key, d := range p.pending {
		todo = append(todo, d.targets...)
		if d.left--; d.left <= 0 {
			delete(p.pending, key)
		}
	}
	return todo
}

// pokes sends the pending agents their pokes on send, a round every
// pokeRoundEvery while any are pending, at most pokeRate a second, from
// when ready closes until done does.
func (p *quicPeers) pokes(send func(b []byte, to net.Addr) error, ready, done <-chan struct{}) {
	select {
	case <-ready:
	case <-done:
		return
	}
	for {
		todo := p.due()
		if len(todo) == 0 {
			select {
			case <-p.kick:
				continue
			case <-done:
				return
			}
		}
		p.log.Debug("poking agents so that they reconnect now", "sessions", len(todo))
		start, failed := time.Now(), 0
		for i, e := range todo {
			if i > 0 && i%(pokeRate/100) == 0 {
				// Paced in steps of a hundredth of a second.
				if !sleepUntil(start.Add(time.Duration(i)*time.Second/pokeRate), done) {
					return
				}
			}
			if err := send(quicPokeRecord(e.Token), net.UDPAddrFromAddrPort(e.Addr)); err != nil {
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
		ip := e.Addr.Addr().As16()
		b = append(b, e.Key[:]...)
		b = append(b, e.Token[:]...)
		b = append(b, ip[:]...)
		b = binary.BigEndian.AppendUint16(b, e.Addr.Port())
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
		copy(e.Key[:], rest[:16])
		copy(e.Token[:], rest[16:32])
		ip := netip.AddrFrom16([16]byte(rest[32:48])).Unmap()
		e.Addr = netip.AddrPortFrom(ip, binary.BigEndian.Uint16(rest[48:50]))
		if !e.Addr.IsValid() || e.Addr.Port() == 0 {
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
