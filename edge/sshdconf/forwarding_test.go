package sshdconf

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/tether-dev/tether/internal/testenv"
)

func TestLocalForwarding(t *testing.T) {
	cases := []struct {
		name      string
		effective string
		refused   bool
	}{
		{"defaults", "port 22\nallowtcpforwarding yes\ndisableforwarding no\npermitopen any\n", false},
		{"local only", "allowtcpforwarding local\n", false},
		{"no", "allowtcpforwarding no\n", true},
		{"remote only", "allowtcpforwarding remote\n", true},
		{"disabled", "allowtcpforwarding yes\ndisableforwarding yes\n", true},
		{"permitopen none", "permitopen none\n", true},
		{"permitopen a list", "permitopen 127.0.0.1:6443 127.0.0.1:2379\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := localForwarding([]byte(tc.effective))
			if got := errors.Is(err, ErrNoLocalForwarding); got != tc.refused {
				t.Fatalf("localForwarding(%q) = %v; refused want %v", tc.effective, err, tc.refused)
			}
		})
	}
}

// TestCheckLocalForwardingRealSSHD asks the real sshd -T, with a Match
// block for the login, as the agent does at start.
func TestCheckLocalForwardingRealSSHD(t *testing.T) {
	needOpenSSH(t)
	login := testenv.LoginName()
	cases := []struct {
		name    string
		lines   []string
		login   string
		refused bool
	}{
		{"default", nil, login, false},
		{"AllowTcpForwarding no", []string{"AllowTcpForwarding no"}, login, true},
		{"Match for the login", []string{"Match User " + login, "  AllowTcpForwarding no"}, login, true},
		{"Match for another login", []string{"Match User nobody-else", "  AllowTcpForwarding no"}, login, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testenv.SSHDConfig{Dir: t.TempDir()}
			// Match blocks must come last in sshd_config: they go into a
			// drop-in included at the end, as on a Debian host.
			path, err := testenv.WriteSSHDConfig(&cfg, testenv.FreePort(t))
			if err != nil {
				t.Fatal(err)
			}
			appendLines(t, path, tc.lines)
			err = CheckLocalForwarding(context.Background(), path, tc.login)
			if got := errors.Is(err, ErrNoLocalForwarding); got != tc.refused {
				t.Fatalf("CheckLocalForwarding = %v; refused want %v", err, tc.refused)
			}
		})
	}
}

func appendLines(t *testing.T, path string, lines []string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, l := range lines {
		if _, err := f.WriteString(l + "\n"); err != nil {
			t.Fatal(err)
		}
	}
}
