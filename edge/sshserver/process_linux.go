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
		if killSessionMembers(sid) == 0 {
			return
		}
	}
}

// killSessionMembers kills the live processes whose session id is sid and
// returns how many it found.
func killSessionMembers(sid int) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp session ..."; comm may contain
		// spaces and parentheses, so parse after the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 4 || string(f[0]) == "Z" || string(f[0]) == "X" {
			continue // dead; its parent (or init) reaps it
		}
		if s, err := strconv.Atoi(string(f[3])); err == nil && s == sid {
			syscall.Kill(pid, syscall.SIGKILL)
			n++
		}
	}
	return n
}
