package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRunOutputAndExitCodes(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
		tests := []struct {
			name, line           string
			wantOut, wantErrText string
			wantCode             int
			// The wrapper (sshd) turns a death by signal into a status;
			// the embedded server runs the command plainly and reports
			// the signal too.
			embeddedSignal string
		}{
			{"separated streams", "echo out; echo err >&2; exit 3", "out\n", "err\n", 3, ""},
			{"success", "printf 'a b\\n'", "a b\n", "", 0, ""},
			{"quotes survive", `printf '%s|' "it's" '"q"' '$HOME' '\n'`, `it's|"q"|$HOME|\n|`, "", 0, ""},
			{"multi-line", "echo one\necho two", "one\ntwo\n", "", 0, ""},
			{"killed by signal", "kill -TERM $$", "", "", 128 + 15, "TERM"},
			{"not found", "/nonexistent/tool", "", "/nonexistent/tool", 127, ""},
			{"exit 255", "exit 255", "", "", 255, ""},
			// All output arrives before Run returns.
			{"1 MiB of output", "i=0; while [ $i -lt 65536 ]; do printf 0123456789abcdef; i=$((i+1)); done", big, "", 0, ""},
			{"stdin is empty", "cat; echo rc=$?", "rc=0\n", "", 0, ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				res, out, errOut, err := run(t, c, Command{Line: tt.line})
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				wantSignal := ""
				if s.kind == "embedded" {
					wantSignal = tt.embeddedSignal
				}
				if res.ExitCode != tt.wantCode || res.Signal != wantSignal {
					t.Errorf(
						"exit %d signal %q, want %d signal %q; stderr %q",
						res.ExitCode, res.Signal, tt.wantCode, wantSignal, errOut,
					)
				}
				if out != tt.wantOut {
					if len(out) > 200 {
						out = fmt.Sprintf("%d bytes, sha256 %x", len(out), sha256.Sum256([]byte(out)))
					}
					t.Errorf("stdout %q, want %q", out, tt.wantOut)
				}
				if !strings.Contains(errOut, tt.wantErrText) || (tt.wantErrText == "" && errOut != "") {
					t.Errorf("stderr %q, want %q", errOut, tt.wantErrText)
				}
				if res.Duration <= 0 {
					t.Errorf("duration %v", res.Duration)
				}
			})
		}
	})
}

func TestRunEnv(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		env := map[string]string{
			"PLAIN":   "value",
			"QUOTES":  `it's "quoted" \ back`,
			"SHELLY":  "$HOME; `id`; $(id) * ?",
			"NEWLINE": "a\nb",
			"EMPTY":   "",
			"_x9":     "underscore",
		}
		var lines []string
		for _, k := range []string{"PLAIN", "QUOTES", "SHELLY", "NEWLINE", "EMPTY", "_x9"} {
			lines = append(lines, fmt.Sprintf(`printf '%%s\n' "%s=${%s-unset}"`, k, k))
		}
		want := ""
		for _, k := range []string{"PLAIN", "QUOTES", "SHELLY", "NEWLINE", "EMPTY", "_x9"} {
			want += k + "=" + env[k] + "\n"
		}
		_, out, errOut, err := run(t, c, Command{Line: strings.Join(lines, "; "), Env: env})
		if err != nil || out != want {
			t.Fatalf("env: %v\ngot  %q\nwant %q\nstderr %q", err, out, want, errOut)
		}
		// Scripts get the same environment.
		_, out, _, err = run(t, c, Command{Script: []byte(`printf '%s' "$SHELLY"`), Env: env})
		if err != nil || out != env["SHELLY"] {
			t.Fatalf("script env: %v, %q", err, out)
		}

		for _, bad := range []string{"", "1ABC", "A-B", "A B", "A=B", "Ä", "A\x00"} {
			_, err := c.Run(context.Background(), Command{Line: "true", Env: map[string]string{bad: "x"}}, nil, nil)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("env name %q: %v, want ErrInvalid", bad, err)
			}
		}
		_, err = c.Run(context.Background(), Command{Line: "true", Env: map[string]string{"A": "x\x00y"}}, nil, nil)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("NUL in value: %v, want ErrInvalid", err)
		}
	})
}

func TestRunInvalidCommand(t *testing.T) {
	s := newServer(t, "embedded", hostCertOK)
	c := s.connect(t)
	for name, cmd := range map[string]Command{
		"empty":      {},
		"both":       {Line: "true", Script: []byte("true")},
		"NUL":        {Line: "echo \x00"},
		"long #!":    {Script: []byte("#!/bin/" + strings.Repeat("x", 300) + "\n")},
		"NUL in #!":  {Script: []byte("#!/bin/sh\x00\n")},
		"empty line": {Line: "", Env: map[string]string{"A": "b"}},
	} {
		if _, err := c.Run(context.Background(), cmd, nil, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestRunScript(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		tests := []struct {
			name     string
			script   string
			wantOut  string
			wantCode int
		}{
			// $0 is the uploaded file; its mode is checked from inside.
			{"no #! runs with sh", "echo \"path=$0\"\necho mode=$(stat -c %a \"$0\")\nexit 4\n", "", 4},
			{"#! interpreter and argument", "#!/bin/sh -e\necho \"path=$0\"\nfalse\necho not reached\n", "", 1},
			{"#!/usr/bin/env bash", "#!/usr/bin/env bash\necho \"path=$0\"\necho \"bash=${BASH_VERSION:+yes}\"\n",
				"bash=yes\n", 0},
			{"CRLF #! line", "#!/bin/sh\r\necho \"path=$0\"\n", "", 0},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				res, out, errOut, err := run(t, c, Command{Script: []byte(tt.script)})
				if err != nil || res.ExitCode != tt.wantCode {
					t.Fatalf("Run: %+v, %v; stdout %q stderr %q", res, err, out, errOut)
				}
				first, rest, _ := strings.Cut(out, "\n")
				path, ok := strings.CutPrefix(first, "path=")
				if !ok || !strings.HasPrefix(path, "/tmp/.tether-run-") {
					t.Fatalf("script path line %q", first)
				}
				if strings.HasPrefix(rest, "mode=") {
					if rest != "mode=700\n" {
						t.Errorf("script file %s", rest)
					}
				} else if rest != tt.wantOut {
					t.Errorf("output %q, want %q", rest, tt.wantOut)
				}
				if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("script %s not removed: %v", path, err)
				}
			})
		}
	})
}

// killScript starts a tree of processes, including one that ignores the
// usual termination signals and one in a nested shell, writes their pids
// to $PIDS and waits.
const killScript = `sleep 300 &
echo $! >> "$PIDS"
sh -c 'trap "" HUP INT TERM; sleep 300 & echo $! >> "$PIDS"; echo $$ >> "$PIDS"; while :; do sleep 1; done' &
echo $! >> "$PIDS"
echo $$ >> "$PIDS"
echo started
wait
`

// watchWriter is a buffer safe to write from Run and read from the test
// that closes seen once its content holds want.
type watchWriter struct {
	mu   sync.Mutex
	b    bytes.Buffer
	want string
	seen chan struct{}
}

func newWatchWriter(want string) *watchWriter {
	return &watchWriter{want: want, seen: make(chan struct{})}
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := strings.Contains(w.b.String(), w.want)
	n, err := w.b.Write(p)
	if !had && strings.Contains(w.b.String(), w.want) {
		close(w.seen)
	}
	return n, err
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// killScriptPids is how many pids killScript writes.
const killScriptPids = 5

func TestRunKillsProcessTree(t *testing.T) {
	cases := []struct {
		name    string
		trigger func(s *testServer, cancel context.CancelFunc) // nil: the deadline
		wantErr []error
	}{
		{"timeout", nil, []error{ErrTimeout, context.DeadlineExceeded}},
		{"cancel", func(_ *testServer, cancel context.CancelFunc) { cancel() }, []error{ErrCanceled, context.Canceled}},
		{"connection drop", func(s *testServer, _ context.CancelFunc) { s.dropConns() }, []error{ErrConnLost}},
	}
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				if tc.name == "connection drop" {
					// Dropping closes the shared client's connection.
					c = s.connect(t)
				}
				pidFile := filepath.Join(t.TempDir(), "pids")
				var ctx context.Context
				var cancel context.CancelFunc
				if tc.trigger == nil {
					ctx, cancel = context.WithTimeout(context.Background(), 1500*time.Millisecond)
				} else {
					ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
				}
				defer cancel()

				var wg sync.WaitGroup
				var triggered time.Time
				stdout := newWatchWriter("started\n")
				if tc.trigger != nil {
					wg.Go(func() {
						// Trigger once the whole tree runs (every pid
						// written; the nested shell writes its own in the
						// background) and "started" has reached the client:
						// either alone races the other.
						select {
						case <-stdout.seen:
						case <-time.After(15 * time.Second):
						}
						// Not waitPids: no t.Fatal off the test goroutine.
						for range 750 {
							if len(readPidsNoFail(pidFile)) >= killScriptPids {
								break
							}
							time.Sleep(20 * time.Millisecond)
						}
						triggered = time.Now()
						tc.trigger(s, cancel)
					})
				}
				res, err := c.Run(ctx, Command{Script: []byte(killScript), Env: map[string]string{"PIDS": pidFile}}, stdout, nil)
				returned := time.Now()
				wg.Wait()
				if tc.trigger == nil {
					triggered, _ = ctx.Deadline()
				}
				for _, want := range tc.wantErr {
					if !errors.Is(err, want) {
						t.Errorf("Run error %v, want %v", err, want)
					}
				}
				if stdout.String() != "started\n" {
					t.Errorf("stdout %q", stdout.String())
				}
				pids := readPids(t, pidFile)
				if len(pids) < killScriptPids {
					t.Fatalf("script wrote only pids %v", pids)
				}
				// The node closed the session by itself: the kill
				// worked without Run's escalation (KillGrace is 10s).
				if took := returned.Sub(triggered); took > 5*time.Second {
					t.Errorf("Run returned %v after the trigger", took)
				}
				waitGone(t, pids, 5*time.Second)
				t.Logf("result %+v, returned %v after the trigger", res, returned.Sub(triggered).Round(time.Millisecond))
				switch {
				case tc.name == "connection drop":
					if res.ExitCode != -1 {
						t.Errorf("exit code %d after a drop, want -1", res.ExitCode)
					}
				case res.ExitCode != 137 || res.Signal != "KILL":
					t.Errorf("result %+v, want exit 137 by KILL", res)
				}
			})
		}
		// The client is still usable after a killed run.
		if out := mustRun(t, s.connect(t), "echo alive"); out != "alive\n" {
			t.Errorf("after kills: %q", out)
		}
	})
}

// A command that exits while its background children still hold stdout
// must not keep the step open: the leftovers are killed.
func TestRunKillsLeftoversOnExit(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		pidFile := filepath.Join(t.TempDir(), "pids")
		start := time.Now()
		res, out, _, err := run(t, c, Command{
			Line: `sleep 300 & echo $! > "$PIDS"; (trap "" TERM HUP; sleep 300) & echo $! >> "$PIDS"; echo done`,
			Env:  map[string]string{"PIDS": pidFile},
		})
		if err != nil || res.ExitCode != 0 || out != "done\n" {
			t.Fatalf("Run: %+v, %v, %q", res, err, out)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("Run took %v: leftovers kept the session open", took)
		}
		waitGone(t, readPids(t, pidFile), 5*time.Second)
	})
}

func TestRunReusesConnection(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		for i := range 5 {
			if out := mustRun(t, c, fmt.Sprintf("echo %d", i)); out != fmt.Sprintf("%d\n", i) {
				t.Fatalf("run %d: %q", i, out)
			}
		}
		dst := filepath.Join(t.TempDir(), "f")
		if _, err := c.Upload(context.Background(), strings.NewReader("x"), 1, dst, UploadOptions{}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				res, out, _, err := run(t, c, Command{Line: fmt.Sprintf("sleep 0.2; echo %d; exit %d", i, i)})
				if err != nil || res.ExitCode != i || out != fmt.Sprintf("%d\n", i) {
					t.Errorf("concurrent run %d: %+v %v %q", i, res, err, out)
				}
			})
			wg.Go(func() {
				if ok, err := c.Exists(context.Background(), dst); !ok || err != nil {
					t.Errorf("concurrent Exists: %v %v", ok, err)
				}
			})
		}
		wg.Wait()
		if n := s.dials.Load(); n != 1 {
			t.Errorf("%d dials, want 1", n)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if _, err := c.Run(context.Background(), Command{Line: "true"}, nil, nil); err == nil {
			t.Error("Run after Close succeeded")
		}
	})
}

// Cancellation at any moment, including before the wrapper has set up its
// trap and watchdog, leaves nothing behind. The user processes carry a
// unique variable so they can be found without their pids.
func TestRunCancelAtAnyMoment(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		for i := range 10 {
			delay := time.Duration(i) * 5 * time.Millisecond
			token := fmt.Sprintf("%s-%d-%d", s.kind, time.Now().UnixNano(), i)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(delay, cancel)
			_, err := c.Run(
				ctx, Command{Line: "sleep 600 & sleep 600 & wait", Env: map[string]string{"TETHER_TEST_TOKEN": token}},
				nil, nil,
			)
			cancel()
			if !errors.Is(err, ErrCanceled) {
				t.Fatalf("cancel after %v: %v, want ErrCanceled", delay, err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				left := processesWithEnv("TETHER_TEST_TOKEN=" + token)
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					waitGone(t, left, 0) // reports and kills them
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
}

// One writer for both streams gets combined output without a data race
// (run with -race).
func TestRunCombinedOutput(t *testing.T) {
	s := newServer(t, "embedded", hostCertOK)
	c := s.connect(t)
	var out bytes.Buffer
	res, err := c.Run(
		context.Background(), Command{Line: "i=0; while [ $i -lt 200 ]; do echo o; echo e >&2; i=$((i+1)); done"},
		&out, &out,
	)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Run: %+v %v", res, err)
	}
	if n := strings.Count(out.String(), "o\n") + strings.Count(out.String(), "e\n"); n != 400 || len(out.String()) != 800 {
		t.Errorf("combined output has %d lines, %d bytes; want 400, 800", n, out.Len())
	}
}

// On the embedded server a step is one process, started by the server
// itself (no wrapper shell and watchdog in between); under sshd the
// wrapper stands between sshd and the command.
func TestRunEmbeddedServerRunsCommandPlainly(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		res, out, _, err := run(t, c, Command{Line: "echo $PPID"})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Run: %+v, %v", res, err)
		}
		ppid, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("output %q", out)
		}
		if direct := ppid == os.Getpid(); direct != (s.kind == "embedded") {
			t.Errorf(
				"%s: the command's parent is pid %d (this process %d): want it started directly only by the embedded server",
				s.kind, ppid, os.Getpid(),
			)
		}
	})
}
