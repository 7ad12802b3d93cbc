package grafana

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestDashboardLayout: the committed dashboard is valid JSON, its panel ids
// are unique, its panels sit on the grid without overlapping, and each has
// a unit, a query and the ${DS_PROMETHEUS} variable.
func TestDashboardLayout(t *testing.T) {
	onDisk, err := os.ReadFile(File)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, DashboardJSON) {
		t.Fatalf("the embedded dashboard is not %s", File)
	}
	if !json.Valid(onDisk) {
		t.Fatalf("%s is not valid JSON", File)
	}
	d, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(d.CheckLayout()...); err != nil {
		t.Fatal(err)
	}
	if n := len(d.AllPanels()); n < 20 {
		t.Fatalf("the dashboard has %d panels; did it lose some?", n)
	}
}

// TestDashboardQueriesParse: every panel query of the committed dashboard is
// PromQL once Grafana's variables are in, and names only variables the
// dashboard defines. (Whether the names exist is the e2e test
// TestGrafanaDashboard's job, against a real hub's /metrics.)
func TestDashboardQueriesParse(t *testing.T) {
	d, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = "x"
	}
	n := 0
	for _, p := range d.AllPanels() {
		for _, tg := range p.Targets {
			c := &checker{ex: NewExports(), where: p.Title + " " + tg.RefID}
			c.parse(tg.Expr, vars)
			if err := errors.Join(c.errs...); err != nil {
				t.Error(err)
			}
			n++
		}
	}
	if n < 30 {
		t.Fatalf("only %d queries", n)
	}
}

// TestCheckLayoutFinds: each kind of layout mistake is reported.
func TestCheckLayoutFinds(t *testing.T) {
	cases := []struct {
		name   string
		change func(d map[string]any)
		want   string
	}{
		{"duplicate id", func(d map[string]any) { panel(d, 3)["id"] = panel(d, 2)["id"] }, "is also panel"},
		{"zero id", func(d map[string]any) { panel(d, 2)["id"] = 0 }, "positive integer"},
		{"overlap", func(d map[string]any) { panel(d, 3)["gridPos"] = panel(d, 2)["gridPos"] }, "overlaps panel"},
		{"off the grid", func(d map[string]any) { pos(d, 2)["x"] = 22.0 }, "off the 24-column grid"},
		{"no width", func(d map[string]any) { pos(d, 2)["w"] = 0.0 }, "off the 24-column grid"},
		{"no unit", func(d map[string]any) {
			delete(panel(d, 3)["fieldConfig"].(map[string]any)["defaults"].(map[string]any), "unit")
		}, "no unit"},
		{"fixed datasource", func(d map[string]any) {
			panel(d, 3)["datasource"] = map[string]any{"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
		}, "is not the ${DS_PROMETHEUS} variable"},
		{"query with a fixed datasource", func(d map[string]any) {
			panel(d, 3)["targets"].([]any)[0].(map[string]any)["datasource"] = map[string]any{"type": "prometheus", "uid": "abc"}
		}, "query A: datasource"},
		{"variable with a fixed datasource", func(d map[string]any) {
			d["templating"].(map[string]any)["list"].([]any)[1].(map[string]any)["datasource"] = map[string]any{
				"type": "prometheus",
				"uid":  "abc",
			}
		}, `variable "job": datasource`},
		{"no query", func(d map[string]any) { panel(d, 3)["targets"] = []any{} }, "no query"},
		{"empty expression", func(d map[string]any) {
			panel(d, 3)["targets"].([]any)[0].(map[string]any)["expr"] = " "
		}, "has no expression"},
		{"import input", func(d map[string]any) {
			d["__inputs"] = []any{map[string]any{"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}}
		}, `import input "DS_PROMETHEUS"`},
		{"no datasource variable", func(d map[string]any) {
			d["templating"].(map[string]any)["list"].([]any)[0].(map[string]any)["name"] = "ds"
		}, `no variable "DS_PROMETHEUS"`},
		{"collapsed row's panel overlapping", func(d map[string]any) {
			row := panel(d, 0)
			row["collapsed"] = true
			row["panels"] = []any{map[string]any{"id": 999.0, "type": "stat", "title": "hidden",
				"gridPos": pos(d, 2), "datasource": panel(d, 2)["datasource"],
				"fieldConfig": panel(d, 2)["fieldConfig"], "targets": panel(d, 2)["targets"]}}
		}, `overlaps panel 999 "hidden"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(DashboardJSON, &m); err != nil {
				t.Fatal(err)
			}
			tc.change(m)
			b, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			d, err := Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			err = errors.Join(d.CheckLayout()...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := Parse([]byte(`{"panels": [`)); err == nil {
		t.Fatal("truncated JSON parsed")
	}
}

func panel(d map[string]any, i int) map[string]any { return d["panels"].([]any)[i].(map[string]any) }
func pos(d map[string]any, i int) map[string]any {
	return panel(d, i)["gridPos"].(map[string]any)
}

// scrape is a /metrics answer in the shape the hub's has: a labelled
// gauge and counter, an unlabelled gauge, a histogram and a summary.
const scrape = `# HELP tether_nodes_connected Nodes with a live tunnel, by transport.
# TYPE tether_nodes_connected gauge
tether_nodes_connected{transport="quic"} 1
tether_nodes_connected{transport="tcp"} 0
# HELP tether_joins_total Join requests, by result.
# TYPE tether_joins_total counter
tether_joins_total{result="ok"} 2
# HELP tether_streams_active Streams to nodes currently relaying.
# TYPE tether_streams_active gauge
tether_streams_active 0
# HELP tether_tunnel_handshake_duration_seconds Time from session accept to the node being registered.
# TYPE tether_tunnel_handshake_duration_seconds histogram
tether_tunnel_handshake_duration_seconds_bucket{transport="quic",le="0.001"} 0
tether_tunnel_handshake_duration_seconds_bucket{transport="quic",le="+Inf"} 1
tether_tunnel_handshake_duration_seconds_sum{transport="quic"} 0.01
tether_tunnel_handshake_duration_seconds_count{transport="quic"} 1
# HELP go_gc_duration_seconds A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 1e-05
go_gc_duration_seconds_sum 0.001
go_gc_duration_seconds_count 3
`

// TestCheckQuery: what a query may and may not say about the exports. The
// "misspelled metric" case is the mistake the dashboard test exists for.
func TestCheckQuery(t *testing.T) {
	ex, err := ParseExposition(strings.NewReader(scrape))
	if err != nil {
		t.Fatal(err)
	}
	vars := []string{"job", "instance", DatasourceVar}
	const sel = `{job=~"$job",instance=~"$instance"}`
	cases := []struct {
		name, expr, legend string
		want               string // "" = no error
	}{
		{"gauge by label", `sum by (transport) (tether_nodes_connected` + sel + `)`, "{{transport}}", ""},
		{"counter rate", `sum by (result) (rate(tether_joins_total` + sel + `[$__rate_interval]))`, "{{result}}", ""},
		{"quantile",
			`histogram_quantile(0.9, sum by (le, transport) ` +
				`(rate(tether_tunnel_handshake_duration_seconds_bucket` + sel + `[$__rate_interval])))`,
			"p90 {{transport}}", ""},
		{"histogram mean",
			`rate(tether_tunnel_handshake_duration_seconds_sum[5m]) / ` +
				`rate(tether_tunnel_handshake_duration_seconds_count[5m])`,
			"{{transport}} {{instance}}", ""},
		{"summary", `max(go_gc_duration_seconds{quantile="0"})`, "", ""},
		{"unlabelled gauge", `tether_streams_active` + sel, "{{instance}}", ""},
		{"scrape series", `sum(up` + sel + `)`, "", ""},
		{"name matcher", `{__name__="tether_streams_active"}`, "", ""},
		{"without", `sum without (instance) (tether_nodes_connected)`, "{{transport}} {{job}}", ""},
		{"label_replace", `sum by (t) (label_replace(tether_nodes_connected, "t", "$1", "transport", "(.*)"))`, "{{t}}", ""},
		{"vector matching", `tether_nodes_connected / on (instance) group_left () tether_streams_active`,
			"{{transport}}", ""},

		{"misspelled metric", `sum(tether_node_connected` + sel + `)`, "",
			"metric tether_node_connected is not exported by the hub (did you mean tether_nodes_connected?)"},
		{"misspelled in rate", `rate(tether_join_total[5m])`, "", "metric tether_join_total is not exported"},
		{"histogram by its base name", `rate(tether_tunnel_handshake_duration_seconds[5m])`, "",
			"is a histogram: select tether_tunnel_handshake_duration_seconds_bucket"},
		{"bucket of a counter", `rate(tether_joins_total_bucket[5m])`, "",
			"metric tether_joins_total_bucket is not exported"},
		{"unknown label matcher", `tether_joins_total{transport="quic"}`, "",
			`metric tether_joins_total has no label "transport" (it has: instance, job, result)`},
		{"unknown by label", `sum by (state) (tether_nodes_connected)`, "", `no series under it has label "state"`},
		{"unknown without label", `sum without (sate) (tether_nodes_connected)`, "", `no series under it has label "sate"`},
		{"unknown on label", `tether_nodes_connected / on (node) tether_streams_active`, "",
			`matching on label "node", which neither side has`},
		{"rate of a gauge", `rate(tether_nodes_connected[5m])`, "", "rate() over tether_nodes_connected, which is a gauge"},
		{"quantile dropping le",
			`histogram_quantile(0.9, sum by (transport) (rate(tether_tunnel_handshake_duration_seconds_bucket[5m])))`,
			"", "the aggregation drops le"},
		{"quantile over no buckets", `histogram_quantile(0.9, rate(tether_joins_total[5m]))`, "",
			"selects no _bucket series"},
		{"legend label dropped by sum", `sum(tether_nodes_connected)`, "{{transport}}",
			`legend "{{transport}}" names {{transport}}`},
		{"legend label of no series", `sum by (transport) (tether_nodes_connected)`, "{{result}}", "names {{result}}"},
		{"undefined variable", `tether_nodes_connected{job=~"$cluster"}`, "", "uses $cluster, which is neither a variable"},
		{"no name", `{transport="quic"}`, "", "names no metric"},
		{"not PromQL", `sum by (transport (tether_nodes_connected)`, "", "does not parse as PromQL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := errors.Join(CheckQuery(tc.expr, tc.legend, vars, ex)...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestCheckQueryOneErrorPerMistake: a misspelled metric under an
// aggregation is one error, not one more for each label its (unknown) series
// would have.
func TestCheckQueryOneErrorPerMistake(t *testing.T) {
	ex, err := ParseExposition(strings.NewReader(scrape))
	if err != nil {
		t.Fatal(err)
	}
	errs := CheckQuery(`sum by (transport) (tether_node_connected) / on (transport) tether_node_connected`,
		"{{transport}}", nil, ex)
	if len(errs) != 2 { // one per selector
		t.Fatalf("%d errors, want 2: %v", len(errs), errors.Join(errs...))
	}
}

// TestCheckQueriesVariables: query variables are checked like panel
// queries, and a panel's error names the panel.
func TestCheckQueriesVariables(t *testing.T) {
	ex, err := ParseExposition(strings.NewReader(scrape))
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse([]byte(`{"uid": "u", "title": "t",
	  "templating": {"list": [
	    {"name": "job", "type": "query", "query": "label_values(tether_nodes_connected, job)"},
	    {"name": "transport", "type": "query", "query": {"query": ` +
		`"label_values(tether_nodes_connected{job=~\"$job\"}, transport)"}},
	    {"name": "bad1", "type": "query", "query": "label_values(tether_nodes_conected, instance)"},
	    {"name": "bad2", "type": "query", "query": "label_values(tether_joins_total, transport)"},
	    {"name": "bad3", "type": "query", "query": "metrics(tether_.*)"}
	  ]},
	  "panels": [{"id": 7, "type": "timeseries", "title": "Joins", "targets": [
	    {"refId": "A", "expr": "sum by (result) (rate(tether_joins_total{transport=\"x\"}[$__rate_interval]))", ` +
		`"legendFormat": "{{result}}"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := errors.Join(CheckQueries(d, ex)...)
	if got == nil {
		t.Fatal("no errors")
	}
	for _, want := range []string{
		`variable "bad1": metric tether_nodes_conected is not exported`,
		`variable "bad2": label_values over tether_joins_total asks for label "transport"`,
		`variable "bad3": query "metrics(tether_.*)" is not label_values`,
		`panel 7 "Joins" query A: metric tether_joins_total has no label "transport"`,
	} {
		if !strings.Contains(got.Error(), want) {
			t.Errorf("errors lack %q:\n%v", want, got)
		}
	}
	if n := strings.Count(got.Error(), "\n") + 1; n != 4 {
		t.Errorf("%d errors, want 4:\n%v", n, got)
	}
}

// TestParseExposition: histograms become their three series, summaries
// their quantile series plus _sum and _count, and label names are kept.
func TestParseExposition(t *testing.T) {
	ex, err := ParseExposition(strings.NewReader(scrape))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		kind   Kind
		labels string
	}{
		"tether_nodes_connected":                          {Gauge, "instance, job, transport"},
		"tether_joins_total":                              {Counter, "instance, job, result"},
		"tether_tunnel_handshake_duration_seconds_bucket": {Counter, "instance, job, le, transport"},
		"tether_tunnel_handshake_duration_seconds_sum":    {Counter, "instance, job, transport"},
		"tether_tunnel_handshake_duration_seconds_count":  {Counter, "instance, job, transport"},
		"go_gc_duration_seconds":                          {Gauge, "instance, job, quantile"},
		"go_gc_duration_seconds_count":                    {Counter, "instance, job"},
		"up":                                              {Gauge, "instance, job"},
	} {
		s, ok := ex.Lookup(name)
		if !ok {
			t.Errorf("%s missing from %v", name, ex.Names())
			continue
		}
		if got := strings.Join(s.labelsOf(), ", "); s.Kind != want.kind || got != want.labels {
			t.Errorf("%s: %s with labels %s, want %s with %s", name, s.Kind, got, want.kind, want.labels)
		}
	}
	if _, ok := ex.Lookup("tether_tunnel_handshake_duration_seconds"); ok {
		t.Error("a histogram's base name is not a series")
	}
	if _, err := ParseExposition(strings.NewReader("tether_x{a=\"b\" 1\n")); err == nil {
		t.Error("a broken scrape parsed")
	}
}

// FuzzCheckQuery: no expression or legend makes the checker panic, whatever
// the parser accepts.
func FuzzCheckQuery(f *testing.F) {
	ex, err := ParseExposition(strings.NewReader(scrape))
	if err != nil {
		f.Fatal(err)
	}
	// Seeds: the shapes the dashboard uses, and the corners of outLabels
	// (vector matching, count_values, label_replace, subqueries, scalars).
	for _, s := range []string{
		`histogram_quantile(0.9, sum by (le, transport) ` +
			`(rate(tether_tunnel_handshake_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`,
		`sum by (result) (rate(tether_joins_total[5m]))`,
		`tether_nodes_connected * on (instance) group_right (transport) tether_streams_active`,
		`count_values("v", tether_nodes_connected)`,
		`label_join(tether_nodes_connected, "x", ",", "transport")`,
		`max_over_time(rate(tether_joins_total[1m])[5m:1m])`,
		`-scalar(tether_streams_active) + 1`,
		`topk(3, tether_nodes_connected) or absent(up)`,
		`{__name__=~"tether_.*"}`,
	} {
		f.Add(s, "{{transport}}")
	}
	f.Fuzz(func(t *testing.T, expr, legend string) {
		CheckQuery(expr, legend, []string{"job", "instance"}, ex)
	})
}
