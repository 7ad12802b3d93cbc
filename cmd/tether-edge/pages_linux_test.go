package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// exeRSS is the resident size of this process's read-only mappings of its
// executable, from /proc/self/smaps.
func exeRSS(t *testing.T) int64 {
	t.Helper()
	self, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rss int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if _, _, ok := strings.Cut(line, "-"); ok && len(strings.Fields(line)) >= 5 &&
			!strings.HasSuffix(strings.Fields(line)[0], ":") {
			_, _, in = exeSpan(line, self)
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			rss += kb << 10
		}
	}
	return rss
}

// TestReleaseExePages: the agent's executable pages leave its RSS and the
// process goes on running the code they held.
func TestReleaseExePages(t *testing.T) {
	before := exeRSS(t)
	n, err := releaseExePages()
	if err != nil {
		t.Fatal(err)
	}
	after := exeRSS(t)
	if n == 0 || after >= before {
		t.Fatalf("released %d bytes of address space; executable RSS %d -> %d bytes, want it lower", n, before, after)
	}
	t.Logf("executable RSS %d KiB -> %d KiB", before>>10, after>>10)
}

func TestExeSpan(t *testing.T) {
	const exe = "/usr/bin/tether-edge"
	for _, tc := range []struct {
		line       string
		start, end uintptr
		ok         bool
	}{
		{"00400000-00a95000 r-xp 00000000 fe:00 10027089   /usr/bin/tether-edge", 0x400000, 0xa95000, true},
		{"00a95000-011e4000 r--p 00695000 fe:00 10027089   /usr/bin/tether-edge", 0xa95000, 0x11e4000, true},
		{"011e4000-012b4000 rw-p 00de4000 fe:00 10027089   /usr/bin/tether-edge", 0, 0, false},
		{"00400000-00a95000 r-xp 00000000 fe:00 10027089   /usr/bin/tether-edge-onboard", 0, 0, false},
		{"7f7281bd0000-7f7281e00000 rw-p 00000000 00:00 0", 0, 0, false},
		{"zz-00a95000 r-xp 00000000 fe:00 1   /usr/bin/tether-edge", 0, 0, false},
	} {
		s, e, ok := exeSpan(tc.line, exe)
		if s != tc.start || e != tc.end || ok != tc.ok {
			t.Errorf("exeSpan(%q) = %#x, %#x, %v; want %#x, %#x, %v", tc.line, s, e, ok, tc.start, tc.end, tc.ok)
		}
	}
}
