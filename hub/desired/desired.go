// Package desired keeps desired state in step down the tree of hubs: the
// objects an operator creates at one hub (missions, services) reach every
// site below it, and each site does its part of them even while its uplink
// is down.
//
// The rules that make a reconnect safe (a pull-mode agent that deleted
// everything on a member when it reconnected is the failure to avoid):
//
//   - A site stores an object durably, in one transaction, before it
//     acknowledges it; a parent re-sends whatever a child has not
//     acknowledged whenever the child connects, so an object lost in
//     flight, or stored but not acknowledged because the site died in
//     between, arrives again.
//   - A generation at or below the stored one changes nothing and is
//     acknowledged again: a re-send never re-runs work.
//   - Only a tombstone (a newer generation with Deleted set) removes an
//     object. A site never removes anything because its parent did not
//     mention it.
//   - A site takes objects only from its uplink, and only those whose
//     origin is one of its ancestors; it passes every object it holds on
//     to its own sites (placement is the kind's business, applied where
//     the object lands).
//
// Kinds register what they are (Kind): how to validate a spec and what to
// do after a new generation was stored. Objects of a kind this hub does not
// know are stored, acknowledged and passed on all the same.
package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Sentinel errors callers branch on.
var (
	// ErrUnknownKind: Put or Delete of a kind no one registered.
	ErrUnknownKind = errors.New("desired: unknown kind")
	// ErrInvalid wraps a kind's spec validation error.
	ErrInvalid = errors.New("desired: invalid spec")
	// ErrNotFound: no such object (Delete, Get).
	ErrNotFound = store.ErrNotFound
)

// Kind is what a kind of desired object registers.
type Kind struct {
	// Name is the DesiredObject.Kind ("mission", "service").
	Name string
	// Validate checks a spec, at the origin before it is stored and at a
	// site before it is stored there (a spec a site refuses is not
	// acknowledged, so the parent offers it again on the next connect: a
	// site upgraded since takes it then). nil accepts any spec.
	Validate func(spec json.RawMessage) error
	// Apply is called after a new generation of an object of this kind
	// (or its tombstone) was committed to this hub's store: at the origin
	// after Put or Delete, at a site after it stored what its parent sent.
	// It must not block for long (start work and return). It is not
	// replayed at start: a kind reads List at start for the objects it
	// holds, which covers a hub that died between the store and Apply.
	// nil: nothing to do here.
	Apply func(ctx context.Context, o siteproto.DesiredObject)
}

// Child is one child site, as the parent side of the site protocol sees it.
type Child struct {
	// Name is the site's name under this hub (what Children.Send takes).
	Name string
	// ID keys the site's acknowledgements: its hub ID, so a different hub
	// that later joins under the same name inherits nothing.
	ID string
}

// Children is the parent side of the site protocol (hub/site's Children,
// adapted by the hub's wiring).
type Children interface {
	// Connected lists the child sites whose session is up now.
	Connected() []Child
	// Send sends m on the site's control stream; an error when the site
	// is not connected.
	Send(ctx context.Context, site string, m *control.Message) error
}

// Config is what a Sync works with.
type Config struct {
	// Store holds the objects and the children's acknowledgements.
	Store store.DesiredStore
	// HubID is this hub's ID: the Origin of the objects created here.
	HubID string
	// Ancestors returns the hub IDs above this hub, parent first (from
	// the uplink's welcome); objects from the uplink are taken only from
	// those origins. nil (a root) refuses every object from above.
	Ancestors func() []string
	// ResendInterval is how often objects sent to a connected child but
	// not acknowledged are sent again (default 1 minute); a reconnect
	// re-sends at once.
	ResendInterval time.Duration
	Logger         *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Sync is one hub's desired state: the origin side (Put, Delete), the
// site side (HandleDesired) and the parent side (ChildConnected,
// HandleAck, Run).
type Sync struct {
	cfg  Config
	kick chan struct{}

	mu       sync.Mutex // guards the following fields
	kinds    map[string]Kind
	children Children
	// sent holds, per child ID, the generation of each object sent on
	// the child's current connection and not yet acknowledged.
	sent map[string]map[objKey]int64
}

type objKey struct{ kind, origin, name string }

func keyOf(o siteproto.DesiredObject) objKey { return objKey{o.Kind, o.Origin, o.Name} }

// New returns a Sync; Run sends to the children.
func New(cfg Config) (*Sync, error) {
	if cfg.Store == nil {
		return nil, errors.New("desired: Config.Store is required")
	}
	if cfg.HubID == "" {
		return nil, errors.New("desired: Config.HubID is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ResendInterval <= 0 {
		cfg.ResendInterval = time.Minute
	}
	return &Sync{cfg: cfg, kick: make(chan struct{}, 1), kinds: map[string]Kind{},
		sent: map[string]map[objKey]int64{}}, nil
}

// HubID is this hub's ID, the origin of objects created here.
func (s *Sync) HubID() string { return s.cfg.HubID }

// Register adds a kind; call it before the hub serves (before Run and the
// first HandleDesired).
func (s *Sync) Register(k Kind) error {
	if err := siteproto.ValidLabel("kind", k.Name); err != nil {
		return fmt.Errorf("desired: register: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.kinds[k.Name]; ok {
		return fmt.Errorf("desired: kind %q registered twice", k.Name)
	}
	s.kinds[k.Name] = k
	return nil
}

func (s *Sync) kind(name string) (Kind, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.kinds[name]
	return k, ok
}

// Put creates or changes the object kind/name originating at this hub: a
// spec different from the stored one is stored as the next generation,
// applied here and sent to the children. It returns the stored object and
// whether it changed (an identical spec changes nothing).
func (s *Sync) Put(
	ctx context.Context, kind, name string, spec json.RawMessage,
) (siteproto.DesiredObject, bool, error) {
	k, ok := s.kind(kind)
	if !ok {
		return siteproto.DesiredObject{}, false, fmt.Errorf("%w %q", ErrUnknownKind, kind)
	}
	if err := siteproto.ValidLabel(kind+" name", name); err != nil {
		return siteproto.DesiredObject{}, false, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(spec) == 0 || len(spec) > siteproto.MaxDesiredSpec {
		return siteproto.DesiredObject{}, false,
			fmt.Errorf("%w: %s %s: spec of %d bytes (want 1..%d)", ErrInvalid, kind, name, len(spec), siteproto.MaxDesiredSpec)
	}
	if k.Validate != nil {
		if err := k.Validate(spec); err != nil {
			return siteproto.DesiredObject{}, false, fmt.Errorf("%w: %s %s: %w", ErrInvalid, kind, name, err)
		}
	}
	o, changed, err := s.cfg.Store.BumpDesired(ctx, kind, s.cfg.HubID, name, spec, false, s.cfg.Now())
	if err != nil {
		return siteproto.DesiredObject{}, false, err
	}
	if changed {
		s.applied(ctx, k, o)
	}
	return o, changed, nil
}

// Delete stores a tombstone for kind/name of this hub at the next
// generation, applies it here and sends it to the children
// (ErrNotFound if there is no such object; deleting a tombstone again
// changes nothing).
func (s *Sync) Delete(ctx context.Context, kind, name string) (siteproto.DesiredObject, error) {
	k, ok := s.kind(kind)
	if !ok {
		return siteproto.DesiredObject{}, fmt.Errorf("%w %q", ErrUnknownKind, kind)
	}
	o, changed, err := s.cfg.Store.BumpDesired(ctx, kind, s.cfg.HubID, name, nil, true, s.cfg.Now())
	if err != nil {
		return siteproto.DesiredObject{}, err
	}
	if changed {
		s.applied(ctx, k, o)
	}
	return o, nil
}

// applied runs the kind's Apply for a stored generation and wakes the
// sender.
func (s *Sync) applied(ctx context.Context, k Kind, o siteproto.DesiredObject) {
	if k.Apply != nil {
		k.Apply(ctx, o)
	}
	s.Kick()
}

// Get returns one object this hub holds (tombstones included).
func (s *Sync) Get(ctx context.Context, kind, origin, name string) (store.DesiredRecord, error) {
	return s.cfg.Store.GetDesired(ctx, kind, origin, name)
}

// List returns the objects of kind this hub holds, tombstones included
// (Deleted set), whatever their origin.
func (s *Sync) List(ctx context.Context, kind string) ([]store.DesiredRecord, error) {
	return s.cfg.Store.ListDesired(ctx, kind)
}

// HandleDesired is the site side: m (TypeDesired) came from this hub's
// parent on its uplink. Each object is checked (an ancestor's origin, the
// kind's validation), stored if its generation is newer, and acknowledged
// with reply once stored; then the kinds apply what changed and the
// objects go on to this hub's own sites. An object refused is logged and
// not acknowledged.
func (s *Sync) HandleDesired(ctx context.Context, m *control.Message, reply func(*control.Message) error) error {
	var ancestors []string
	if s.cfg.Ancestors != nil {
		ancestors = s.cfg.Ancestors()
	}
	var (
		acks    []siteproto.DesiredAck
		changed []siteproto.DesiredObject
	)
	for _, o := range m.Desired {
		if !slices.Contains(ancestors, o.Origin) {
			s.cfg.Logger.Warn("desired object refused: its origin is not a hub above this one",
				"kind", o.Kind, "name", o.Name, "origin", o.Origin)
			continue
		}
		if k, ok := s.kind(o.Kind); ok && k.Validate != nil && !o.Deleted {
			if err := k.Validate(o.Spec); err != nil {
				s.cfg.Logger.Error("desired object refused: invalid spec; the parent offers it again on the next connect",
					"kind", o.Kind, "name", o.Name, "origin", o.Origin, "generation", o.Generation, "err", err)
				continue
			}
		}
		stored, err := s.cfg.Store.StoreDesired(ctx, o, s.cfg.Now())
		if err != nil {
			// Not acknowledged: the parent sends it again.
			s.cfg.Logger.Error("store desired object", "kind", o.Kind, "name", o.Name, "generation", o.Generation, "err", err)
			continue
		}
		acks = append(acks, siteproto.DesiredAck{Kind: o.Kind, Origin: o.Origin, Name: o.Name, Generation: o.Generation})
		if stored {
			changed = append(changed, o)
		}
	}
	var sendErr error
	if len(acks) > 0 {
		if sendErr = reply(&control.Message{Type: siteproto.TypeDesiredAck, DesiredAcks: acks}); sendErr != nil {
			sendErr = fmt.Errorf("desired: acknowledge %d objects: %w", len(acks), sendErr)
		}
	}
	for _, o := range changed {
		s.cfg.Logger.Info("desired object stored", "kind", o.Kind, "name", o.Name, "origin", o.Origin,
			"generation", o.Generation, "deleted", o.Deleted)
		if k, ok := s.kind(o.Kind); ok && k.Apply != nil {
			k.Apply(ctx, o)
		}
	}
	if len(changed) > 0 {
		s.Kick()
	}
	return sendErr
}

// SetChildren attaches the parent side; call it before Run.
func (s *Sync) SetChildren(c Children) {
	s.mu.Lock()
	s.children = c
	s.mu.Unlock()
	s.Kick()
}

// ChildConnected is called when a child site's session comes up: what it
// has not acknowledged is sent again.
func (s *Sync) ChildConnected(c Child) {
	s.mu.Lock()
	delete(s.sent, c.ID)
	s.mu.Unlock()
	s.Kick()
}

// HandleAck is the parent side: m (TypeDesiredAck) came from child c.
func (s *Sync) HandleAck(ctx context.Context, c Child, m *control.Message) error {
	if err := s.cfg.Store.AckDesired(ctx, c.ID, m.DesiredAcks); err != nil {
		return err
	}
	s.mu.Lock()
	if sent := s.sent[c.ID]; sent != nil {
		for _, a := range m.DesiredAcks {
			k := objKey{a.Kind, a.Origin, a.Name}
			if sent[k] <= a.Generation {
				delete(sent, k)
			}
		}
	}
	s.mu.Unlock()
	return nil
}

// Kick wakes the sender: something may be waiting for a child.
func (s *Sync) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run sends children what they have not acknowledged, on every Kick and
// every ResendInterval, until ctx ends.
func (s *Sync) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.ResendInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-t.C:
			// A child that took an object but whose ack never came (it
			// refused the spec, or an ack was lost) is offered it again.
			s.mu.Lock()
			clear(s.sent)
			s.mu.Unlock()
		}
		s.SendPending(ctx)
	}
}

// SendPending sends every connected child the objects it has not
// acknowledged and that were not sent on its current connection yet.
func (s *Sync) SendPending(ctx context.Context) {
	s.mu.Lock()
	children := s.children
	s.mu.Unlock()
	if children == nil {
		return
	}
	for _, c := range children.Connected() {
		if ctx.Err() != nil {
			return
		}
		if err := s.sendTo(ctx, children, c); err != nil {
			s.cfg.Logger.Warn("send desired state to site; sent again when it reconnects", "site", c.Name, "err", err)
		}
	}
}

// maxFrameSpecs bounds the spec bytes of one desired message, so a frame
// stays under control.MaxFrame.
const maxFrameSpecs = control.MaxFrame / 2

func (s *Sync) sendTo(ctx context.Context, children Children, c Child) error {
	objs, err := s.cfg.Store.UnackedDesired(ctx, c.ID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	sent := s.sent[c.ID]
	todo := objs[:0]
	for _, o := range objs {
		if sent == nil || sent[keyOf(o)] < o.Generation {
			todo = append(todo, o)
		}
	}
	s.mu.Unlock()
	for len(todo) > 0 {
		n, size := 0, 0
		for n < len(todo) && n < siteproto.MaxDesiredPerFrame && (n == 0 || size+len(todo[n].Spec) <= maxFrameSpecs) {
			size += len(todo[n].Spec)
			n++
		}
		frame := todo[:n]
		todo = todo[n:]
		// Recorded before the send: a reconnect during it clears the
		// record, so the new connection gets the frame again.
		s.mu.Lock()
		if s.sent[c.ID] == nil {
			s.sent[c.ID] = map[objKey]int64{}
		}
		for _, o := range frame {
			s.sent[c.ID][keyOf(o)] = o.Generation
		}
		s.mu.Unlock()
		if err := children.Send(ctx, c.Name, &control.Message{Type: siteproto.TypeDesired, Desired: frame}); err != nil {
			s.mu.Lock()
			delete(s.sent, c.ID)
			s.mu.Unlock()
			return err
		}
	}
	return nil
}
