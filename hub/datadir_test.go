package hub

import (
	"errors"
	"os"
	"slices"
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

func TestServingNames(t *testing.T) {
	host, _ := os.Hostname()
	tests := []struct {
		listen    string
		advertise []string
		want      []string // must be present
		not       []string // must be absent
	}{
		{listen: "127.0.0.1:7443", want: []string{"127.0.0.1"}, not: []string{"localhost", "hub.tether.internal"}},
		{listen: "127.0.0.1:7443", advertise: []string{"hub.example.com:7443", "[2001:db8::1]:7443"}, want: []string{"hub.example.com", "2001:db8::1", "127.0.0.1"}},
		{listen: ":7443", want: []string{"localhost", "127.0.0.1", "::1", host}},
		{listen: "[::]:7443", advertise: []string{"10.0.0.5:7443"}, want: []string{"10.0.0.5", "127.0.0.1"}},
	}
	for _, tt := range tests {
		got := servingNames(tt.listen, tt.advertise)
		for _, w := range tt.want {
			if !slices.Contains(got, w) {
				t.Errorf("servingNames(%q, %q) = %q, missing %q", tt.listen, tt.advertise, got, w)
			}
		}
		for _, n := range tt.not {
			if slices.Contains(got, n) {
				t.Errorf("servingNames(%q, %q) = %q, has %q", tt.listen, tt.advertise, got, n)
			}
		}
	}
}
