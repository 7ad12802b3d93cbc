package mission

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Uplink is a site hub's session with its parent (site.Uplink): where
// missions from hubs above come from, and where their state goes up.
type Uplink interface {
	Path() string
	Ancestors() []string
	AddStatus(f func(st *siteproto.Status))
}

// Registrar takes missions as a kind of desired state (desired.Sync).
type Registrar interface {
	Register(k desired.Kind) error
}

// AtHub makes a hub's mission manager: it places the missions this hub
// holds on its own nodes (cfg.Where is set from up), takes them from the
// desired-state sync d, and reports their state up the uplink (nil on a
// hub without a parent). Jobs are attached by Start.
func AtHub(cfg Config, d Registrar, up Uplink) (*Manager, error) {
	self := cfg.HubID
	cfg.Where = func(origin string) (string, bool) { return "", origin == self }
	if up != nil {
		cfg.Where = func(origin string) (string, bool) { return RelativePath(self, origin, up.Path(), up.Ancestors()) }
	}
	m, err := New(cfg)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	if err := d.Register(desired.Kind{Name: Kind, Validate: ValidateSpec, Apply: m.Apply}); err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	if up != nil {
		up.AddStatus(func(st *siteproto.Status) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			m.FillStatus(ctx, st)
		})
	}
	return m, nil
}

// Start attaches the job engine, marks the runs a previous process left
// live as interrupted, then runs the manager until the returned stop is
// called.
func (m *Manager) Start(ctx context.Context, j Jobs) (stop func(), err error) {
	m.AttachJobs(j)
	if _, err := m.Recover(ctx); err != nil {
		return nil, fmt.Errorf("hub: missions: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })
	return func() { cancel(); wg.Wait() }, nil
}

// Ops is what /v1/missions does at a hub: the manager, with the
// desired-state sync that sends the missions created here down to the
// sites.
type Ops struct {
	M *Manager
	D Desired
}

// Create creates a mission at this hub.
func (a Ops) Create(ctx context.Context, req CreateRequest, by string) (Detail, error) {
	return a.M.Create(ctx, a.D, req, by)
}

// List lists the missions this hub holds.
func (a Ops) List(ctx context.Context) ([]Summary, error) { return a.M.List(ctx) }

// Get is one mission, by its origin and name.
func (a Ops) Get(ctx context.Context, origin, name string) (Detail, error) {
	return a.M.Get(ctx, origin, name)
}

// Delete deletes a mission created at this hub.
func (a Ops) Delete(ctx context.Context, name, by string) (siteproto.DesiredObject, error) {
	return a.M.Delete(ctx, a.D, name, by)
}
