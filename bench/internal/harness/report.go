package harness

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Row is one measurement with its same-run reference.
type Row struct {
	ID      string // P1..P7
	What    string // what was measured
	Value   string // tether's figure, with unit
	Ref     string // the reference measured in the same run ("" if none)
	Ratio   string // Value/Ref, or another comparison
	Target  string
	Met     string // "yes", "no", "" (no target)
	Comment string
}

// Report collects the rows of a run.
type Report struct {
	Title string
	Rows  []Row
	Notes []string
	Out   io.Writer // rows are printed here as they come (nil: stdout)
	head  bool
}

const tableHead = "| id | measurement | tether | reference (same run) | ratio | target | met |\n" +
	"|---|---|---|---|---|---|---|\n"

// Add records a row and prints it at once.
func (r *Report) Add(row Row) {
	r.Rows = append(r.Rows, row)
	w := r.Out
	if w == nil {
		w = os.Stdout
	}
	if !r.head {
		fmt.Fprint(w, tableHead)
		r.head = true
	}
	fmt.Fprint(w, row.markdown())
}

// Note records a line printed under the table.
func (r *Report) Note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	r.Notes = append(r.Notes, n)
	w := r.Out
	if w == nil {
		w = os.Stdout
	}
	fmt.Fprintln(w, "  note: "+n)
}

func (row Row) markdown() string {
	dash := func(s string) string {
		if s == "" {
			return "—"
		}
		return s
	}
	what := row.What
	if row.Comment != "" {
		what += " (" + row.Comment + ")"
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s |\n", row.ID, what, row.Value, dash(row.Ref),
		dash(row.Ratio), dash(row.Target), dash(row.Met))
}

// Markdown is the whole report with the machine description.
func (r *Report) Markdown(machine string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n## %s — %s (%s)\n\n%s\n\n", r.Title, time.Now().UTC().Format("2006-01-02T15:04Z"),
		gitRev(), machine)
	b.WriteString(tableHead)
	for _, row := range r.Rows {
		b.WriteString(row.markdown())
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range r.Notes {
			b.WriteString("- " + n + "\n")
		}
	}
	return b.String()
}

// AppendTo appends the report to path (bench/RESULTS.md).
func (r *Report) AppendTo(path, machine string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("harness: results file: %w", err)
	}
	defer f.Close()
	_, err = f.WriteString(r.Markdown(machine))
	return err
}

// Machine describes this machine: cores, memory, kernel, Go and OpenSSH
// versions, and the load average at start (other work on the machine makes
// numbers noisy; the load says how much there was).
func Machine() string {
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	sshv := "?"
	if out, err := exec.Command("ssh", "-V").CombinedOutput(); err == nil {
		sshv = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("machine: %d cores (%s), %s RAM, kernel %s, %s, %s; load average at start %s",
		runtime.NumCPU(), cpu, mem, kernel, goVersion(), sshv, load)
}

func goVersion() string {
	if out, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	return runtime.Version()
}

func gitRev() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown rev"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command(
		"git", "status", "--porcelain", "--untracked-files=no",
	).Output(); err == nil && len(st) > 0 {
		rev += "-dirty"
	}
	return rev
}

// LoadAvg1 is the 1-minute load average.
func LoadAvg1() float64 {
	var l float64
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscanf(string(b), "%f", &l)
	}
	return l
}

// Ratio formats a/b with two decimals ("—" when b is 0).
func Ratio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// YesNo formats a target check.
func YesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
