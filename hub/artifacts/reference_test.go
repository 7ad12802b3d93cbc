package artifacts

import (
	"errors"
	"strings"
	"testing"
)

func TestParseReference(t *testing.T) {
	d := "sha256:" + strings.Repeat("ab", 32)
	ok := []struct {
		in   string
		want Reference
	}{
		{"oci://registry.example:5000/tether/edge:v1.4.0",
			Reference{Registry: "registry.example:5000", Repository: "tether/edge", Tag: "v1.4.0"}},
		{"oci://127.0.0.1:5000/edge:1", Reference{Registry: "127.0.0.1:5000", Repository: "edge", Tag: "1"}},
		{"oci://ghcr.io/org/patches/openssl:42",
			Reference{Registry: "ghcr.io", Repository: "org/patches/openssl", Tag: "42"}},
		{"oci://localhost/a_b/c-d/e.f:Tag_1.x-2",
			Reference{Registry: "localhost", Repository: "a_b/c-d/e.f", Tag: "Tag_1.x-2"}},
		{"oci://[::1]:5000/edge@" + d, Reference{Registry: "[::1]:5000", Repository: "edge", Digest: d}},
		{"oci://r.example/edge@" + d, Reference{Registry: "r.example", Repository: "edge", Digest: d}},
		// A digest wins over a tag written beside it.
		{"oci://r.example/edge:v1@" + d, Reference{Registry: "r.example", Repository: "edge", Digest: d}},
	}
	for _, c := range ok {
		got, err := ParseReference(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseReference(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		if again, err := ParseReference(got.String()); err != nil || again != got {
			t.Errorf("round trip of %q: %+v, %v", c.in, again, err)
		}
	}
	bad := []struct{ in, says string }{
		{"registry.example/edge:v1", "does not start with oci://"},
		{"https://registry.example/edge:v1", "does not start with oci://"},
		{"oci://registry.example", "no repository"},
		{"oci://registry.example/", "no repository"},
		{"oci://registry.example/edge", "no :TAG"},
		{"oci://registry.example/Edge:v1", "repository component"},
		{"oci://registry.example/edge//x:v1", "repository component"},
		{"oci://registry.example/edge:", "tag"},
		{"oci://registry.example/edge:.v1", "tag"},
		{"oci://registry.example/edge:" + strings.Repeat("a", 129), "tag"},
		{"oci://registry.example/edge@sha256:abc", "digest"},
		{"oci://registry.example/edge@sha512:" + strings.Repeat("a", 128), "digest"},
		{"oci://registry.example/edge@" + strings.ToUpper(d), "digest"},
		{"oci://registry.example:0/edge:v1", "port"},
		{"oci://registry.example:99999/edge:v1", "port"},
		{"oci://registry.example:/edge:v1", "port"},
		{"oci://-bad.example/edge:v1", "host label"},
		{"oci://a..b/edge:v1", "host label"},
		{"oci://[::1/edge:v1", "unclosed"},
		{"oci://[1.2.3.4]/edge:v1", "IPv6"},
		{"oci://user@r.example/edge:v1", "host label"},
		{"oci://r.example/edge:v1?x=1", "tag"},
		{"oci://" + strings.Repeat("a", 1100), "longer than"},
	}
	for _, c := range bad {
		_, err := ParseReference(c.in)
		if !errors.Is(err, ErrBadReference) || !strings.Contains(err.Error(), c.says) ||
			!strings.Contains(err.Error(), "want oci://HOST") {
			t.Errorf("ParseReference(%q) = %v; want ErrBadReference saying %q", c.in, err, c.says)
		}
	}
}

func FuzzParseReference(f *testing.F) {
	for _, s := range []string{
		"oci://registry.example:5000/tether/edge:v1.4.0",           // tag
		"oci://r.example/edge@sha256:" + strings.Repeat("0", 64),   // digest
		"oci://[::1]:5000/a/b:c@sha256:" + strings.Repeat("f", 64), // both, IPv6
		"oci://r/e:", "oci://:5000/x:1", "oci://r.example/a__b---c:x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseReference(s)
		if err != nil {
			if !errors.Is(err, ErrBadReference) {
				t.Fatalf("error not ErrBadReference: %v", err)
			}
			return
		}
		if (r.Tag == "") == (r.Digest == "") {
			t.Fatalf("%q: exactly one of tag and digest: %+v", s, r)
		}
		again, err := ParseReference(r.String())
		if err != nil || again != r {
			t.Fatalf("%q: round trip %q: %+v, %v", s, r.String(), again, err)
		}
	})
}
