package upgrade

import "testing"

func TestWithoutNames(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"n1: failed; n10: failed", "another node: failed; n10: failed"},
		{"n1, n1 and n1.", "another node, another node and another node."},
		{"an-n1 n1-b xn1 n1x", "an-n1 n1-b xn1 n1x"},
		{"", ""},
	} {
		if got := withoutNames(tc.text, []string{"n1", ""}); got != tc.want {
			t.Errorf("withoutNames(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}
