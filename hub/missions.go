package hub

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/tunnel/control"
)

// setupDesired makes this hub's desired-state sync (hub/desired) and
// hooks it to the site protocol: objects from the parent arrive on the
// uplink (stored before they are acknowledged), and go on to this hub's
// own sites, each sent what it has not acknowledged whenever it connects.
// Kinds (missions, services) register on s.desired before Run starts the
// uplink and accepts sessions.
func (s *Server) setupDesired() error {
	var ancestors func() []string
	if u := s.uplink; u != nil {
		ancestors = u.Ancestors
	}
	var err error
	s.desired, err = desired.New(desired.Config{Store: s.store, HubID: s.ca.Pin(), Ancestors: ancestors,
		Logger: s.log.With("component", "desired")})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	s.desired.SetChildren(desiredChildren{s.children})
	s.children.OnConnect(func(_ context.Context, c site.Child) {
		s.desired.ChildConnected(desired.Child{Name: c.Name, ID: c.HubID})
	})
	s.children.Handle(control.TypeDesiredAck, func(ctx context.Context, c site.Child, m *control.Message) {
		if err := s.desired.HandleAck(ctx, desired.Child{Name: c.Name, ID: c.HubID}, m); err != nil {
			s.log.Error("record desired-state acknowledgements; the site is sent them again", "site", c.Name, "err", err)
		}
	})
	if u := s.uplink; u != nil {
		u.Handle(control.TypeDesired, func(ctx context.Context, m *control.Message) {
			if err := s.desired.HandleDesired(ctx, m, u.Send); err != nil {
				s.log.Warn("desired state from the parent", "err", err)
			}
		})
	}
	return nil
}

// desiredChildren adapts hub/site's Children to hub/desired.
type desiredChildren struct{ c *site.Children }

func (d desiredChildren) Connected() []desired.Child {
	var out []desired.Child
	for _, c := range d.c.List() {
		if c.Connected && c.HubID != "" {
			out = append(out, desired.Child{Name: c.Name, ID: c.HubID})
		}
	}
	return out
}

func (d desiredChildren) Send(ctx context.Context, name string, m *control.Message) error {
	return d.c.Send(ctx, name, m)
}

// newMissions makes the mission manager: it places the missions this hub
// holds on its own nodes, runs them with the job engine (kind
// mission.JobKind, attached in startMissions) and reports their state up.
func (s *Server) newMissions(connect jobs.Connector) (*mission.Manager, error) {
	self := s.ca.Pin()
	where := func(origin string) (string, bool) { return "", origin == self }
	if u := s.uplink; u != nil {
		where = func(origin string) (string, bool) { return mission.RelativePath(self, origin, u.Path(), u.Ancestors()) }
	}
	m, err := mission.New(mission.Config{Store: s.store, HubID: self, Where: where, Connect: connect, Online: s.online,
		Sites: s.missionSites, Logger: s.log.With("component", "missions"), Audit: s.audit})
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	if err := s.desired.Register(desired.Kind{Name: mission.Kind, Validate: mission.ValidateSpec, Apply: m.Apply}); err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	if u := s.uplink; u != nil {
		u.AddStatus(func(st *control.SiteStatus) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			m.FillStatus(ctx, st)
		})
	}
	return m, nil
}

// missionSites is the sites below this hub as missions read their state.
func (s *Server) missionSites() []mission.SiteView {
	children := s.children.List()
	out := make([]mission.SiteView, 0, len(children))
	for _, c := range children {
		out = append(out, mission.SiteView{Name: c.Name, Connected: c.Connected, Stale: c.Stale, StaleFor: c.StaleFor,
			LastHeartbeat: c.LastHeartbeat, Status: c.Status})
	}
	return out
}

// startMissions marks the runs a previous process left live as
// interrupted, then runs the mission manager and the desired-state sender
// until the returned stop is called.
func (s *Server) startMissions(ctx context.Context, m *mission.Manager, engine *jobs.Engine) (stop func(), err error) {
	m.AttachJobs(engine)
	if _, err := m.Recover(ctx); err != nil {
		return nil, fmt.Errorf("hub: missions: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })
	wg.Go(func() { s.desired.Run(ctx) })
	return func() { cancel(); wg.Wait() }, nil
}

// missionAPI serves /v1/missions.
type missionAPI struct {
	m *mission.Manager
	d *desired.Sync
}

func (a missionAPI) Create(ctx context.Context, req mission.CreateRequest, by string) (mission.Detail, error) {
	return a.m.Create(ctx, a.d, req, by)
}

func (a missionAPI) List(ctx context.Context) ([]mission.Summary, error) { return a.m.List(ctx) }

func (a missionAPI) Get(ctx context.Context, origin, name string) (mission.Detail, error) {
	return a.m.Get(ctx, origin, name)
}

func (a missionAPI) Delete(ctx context.Context, name, by string) (control.DesiredObject, error) {
	return a.m.Delete(ctx, a.d, name, by)
}
