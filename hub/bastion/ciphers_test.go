package bastion

import (
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

// TestNegotiatedCipher: a client with stock OpenSSH's list gets aes128-gcm
// from the default bastion where the CPU has AES-GCM instructions (its own
// first choice, chacha20, otherwise); --ssh-ciphers wins over the default;
// a client with nothing in common is refused in the key exchange.
func TestNegotiatedCipher(t *testing.T) {
	noLeaks(t)
	stock := gossh.CipherChaCha20Poly1305
	if hasAESGCMHardware() {
		stock = gossh.CipherAES128GCM
	}
	for _, tc := range []struct {
		name    string
		offered []string // the bastion's Config.Ciphers
		client  []string
		want    string // "": the handshake fails
	}{
		{"default, stock client", nil, openSSHCiphers, stock},
		{"chosen chacha20", []string{gossh.CipherChaCha20Poly1305, gossh.CipherAES128GCM}, openSSHCiphers, gossh.CipherChaCha20Poly1305},
		{"chosen aes256-gcm", []string{gossh.CipherAES256GCM}, openSSHCiphers, gossh.CipherAES256GCM},
		{"nothing in common", []string{gossh.CipherAES256GCM}, []string{gossh.CipherAES128CTR}, ""},
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
		})
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
