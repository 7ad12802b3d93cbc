package bulkonboard

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Summary counts results by status.
type Summary struct {
	Onboarded, Already, Failed int
}

// Summarize counts rs.
func Summarize(rs []Result) Summary {
	var s Summary
	for _, r := range rs {
		switch r.Status {
		case StatusOnboarded:
			s.Onboarded++
		case StatusAlready:
			s.Already++
		default:
			s.Failed++
		}
	}
	return s
}

// WriteTable prints one row per host (inventory order) and, when some
// failed, how to finish them.
func WriteTable(w io.Writer, rs []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LINE\tHOST\tSTATUS\tNODE\tAGENT\tTOOK\tERROR")
	for _, r := range rs {
		agent := "present"
		if r.CopiedAgent {
			agent = "copied"
		}
		if r.Status == StatusFailed && (r.Step == StepConnect || r.Step == StepCopy && !r.CopiedAgent) {
			agent = "-"
		}
		status := string(r.Status)
		if r.Step != "" {
			status += " (" + r.Step + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Line, r.Host, status, dash(r.Node), agent,
			(time.Duration(r.Seconds * float64(time.Second))).Round(100*time.Millisecond), dash(oneLine(r.Error)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := Summarize(rs)
	fmt.Fprintf(w, "%d onboarded, %d already onboarded, %d failed\n", s.Onboarded, s.Already, s.Failed)
	if s.Failed > 0 {
		fmt.Fprintln(
			w,
			"Fix what the ERROR column says and run the same command again: onboarded hosts are left as they are.",
		)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Progress draws a one-line progress bar (on a terminal), redrawn at every
// result: [#####.....] 5/10  4 ok  1 failed  12s.
type Progress struct {
	w            io.Writer
	total, width int
	done, failed int
	start        time.Time
}

// NewProgress returns a bar for total hosts on w.
func NewProgress(w io.Writer, total int) *Progress {
	p := &Progress{w: w, total: total, width: 30, start: time.Now()}
	p.draw()
	return p
}

// Add counts one finished host and redraws.
func (p *Progress) Add(r Result) {
	p.done++
	if r.Status == StatusFailed {
		p.failed++
	}
	p.draw()
}

// Finish ends the bar's line.
func (p *Progress) Finish() { fmt.Fprintln(p.w) }

func (p *Progress) draw() {
	filled := 0
	if p.total > 0 {
		filled = p.width * p.done / p.total
	}
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d  %d ok  %d failed  %s ",
		strings.Repeat("#", filled), strings.Repeat(".", p.width-filled), p.done, p.total,
		p.done-p.failed, p.failed, time.Since(p.start).Round(time.Second))
}
