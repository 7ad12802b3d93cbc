package hub

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/hub/api/apitype"
	"golang.org/x/sys/unix"
)

// LockFile is the file in the data dir a running hub holds an exclusive
// flock on, with its PID inside. The kernel drops the lock when the process
// ends, however it ends (kill -9 included), so a stale file never blocks.
const LockFile = "hub.lock"

// ErrDataDirInUse means another hub holds the data dir.
var ErrDataDirInUse = errors.New("the data dir is in use by another hub")

// dataDirLock is a held lock on a data dir.
type dataDirLock struct{ f *os.File }

// lockDataDir takes the data dir's lock for this process's life, or says
// which hub holds it (its PID and, once it serves, its addresses).
func lockDataDir(dir string) (*dataDirLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the data dir %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		return nil, holderError(dir, f)
	}
	// Only the holder writes its PID, after it holds the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dataDirLock{f: f}, nil
}

// holderError names the hub that holds dir's lock.
func holderError(dir string, lockFile *os.File) error {
	b := make([]byte, 32)
	n, _ := lockFile.ReadAt(b, 0)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	holder := "another hub"
	if pid > 0 {
		holder = fmt.Sprintf("the hub with PID %d", pid)
	}
	where := "(still starting)"
	if raw, err := os.ReadFile(filepath.Join(dir, apitype.HubInfoFile)); err == nil {
		var info apitype.HubInfo
		if json.Unmarshal(raw, &info) == nil && (pid == 0 || info.PID == pid) && info.API != "" {
			where = fmt.Sprintf("(API %s, SSH %s)", info.API, info.SSH)
		}
	}
	return fmt.Errorf("%w: %s uses %s %s; stop it first, or give this hub its own --data-dir", ErrDataDirInUse,
		holder, dir, where)
}

// release drops the lock (the kernel does it too when the process ends).
func (l *dataDirLock) release() {
	if l != nil && l.f != nil {
		_ = l.f.Truncate(0) // no PID: Starting knows no hub is on the way
		_ = l.f.Close()
		l.f = nil
	}
}

// Starting reports whether a hub process holds dir's lock (it may not
// serve yet): the lock file names a live process. It only reads the file,
// so it never races a hub for the lock.
func Starting(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, LockFile))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}
	return unix.Kill(pid, 0) != unix.ESRCH
}
