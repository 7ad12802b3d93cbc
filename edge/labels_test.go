package edge

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/validate"
)

func TestReadLabels(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, file string
		want       map[string]string
		wantErr    string
	}{
		{"pairs, comments, blanks", "# set by cloud-init\nenv=dev\n\n rack = r7 \nempty=\n",
			map[string]string{"env": "dev", "rack": "r7", "empty": ""}, ""},
		{"no equals", "env\n", nil, "line 1"},
		{"twice", "a=1\na=2\n", nil, "given twice"},
		{"bad key", "Env=dev\n", nil, "label key"},
		{"bad value", "env=a b\n", nil, "label value"},
		{"too long", strings.Repeat("#", maxLabelsFile+10), nil, "longer than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.WriteFile(p, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := ReadLabels(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReadLabels = %v, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !maps.Equal(got, tc.want) {
				t.Fatalf("ReadLabels = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if got, err := ReadLabels(filepath.Join(dir, "missing")); err != nil || got != nil {
		t.Fatalf("missing file: %v, %v; want no labels, no error", got, err)
	}
}

// FuzzParseLabels: whatever a labels file holds, the agent either refuses it
// or reports labels the hub's label rules accept.
func FuzzParseLabels(f *testing.F) {
	f.Add("env=dev\nrack=r7\n")         // plain
	f.Add("# comment\n\n a = b \n")     // comments, blanks, spaces
	f.Add("a=1\na=2\n")                 // duplicate key
	f.Add("k=v=w\n")                    // '=' in the value
	f.Add("\xff=\xfe\n")                // not UTF-8
	f.Add(strings.Repeat("k=v\n", 100)) // many lines
	f.Fuzz(func(t *testing.T, in string) {
		got, err := parseLabels("f", strings.NewReader(in))
		if err != nil {
			return
		}
		if err := validate.Labels(got); err != nil {
			t.Fatalf("accepted labels the rules refuse: %v: %v", got, err)
		}
	})
}
