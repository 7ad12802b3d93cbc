package sshserver

import (
	"bytes"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// waitExitedNoReap blocks until process pid has exited but leaves it a
// zombie, so its pid (and the session and group ids equal to it) stay
// reserved until the caller reaps it with Wait. It reports false if that is
// not possible, and the caller falls back to reaping first.
func waitExitedNoReap(pid int) bool {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		return err == nil
	}
}

// maxKillPasses bounds the rescans of /proc: each pass kills what the
// previous one could not see (processes forked meanwhile), and SIGKILLed
// processes cannot fork, so a few passes suffice.
const maxKillPasses = 4

// killSession SIGKILLs every process in session sid. The group kill covers
// plain commands; the /proc scan also reaches job-control groups an
// interactive shell created inside the session, which a group kill misses.
func killSession(sid int) {
	syscall.Kill(-sid, syscall.SIGKILL)
	for range maxKillPasses {
		if signalSessionMembers(sid, syscall.SIGKILL) == 0 {
			return
		}
	}
}

// hangupSession sends SIGHUP, then SIGCONT, to every process in session
// sid: the group signal for plain commands, one /proc pass for job-control
// groups of an interactive shell. One pass, since processes that ignore the
// hangup stay alive by design and a rescan would only find them again.
func hangupSession(sid int) {
	syscall.Kill(-sid, syscall.SIGHUP)
	syscall.Kill(-sid, syscall.SIGCONT)
	signalSessionMembers(sid, syscall.SIGHUP, syscall.SIGCONT)
}

// signalSessionMembers sends sigs, in order, to the live processes whose
// session id is sid and returns how many it found. It runs at the end of every session, so it
// asks the kernel for each pid's session with getsid(2) (one syscall, no
// file) and reads /proc/PID/stat only for the few that are members: a
// fan-out of many short commands on a busy node pays microseconds, not a
// full /proc read per process.
func signalSessionMembers(sid int, sigs ...syscall.Signal) int {
	dir, err := os.Open("/proc")
	if err != nil {
		return 0
	}
	names, _ := dir.Readdirnames(-1)
	dir.Close()
	n := 0
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		if s, err := unix.Getsid(pid); err != nil || s != sid || !alive(pid) {
			continue
		}
		for _, sig := range sigs {
			syscall.Kill(pid, sig)
		}
		n++
	}
	return n
}

// alive reports whether pid has not exited yet: a zombie (or a task being
// torn down) is dead, and its parent (or init) reaps it.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) state ppid pgrp session ..."; comm may contain spaces
	// and parentheses, so parse after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state != 'Z' && state != 'X'
}
