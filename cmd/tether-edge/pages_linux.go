package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// releaseExePages drops this process's mappings of the pages of its own
// executable's read-only segments (code and read-only data) with
// MADV_DONTNEED, and returns how many bytes of address space it covered.
//
// Why: at start the kernel reads the executable in around each page
// fault (the block device's read-ahead, 8 MiB on the benchmark machine)
// into large page-cache folios and maps whole folios, so nearly the whole
// binary counts in the agent's RSS, while an idle agent touches about
// 1.5 MiB of it (measured with /proc/PID/clear_refs and the smaps
// Referenced field). Dropping the mappings once start-up is over leaves
// the page cache as it is (no disk read follows: a page the agent touches
// again is mapped back by a minor fault) and RSS then follows what the
// agent uses. The segments are read-only and never written, so nothing
// is lost; a debugger's breakpoints written into the code would be.
func releaseExePages() (int64, error) {
	self, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var n int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		start, end, ok := exeSpan(sc.Text(), self)
		if !ok {
			continue
		}
		if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, start, end-start, syscall.MADV_DONTNEED); e != 0 {
			return n, fmt.Errorf("madvise(MADV_DONTNEED) of %s [%#x, %#x): %w", self, start, end, e)
		}
		n += int64(end - start)
	}
	return n, sc.Err()
}

// exeSpan parses a /proc/PID/maps line: the address range of a private,
// not writable mapping of the file exe.
func exeSpan(line, exe string) (start, end uintptr, ok bool) {
	fl := strings.Fields(line)
	if len(fl) < 6 || strings.Join(fl[5:], " ") != exe || (fl[1] != "r-xp" && fl[1] != "r--p") {
		return 0, 0, false
	}
	a, b, _ := strings.Cut(fl[0], "-")
	s, err1 := strconv.ParseUint(a, 16, 64)
	e, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}
