package sshdconf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzCheckIncluded: an sshd_config of any content (with Includes kept
// inside the test's directory, written @D) gives a verdict or an error that
// says what is wrong, never a panic or a hang; Include cycles end at sshd's
// depth limit.
func FuzzCheckIncluded(f *testing.F) {
	for _, seed := range []string{
		"Include @D/sshd_config.d/*.conf\nPort 22\n",
		"Port 22\n",
		"TrustedUserCAKeys /x\nInclude @D/sshd_config.d/*.conf\n",
		"Match User x\nInclude @D/sshd_config.d/*.conf\n",
		"Include @D/*\n", // includes itself: the depth limit ends it
		"Include \"@D/sshd_config.d/50-tether.conf\"", // the drop-in by name
		"Include @D/[\n", // bad pattern
		"Include=@D/sshd_config.d/*.conf #c\n",
		"\"unterminated\n",
	} {
		f.Add(seed)
	}
	dir := f.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sshd_config.d"), 0o755); err != nil {
		f.Fatal(err)
	}
	cfg := filepath.Join(dir, "sshd_config")
	dropIn := filepath.Join(dir, "sshd_config.d", "50-tether.conf")
	f.Fuzz(func(t *testing.T, content string) {
		content = strings.ReplaceAll(content, "@D", dir)
		// Includes outside the test's directory would read this machine's
		// files (or block on a device): not what is under test.
		for _, line := range strings.Split(content, "\n") {
			args, err := splitConfigLine(line)
			if err != nil || len(args) == 0 || !strings.EqualFold(args[0], "include") {
				continue
			}
			for _, a := range args[1:] {
				if !strings.HasPrefix(a, dir+"/") || strings.Contains(a, "..") {
					t.Skip("Include outside the test directory")
				}
			}
		}
		if err := os.WriteFile(cfg, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		err := CheckIncluded(cfg, dropIn)
		if err != nil && !errors.Is(err, ErrNotIncluded) && !errors.Is(err, ErrShadowed) &&
			!strings.HasPrefix(err.Error(), "sshdconf: ") {
			t.Fatalf("error without context: %v", err)
		}
	})
}
