package resume

import (
	"fmt"

	"github.com/tether-dev/tether/tunnel"
)

// Pending is a resumable stream between its Open frame and the tunnel
// Reply that accepts it: until then it is the plain tunnel stream (the
// Reply, and whatever request frame the service reads, are not resume
// frames). The code that serves or opens the stream exchanges the Reply on
// it as on any stream and then calls Answered, which turns it into a
// Stream kept in its Set. So the code that answers a stream need not know
// whether the stream is resumable: a Pending handed where a tunnel.Stream
// is expected does the right thing, and a refused one is simply closed.
type Pending struct {
	tunnel.Stream
	id  ID
	set *Set
	cfg Config
}

// NewPending is under, whose Open frame for id was written or read, to be
// kept in set with cfg once answered.
func NewPending(id ID, under tunnel.Stream, set *Set, cfg Config) *Pending {
	return &Pending{Stream: under, id: id, set: set, cfg: cfg}
}

// ID is the stream's resume ID.
func (p *Pending) ID() ID { return p.id }

// Keep wraps the stream, whose Reply has been exchanged, as a Stream in its
// Set. An ID the set already holds (or held recently) is refused: the
// stream is aborted with a Close frame saying so, and an error returned.
func (p *Pending) Keep() (*Stream, error) {
	s := New(p.id, p.Stream, p.cfg)
	if err := p.set.Add(s); err != nil {
		s.Abort("the stream's id is already in use on this side; stream ended")
		return nil, fmt.Errorf("keep resumable stream %s: %w", p.id, err)
	}
	return s, nil
}

// Answered is what to carry the bytes of st on once its Reply has been
// written or read: for a Pending, the Stream it is now kept as (Keep);
// for any other stream, st itself.
func Answered(st tunnel.Stream) (tunnel.Stream, error) {
	p, ok := st.(*Pending)
	if !ok {
		return st, nil
	}
	s, err := p.Keep()
	if err != nil {
		return nil, err
	}
	return s, nil
}
