package bastion

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

func TestCheckCiphers(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"aes128-gcm@openssh.com"}, ""},
		{[]string{"chacha20-poly1305@openssh.com", "aes256-gcm@openssh.com"}, ""},
		{[]string{"aes128-gcm@openssh.com", "aes128-cbc"}, `unknown or weak SSH cipher "aes128-cbc"`},
		{[]string{" aes128-gcm@openssh.com"}, `unknown or weak SSH cipher " aes128-gcm@openssh.com"`},
		{[]string{"3des"}, "choose from aes128-gcm@openssh.com,"},
	} {
		err := CheckCiphers(tc.in)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckCiphers(%q) = %v, want an error with %q", tc.in, err, tc.wantErr)
		}
	}
}

// openSSHCiphers is stock OpenSSH 9's client cipher list, in its order.
var openSSHCiphers = []string{
	gossh.CipherChaCha20Poly1305, gossh.CipherAES128CTR, gossh.CipherAES192CTR, gossh.CipherAES256CTR,
	gossh.CipherAES128GCM, gossh.CipherAES256GCM,
}

// Client version lines as real clients send them.
const (
	openSSHVersion  = "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3"
	paramikoVersion = "SSH-2.0-paramiko_2.12.0"
)

// paramikoCiphers is paramiko 2.12's list (without the CBC modes, which
// x/crypto's client does not have; the bastion never offers them).
var paramikoCiphers = []string{gossh.CipherAES128CTR, gossh.CipherAES192CTR, gossh.CipherAES256CTR}

// TestNegotiatedCipher: with the default offer, an OpenSSH client that has
// AES-GCM gets aes128-gcm where the CPU has AES-GCM instructions (its own
// first choice, chacha20, otherwise), and every other client its own first
// choice: paramiko aes128-ctr, an OpenSSH configured for chacha20 only
// chacha20. --ssh-ciphers is offered to everyone alike; a client with
// nothing in common is refused in the key exchange.
func TestNegotiatedCipher(t *testing.T) {
	noLeaks(t)
	const (
		chacha    = gossh.CipherChaCha20Poly1305
		aes128ctr = gossh.CipherAES128CTR
		aes256ctr = gossh.CipherAES256CTR
		aes256gcm = gossh.CipherAES256GCM
	)
	stock := gossh.CipherChaCha20Poly1305
	if hasAESGCMHardware() {
		stock = gossh.CipherAES128GCM
	}
	for _, tc := range []struct {
		name    string
		offered []string // the bastion's Config.Ciphers
		version string   // the client's version line ("": x/crypto's)
		client  []string
		want    string // "": the handshake fails
	}{
		{"default, stock OpenSSH", nil, openSSHVersion, openSSHCiphers, stock},
		{"default, paramiko", nil, paramikoVersion, paramikoCiphers, aes128ctr},
		{"default, OpenSSH without AES-GCM", nil, openSSHVersion, []string{chacha}, chacha},
		{"default, OpenSSH preferring aes256-ctr", nil, openSSHVersion, []string{aes256ctr, aes256gcm},
			map[bool]string{true: aes256gcm, false: aes256ctr}[hasAESGCMHardware()]},
		{"default, other client preferring chacha20", nil, "SSH-2.0-PuTTY_Release_0.81", openSSHCiphers, chacha},
		{"default, x/crypto client", nil, "", nil, gossh.CipherAES128GCM},
		{"chosen chacha20", []string{chacha, gossh.CipherAES128GCM}, openSSHVersion, openSSHCiphers, chacha},
		{"chosen aes256-gcm", []string{aes256gcm}, openSSHVersion, openSSHCiphers, aes256gcm},
		{"chosen aes256-gcm, paramiko", []string{aes256gcm}, paramikoVersion, paramikoCiphers, ""},
		{"nothing in common", []string{aes256gcm}, "", []string{aes128ctr}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := cipherBastion(t, tc.offered)
			conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			c, chans, reqs, err := gossh.NewClientConn(conn, addr, &gossh.ClientConfig{
				User: "alice", Auth: []gossh.AuthMethod{gossh.PublicKeys(newSigner(t))},
				HostKeyCallback: gossh.InsecureIgnoreHostKey(), // the test's own bastion; host keys are not under test
				Config:          gossh.Config{Ciphers: tc.client},
				ClientVersion:   tc.version,
			})
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), "no common algorithm for client to server cipher") {
					t.Fatalf("handshake: %v; want no common cipher", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			client := gossh.NewClient(c, chans, reqs)
			defer client.Close()
			algs := c.(gossh.AlgorithmsConnMetadata).Algorithms()
			if algs.Read.Cipher != tc.want || algs.Write.Cipher != tc.want {
				t.Fatalf("negotiated %s / %s, want %s both ways", algs.Read.Cipher, algs.Write.Cipher, tc.want)
			}
			if string(c.ServerVersion()) != "SSH-2.0-"+serverVersion {
				t.Fatalf("server version %q", c.ServerVersion())
			}
		})
	}
}

// TestServerVersionFirst: the bastion sends its version line before it has
// the client's, although it reads the client's before its key exchange: a
// client that waits for the server's line first is served.
func TestServerVersionFirst(t *testing.T) {
	noLeaks(t)
	addr := cipherBastion(t, nil)
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(io.LimitReader(conn, 64)).ReadString('\n')
	if err != nil || line != "SSH-2.0-"+serverVersion+"\r\n" {
		t.Fatalf("before sending anything, read %q, %v; want the server's version line", line, err)
	}
	// The line was read; the rest of the handshake must go on as usual.
	c, chans, reqs, err := gossh.NewClientConn(&skipVersionConn{Conn: conn, skip: len(line)}, addr, &gossh.ClientConfig{
		User: "alice", Auth: []gossh.AuthMethod{gossh.PublicKeys(newSigner(t))},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), ClientVersion: openSSHVersion,
	})
	if err != nil {
		t.Fatalf("handshake after reading the server's version first: %v", err)
	}
	gossh.NewClient(c, chans, reqs).Close()
}

// skipVersionConn hands x/crypto's client the server's version line again,
// which the test read off the connection before.
type skipVersionConn struct {
	net.Conn
	skip int
}

func (c *skipVersionConn) Read(p []byte) (int, error) {
	if c.skip > 0 {
		line := "SSH-2.0-" + serverVersion + "\r\n"
		n := copy(p, line[len(line)-c.skip:])
		c.skip -= n
		return n, nil
	}
	return c.Conn.Read(p)
}

// kexInitPacket is an unencrypted binary packet carrying a KEXINIT with
// the given cipher lists.
func kexInitPacket(toServer, toClient []string) string {
	payload := []byte{msgKexInit}
	payload = append(payload, make([]byte, 16)...) // cookie
	lists := [][]string{{"curve25519-sha256"}, {"ssh-ed25519"}, toServer, toClient,
		{"hmac-sha2-256"}, {"hmac-sha2-256"}, {"none"}, {"none"}, nil, nil}
	for _, l := range lists {
		s := strings.Join(l, ",")
		payload = binary.BigEndian.AppendUint32(payload, uint32(len(s)))
		payload = append(payload, s...)
	}
	payload = append(payload, 0, 0, 0, 0, 0) // first_kex_packet_follows, reserved
	padding := 8 - (5+len(payload))%8
	if padding < 4 {
		padding += 8
	}
	pkt := binary.BigEndian.AppendUint32(nil, uint32(1+len(payload)+padding))
	pkt = append(pkt, byte(padding))
	pkt = append(pkt, payload...)
	return string(append(pkt, make([]byte, padding)...))
}

// failReader fails the test if read: readHello must not wait for bytes a
// client does not send before the server's KEXINIT.
type failReader struct{ t *testing.T }

func (r failReader) Read([]byte) (int, error) {
	r.t.Error("readHello read past what it needed")
	return 0, io.EOF
}

// TestReadHello: the version line (after any other lines), then from
// OpenSSH only its KEXINIT's cipher lists; every byte read is returned for
// x/crypto; anything unexpected stops the reading, not the connection.
func TestReadHello(t *testing.T) {
	gcmFirst := []string{gossh.CipherAES128GCM, gossh.CipherChaCha20Poly1305}
	kex := kexInitPacket(openSSHCiphers, gcmFirst)
	v := openSSHVersion + "\r\n"
	const windows = "SSH-2.0-OpenSSH_for_Windows_9.5"
	for _, tc := range []struct {
		name    string
		in      string
		more    bool // the client sends more only after the server's KEXINIT
		version string
		kexInit bool
		wantErr string
		wantGCM bool // defaultCiphers offers AES-GCM only (with the hardware)
	}{
		{"OpenSSH", v + kex, false, openSSHVersion, true, "", true},
		{"OpenSSH, LF only, lines before", "hello\nworld\r\n" + openSSHVersion + "\n" + kex, false,
			openSSHVersion, true, "", true},
		{"OpenSSH without AES-GCM", v + kexInitPacket([]string{gossh.CipherChaCha20Poly1305}, gcmFirst), false,
			openSSHVersion, true, "", false},
		{"OpenSSH, AES-GCM one way only", v + kexInitPacket(openSSHCiphers, []string{gossh.CipherAES128CTR}), false,
			openSSHVersion, true, "", false},
		{"OpenSSH for Windows", windows + "\r\n" + kex, false, windows, true, "", true},
		{"paramiko: its KEXINIT is not waited for", paramikoVersion + "\r\n", true, paramikoVersion, false, "", false},
		{"paramiko: KEXINIT read along is replayed, not parsed", paramikoVersion + "\r\n" + kex, true,
			paramikoVersion, false, "", false},
		{"not OpenSSH, named like it later", "SSH-2.0-Go OpenSSH\r\n", true, "SSH-2.0-Go OpenSSH", false, "", false},
		{"EOF before the version", "SSH-2.0-Open", false, "", false, "EOF", false},
		{"EOF inside the KEXINIT", v + kex[:100], false, openSSHVersion, false, "EOF", false},
		{"huge first packet", v + "\x7f\xff\xff\xff\x04", true, openSSHVersion, false, "not a KEXINIT", false},
		{"not a KEXINIT", v + "\x00\x00\x00\x0c\x04\x15" + strings.Repeat("\x00", 10), true, openSSHVersion, false,
			"not a KEXINIT", false},
		{"no version line in 8 KiB", strings.Repeat("x", 9000), true, "", false, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r io.Reader = strings.NewReader(tc.in)
			if tc.more {
				r = io.MultiReader(r, failReader{t})
			}
			got, h := readHello(r)
			// Every byte read comes back, in order, for x/crypto.
			if !strings.HasPrefix(tc.in, string(got)) || !tc.more && len(got) != len(tc.in) {
				t.Errorf("returned %d bytes %.40q…, want what was read of the %d sent", len(got), got, len(tc.in))
			}
			if h.version != tc.version || h.kexInit != tc.kexInit {
				t.Errorf("version %q, KEXINIT %v; want %q, %v", h.version, h.kexInit, tc.version, tc.kexInit)
			}
			if tc.wantErr == "" && h.readErr != nil ||
				tc.wantErr != "" && (h.readErr == nil || !strings.Contains(h.readErr.Error(), tc.wantErr)) {
				t.Errorf("read error %v, want %q", h.readErr, tc.wantErr)
			}
			if gcm := defaultCiphers(h, true) != nil; gcm != tc.wantGCM {
				t.Errorf("defaultCiphers offers AES-GCM only: %v, want %v", gcm, tc.wantGCM)
			}
			if defaultCiphers(h, false) != nil {
				t.Error("without AES-GCM instructions the offer must be x/crypto's list")
			}
		})
	}
}

// TestHelloConn: x/crypto reads the bytes read ahead first, and its
// version line, sent already, is not sent twice; any other first write is
// an error rather than a corrupt handshake.
func TestHelloConn(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	hc := &helloConn{Conn: a, unread: []byte("ahead"), sent: []byte("SSH-2.0-X\r\n")}
	buf := make([]byte, 3)
	if n, err := hc.Read(buf); n != 3 || err != nil || string(buf) != "ahe" {
		t.Fatalf("Read = %d %v %q", n, err, buf[:n])
	}
	if n, err := hc.Read(buf); n != 2 || err != nil || string(buf[:n]) != "ad" {
		t.Fatalf("Read = %d %v %q", n, err, buf[:n])
	}
	go func() { _, _ = b.Write([]byte("conn")) }()
	if n, err := io.ReadFull(hc, buf[:3]); n != 3 || err != nil || string(buf) != "con" {
		t.Fatalf("Read from the connection = %d %v %q", n, err, buf[:n])
	}
	if n, err := hc.Read(buf); n != 1 || err != nil || buf[0] != 'n' { // the rest of "conn"
		t.Fatalf("Read from the connection = %d %v %q", n, err, buf[:n])
	}
	done := make(chan string, 1)
	go func() {
		got := make([]byte, 4)
		_, _ = io.ReadFull(b, got)
		done <- string(got)
	}()
	if n, err := hc.Write([]byte("SSH-2.0-X\r\nkex!")); n != 15 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if got := <-done; got != "kex!" {
		t.Fatalf("the peer got %q after the version line, want kex!", got)
	}
	hc2 := &helloConn{Conn: a, sent: []byte("SSH-2.0-X\r\n")}
	if _, err := hc2.Write([]byte("SSH-2.0-Y\r\n")); err == nil || !strings.Contains(err.Error(), "not the version line") {
		t.Fatalf("a different first write: %v", err)
	}
}

// cipherBastion runs a bastion offering ciphers that lets anyone in.
func cipherBastion(t *testing.T, ciphers []string) string {
	t.Helper()
	_, addr := startBastion(t, Config{
		Addr: "127.0.0.1:0", HostSigner: newSigner(t), Dialer: noDialer{}, Ciphers: ciphers,
		Authorize: func(string, gossh.PublicKey) bool { return true },
	})
	return addr
}

// FuzzReadHello: whatever a client sends before the key exchange,
// readHello returns without panicking exactly the bytes it read (a prefix
// of the input), and parses a KEXINIT only from a client that says it is
// OpenSSH.
func FuzzReadHello(f *testing.F) {
	kex := kexInitPacket(openSSHCiphers, openSSHCiphers)
	for _, s := range []string{
		openSSHVersion + "\r\n" + kex, paramikoVersion + "\r\n" + kex, "x\r\n" + openSSHVersion + "\n" + kex[:20],
		openSSHVersion + "\r\n\x00\x00\x00\x05\x04\x14", openSSHVersion + "\r\n\xff\xff\xff\xff\x00", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, h := readHello(bytes.NewReader(in))
		if !bytes.HasPrefix(in, got) {
			t.Fatalf("returned %q, not a prefix of the input", got)
		}
		if h.kexInit && !h.isOpenSSH() {
			t.Fatalf("parsed a KEXINIT from %q", h.version)
		}
		if h.readErr == nil && h.version == "" && len(got) < maxVersionRead {
			t.Fatalf("stopped after %d bytes without a version line or an error", len(got))
		}
	})
}
