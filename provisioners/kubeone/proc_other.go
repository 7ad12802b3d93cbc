//go:build !linux

package kubeone

import "syscall"

// sysProcAttr puts KubeOne in its own process group, so a stop reaches
// everything it started.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
