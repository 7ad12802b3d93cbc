package sshserver

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// fallbackShell runs sessions when the agent's user has no usable shell.
const fallbackShell = "/bin/sh"

// passwdFile is the password database defaultShell reads; a variable for
// tests.
var passwdFile = "/etc/passwd"

// defaultShell is the shell sessions run when Config.Shell is empty: the
// agent user's login shell from the password database, as sshd uses, except
// that a nologin shell (what systemd's User= service accounts have) falls
// back to /bin/sh: sshd would refuse such an account, but the agent's user
// is not the operator's account, only the one the agent happens to run as.
// why says which case applied, for the log.
func defaultShell() (shell, why string) {
	sh, ok := passwdShell(passwdFile, os.Getuid())
	if !ok {
		// A user from NSS (LDAP and the like) is not in the file; systemd
		// and login set $SHELL from the same database.
		sh = os.Getenv("SHELL")
	}
	switch {
	case sh == "":
		return fallbackShell, "the agent's user has no shell in " + passwdFile + " or $SHELL"
	case isNologinShell(sh):
		return fallbackShell, "the agent's user has the nologin shell " + sh +
			" (a service account); use --shell to choose another"
	}
	return sh, "the agent user's login shell"
}

// isNologinShell reports whether sh is a shell that refuses logins.
func isNologinShell(sh string) bool {
	switch filepath.Base(sh) {
	case "nologin", "false", "true", "sync", "shutdown", "halt":
		return true
	}
	return false
}

// passwdShell returns the shell field of uid's entry in a passwd(5) file.
func passwdShell(path string, uid int) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	want := strconv.Itoa(uid)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// name:passwd:uid:gid:gecos:home:shell
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[2] == want {
			return strings.TrimSpace(fields[6]), true
		}
	}
	return "", false
}
