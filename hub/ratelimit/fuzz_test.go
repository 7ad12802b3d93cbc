package ratelimit

import "testing"

// FuzzSource: any remote address string maps to a key, and a key maps to
// itself (so keys never split or merge on a second pass).
func FuzzSource(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1:22", "[2001:db8::1]:443", "[fe80::1%eth0]:1", "::ffff:1.2.3.4", "", "[", "a:b:c",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, remote string) {
		k := Source(remote)
		if again := Source(k); again != k {
			t.Fatalf("Source(%q) = %q, but Source(%q) = %q", remote, k, k, again)
		}
	})
}
