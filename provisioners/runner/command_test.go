package runner

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// Quoting is checked with the shells a node may have: each word must come
// back unchanged from the shell.
func TestShellQuoteRoundTrip(t *testing.T) {
	words := []string{
		"", "plain", "it's", "''", `"`, `\`, `\'`, "$HOME", "`id`", "$(id)", "a\nb", "*", "-n", "!x", "ünï",
		" lead", "trail ",
	}
	for _, sh := range []string{"/bin/sh", "/bin/bash"} {
		if _, err := exec.LookPath(sh); err != nil {
			t.Logf("%s not installed", sh)
			continue
		}
		for _, w := range words {
			out, err := exec.Command(sh, "-c", "printf '%s' "+shellQuote(w)).Output()
			if err != nil || string(out) != w {
				t.Errorf("%s: %q came back as %q (%v)", sh, w, out, err)
			}
		}
	}
}

// The wrapper must parse in the shells it may meet; the behaviour is
// tested end to end against both servers.
func TestWrapperSyntax(t *testing.T) {
	for _, sh := range []string{"/bin/sh", "/bin/bash"} {
		if _, err := exec.LookPath(sh); err != nil {
			continue
		}
		if out, err := exec.Command(sh, "-n", "-c", wrapper).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", sh, err, out)
		}
		// The full line as a login shell receives it.
		line := remoteLine("/tmp/x", []string{"env", "A=it's", "/bin/sh", "-c", "echo $A"})
		if out, err := exec.Command(sh, "-n", "-c", line).CombinedOutput(); err != nil {
			t.Errorf("%s -n on the remote line: %v\n%s", sh, err, out)
		}
	}
}

func TestInterpreter(t *testing.T) {
	tests := []struct {
		script, interp, arg string
	}{
		{"echo hi", "/bin/sh", ""},
		{"", "/bin/sh", ""},
		{"#!/bin/bash\necho", "/bin/bash", ""},
		{"#! /bin/bash -eu \n", "/bin/bash", "-eu"},
		{"#!/usr/bin/env python3 -u -X dev\n", "/usr/bin/env", "python3 -u -X dev"},
		{"#!/bin/sh\r\n", "/bin/sh", ""},
		{"#!\tperl\t-w\n", "perl", "-w"},
		{"#!\n", "/bin/sh", ""},
		{"#!/bin/sh", "/bin/sh", ""},
	}
	for _, tt := range tests {
		interp, arg, err := interpreter([]byte(tt.script))
		if err != nil || interp != tt.interp || arg != tt.arg {
			t.Errorf("interpreter(%q) = %q, %q, %v; want %q, %q", tt.script, interp, arg, err, tt.interp, tt.arg)
		}
	}
	if _, _, err := interpreter([]byte("#!/" + strings.Repeat("x", 300))); err == nil {
		t.Error("overlong #! line accepted")
	}
}

func TestCommandEnvNames(t *testing.T) {
	for name, want := range map[string]bool{
		"A": true, "_": true, "a_B9": true, "_9": true,
		"": false, "9A": false, "A-B": false, "A.B": false, "A=B": false, "Ä": false, "A B": false,
	} {
		err := (&Command{Line: "true", Env: map[string]string{name: "v"}}).validate(testNodeName)
		if (err == nil) != want || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("env name %q: validate() = %v, want ok=%v", name, err, want)
		}
	}
}
