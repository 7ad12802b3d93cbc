package kubeone

import (
	"context"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
)

// Status is a cluster with the state of each member's tunnel, its last
// apply, and (once installed) the health of its API server.
type Status struct {
	Name        string         `json:"name"`
	Kubernetes  string         `json:"kubernetes"`
	Status      string         `json:"status"`
	BastionUser string         `json:"bastion_user"`
	Members     []MemberStatus `json:"members"`
	// MembersUp counts the members whose tunnel is up.
	MembersUp int `json:"members_up"`
	// LastApply is the last `kubeone apply` or `reset` job, if any.
	LastApply *store.KubeOneApply `json:"last_apply,omitempty"`
	// Kube is the API server's health through the tunnel, if checked.
	Kube *KubeHealth `json:"kube,omitempty"`
}

// MemberStatus is one member and its tunnel.
type MemberStatus struct {
	Node      string    `json:"node"`
	NodeID    string    `json:"node_id"`
	Role      string    `json:"role"` // control-plane | worker
	Online    bool      `json:"online"`
	Transport string    `json:"transport,omitempty"` // quic | tcp, of the live or last session
	LastSeen  time.Time `json:"last_seen,omitzero"`
	Address   string    `json:"address,omitempty"` // the node's reported address (privateAddress)
	Revoked   bool      `json:"revoked,omitempty"`
}

// KubeHealth is the API server's /readyz as fetched through the tunnel.
type KubeHealth struct {
	Ready     bool      `json:"ready"`
	Detail    string    `json:"detail,omitempty"`
	CheckedAt time.Time `json:"checked_at"`
}

// Status returns the cluster's status now.
func (s *Clusters) Status(ctx context.Context, name string) (Status, error) {
	c, err := s.Load(ctx, name)
	if err != nil {
		return Status{}, err
	}
	st := Status{
		Name:        c.Name,
		Kubernetes:  c.Kubernetes,
		Status:      c.Status,
		BastionUser: access.KubeOneBastionUser(c.Name),
		Members:     []MemberStatus{},
	}
	for _, m := range c.Members {
		n := m.Node
		ms := MemberStatus{
			Node:      n.Name,
			NodeID:    m.NodeID,
			Role:      m.Role,
			Online:    n.Online && n.RevokedAt.IsZero(),
			Transport: n.Transport,
			LastSeen:  n.LastSeen,
			Address:   n.Facts.Address,
			Revoked:   !n.RevokedAt.IsZero(),
		}
		if ms.Online {
			st.MembersUp++
		}
		st.Members = append(st.Members, ms)
	}
	if c.LastApply.Job != "" {
		la := c.LastApply
		st.LastApply = &la
	}
	if s.cfg.KubeHealth != nil {
		st.Kube = s.cfg.KubeHealth(ctx, c)
	}
	return st, nil
}

func marshalYAML(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}
