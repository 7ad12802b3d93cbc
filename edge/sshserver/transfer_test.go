package sshserver

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSCPUploadDownload(t *testing.T) {
	e := newTestEnv(t)
	data := make([]byte, 5<<20)
	rand.Read(data)
	local := filepath.Join(e.dir, "local.bin")
	if err := os.WriteFile(local, data, 0o644); err != nil {
		t.Fatal(err)
	}
	remote := filepath.Join(e.dir, "remote", "uploaded.bin")
	if err := os.Mkdir(filepath.Dir(remote), 0o755); err != nil {
		t.Fatal(err)
	}

	// OpenSSH 9 scp speaks SFTP to the server by default.
	mustSucceed(t, "scp upload", e.run(nil, nil, "scp", "-q", local, testHost+":"+remote))
	if got, err := os.ReadFile(remote); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("uploaded file differs (err %v, %d bytes)", err, len(got))
	}

	back := filepath.Join(e.dir, "downloaded.bin")
	mustSucceed(t, "scp download", e.run(nil, nil, "scp", "-q", testHost+":"+remote, back))
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("downloaded file differs (err %v, %d bytes)", err, len(got))
	}
}

func TestSFTPBatch(t *testing.T) {
	e := newTestEnv(t)
	remoteDir := filepath.Join(e.dir, "srv")
	local := filepath.Join(e.dir, "hello.txt")
	if err := os.WriteFile(local, []byte("hello sftp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	batch := filepath.Join(e.dir, "batch")
	script := strings.Join([]string{
		"mkdir " + remoteDir,
		"cd " + remoteDir,
		"put " + local + " a.txt",
		"rename a.txt b.txt",
		"ls -1",
		"get b.txt " + filepath.Join(e.dir, "back.txt"),
		"rm b.txt",
		"pwd",
	}, "\n") + "\n"
	if err := os.WriteFile(batch, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.run(nil, nil, "sftp", "-b", batch, testHost)
	mustSucceed(t, "sftp -b", r)
	if !strings.Contains(r.stdout, "b.txt") || !strings.Contains(r.stdout, "Remote working directory: "+remoteDir) {
		t.Fatalf("sftp output %q", r.stdout)
	}
	if got, err := os.ReadFile(filepath.Join(e.dir, "back.txt")); err != nil || string(got) != "hello sftp\n" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	if entries, err := os.ReadDir(remoteDir); err != nil || len(entries) != 0 {
		t.Fatalf("remote dir after rm: %v, %v", entries, err)
	}

	// Relative paths start in the home directory.
	home, _ := os.UserHomeDir()
	if err := os.WriteFile(batch, []byte("pwd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = e.run(nil, nil, "sftp", "-b", batch, testHost)
	mustSucceed(t, "sftp pwd", r)
	if !strings.Contains(r.stdout, "Remote working directory: "+home) {
		t.Fatalf("sftp pwd %q, want home %q", r.stdout, home)
	}
}

// sftp's ln -s keeps the target as given, as OpenSSH's sftp-server does:
// a relative target stays relative (to the link), an absolute one absolute.
func TestSFTPSymlinkTarget(t *testing.T) {
	e := newTestEnv(t)
	dir := filepath.Join(e.dir, "links")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	batch := filepath.Join(e.dir, "batch")
	script := strings.Join([]string{
		"cd " + dir,
		"ln -s ../lib/target.so rel",
		"ln -s /etc/hostname abs",
		"ln -s plain sibling",
		"-ln -s again rel", // exists: must fail like any sftp-server
	}, "\n") + "\n"
	if err := os.WriteFile(batch, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.run(nil, nil, "sftp", "-b", batch, testHost)
	mustSucceed(t, "sftp ln -s", r)
	for link, want := range map[string]string{"rel": "../lib/target.so", "abs": "/etc/hostname", "sibling": "plain"} {
		got, err := os.Readlink(filepath.Join(dir, link))
		if err != nil || got != want {
			t.Errorf("link %s -> %q (%v), want %q", link, got, err, want)
		}
	}
	if !strings.Contains(r.stderr, "again") && !strings.Contains(r.stderr, "ailure") {
		t.Errorf("existing link: stderr %q, want a failure", r.stderr)
	}
}
