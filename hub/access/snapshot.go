package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
)

// Snapshot is an immutable view of who may do what: operators with their
// keys and compiled roles, every role, and the revoked operator keys. It is
// replaced wholesale on change; readers never lock.
type Snapshot struct {
	// Generation increases with every reload; a push compares it to know
	// whether what it computed is still current.
	Generation uint64

	operators      map[string]*Operator
	roles          []roles.Compiled // sorted by name
	revoked        []string         // authorized_keys lines
	provisionLogin string
	// kubeone are the KubeOne clusters' SSH identities by bastion user;
	// kubeoneByNode the identity each member node ID belongs to.
	kubeone       map[string]*KubeOneIdentity
	kubeoneByNode map[string]*KubeOneIdentity

	// stored is a digest of the store rows the snapshot was built from
	// (see Same).
	stored [sha256.Size]byte
}

// Same reports whether s and o were built from the same stored state, so
// that nothing decided from one can differ when decided from the other. A
// periodic re-read that finds nothing changed then costs no work per node.
func (s *Snapshot) Same(o *Snapshot) bool {
	return s != nil && o != nil && s.stored == o.stored
}

// kubeOneGrants is what a snapshot takes from the KubeOne clusters: not
// their status or their members' node rows, which change while nothing
// granted does.
func kubeOneGrants(clusters []store.KubeOneCluster) [][]string {
	g := make([][]string, 0, len(clusters))
	for _, c := range clusters {
		row := []string{c.Name, c.ID, c.Login, c.PublicKey}
		for _, m := range c.Members {
			row = append(row, m.NodeID)
		}
		g = append(g, row)
	}
	return g
}

// digestRows hashes what load read. Rows are plain data with sorted JSON
// map keys, so equal rows give equal digests; a row that cannot be encoded
// (none can today) gives a digest of its own, so it is never taken as
// unchanged.
func digestRows(rows ...any) [sha256.Size]byte {
	h := sha256.New()
	enc := json.NewEncoder(h)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			var unique [sha256.Size]byte
			_, _ = rand.Read(unique[:])
			return unique
		}
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// KubeOneIdentity is a KubeOne cluster's SSH identity as decisions see it:
// one key, valid at the bastion as the cluster's bastion user and on the
// cluster's members as its login, nowhere else.
type KubeOneIdentity struct {
	Cluster string // the cluster's name
	ID      string // the cluster's ID (random per creation)
	Login   string // the login KubeOne uses on the members
	Key     gossh.PublicKey
	Members map[string]bool // node IDs
}

// Operator is a registered operator as decisions see it.
type Operator struct {
	Name  string
	Keys  []gossh.PublicKey // oldest first; never empty
	Roles []roles.Compiled
}

// HasKey reports whether k (a plain key, not a certificate) is one of the
// operator's registered keys.
func (o *Operator) HasKey(k gossh.PublicKey) bool {
	return slices.ContainsFunc(o.Keys, func(r gossh.PublicKey) bool { return sameKey(r, k) })
}

func load(ctx context.Context, st Store, gen uint64, provisionLogin string, log *slog.Logger) (*Snapshot, error) {
	ops, err := st.ListOperators(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := st.ListRoles(ctx)
	if err != nil {
		return nil, err
	}
	revoked, err := st.ListRevokedKeys(ctx)
	if err != nil {
		return nil, err
	}
	clusters, err := st.ListKubeOneClusters(ctx)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{
		Generation:     gen,
		operators:      make(map[string]*Operator, len(ops)),
		revoked:        revoked,
		provisionLogin: provisionLogin,
		kubeone:        make(map[string]*KubeOneIdentity, len(clusters)),
		kubeoneByNode:  map[string]*KubeOneIdentity{},
		stored:         digestRows(ops, rs, revoked, kubeOneGrants(clusters), provisionLogin),
	}
	for _, c := range clusters {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(c.PublicKey))
		if err != nil {
			log.Warn("KubeOne cluster key grants nothing: unreadable", "cluster", c.Name, "err", err)
			continue
		}
		id := &KubeOneIdentity{
			Cluster: c.Name,
			ID:      c.ID,
			Login:   c.Login,
			Key:     k,
			Members: make(map[string]bool, len(c.Members)),
		}
		for _, m := range c.Members {
			id.Members[m.NodeID] = true
			s.kubeoneByNode[m.NodeID] = id
		}
		s.kubeone[KubeOneBastionUser(c.Name)] = id
	}
	byName := make(map[string]roles.Compiled, len(rs))
	for _, r := range rs {
		c, err := roles.Compile(roles.Role(r))
		if err != nil {
			// Stored roles were validated when put; one that no longer
			// compiles (a rule tightened since) grants nothing.
			log.Warn("role grants nothing: it does not validate", "role", r.Name, "err", err)
			continue
		}
		byName[r.Name] = c
		s.roles = append(s.roles, c)
	}
	slices.SortFunc(s.roles, func(a, b roles.Compiled) int { return strings.Compare(a.Name, b.Name) })
	for _, o := range ops {
		op := &Operator{Name: o.Name}
		for _, sk := range o.Keys {
			k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(strings.TrimSpace(sk.PublicKey)))
			if err != nil {
				log.Warn("operator key grants nothing: unreadable", "operator", o.Name, "key", sk.Fingerprint, "err", err)
				continue
			}
			op.Keys = append(op.Keys, k)
		}
		if len(op.Keys) == 0 {
			log.Warn("operator grants nothing: no readable key", "operator", o.Name)
			continue
		}
		for _, name := range o.Roles {
			if r, ok := byName[name]; ok {
				op.Roles = append(op.Roles, r)
			}
		}
		s.operators[o.Name] = op
	}
	return s, nil
}

// Operator returns a registered operator.
func (s *Snapshot) Operator(name string) (*Operator, bool) {
	o, ok := s.operators[name]
	return o, ok
}

// RevokedKeys are the operator keys every node must refuse.
func (s *Snapshot) RevokedKeys() []string { return s.revoked }

// Role returns a role by name (roles that do not validate are absent).
func (s *Snapshot) Role(name string) (roles.Compiled, bool) {
	i, ok := slices.BinarySearchFunc(
		s.roles, name, func(r roles.Compiled, n string) int { return strings.Compare(r.Name, n) },
	)
	if !ok {
		return roles.Compiled{}, false
	}
	return s.roles[i], true
}

func (o *Operator) roleNames() string {
	names := make([]string, 0, len(o.Roles))
	for _, r := range o.Roles {
		names = append(names, r.Name)
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
