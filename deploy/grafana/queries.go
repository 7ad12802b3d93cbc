package grafana

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
)

// grafanaIntervals are Grafana's built-in interval variables, with a value
// of the right shape for parsing.
var grafanaIntervals = map[string]string{
	"__rate_interval": "5m",
	"__interval":      "1m",
	"__range":         "1h",
}

// varRef is a variable reference in a query: $name, ${name}, ${name:format}
// or the deprecated [[name]].
var varRef = regexp.MustCompile(`\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]`)

// legendRef is a label a legend format names ({{label}}).
var legendRef = regexp.MustCompile(`\{\{\s*([^}\s]+)\s*\}\}`)

// labelValues is a query variable's label_values(SELECTOR, LABEL).
var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$`)

// CheckQueries parses every panel query and every query variable of the
// dashboard with the PromQL parser and returns every way one of them does
// not fit ex: a series that is not exported (including a histogram named
// without _bucket, _sum or _count), a label a series does not have in a
// matcher, a by/without/on/ignoring clause or a legend, rate() or increase()
// over a gauge, a histogram_quantile over no buckets or over an aggregation
// that drops le, and a variable the dashboard does not define.
func CheckQueries(d *Dashboard, ex *Exports) []error {
	var errs []error
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = "x"
		if v.Type == "interval" {
			vars[v.Name] = "5m"
		}
	}
	for _, p := range d.AllPanels() {
		for _, t := range p.Targets {
			c := &checker{ex: ex, where: fmt.Sprintf("panel %d %q query %s", p.ID, p.Title, t.RefID)}
			c.query(t.Expr, t.LegendFormat, vars)
			errs = append(errs, c.errs...)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		c := &checker{ex: ex, where: fmt.Sprintf("variable %q", v.Name)}
		c.variable(v.QueryText(), vars)
		errs = append(errs, c.errs...)
	}
	return errs
}

// CheckQuery checks one PromQL expression (with its legend format) as
// CheckQueries checks a panel's, with vars as the dashboard's variables.
func CheckQuery(expr, legend string, vars []string, ex *Exports) []error {
	vm := map[string]string{}
	for _, v := range vars {
		vm[v] = "x"
	}
	c := &checker{ex: ex, where: "query"}
	c.query(expr, legend, vm)
	return c.errs
}

type checker struct {
	ex    *Exports
	where string
	errs  []error
}

func (c *checker) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("%s: %s", c.where, fmt.Sprintf(format, args...)))
}

// expand replaces variable references with values of the right shape, and
// reports references to variables the dashboard does not define.
func (c *checker) expand(q string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(q, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		if name[0] >= '0' && name[0] <= '9' {
			return ref // a regular expression's group ($1), which Grafana leaves alone too
		}
		if v, ok := grafanaIntervals[name]; ok {
			return v
		}
		if v, ok := vars[name]; ok {
			return v
		}
		c.fail("uses $%s, which is neither a variable of the dashboard nor one of Grafana's intervals", name)
		return "x"
	})
}

func (c *checker) parse(q string, vars map[string]string) parser.Expr {
	e, err := parser.ParseExpr(c.expand(q, vars))
	if err != nil {
		c.fail("%q does not parse as PromQL: %v", q, err)
		return nil
	}
	return e
}

func (c *checker) query(q, legend string, vars map[string]string) {
	e := c.parse(q, vars)
	if e == nil {
		return
	}
	c.walk(e)
	if strings.HasPrefix(legend, "__") { // __auto: Grafana's own legend
		return
	}
	out, known := c.outLabels(e)
	if !known {
		return
	}
	for _, m := range legendRef.FindAllStringSubmatch(legend, -1) {
		if !out[m[1]] {
			c.fail("legend %q names {{%s}}, which the query's result does not carry (it has: %s)", legend, m[1], setString(out))
		}
	}
}

// variable checks a query variable: label_values(SELECTOR, LABEL),
// label_values(LABEL) or query_result(EXPR).
func (c *checker) variable(q string, vars map[string]string) {
	switch m := labelValues.FindStringSubmatch(q); {
	case m != nil:
		e := c.parse(m[1], vars)
		if e == nil {
			return
		}
		c.walk(e)
		if out, known := c.outLabels(e); known && !out[m[2]] {
			c.fail("label_values over %s asks for label %q, which it does not carry (it has: %s)", m[1], m[2], setString(out))
		}
	case strings.HasPrefix(strings.TrimSpace(q), "query_result("):
		inner := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(q), "query_result("), ")")
		if e := c.parse(inner, vars); e != nil {
			c.walk(e)
		}
	default:
		c.fail("query %q is not label_values(SELECTOR, LABEL) or query_result(EXPR), so it cannot be checked", q)
	}
}

// walk checks every selector, call, aggregation and vector matching in e.
func (c *checker) walk(e parser.Expr) {
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			c.selector(n)
		case *parser.Call:
			c.call(n)
		case *parser.AggregateExpr:
			avail, complete := c.labelsIn(n.Expr)
			for _, l := range n.Grouping {
				if !complete {
					break // a missing series is reported already; its labels are unknown
				}
				if !avail[l] {
					c.fail("%s %s (%s): no series under it has label %q (they have: %s)",
						n.Op, clause(n.Without, "without", "by"), strings.Join(n.Grouping, ", "), l, setString(avail))
				}
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				avail, lok := c.labelsIn(n.LHS)
				rhs, rok := c.labelsIn(n.RHS)
				maps.Copy(avail, rhs)
				for _, l := range append(slices.Clone(vm.MatchingLabels), vm.Include...) {
					if lok && rok && !avail[l] {
						c.fail("%s: matching on label %q, which neither side has", n.Op, l)
					}
				}
			}
		}
		return nil
	})
}

func clause(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}

// seriesName is the metric name a selector selects, "" if none.
func seriesName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == "__name__" && m.Type.String() == "=" {
			return m.Value
		}
	}
	return ""
}

func (c *checker) selector(vs *parser.VectorSelector) {
	name := seriesName(vs)
	if name == "" {
		c.fail("selector %s names no metric (select one by name, so it can be checked)", vs)
		return
	}
	s, ok := c.ex.Lookup(name)
	if !ok {
		c.fail("metric %s is not exported by the hub%s", name, c.ex.hint(name))
		return
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == "__name__" || s.Labels[m.Name] || slices.Contains(TargetLabels, m.Name) {
			continue
		}
		c.fail("metric %s has no label %q (it has: %s)", name, m.Name, strings.Join(s.labelsOf(), ", "))
	}
}

func (c *checker) call(n *parser.Call) {
	switch n.Func.Name {
	case "rate", "irate", "increase", "resets":
		ms, ok := unparen(n.Args[0]).(*parser.MatrixSelector)
		if !ok {
			return
		}
		vs, ok := ms.VectorSelector.(*parser.VectorSelector)
		if !ok {
			return
		}
		if s, ok := c.ex.Lookup(seriesName(vs)); ok && s.Kind != Counter {
			c.fail(
				"%s() over %s, which is a %s: plot it as it is, or use delta() or deriv()",
				n.Func.Name, seriesName(vs), s.Kind,
			)
		}
	case "histogram_quantile":
		arg := n.Args[1]
		buckets := false
		parser.Inspect(arg, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok && strings.HasSuffix(seriesName(vs), "_bucket") {
				buckets = true
			}
			return nil
		})
		if !buckets {
			c.fail("histogram_quantile over %s, which selects no _bucket series", arg)
			return
		}
		if out, known := c.outLabels(arg); known && !out["le"] {
			c.fail(
				"histogram_quantile over %s: the aggregation drops le, so there are no buckets left to compute a "+
					"quantile from (aggregate by (le, …))",
				arg,
			)
		}
	}
}

func unparen(e parser.Expr) parser.Expr {
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			return e
		}
		e = p.Expr
	}
}

// labelsIn is every label of every series e selects, target labels and
// labels made by label_replace and label_join included; complete is false
// if e selects a series that is not exported.
func (c *checker) labelsIn(e parser.Expr) (out map[string]bool, complete bool) {
	out, complete = map[string]bool{}, true
	for _, l := range TargetLabels {
		out[l] = true
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			if s, ok := c.ex.Lookup(seriesName(n)); ok {
				maps.Copy(out, s.Labels)
			} else {
				complete = false
			}
		case *parser.Call:
			if dst := madeLabel(n); dst != "" {
				out[dst] = true
			}
		}
		return nil
	})
	return out, complete
}

// madeLabel is the label a label_replace or label_join call writes.
func madeLabel(n *parser.Call) string {
	if (n.Func.Name == "label_replace" || n.Func.Name == "label_join") && len(n.Args) > 1 {
		if s, ok := unparen(n.Args[1]).(*parser.StringLiteral); ok {
			return s.Val
		}
	}
	return ""
}

// outLabels is the label names the result of e carries; known is false
// where the shape is beyond this analysis (the caller then checks nothing).
func (c *checker) outLabels(e parser.Expr) (out map[string]bool, known bool) {
	switch n := e.(type) {
	case *parser.ParenExpr:
		return c.outLabels(n.Expr)
	case *parser.UnaryExpr:
		return c.outLabels(n.Expr)
	case *parser.StepInvariantExpr:
		return c.outLabels(n.Expr)
	case *parser.SubqueryExpr:
		return c.outLabels(n.Expr)
	case *parser.MatrixSelector:
		return c.outLabels(n.VectorSelector)
	case *parser.NumberLiteral, *parser.StringLiteral:
		return map[string]bool{}, true
	case *parser.VectorSelector:
		s, ok := c.ex.Lookup(seriesName(n))
		if !ok {
			return nil, false // already reported
		}
		out = maps.Clone(s.Labels)
		for _, l := range TargetLabels {
			out[l] = true
		}
		return out, true
	case *parser.AggregateExpr:
		switch n.Op {
		case parser.TOPK, parser.BOTTOMK, parser.LIMITK, parser.LIMIT_RATIO:
			return c.outLabels(n.Expr)
		}
		if n.Without {
			if out, known = c.outLabels(n.Expr); !known {
				return nil, false
			}
			for _, l := range n.Grouping {
				delete(out, l)
			}
		} else {
			out, known = map[string]bool{}, true
			for _, l := range n.Grouping {
				out[l] = true
			}
		}
		if n.Op == parser.COUNT_VALUES {
			if s, ok := unparen(n.Param).(*parser.StringLiteral); ok {
				out[s.Val] = true
			}
		}
		return out, known
	case *parser.Call:
		switch n.Func.Name {
		case "histogram_quantile":
			if out, known = c.outLabels(n.Args[1]); known {
				delete(out, "le")
			}
			return out, known
		case "label_replace", "label_join":
			if out, known = c.outLabels(n.Args[0]); known {
				out[madeLabel(n)] = true
			}
			return out, known
		case "absent", "absent_over_time", "vector", "time", "scalar":
			return nil, false
		}
		for _, a := range n.Args {
			if t := a.Type(); t == parser.ValueTypeVector || t == parser.ValueTypeMatrix {
				return c.outLabels(a)
			}
		}
		return nil, false
	case *parser.BinaryExpr:
		lt, rt := n.LHS.Type(), n.RHS.Type()
		switch {
		case lt != parser.ValueTypeVector:
			return c.outLabels(n.RHS)
		case rt != parser.ValueTypeVector:
			return c.outLabels(n.LHS)
		}
		vm := n.VectorMatching
		if vm != nil && vm.On && vm.Card == parser.CardOneToOne {
			out = map[string]bool{}
			for _, l := range vm.MatchingLabels {
				out[l] = true
			}
			return out, true
		}
		side := n.LHS
		if vm != nil && vm.Card == parser.CardOneToMany {
			side = n.RHS
		}
		if out, known = c.outLabels(side); !known {
			return nil, false
		}
		if vm != nil {
			if !vm.On && vm.Card == parser.CardOneToOne {
				for _, l := range vm.MatchingLabels {
					delete(out, l)
				}
			}
			for _, l := range vm.Include {
				out[l] = true
			}
		}
		return out, true
	}
	return nil, false
}

func setString(s map[string]bool) string {
	if len(s) == 0 {
		return "no labels"
	}
	return strings.Join(slices.Sorted(maps.Keys(s)), ", ")
}
