package bulkonboard

import (
	"errors"
	"strings"
	"testing"
)

func TestWriteTableAndProgress(t *testing.T) {
	rs := []Result{
		{Host: "root@a", Line: 3, Status: StatusOnboarded, Node: "a", CopiedAgent: true, Seconds: 1.2},
		{Host: "b:2222", Line: 4, Status: StatusAlready, Node: "b"},
		{
			Host:   "c",
			Line:   5,
			Status: StatusFailed,
			Step:   StepConnect,
			Error:  "host key not in known_hosts:\n c offers …",
		},
	}
	var b strings.Builder
	if err := WriteTable(&b, rs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"LINE", "root@a", "onboarded", "copied", "already-onboarded", "present",
		"failed (connect)", "host key not in known_hosts: c offers", "1 onboarded, 1 already onboarded, 1 failed",
		"run the same command again"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if s := Summarize(rs); s != (Summary{1, 1, 1}) {
		t.Errorf("summary %+v", s)
	}

	b.Reset()
	p := NewProgress(&b, 2)
	p.Add(rs[0])
	p.Add(Result{Status: StatusFailed, Err: errors.New("x")})
	p.Finish()
	if out := b.String(); !strings.Contains(out, "\r[###############...............] 1/2  1 ok  0 failed") ||
		!strings.Contains(out, "] 2/2  1 ok  1 failed") || !strings.HasSuffix(out, "\n") {
		t.Errorf("progress:\n%q", out)
	}
}

func TestParseOnboardOutput(t *testing.T) {
	runErr := errors.New("Process exited with status 1")
	for _, tc := range []struct {
		name, out, errOut string
		runErr            error
		node              string
		already           bool
		err               string
	}{
		{"onboarded", `{"name":"shop-7","existing":false}`, "", nil, "shop-7", false, ""},
		{"finished an earlier try", `{"name":"shop-7","existing":true}`, "", nil, "shop-7", false, ""},
		{"onboarded before", `{"checks":[{"name":"not onboarded yet","status":"fail",` +
			`"detail":"/var/lib/tether-edge already holds node shop-7 (ab12)"}],"error":"prerequisites failed"}`,
			"", runErr, "shop-7", true, ""},
		{"refused", `{"checks":[{"name":"machine uuid","status":"pass"}],"error":"onboarding refused: credential expired"}`,
			"", runErr, "", false, "credential expired"},
		{"failed check named", `{"checks":[{"name":"running as root","status":"fail","detail":"euid 1000"}],` +
			`"error":"prerequisites failed"}`, "", runErr, "", false, "running as root: euid 1000"},
		{"no json", "", "tether-edge: unknown command \"onboard\"\n", runErr, "", false, `unknown command`},
		{"garbage on success", "hello", "", nil, "", false, "unreadable output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, already, err := parseOnboardOutput([]byte(tc.out), []byte(tc.errOut), tc.runErr)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || node != tc.node || already != tc.already {
				t.Fatalf("= %q %v %v, want %q %v", node, already, err, tc.node, tc.already)
			}
		})
	}
}

// FuzzParseOnboardOutput: whatever a host prints, parsing it gives a
// result or an error, never a panic, and a failed command is never taken
// for a fresh onboarding.
func FuzzParseOnboardOutput(f *testing.F) {
	f.Add(
		`{"name":"n","existing":true}`,
		false,
	) // success
	f.Add(
		`{"checks":[{"name":"not onboarded yet","status":"fail","detail":"d already holds node n (x)"}]}`,
		true,
	) // onboarded before
	f.Add(
		`{"error":"refused"}`,
		true,
	) // refused
	f.Add(
		"not json",
		true,
	) // a broken host
	f.Fuzz(func(t *testing.T, out string, failed bool) {
		var runErr error
		if failed {
			runErr = errors.New("exit 1")
		}
		node, already, err := parseOnboardOutput([]byte(out), nil, runErr)
		if failed && err == nil && !already {
			t.Fatalf("failed run taken for success: %q → %q", out, node)
		}
	})
}
