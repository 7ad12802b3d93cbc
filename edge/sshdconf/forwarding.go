package sshdconf

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// ErrNoLocalForwarding is returned by CheckLocalForwarding when the sshd
// configuration refuses local port forwarding (ssh -L, direct-tcpip).
// KubeOne needs it: it reaches each control-plane node's kube-apiserver
// (127.0.0.1:6443) and etcd through the node's own SSH connection.
var ErrNoLocalForwarding = errors.New("sshdconf: sshd refuses local port forwarding")

// CheckLocalForwarding asks sshd for its effective configuration (`sshd -T
// -f sshdConfig`, with the Match blocks for login connecting from the
// loopback, which is where the agent's connections come from when login is
// not "") and reports ErrNoLocalForwarding, naming the setting, if
// AllowTcpForwarding is no or remote, DisableForwarding is yes, or
// PermitOpen is none. It does not judge who may forward: Tether's trust
// (certificates, their permit-port-forwarding extension) decides that per
// login; this only finds an sshd that would refuse everybody.
func CheckLocalForwarding(ctx context.Context, sshdConfig, login string) error {
	bin, err := exec.LookPath("sshd")
	if err != nil {
		bin = DefaultSSHD
	}
	args := []string{"-T"}
	if sshdConfig != "" {
		args = append(args, "-f", sshdConfig)
	}
	if login != "" {
		args = append(args, "-C", "user="+login+",host=localhost,addr=127.0.0.1")
	}
	out, err := exec.CommandContext(ctx, bin, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("sshdconf: sshd -T: %w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return fmt.Errorf("sshdconf: sshd -T: %w", err)
	}
	return localForwarding(out)
}

// localForwarding judges the output of sshd -T (lower-case keywords, one
// per line).
func localForwarding(effective []byte) error {
	sc := bufio.NewScanner(bytes.NewReader(effective))
	for sc.Scan() {
		key, value, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		value = strings.ToLower(strings.TrimSpace(value))
		switch {
		case key == "allowtcpforwarding" && (value == "no" || value == "remote"):
			return fmt.Errorf("%w: AllowTcpForwarding %s (set it to yes or local)", ErrNoLocalForwarding, value)
		case key == "disableforwarding" && value == "yes":
			return fmt.Errorf("%w: DisableForwarding yes (set it to no)", ErrNoLocalForwarding)
		case key == "permitopen" && value == "none":
			return fmt.Errorf("%w: PermitOpen none (allow at least 127.0.0.1:6443 and the etcd ports)", ErrNoLocalForwarding)
		}
	}
	return sc.Err()
}
