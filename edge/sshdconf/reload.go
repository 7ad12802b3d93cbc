package sshdconf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// DefaultPidFile is where Debian's sshd writes its pid (PidFile default).
const DefaultPidFile = "/run/sshd.pid"

// DefaultSSHD is the sshd binary CheckConfig runs when none is in $PATH.
const DefaultSSHD = "/usr/sbin/sshd"

// Reloader asks sshd to re-read its configuration. It returns once the
// request is delivered; sshd applies it asynchronously (see SignalReloader).
type Reloader func(ctx context.Context) error

// SystemdReloader returns the default Reloader for a node: when systemd runs
// (/run/systemd/system exists) and systemctl is installed, it runs
// `systemctl reload ssh` (Debian's unit) and, if that fails,
// `systemctl reload sshd` (most other distributions). Otherwise it sends
// SIGHUP to the pid in DefaultPidFile. Debian's unit validates the
// configuration with `sshd -t` before signalling.
func SystemdReloader() Reloader {
	return func(ctx context.Context) error {
		systemctl, err := exec.LookPath("systemctl")
		if _, serr := os.Stat("/run/systemd/system"); err != nil || serr != nil {
			return PidFileReloader(DefaultPidFile)(ctx)
		}
		var errs []error
		for _, unit := range []string{"ssh", "sshd"} {
			out, err := exec.CommandContext(ctx, systemctl, "reload", unit).CombinedOutput()
			if err == nil {
				return nil
			}
			errs = append(errs, fmt.Errorf("systemctl reload %s: %w: %s", unit, err, bytes.TrimSpace(out)))
		}
		return fmt.Errorf("sshdconf: reload sshd: %w", errors.Join(errs...))
	}
}

// PidFileReloader returns a Reloader that sends SIGHUP to the pid written in
// pidFile, read anew on every call (sshd keeps its pid across a reload but
// not across a restart).
func PidFileReloader(pidFile string) Reloader {
	return func(ctx context.Context) error {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return fmt.Errorf("sshdconf: reload sshd: read pid file: %w", err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return fmt.Errorf("sshdconf: reload sshd: pid file %s: %w", pidFile, err)
		}
		return SignalReloader(pid)(ctx)
	}
}

// SignalReloader returns a Reloader that sends SIGHUP to the sshd listener
// with the given pid. On SIGHUP, sshd closes its listening sockets and
// re-executes itself with its original arguments, keeping its pid: the new
// configuration is in effect once it listens again, a few milliseconds
// later, and connections attempted in between are refused. Sessions
// already established are not affected. A configuration sshd cannot parse
// makes the re-executed sshd exit, so run CheckConfig first.
//
// pid must be greater than 1: 0 and negative values would signal process
// groups, and 1 is init.
func SignalReloader(pid int) Reloader {
	return func(ctx context.Context) error {
		if pid <= 1 {
			return invalidf("reload sshd: refusing to signal pid %d", pid)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sshdconf: reload sshd: %w", err)
		}
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			return fmt.Errorf("sshdconf: reload sshd: signal pid %d: %w", pid, err)
		}
		return nil
	}
}

// CheckConfig runs `sshd -t -f sshdConfig`, which parses the configuration
// (drop-ins included) and loads the host keys, and returns sshd's complaint
// if it fails. Call it after Apply and before reloading: sshd does not
// survive a reload into a configuration it cannot parse. sshdConfig empty
// means sshd's default (/etc/ssh/sshd_config).
//
// sshd -t succeeds even when a HostCertificate is missing or matches no
// host key (sshd only logs that and serves the plain key), which is why
// Apply checks the certificate against the host key itself.
func CheckConfig(ctx context.Context, sshdConfig string) error {
	bin, err := exec.LookPath("sshd")
	if err != nil {
		bin = DefaultSSHD
	}
	args := []string{"-t"}
	if sshdConfig != "" {
		args = append(args, "-f", sshdConfig)
	}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sshdconf: sshd -t: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}
