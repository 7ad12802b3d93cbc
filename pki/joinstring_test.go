package pki

import (
	"errors"
	"strings"
	"testing"
)

const testPin = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestJoinStringRoundTrip(t *testing.T) {
	id, secret, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	in := JoinString{
		Addrs: []string{"127.0.0.1:7443", "[::1]:7443", "hub.example.com:443"},
		Token: id + "." + secret,
		CAPin: testPin,
	}
	out, err := ParseJoinString(in.String())
	if err != nil {
		t.Fatalf("parse %q: %v", in.String(), err)
	}
	if out.String() != in.String() || out.Token != in.Token || out.CAPin != in.CAPin || len(out.Addrs) != 3 {
		t.Fatalf("round trip: got %+v want %+v", out, in)
	}
}

func TestParseJoinStringRejects(t *testing.T) {
	good := "tether://abcdefgh.abcdefghijklmnopqrstuvwxyz234567@127.0.0.1:7443?ca=sha256:" + testPin
	if _, err := ParseJoinString(good); err != nil {
		t.Fatalf("good string refused: %v", err)
	}
	cases := map[string]string{
		"empty":         "",
		"wrong scheme":  strings.Replace(good, "tether://", "https://", 1),
		"no token":      "tether://127.0.0.1:7443?ca=sha256:" + testPin,
		"short secret":  strings.Replace(good, "234567@", "@", 1),
		"no port":       strings.Replace(good, ":7443", "", 1),
		"port zero":     strings.Replace(good, ":7443", ":0", 1),
		"port too big":  strings.Replace(good, ":7443", ":70000", 1),
		"empty host":    strings.Replace(good, "127.0.0.1", "", 1),
		"no pin":        strings.Replace(good, "?ca=sha256:"+testPin, "", 1),
		"short pin":     strings.TrimSuffix(good, "ef"),
		"upper pin":     strings.Replace(good, "abcdef01", "ABCDEF01", 1),
		"md5 pin":       strings.Replace(good, "sha256:", "md5:", 1),
		"huge":          good + strings.Repeat("a", 5000),
		"empty in list": strings.Replace(good, "127.0.0.1:7443", "127.0.0.1:7443,", 1),
		"uppercase tok": strings.Replace(good, "abcdefgh.", "ABCDEFGH.", 1),
		"percent host":  strings.Replace(good, "127.0.0.1", "%25", 1),
		"ipv6 zone":     strings.Replace(good, "127.0.0.1", "[fe80::1%eth0]", 1),
		"underscore":    strings.Replace(good, "127.0.0.1", "hub_1.example", 1),
		"hyphen label":  strings.Replace(good, "127.0.0.1", "-hub.example", 1),
		"empty label":   strings.Replace(good, "127.0.0.1", "hub..example", 1),
		"long label":    strings.Replace(good, "127.0.0.1", strings.Repeat("a", 64)+".example", 1),
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseJoinString(s); !errors.Is(err, ErrBadJoinString) {
				t.Fatalf("ParseJoinString(%q) = %v, want ErrBadJoinString", s, err)
			}
		})
	}
}

// FuzzParseJoinString: anything accepted must re-encode to a string that
// parses to the same value, and nothing may panic.
func FuzzParseJoinString(f *testing.F) {
	f.Add("tether://abcdefgh.abcdefghijklmnopqrstuvwxyz234567@127.0.0.1:7443?ca=sha256:" + testPin)
	f.Add("tether://abcdefgh.abcdefghijklmnopqrstuvwxyz234567@a:1,[::1]:2?ca=sha256:" + testPin)
	f.Add("tether://@?")
	f.Add("tether://x.y@:?ca=sha256:")
	f.Fuzz(func(t *testing.T, s string) {
		j, err := ParseJoinString(s)
		if err != nil {
			return
		}
		j2, err := ParseJoinString(j.String())
		if err != nil {
			t.Fatalf("re-encoded %q does not parse: %v", j.String(), err)
		}
		if j2.String() != j.String() {
			t.Fatalf("unstable encoding: %q vs %q", j.String(), j2.String())
		}
	})
}

func TestTokenSecret(t *testing.T) {
	id, secret, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	gotID, gotSecret, err := SplitToken(id + "." + secret)
	if err != nil || gotID != id || gotSecret != secret {
		t.Fatalf("SplitToken: %v %q %q", err, gotID, gotSecret)
	}
	h := HashSecret(secret)
	if !SecretMatches(h, secret) {
		t.Fatal("secret does not match its own hash")
	}
	if SecretMatches(h, secret[:31]+"a") && secret[31] != 'a' {
		t.Fatal("different secret matched")
	}
	for _, bad := range []string{"", ".", id, id + ".", "." + secret, id + "." + secret + "x", "x" + id + "." + secret} {
		if _, _, err := SplitToken(bad); err == nil {
			t.Errorf("SplitToken(%q) accepted", bad)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"n1", "node-7", "a", strings.Repeat("a", 63)} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"", "-a", "a-", "A", "127.0.0.1", "a.b", "localhost:22", "123", strings.Repeat("a", 64), "a b", "ä",
	} {
		if err := ValidateName(bad); err == nil {
			t.Errorf("ValidateName(%q) accepted", bad)
		}
	}
}
