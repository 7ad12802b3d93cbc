package idleprocs

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPolicyNext(t *testing.T) {
	p := policy{Sample: time.Second, IdleLoad: 0.10, IdleFor: 30 * time.Second, BusyLoad: 0.40}
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	cases := []struct {
		name string
		s    state
		load float64
		now  time.Time
		want state
	}{
		{"first idle sample starts the clock", state{}, 0.05, at(0), state{idleSince: at(0)}},
		{"idle, not for long enough", state{idleSince: at(0)}, 0.05, at(29), state{idleSince: at(0)}},
		{"idle for IdleFor narrows", state{idleSince: at(0)}, 0.05, at(30), state{narrow: true}},
		{"a busy sample restarts the clock", state{idleSince: at(0)}, 0.10, at(29), state{}},
		{"narrow, moderate load stays narrow", state{narrow: true}, 0.30, at(40), state{narrow: true}},
		{"narrow, load at BusyLoad stays narrow", state{narrow: true}, 0.40, at(40), state{narrow: true}},
		{"narrow, load above BusyLoad widens", state{narrow: true}, 0.41, at(40), state{}},
		{"narrow, a saturated core widens", state{narrow: true}, 1.0, at(40), state{}},
	}
	for _, tc := range cases {
		if got := p.next(tc.s, tc.load, tc.now); got != tc.want {
			t.Errorf("%s: next(%+v, %.2f) = %+v, want %+v", tc.name, tc.s, tc.load, got, tc.want)
		}
	}
	if got := p.interval(state{narrow: true}); got != 250*time.Millisecond {
		t.Errorf("narrow interval = %v, want a quarter of Sample", got)
	}
	if got := p.interval(state{}); got != time.Second {
		t.Errorf("wide interval = %v, want Sample", got)
	}
}

// waitProcs waits (bounded) for GOMAXPROCS to become want.
func waitProcs(t *testing.T, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for runtime.GOMAXPROCS(0) != want {
		if time.Now().After(deadline) {
			t.Fatalf("GOMAXPROCS is %d after %v, want %d", runtime.GOMAXPROCS(0), within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStartNarrowsAndWidens runs the real tuner on this process: it
// narrows the idle test to one P, widens under a spinning goroutine, and
// its stop puts the default back and ends its goroutine (goleak).
func TestStartNarrowsAndWidens(t *testing.T) {
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		t.Skip("GOMAXPROCS is set in the environment: the tuner stays off")
	}
	wide := runtime.GOMAXPROCS(0)
	if wide < 2 {
		t.Skip("one CPU: nothing to narrow")
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := policy{Sample: 100 * time.Millisecond, IdleLoad: 0.10, IdleFor: 300 * time.Millisecond, BusyLoad: 0.40}
	stop := start(log, p)
	stop2 := start(log, p) // a second holder shares the tuner
	stop2()
	waitProcs(t, 1, 5*time.Second)

	spin := make(chan struct{})
	spun := make(chan struct{})
	go func() {
		defer close(spun)
		end := time.Now().Add(10 * time.Second)
		for time.Now().Before(end) {
			select {
			case <-spin:
				return
			default:
			}
		}
	}()
	waitProcs(t, wide, 2*time.Second)
	close(spin)
	<-spun

	waitProcs(t, 1, 5*time.Second) // idle again
	// A holder that comes while the process is narrow shares the tuner:
	// the first holder's stop leaves it running for the later one.
	late := start(log, p)
	stop()
	stop() // a second call is a no-op
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("GOMAXPROCS = %d after the first holder stopped with a later one left, want the tuner's 1", got)
	}
	late()
	if got := runtime.GOMAXPROCS(0); got != wide {
		t.Fatalf("GOMAXPROCS after the last stop = %d, want the default %d", got, wide)
	}
}

func TestRunStopsWhenCPUCannotBeRead(t *testing.T) {
	calls := 0
	cpu := func() (time.Duration, error) {
		calls++
		if calls > 1 {
			return 0, errors.New("no rusage")
		}
		return 0, nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(
			t.Context(), slog.New(slog.NewTextHandler(io.Discard, nil)),
			policy{Sample: 10 * time.Millisecond, IdleFor: time.Hour}, cpu,
		)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("run did not end after the CPU time could not be read")
	}
	if calls != 2 {
		t.Errorf("cpu read %d times, want 2", calls)
	}
}

// TestStartOffWithGOMAXPROCSSet: the operator's GOMAXPROCS wins; the tuner
// does not start, so an idle process keeps its Ps.
func TestStartOffWithGOMAXPROCSSet(t *testing.T) {
	wide := runtime.GOMAXPROCS(0)
	if wide < 2 {
		t.Skip("one CPU: nothing to narrow")
	}
	t.Setenv("GOMAXPROCS", strconv.Itoa(wide))
	stop := start(
		slog.New(slog.NewTextHandler(io.Discard, nil)),
		policy{Sample: 20 * time.Millisecond, IdleLoad: 0.5, IdleFor: 40 * time.Millisecond, BusyLoad: 0.9},
	)
	defer stop()
	time.Sleep(500 * time.Millisecond)
	if got := runtime.GOMAXPROCS(0); got != wide {
		t.Fatalf("GOMAXPROCS = %d with GOMAXPROCS set in the environment, want %d untouched", got, wide)
	}
}
