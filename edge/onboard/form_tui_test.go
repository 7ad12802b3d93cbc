//go:build !noform

package onboard

import (
	"strings"
	"testing"
)

// What a question leaves on the terminal once answered shows the whole
// answer, wrapped to the terminal's width, however long: an input's own
// frame shows only the part around the cursor, and left a long proxy URL
// cut at its start. A secret stays hidden.
func TestFormLastFrameShowsWholeAnswer(t *testing.T) {
	long := "http://proxy.very-long-hostname.example.internal.company.net:3128/x"
	for _, tc := range []struct {
		name   string
		ask    func(f *Form) (string, error)
		answer string // what the question returns
		shown  string // what its last frame shows, line breaks taken out
		hidden string // what the last frame must not show
	}{
		{"input", func(f *Form) (string, error) { return f.Input(Field{Title: "HTTPS proxy", Value: long}) }, long, long, ""},
		{"typed", func(f *Form) (string, error) {
			f.In = strings.NewReader(long + "\r")
			return f.Input(Field{Title: "Labels"})
		}, long, long, ""},
		{"secret", func(f *Form) (string, error) {
			return f.Input(Field{Title: "Onboarding credential", Value: "id.secret-value", Secret: true})
		}, "id.secret-value", "••••••••", "secret-value"},
		{"choose", func(f *Form) (string, error) {
			return f.Choose("Apply the node's cloud-init", [][2]string{
				{"apply", "now: write its files, start the agent and wait until it is connected"},
				{"write-only", "at the next boot"},
			}, "apply")
		}, "apply", "apply: now: write its files, start the agent and wait until it is connected", ""},
		{"confirm", func(f *Form) (string, error) {
			f.In = strings.NewReader("y")
			ok, err := f.Confirm("Trust this hub CA?", "sha256:"+strings.Repeat("ab", 32))
			if ok {
				return "yes", err
			}
			return "no", err
		}, "yes", "Yes", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			f := &Form{Ctx: t.Context(), In: strings.NewReader("\r"), Out: &out, size: [2]int{40, 24}}
			got, err := tc.ask(f)
			if err != nil || got != tc.answer {
				t.Fatalf("answer %q, %v; want %q", got, err, tc.answer)
			}
			var answer []string
			for _, l := range strings.Split(f.lastFrame, "\n") {
				if w := len([]rune(l)); w > 40 {
					t.Errorf("line %q is %d wide, the terminal 40", l, w)
				}
				if rest, ok := strings.CutPrefix(l, "┃ > "); ok {
					answer = []string{rest}
				} else if rest, ok := strings.CutPrefix(l, "┃   "); ok && answer != nil {
					answer = append(answer, rest)
				}
			}
			joined := strings.Join(answer, "")
			if strings.ReplaceAll(joined, " ", "") != strings.ReplaceAll(tc.shown, " ", "") {
				t.Errorf("last frame shows %q, want %q:\n%s", joined, tc.shown, f.lastFrame)
			}
			if tc.hidden != "" && strings.Contains(f.lastFrame+out.String(), tc.hidden) {
				t.Errorf("the secret shows:\n%s", f.lastFrame)
			}
		})
	}
}
