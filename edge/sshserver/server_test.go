package sshserver

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestHostKeyPersisted(t *testing.T) {
	defer goleak.VerifyNone(t)
	path := filepath.Join(t.TempDir(), "keys", "host_key")
	s1, err := New(Config{HostKeyPath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("host key mode %v, want 0600", fi.Mode().Perm())
	}
	if s1.HostSigner().PublicKey().Type() != "ssh-ed25519" {
		t.Errorf("host key type %s", s1.HostSigner().PublicKey().Type())
	}
	s2, err := New(Config{HostKeyPath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if !bytes.Equal(s1.HostSigner().PublicKey().Marshal(), s2.HostSigner().PublicKey().Marshal()) {
		t.Fatal("host key changed between New calls")
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temp files left next to the host key: %v", entries)
	}

	// Loose permissions are used but warned about.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s3, err := New(Config{HostKeyPath: path, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("no warning for a world-readable host key; logs: %s", logs.String())
	}
}

func TestHostKeyCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "host_key")
	corrupt := "-----BEGIN OPENSSH PRIVATE KEY-----\ngarbage\n-----END OPENSSH PRIVATE KEY-----\n"
	if err := os.WriteFile(path, []byte(corrupt), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{HostKeyPath: path})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.HasPrefix(err.Error(), "sshserver: ") {
		t.Fatalf("corrupt host key: err %v", err)
	}
	// The corrupt file is left alone for a human to look at.
	if data, _ := os.ReadFile(path); !bytes.Contains(data, []byte("garbage")) {
		t.Fatal("corrupt host key was overwritten")
	}
}

func TestConfigValidation(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "HostKeyPath") {
		t.Fatalf("missing HostKeyPath: %v", err)
	}
	dir := t.TempDir()
	if _, err := New(Config{HostKeyPath: filepath.Join(dir, "k"), IdleTimeout: -1}); err == nil {
		t.Fatal("negative IdleTimeout accepted")
	}
}

func TestHandshakeTimeout(t *testing.T) {
	// Long enough for the real ssh client's handshake on a loaded machine
	// (200 ms was not: the authenticated login below then failed).
	e := newTestEnv(t, func(c *Config) { c.HandshakeTimeout = 2 * time.Second })
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// Say nothing: the server sends its banner, then gives up on us.
	data, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("connection not closed by the server: %v", err)
	}
	if !strings.HasPrefix(string(data), "SSH-2.0-Tether") {
		t.Fatalf("banner %q", data)
	}
	// Authenticated connections are not affected by the timeout.
	r := e.ssh(testHost, "sleep 2.5; echo still-here")
	mustSucceed(t, "ssh past the handshake timeout", r)
}

func TestServeConnContextAndClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv, err := New(Config{HostKeyPath: filepath.Join(t.TempDir(), "host_key")})
	if err != nil {
		t.Fatal(err)
	}

	// Cancelling ServeConn's context closes the stream and returns.
	client, server := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		srv.ServeConn(ctx, server)
		close(done)
	}()
	go io.Copy(io.Discard, client) // take the banner
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return after cancel")
	}
	client.Close()

	// Close ends a connection in progress, is idempotent, and later
	// ServeConn calls close their conn at once.
	client, server = net.Pipe()
	done = make(chan struct{})
	go func() {
		srv.ServeConn(context.Background(), server)
		close(done)
	}()
	go io.Copy(io.Discard, client)
	srv.Close()
	<-done
	srv.Close()
	client.Close()

	client, server = net.Pipe()
	srv.ServeConn(context.Background(), server)
	if _, err := client.Read(make([]byte, 1)); err == nil {
		t.Fatal("ServeConn after Close did not close the conn")
	}
}
