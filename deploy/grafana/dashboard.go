// Package grafana holds the Grafana dashboard for the hub's Prometheus
// metrics (tether-hub.json, embedded here so tests read the file that ships)
// and the checks that keep it importable and true to what the hub exports:
// the layout (unique panel ids, a grid without overlaps, a unit and a query
// on every panel, the data source as a variable) and every query, parsed with
// Prometheus' own PromQL parser and held to the metric and label names of a
// real scrape of /metrics. Nothing in the binaries links this package.
package grafana

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strings"
)

// File is the dashboard's file name in this directory.
const File = "tether-hub.json"

// DashboardJSON is deploy/grafana/tether-hub.json.
//
//go:embed tether-hub.json
var DashboardJSON []byte

// DatasourceVar is the dashboard variable (of type datasource) every panel
// and query takes its Prometheus from. A variable rather than an import
// input (__inputs): Grafana resolves inputs only in its import dialog, so a
// dashboard loaded by file provisioning would look for a data source
// literally called ${DS_PROMETHEUS}; a variable works both ways, starts on
// the default Prometheus and can be switched on the dashboard.
const DatasourceVar = "DS_PROMETHEUS"

// gridWidth is Grafana's fixed number of grid columns.
const gridWidth = 24

// Dashboard is the part of a Grafana dashboard model the checks read.
type Dashboard struct {
	Inputs     []Input    `json:"__inputs"`
	UID        string     `json:"uid"`
	Title      string     `json:"title"`
	Panels     []Panel    `json:"panels"`
	Templating Templating `json:"templating"`
}

// Input is an import input (`__inputs`): Grafana's import dialog asks for
// it and substitutes ${NAME} in the dashboard. This dashboard has none (see
// DatasourceVar).
type Input struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	PluginID string `json:"pluginId"`
}

// Templating holds the dashboard variables.
type Templating struct {
	List []Variable `json:"list"`
}

// Variable is a dashboard variable.
type Variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"` // datasource, query, custom, interval, …
	Query      json.RawMessage `json:"query"`
	Datasource *Datasource     `json:"datasource"`
}

// QueryText is the variable's query: Grafana stores it as a string or, in
// newer versions, as an object with a "query" field.
func (v Variable) QueryText() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.Query, &o)
	return o.Query
}

// Datasource names a data source by type and uid (here always the
// ${DS_PROMETHEUS} variable).
type Datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// GridPos is a panel's place on the 24-column grid, in grid units.
type GridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

// Panel is a dashboard panel; rows are panels of type "row" whose Panels
// hold what they contain while collapsed.
type Panel struct {
	ID          int          `json:"id"`
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	GridPos     GridPos      `json:"gridPos"`
	Datasource  *Datasource  `json:"datasource"`
	FieldConfig *FieldConfig `json:"fieldConfig"`
	Targets     []Target     `json:"targets"`
	Panels      []Panel      `json:"panels"`
}

// FieldConfig holds the panel's field defaults (its unit).
type FieldConfig struct {
	Defaults struct {
		Unit string `json:"unit"`
	} `json:"defaults"`
}

// Target is one query of a panel.
type Target struct {
	RefID        string      `json:"refId"`
	Expr         string      `json:"expr"`
	LegendFormat string      `json:"legendFormat"`
	Datasource   *Datasource `json:"datasource"`
}

// Parse decodes a dashboard. Unknown fields are allowed (Grafana's model
// has many more than the checks read).
func Parse(b []byte) (*Dashboard, error) {
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("grafana: dashboard is not valid JSON: %w", err)
	}
	return &d, nil
}

// Load parses the embedded dashboard.
func Load() (*Dashboard, error) { return Parse(DashboardJSON) }

// AllPanels is every panel, rows' collapsed panels included, in file order.
func (d *Dashboard) AllPanels() []Panel {
	var out []Panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// Variable returns the dashboard variable called name.
func (d *Dashboard) Variable(name string) (Variable, bool) {
	for _, v := range d.Templating.List {
		if v.Name == name {
			return v, true
		}
	}
	return Variable{}, false
}

// CheckLayout returns every way the dashboard would import badly or draw
// wrongly: duplicate or missing panel ids, panels off the grid or on top of
// each other, a panel without a unit or a query, a panel or query that does
// not take its data source from the ${DS_PROMETHEUS} variable, a missing
// datasource variable, and an import input. A collapsed row's panels are laid
// out as if the row were open (as Grafana does on expanding it).
func (d *Dashboard) CheckLayout() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if d.UID == "" || d.Title == "" {
		bad("dashboard: uid and title must be set (uid %q, title %q)", d.UID, d.Title)
	}
	for _, in := range d.Inputs {
		bad(
			"dashboard: import input %q: Grafana's import dialog would replace ${%s} with a fixed data source, and "+
				"file provisioning would not resolve it at all; use the %s variable",
			in.Name, in.Name, DatasourceVar,
		)
	}
	if v, ok := d.Variable(DatasourceVar); !ok || v.Type != "datasource" || v.QueryText() != "prometheus" {
		bad("dashboard: no variable %q of type datasource over prometheus (got %+v)", DatasourceVar, v)
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" && !isVarDatasource(v.Datasource) {
			bad("variable %q: datasource %+v is not the ${%s} variable", v.Name, v.Datasource, DatasourceVar)
		}
	}
	seen := map[int]string{}
	var placed []Panel
	for _, p := range d.AllPanels() {
		name := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID <= 0 {
			bad("%s: id must be a positive integer", name)
		} else if other, dup := seen[p.ID]; dup {
			bad("%s: id %d is also panel %q's", name, p.ID, other)
		}
		seen[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > gridWidth {
			bad("%s: gridPos %+v is off the %d-column grid", name, g, gridWidth)
		}
		for _, q := range placed {
			if overlaps(g, q.GridPos) {
				bad("%s: gridPos %+v overlaps panel %d %q at %+v", name, g, q.ID, q.Title, q.GridPos)
			}
		}
		placed = append(placed, p)
		if p.Type == "row" {
			continue
		}
		if p.Title == "" {
			bad("%s: no title", name)
		}
		if p.FieldConfig == nil || p.FieldConfig.Defaults.Unit == "" {
			bad("%s: no unit (fieldConfig.defaults.unit)", name)
		}
		if !isVarDatasource(p.Datasource) {
			bad("%s: datasource %+v is not the ${%s} variable", name, p.Datasource, DatasourceVar)
		}
		if len(p.Targets) == 0 {
			bad("%s: no query", name)
		}
		refs := map[string]bool{}
		for _, t := range p.Targets {
			if strings.TrimSpace(t.Expr) == "" {
				bad("%s: query %s has no expression", name, t.RefID)
			}
			if t.RefID == "" || refs[t.RefID] {
				bad("%s: query refId %q is empty or repeated", name, t.RefID)
			}
			refs[t.RefID] = true
			if t.Datasource != nil && !isVarDatasource(t.Datasource) {
				bad("%s: query %s: datasource %+v is not the ${%s} variable", name, t.RefID, t.Datasource, DatasourceVar)
			}
		}
	}
	return errs
}

func isVarDatasource(ds *Datasource) bool {
	return ds != nil && ds.Type == "prometheus" && (ds.UID == "${"+DatasourceVar+"}" || ds.UID == "$"+DatasourceVar)
}

func overlaps(a, b GridPos) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}
