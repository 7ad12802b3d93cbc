package sshserver

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestPasswdShell(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")
	data := "root:x:0:0:root:/root:/bin/bash\n" +
		"svc:x:998:998::/var/lib/svc:/usr/sbin/nologin\n" +
		"broken line\n" +
		"off:x:997:997::/:/bin/false\n" +
		"empty:x:996:996::/:\n"
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		uid     int
		want    string
		found   bool
		nologin bool
	}{
		{0, "/bin/bash", true, false},
		{998, "/usr/sbin/nologin", true, true},
		{997, "/bin/false", true, true},
		{996, "", true, false},
		{1234, "", false, false},
	} {
		got, ok := passwdShell(path, tc.uid)
		if got != tc.want || ok != tc.found {
			t.Errorf("uid %d: %q %v, want %q %v", tc.uid, got, ok, tc.want, tc.found)
		}
		if got != "" && isNologinShell(got) != tc.nologin {
			t.Errorf("isNologinShell(%q) = %v", got, !tc.nologin)
		}
	}
}

// A service account's nologin shell would refuse every session: the server
// falls back to /bin/sh and says so.
func TestDefaultShellNologinFallback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")
	line := "me:x:" + strconv.Itoa(os.Getuid()) + ":0::/:/usr/sbin/nologin\n"
	if err := os.WriteFile(path, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	old := passwdFile
	passwdFile = path
	defer func() { passwdFile = old }()
	sh, why := defaultShell()
	if sh != fallbackShell || why == "" {
		t.Fatalf("defaultShell() = %q (%q), want %q", sh, why, fallbackShell)
	}
	e := newTestEnv(t, func(c *Config) { c.Shell = "" })
	r := e.ssh(testHost, "echo $0")
	mustSucceed(t, "session with the fallback shell", r)
	if r.stdout != "/bin/sh\n" {
		t.Fatalf("shell %q", r.stdout)
	}
}
