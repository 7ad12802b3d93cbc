//go:build !linux

package sshserver

import "syscall"

// waitExitedNoReap is only implemented on Linux; elsewhere the caller reaps
// first and then kills the group, accepting the theoretical pid-reuse race.
func waitExitedNoReap(pid int) bool { return false }

// killSession SIGKILLs the process group sid (the session leader's group).
// Without /proc, job-control groups created inside the session are not
// reached.
func killSession(sid int) {
	syscall.Kill(-sid, syscall.SIGKILL)
}

// hangupSession sends SIGHUP and SIGCONT to the process group sid.
func hangupSession(sid int) {
	syscall.Kill(-sid, syscall.SIGHUP)
	syscall.Kill(-sid, syscall.SIGCONT)
}
