package bastion

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/sys/cpu"
)

// Which ciphers the bastion offers an operator's client when Config.Ciphers
// (--ssh-ciphers) is empty.
//
// A client takes the first cipher of its own list that the server offers,
// and stock OpenSSH lists chacha20-poly1305 first. x/crypto's chacha20 has
// no assembly on amd64, so on a CPU with AES-GCM instructions a jump
// negotiated that way cost the hub 1.9× the CPU per GiB relayed (3.84–3.88
// against 2.00–2.08 CPU-s/GiB, `ssh -J` copy, TLS agent) and a quarter of
// the throughput. Offering AES-GCM alone would make OpenSSH pick it, but
// would refuse every client without AES-GCM (paramiko 2.12, which Ansible's
// paramiko connection, Fabric and Netmiko use, has only aes-ctr and
// aes-cbc; an OpenSSH built without OpenSSL or configured with
// `Ciphers chacha20-poly1305@openssh.com`), and offering more after AES-GCM
// makes OpenSSH pick chacha20 again. So the offer is chosen per client,
// before the bastion's key exchange starts: x/crypto sends its KEXINIT
// right after the version lines, with the ServerConfig gliderlabs asked
// for before any byte was read, so the bastion reads the client's version
// line (and OpenSSH's KEXINIT) itself first and replays them to x/crypto
// (helloConn). An OpenSSH client whose KEXINIT lists AES-GCM is offered
// the AES-GCM pair only; every other client x/crypto's whole list, from
// which it takes its own first choice. Without AES-GCM instructions
// chacha20 is the faster one, and everyone gets x/crypto's list.

// aesGCMCiphers is what an OpenSSH client that has AES-GCM is offered.
var aesGCMCiphers = []string{gossh.CipherAES128GCM, gossh.CipherAES256GCM}

// serverVersion is the software part of the bastion's version line.
const serverVersion = "Tether"

// clientHello is what the bastion read of a client before its key
// exchange: the version line and, from OpenSSH, the KEXINIT's ciphers.
type clientHello struct {
	version string // without CR LF; "" if none was read
	// kexInit: a KEXINIT was read and parsed, and the two lists are its.
	kexInit         bool
	ciphersToServer []string
	ciphersToClient []string
	readErr         error // why reading stopped early, if it did
}

// isOpenSSH reports whether the client says it is OpenSSH (on any
// platform: "OpenSSH_9.2p1 Debian-2+deb12u3", "OpenSSH_for_Windows_9.5").
func (h clientHello) isOpenSSH() bool {
	_, soft, ok := strings.Cut(strings.TrimPrefix(h.version, "SSH-"), "-")
	return ok && strings.HasPrefix(soft, "OpenSSH")
}

// defaultCiphers is the offer to a client when Config.Ciphers is empty
// (nil: x/crypto's list); gcmHardware is hasAESGCMHardware().
func defaultCiphers(h clientHello, gcmHardware bool) []string {
	if !gcmHardware || !h.isOpenSSH() || !h.kexInit {
		return nil
	}
	has := func(list []string) bool {
		return slices.ContainsFunc(list, func(c string) bool { return slices.Contains(aesGCMCiphers, c) })
	}
	if has(h.ciphersToServer) && has(h.ciphersToClient) {
		return aesGCMCiphers
	}
	return nil
}

// hasAESGCMHardware reports whether AES-GCM runs on CPU instructions here
// (as crypto/tls decides its own preference).
func hasAESGCMHardware() bool {
	switch runtime.GOARCH {
	case "amd64":
		return cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ
	case "arm64":
		return cpu.ARM64.HasAES && cpu.ARM64.HasPMULL
	}
	return false
}

// CheckCiphers reports the first of names (--ssh-ciphers) that x/crypto
// does not implement or lists as insecure.
func CheckCiphers(names []string) error {
	supported := gossh.SupportedAlgorithms().Ciphers
	for _, name := range names {
		if !slices.Contains(supported, name) {
			return fmt.Errorf("unknown or weak SSH cipher %q; choose from %s", name, strings.Join(supported, ","))
		}
	}
	return nil
}

// offerKey holds a connection's cipher offer, chosen by connCallback.
type offerKey struct{}

// ciphersFor is the cipher offer to the client of ctx.
func (b *Bastion) ciphersFor(ctx ssh.Context) []string {
	if !b.perClientCiphers {
		return b.cfg.Ciphers
	}
	offer, _ := ctx.Value(offerKey{}).([]string)
	return offer
}

// connCallback is the ConnCallback: accept's checks, then, when the offer
// depends on the client, the read-ahead of its hello (bounded by the
// handshake deadline accept armed, like the rest of the handshake).
func (b *Bastion) connCallback(ctx ssh.Context, conn net.Conn) net.Conn {
	c := b.accept(ctx, conn)
	if c == nil || !b.perClientCiphers {
		return c
	}
	hc := &helloConn{Conn: c, sent: []byte("SSH-2.0-" + serverVersion + "\r\n")}
	// Ours first: a client may wait for the server's version line before
	// sending its own (RFC 4253 4.2 lets either side go first).
	var h clientHello
	if _, err := c.Write(hc.sent); err != nil {
		h.readErr = err
	} else {
		hc.unread, h = readHello(c)
	}
	offer := defaultCiphers(h, true)
	ctx.SetValue(offerKey{}, offer)
	shown := strings.Join(offer, ",")
	if offer == nil {
		shown = "x/crypto's list"
	}
	b.cfg.Logger.Debug("ssh ciphers offered", "remote", conn.RemoteAddr().String(),
		"client", fmt.Sprintf("%.80q", h.version), "ciphers", shown, "hello_error", h.readErr)
	return hc
}

// helloConn gives x/crypto the connection as if nothing had been read from
// or written to it: Read returns the bytes read ahead first, and the first
// Write must start with the version line already sent, which it drops.
// x/crypto has one reader and serializes its writes.
type helloConn struct {
	net.Conn
	unread []byte
	sent   []byte
}

func (c *helloConn) Read(p []byte) (int, error) {
	if len(c.unread) > 0 {
		n := copy(p, c.unread)
		c.unread = c.unread[n:]
		if len(c.unread) == 0 {
			c.unread = nil // not kept for the connection's life
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *helloConn) Write(p []byte) (int, error) {
	if len(c.sent) == 0 {
		return c.Conn.Write(p)
	}
	if !bytes.HasPrefix(p, c.sent) {
		return 0, fmt.Errorf("bastion: the SSH server's first write %.40q is not the version line sent ahead of it (%q)",
			p, c.sent)
	}
	n := len(c.sent)
	c.sent = nil
	if n == len(p) {
		return n, nil
	}
	m, err := c.Conn.Write(p[n:])
	return n + m, err
}

const (
	// maxVersionRead bounds the read for the version line. RFC 4253 4.2
	// caps it at 255 bytes; x/crypto also skips lines before it. Past
	// this the bastion stops looking, and x/crypto reads on.
	maxVersionRead = 8 << 10
	// maxKexInitPacket bounds OpenSSH's first packet (~1.5 KiB; RFC 4253
	// 6.1 requires 35000 bytes to be accepted).
	maxKexInitPacket = 35000
	msgKexInit       = 20
)

// readHello reads the client's version line and, if the client is OpenSSH
// (which sends its KEXINIT as soon as it has the server's version line),
// its KEXINIT packet. It returns every byte it read, to be replayed. A
// read error, or bytes that are not what it looks for, end the reading
// early; x/crypto then meets the same error or bytes.
func readHello(r io.Reader) ([]byte, clientHello) {
	var buf []byte
	var h clientHello
	chunk := make([]byte, 4096)
	fill := func() bool {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if err != nil && n == 0 {
			h.readErr = err
			return false
		}
		return true
	}
	// The version line: the first line starting with "SSH-".
	start := 0
	for h.version == "" {
		if i := bytes.IndexByte(buf[start:], '\n'); i >= 0 {
			line := bytes.TrimSuffix(buf[start:start+i], []byte("\r"))
			start += i + 1
			if bytes.HasPrefix(line, []byte("SSH-")) {
				h.version = string(line)
			}
			continue
		}
		if len(buf) >= maxVersionRead || !fill() {
			return buf, h
		}
	}
	if !h.isOpenSSH() {
		return buf, h
	}
	// OpenSSH's first binary packet, unencrypted: uint32 packet_length,
	// byte padding_length, payload (the KEXINIT), padding.
	for len(buf)-start < 5 {
		if !fill() {
			return buf, h
		}
	}
	length := int(binary.BigEndian.Uint32(buf[start:]))
	padding := int(buf[start+4])
	if length > maxKexInitPacket || padding+1 >= length {
		h.readErr = fmt.Errorf("first packet of %d bytes (padding %d) is not a KEXINIT", length, padding)
		return buf, h
	}
	for len(buf)-start < 4+length {
		if !fill() {
			return buf, h
		}
	}
	payload := buf[start+5 : start+4+length-padding]
	var msg struct {
		Cookie                  [16]byte `sshtype:"20"`
		KexAlgos                []string
		ServerHostKeyAlgos      []string
		CiphersClientServer     []string
		CiphersServerClient     []string
		MACsClientServer        []string
		MACsServerClient        []string
		CompressionClientServer []string
		CompressionServerClient []string
		LanguagesClientServer   []string
		LanguagesServerClient   []string
		FirstKexFollows         bool
		Reserved                uint32
	}
	if len(payload) == 0 || payload[0] != msgKexInit {
		h.readErr = errors.New("first packet is not a KEXINIT")
		return buf, h
	}
	if err := gossh.Unmarshal(payload, &msg); err != nil {
		h.readErr = fmt.Errorf("KEXINIT: %w", err)
		return buf, h
	}
	h.kexInit, h.ciphersToServer, h.ciphersToClient = true, msg.CiphersClientServer, msg.CiphersServerClient
	return buf, h
}
