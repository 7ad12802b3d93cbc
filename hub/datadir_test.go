package hub

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestDataDirLock(t *testing.T) {
	dir := t.TempDir()
	first, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !Starting(dir) {
		t.Error("Starting = false while a hub holds the lock")
	}
	_, err = lockDataDir(dir)
	if !errors.Is(err, ErrDataDirInUse) || !strings.Contains(err.Error(), "PID "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second lock: %v, want ErrDataDirInUse naming PID %d", err, os.Getpid())
	}
	first.release()
	if Starting(dir) {
		t.Error("Starting = true after the hub let go")
	}
	again, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.release()
}
