package api

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/operator"
	"github.com/tether-dev/tether/hub/replica"
	"github.com/tether-dev/tether/hub/service"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/hub/upgrade"
)

// features are the features the hub serves, as registered on a hub that
// runs none of them (they answer 404): the routes they add.
func features(st store.Store) []route.Feature {
	return []route.Feature{
		operator.New(operator.Config{}),
		cluster.API{Store: st},
		&jobs.API{Store: st, Targets: Targets{Store: st}},
		&kubeone.API{},
		&mission.API{},
		site.API{},
		&service.API{Store: st},
		&upgrade.API{Store: st, Targets: Targets{Store: st}},
		replica.API{},
	}
}

// TestOpenAPIMatchesRoutes keeps openapi.yaml true: every served route is
// documented and every documented operation is served.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mux := NewHandler(Deps{Store: st, Metrics: metrics.New(), Features: features(st)}).(*routeMux)
	var served []string
	for _, p := range mux.patterns {
		if p != "/" { // the JSON 404 fallback
			served = append(served, p)
		}
	}
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                    `yaml:"openapi"`
		Paths   map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(served)
	slices.Sort(documented)
	for _, p := range served {
		if !slices.Contains(documented, p) {
			t.Errorf("route %q is served but not in openapi.yaml", p)
		}
	}
	for _, p := range documented {
		if !slices.Contains(served, p) {
			t.Errorf("openapi.yaml documents %q, which the hub does not serve", p)
		}
	}
}
