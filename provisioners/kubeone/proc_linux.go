package kubeone

import "syscall"

// sysProcAttr puts KubeOne in its own process group (so a stop reaches
// everything it started) and has the kernel kill it if the hub dies
// without stopping it (SIGKILL, OOM): a run never outlives its hub, which
// marks it interrupted at the next start.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
