package grafana

import (
	"fmt"
	"io"
	"maps"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Kind says how PromQL may use a series: a Counter only goes up between
// resets (rate, increase), a Gauge is read as it is.
type Kind int

const (
	// Gauge is a gauge, an untyped metric or a summary's quantile series.
	Gauge Kind = iota
	// Counter is a counter, or a histogram's or summary's _bucket, _sum or
	// _count series.
	Counter
)

func (k Kind) String() string {
	if k == Counter {
		return "counter"
	}
	return "gauge"
}

// TargetLabels are the labels Prometheus adds to every series it scrapes.
var TargetLabels = []string{"job", "instance"}

// scrapeSeries are the series Prometheus itself records for every target
// (https://prometheus.io/docs/concepts/jobs_instances/): they carry only the
// target labels.
var scrapeSeries = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped",
	"scrape_samples_post_metric_relabeling", "scrape_series_added"}

// Series is a series name as Prometheus stores it, with the label names it
// was seen with (target labels excluded).
type Series struct {
	Kind   Kind
	Labels map[string]bool
}

// Exports is what a hub's /metrics exposes, by series name as PromQL
// selects it: a histogram tether_x_seconds is tether_x_seconds_bucket (with
// le), _sum and _count. It also holds Prometheus' own scrape series.
type Exports struct {
	series     map[string]*Series
	histograms map[string]bool // base names, to say which name to select instead
}

// NewExports returns the exports of a target that exposes nothing: only
// Prometheus' own scrape series.
func NewExports() *Exports {
	e := &Exports{series: map[string]*Series{}, histograms: map[string]bool{}}
	for _, n := range scrapeSeries {
		e.add(n, Gauge, nil)
	}
	return e
}

// ParseExposition reads a scrape in the Prometheus text format.
func ParseExposition(r io.Reader) (*Exports, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("grafana: parse the /metrics scrape: %w", err)
	}
	e := NewExports()
	for name, f := range fams {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		e.Declare(name, f.GetType(), slices.Collect(maps.Keys(labels))...)
	}
	return e, nil
}

// Declare records a metric family of the given type and label names as a
// scrape would show it. Tests use it for families a hub exports only once
// something has happened that the test cannot make happen; each use is a
// claim about the hub's code that no scrape has checked.
func (e *Exports) Declare(name string, typ dto.MetricType, labels ...string) {
	switch typ {
	case dto.MetricType_COUNTER:
		e.add(name, Counter, labels)
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		e.histograms[name] = true
		e.add(name+"_bucket", Counter, append(slices.Clone(labels), "le"))
		e.add(name+"_sum", Counter, labels)
		e.add(name+"_count", Counter, labels)
	case dto.MetricType_SUMMARY:
		e.add(name, Gauge, append(slices.Clone(labels), "quantile"))
		e.add(name+"_sum", Counter, labels)
		e.add(name+"_count", Counter, labels)
	default:
		e.add(name, Gauge, labels)
	}
}

func (e *Exports) add(name string, k Kind, labels []string) {
	s := e.series[name]
	if s == nil {
		s = &Series{Kind: k, Labels: map[string]bool{}}
		e.series[name] = s
	}
	for _, l := range labels {
		s.Labels[l] = true
	}
}

// Lookup returns the series called name.
func (e *Exports) Lookup(name string) (*Series, bool) {
	s, ok := e.series[name]
	return s, ok
}

// Names is every series name, sorted.
func (e *Exports) Names() []string {
	return slices.Sorted(maps.Keys(e.series))
}

// labelsOf is the label names of a series, target labels included, sorted.
func (s *Series) labelsOf() []string {
	out := slices.Collect(maps.Keys(s.Labels))
	out = append(out, TargetLabels...)
	slices.Sort(out)
	return out
}

// hint says what the author of a query naming a missing series probably
// meant: the series of a histogram of that name, or the closest exported
// name.
func (e *Exports) hint(name string) string {
	if e.histograms[name] {
		return fmt.Sprintf(" (%s is a histogram: select %s_bucket, %s_sum or %s_count)", name, name, name, name)
	}
	best, bestD := "", len(name)/3+1
	for n := range e.series {
		if d := editDistance(name, n); d < bestD || (d == bestD && n < best) {
			best, bestD = n, d
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
