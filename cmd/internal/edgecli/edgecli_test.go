package edgecli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// tree is a small command tree like the agent's: a persistent flag on the
// root, a group with its own persistent flag, leaves with flags and
// arguments. Each run records what it saw.
func tree(got *string) *Command {
	root := New("agent", "the agent")
	root.Version = "v1"
	var level string
	root.Persistent.StringVar(&level, "log-level", "info", "log level")

	run := New("run", "run it")
	var state, out string
	var ports UintList
	var bg bool
	run.Flags.StringVar(&state, "state-dir", "/var/lib/x", "state dir")
	run.Flags.StringVar(&out, "output", "text", "text or json")
	run.Flags.Var(&ports, "allow-port", "port (repeatable)")
	run.Flags.BoolVar(&bg, "supervise", false, "supervise")
	run.Alias("o", "output")
	run.Args = MaximumArgs(1)
	run.Run = func(_ context.Context, c *Command, args []string) error {
		*got = fmt.Sprintf("run state=%s out=%s ports=%v bg=%v level=%s args=%v changed(output)=%v",
			state, out, []uint(ports), bg, level, args, c.Changed("output"))
		return nil
	}

	grp := New("upgrade", "upgrades")
	var dir string
	grp.Persistent.StringVar(&dir, "state-dir", "/d", "state dir")
	apply := New("apply NAME", "apply one")
	apply.Args = ExactArgs(1)
	apply.Run = func(_ context.Context, _ *Command, args []string) error {
		*got = fmt.Sprintf("apply dir=%s level=%s args=%v", dir, level, args)
		return nil
	}
	grp.Add(apply)
	root.Add(run, grp)
	return root
}

func TestExecute(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string // what the command saw
		usage   bool   // the error is a usage error
		outHas  string // help or version output contains
		errHas  string
		notWant string
	}{
		{args: []string{"run"},
			want: "run state=/var/lib/x out=text ports=[] bg=false level=info args=[] changed(output)=false"},
		{args: []string{"run", "--state-dir", "/s", "-o", "json", "--allow-port", "22", "--allow-port=80,443", "--supervise"},
			want: "run state=/s out=json ports=[22 80 443] bg=true level=info args=[] changed(output)=true"},
		{args: []string{"run", "ARG", "--state-dir=/s", "--log-level", "debug"},
			want: "run state=/s out=text ports=[] bg=false level=debug args=[ARG] changed(output)=false"},
		{args: []string{"--log-level", "warn", "run", "-state-dir", "/t"},
			want: "run state=/t out=text ports=[] bg=false level=warn args=[] changed(output)=false"},
		{args: []string{"run", "--", "--not-a-flag"},
			want: "run state=/var/lib/x out=text ports=[] bg=false level=info args=[--not-a-flag] changed(output)=false"},
		{args: []string{"upgrade", "--state-dir", "/u", "apply", "N"}, want: "apply dir=/u level=info args=[N]"},
		{args: []string{"upgrade", "apply", "N", "--state-dir", "/u"}, want: "apply dir=/u level=info args=[N]"},
		{args: []string{"upgrade", "apply"}, usage: true,
			errHas: "accepts 1 argument(s), received 0 (see agent upgrade apply --help)"},
		{args: []string{"run", "a", "b"}, usage: true, errHas: "accepts at most 1 argument(s), received 2"},
		{args: []string{"run", "--bogus"}, usage: true,
			errHas: "flag provided but not defined: -bogus (see agent run --help)"},
		{args: []string{"run", "--allow-port", "x"}, usage: true, errHas: `"x" is not an unsigned integer`},
		{args: []string{"bogus"}, usage: true, errHas: `unknown command "bogus" for "agent"`},
		{args: []string{"--version"}, outHas: "agent v1\n"},
		{args: []string{"-v"}, outHas: "agent v1\n"},
		{args: []string{"--help"}, outHas: "\n  -v, --version ", notWant: "\n      --version "},
		{args: []string{"run", "-v"}, usage: true, errHas: "flag provided but not defined: -v (see agent run --help)"},
		{args: []string{"--help"},
			outHas: "Available Commands:\n  run         run it\n  upgrade     upgrades\n" +
				"  completion  Print the shell completion script (bash, zsh or fish)\n  help        Help about any command"},
		{args: []string{"run", "--help"}, outHas: "  -o, --output string      text or json (default \"text\")",
			notWant: "  -o string"},
		{args: []string{"run", "-h"}, outHas: "Global Flags:\n      --log-level string   log level (default \"info\")"},
		{args: []string{"help", "upgrade", "apply"}, outHas: "Usage:\n  agent upgrade apply NAME [flags]"},
		{args: []string{"upgrade"}, outHas: "Use \"agent upgrade [command] --help\""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var got string
			var out bytes.Buffer
			err := tree(&got).Execute(context.Background(), slices.Clone(tc.args), &out)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v, want one containing %q", err, tc.errHas)
				}
				if tc.usage != errors.Is(err, ErrUsage) {
					t.Errorf("errors.Is(%v, ErrUsage) = %v", err, !tc.usage)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("command saw\n  %s\nwant\n  %s", got, tc.want)
			}
			if !strings.Contains(out.String(), tc.outHas) {
				t.Errorf("output lacks %q:\n%s", tc.outHas, out.String())
			}
			if tc.notWant != "" && strings.Contains(out.String(), tc.notWant) {
				t.Errorf("output has %q:\n%s", tc.notWant, out.String())
			}
		})
	}
}

// TestRunErrorPassesThrough: a command's own error is returned as it is,
// not as a usage error.
func TestRunErrorPassesThrough(t *testing.T) {
	sentinel := errors.New("refused")
	root := New("agent", "")
	c := New("run", "")
	c.Run = func(context.Context, *Command, []string) error { return fmt.Errorf("run: %w", sentinel) }
	root.Add(c)
	err := root.Execute(context.Background(), []string{"run"}, &bytes.Buffer{})
	if !errors.Is(err, sentinel) || errors.Is(err, ErrUsage) {
		t.Fatalf("error %v: want the command's own error", err)
	}
}

// TestComplete: the __complete answers the completion scripts ask for
// (cobra's protocol: candidates, then ":DIRECTIVE"), and every script
// calls it.
func TestComplete(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{""},
			"run\trun it\nupgrade\tupgrades\n" +
				"completion\tPrint the shell completion script (bash, zsh or fish)\nhelp\tHelp about any command\n:4\n"},
		{[]string{"u"}, "upgrade\tupgrades\n:4\n"},
		{[]string{"upgrade", ""}, "apply\tapply one\n:4\n"},
		{[]string{"run", "--al"}, "--allow-port\tport (repeatable)\n:4\n"},
		{[]string{"upgrade", "apply", ""}, ":0\n"},
	} {
		var got string
		var out bytes.Buffer
		if err := tree(&got).Execute(context.Background(), append([]string{"__complete"}, tc.args...), &out); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("__complete %q:\n%q\nwant\n%q", tc.args, out.String(), tc.want)
		}
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		var got string
		var out bytes.Buffer
		if err := tree(&got).Execute(context.Background(), []string{"completion", sh}, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "agent __complete") && !strings.Contains(out.String(), "__complete") {
			t.Errorf("%s script does not call __complete:\n%s", sh, out.String())
		}
		if strings.Contains(out.String(), "NAME") || strings.Contains(out.String(), "FUNC") {
			t.Errorf("%s script has an unreplaced placeholder:\n%s", sh, out.String())
		}
	}
}
