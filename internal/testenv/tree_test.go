package testenv

import (
	"reflect"
	"testing"
)

func TestParseSites(t *testing.T) {
	flat := SiteRow{Name: "region", Path: "region", Health: "healthy", Connected: true, NodesOnline: 2, NodesTotal: 2}
	tests := []struct {
		name string
		in   string
		want []SiteRow
		bad  bool
	}{
		{"empty list", `[]`, nil, false},
		{"flat", `[{"name":"region","path":"region","health":"healthy","connected":true,"nodes_online":2,"nodes_total":2}]`,
			[]SiteRow{flat}, false},
		{"nested, status apart",
			`{"sites":[{"name":"region","connected":true,"status":{"health":"degraded","nodes_online":1,"nodes_total":7},
			"sites":[{"name":"munich","health":"stale"},{"name":"berlin","health":"healthy"}]}]}`,
			[]SiteRow{
				{Name: "berlin", Path: "berlin.region", Health: "healthy"},
				{Name: "munich", Path: "munich.region", Health: "stale"},
				{Name: "region", Path: "region", Health: "degraded", Connected: true, NodesOnline: 1, NodesTotal: 7},
			}, false},
		{"flat and nested both name a site once", `[{"name":"region","sites":[{"name":"berlin"}]},{"path":"berlin.region"}]`,
			[]SiteRow{{Name: "berlin", Path: "berlin.region"}, {Name: "region", Path: "region"}}, false},
		{"children with stale and nested statuses", `[{"name":"region","path":"region","connected":false,"stale":true,
			"status":{"health":"healthy","nodes_online":1,"nodes_total":1,"sites":[` +
			`{"name":"berlin","connected":true,"status":{"health":"healthy","nodes_total":3,"nodes_online":3}}]}}]`,
			[]SiteRow{
				{Name: "berlin", Path: "berlin.region", Health: "healthy", Connected: true, NodesOnline: 3, NodesTotal: 3},
				{Name: "region", Path: "region", Health: "stale", NodesOnline: 1, NodesTotal: 1},
			}, false},
		{"not JSON", `NAME HEALTH`, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSites([]byte(tc.in))
			if (err != nil) != tc.bad {
				t.Fatalf("err = %v, want error %v", err, tc.bad)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestTreeNames(t *testing.T) {
	root := &TreeHub{Name: "root"}
	region := &TreeHub{Name: "region", Path: "region", Parent: root}
	berlin := &TreeHub{Name: "berlin", Path: "berlin.region", Parent: region}
	a := &TreeAgent{Name: "n1", Hub: berlin}
	if got := a.Path(); got != "n1.berlin.region" {
		t.Fatalf("agent path %q", got)
	}
	for _, tc := range []struct {
		h    *TreeHub
		path string
		want string
		ok   bool
	}{
		{root, "n1.berlin.region", "n1.berlin.region", true},
		{region, "n1.berlin.region", "n1.berlin", true},
		{berlin, "n1.berlin.region", "n1", true},
		{berlin, "n1.munich.region", "n1.munich.region", false},
	} {
		if got, ok := tc.h.Rel(tc.path); got != tc.want || ok != tc.ok {
			t.Errorf("%s.Rel(%q) = %q, %v; want %q, %v", tc.h.Name, tc.path, got, ok, tc.want, tc.ok)
		}
	}
	tr := &Tree{Hubs: []*TreeHub{root, region, berlin}}
	if !tr.below(berlin, root) || tr.below(root, berlin) || tr.below(region, region) {
		t.Fatal("below is wrong")
	}
}

func TestSumMetrics(t *testing.T) {
	text := "# HELP x y\n# TYPE x counter\nx{dir=\"in\"} 3\nx{dir=\"out\"} 4.5\ny 1e3\nbroken\nz{a=\"b c\"} 2\n"
	got := SumMetrics(text)
	want := map[string]float64{"x": 7.5, "y": 1000, "z": 2}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
