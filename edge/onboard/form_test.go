package onboard

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// lines reads one line per Read, as a terminal does.
type lines struct{ l []string }

func (r *lines) Read(p []byte) (int, error) {
	if len(r.l) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.l[0]+"\n")
	r.l = r.l[1:]
	return n, nil
}

// The form in accessible mode (plain line prompts): a value the check
// refuses is asked again with the reason; an empty answer keeps the
// default; the end of the input is an error, not an endless loop.
func TestFormAccessible(t *testing.T) {
	var out strings.Builder
	reachable := func(v string) error {
		if v != "good" {
			return errors.New("not reachable")
		}
		return nil
	}
	f := &Form{Accessible: true, In: &lines{[]string{"bad", "good"}}, Out: &out}
	got, err := f.Input(Field{Title: "Hub address", Check: reachable})
	if err != nil || got != "good" {
		t.Fatalf("Input = %q, %v\n%s", got, err, out.String())
	}
	if !strings.Contains(out.String(), "not reachable") {
		t.Fatalf("reason not shown:\n%s", out.String())
	}
	f.In = &lines{[]string{""}}
	if got, err := f.Input(Field{Title: "Site", Value: "berlin"}); err != nil || got != "berlin" {
		t.Fatalf("default: %q, %v", got, err)
	}
	f.In = &lines{[]string{"y"}}
	if ok, err := f.Confirm("Trust?", "sha256:…"); err != nil || !ok {
		t.Fatalf("Confirm = %v, %v", ok, err)
	}
	f.In = &lines{[]string{"bad"}}
	if _, err := f.Input(Field{Title: "Hub address", Check: reachable}); !errors.Is(err, ErrInputEnded) {
		t.Fatalf("end of input: %v", err)
	}
}
