package api

import (
	"maps"
	"slices"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/store"
)

func nodeFrom(n store.Node) apitype.Node {
	return apitype.Node{
		ID: n.ID, Name: n.Name, Labels: maps.Clone(n.Labels), ReportedLabels: maps.Clone(n.ReportedLabels),
		Hostname: n.Hostname, OS: n.OS, Arch: n.Arch,
		MachineID: n.MachineID, AgentVersion: n.AgentVersion, Transport: n.Transport, Online: n.Online,
		LastSeen: n.LastSeen, CreatedAt: n.CreatedAt, CertSerial: n.CertSerial, CertExpires: n.CertExpires,
		RevokedAt: n.RevokedAt, ClusterEngine: n.ClusterEngine, ClusterState: n.ClusterState,
		Site: NodeSite(n.Labels),
	}
}

func tokenFrom(t store.Token) apitype.Token {
	return apitype.Token{
		ID:        t.ID,
		Labels:    maps.Clone(t.Labels),
		UsesLeft:  t.UsesLeft,
		ExpiresAt: t.ExpiresAt,
		CreatedAt: t.CreatedAt,
		Kind:      t.Kind,
	}
}

func operatorFrom(o store.Operator) apitype.Operator {
	out := apitype.Operator{
		Name:        o.Name,
		PublicKey:   o.PublicKey,
		Fingerprint: o.Fingerprint,
		Roles:       slices.Clone(o.Roles),
		CreatedAt:   o.CreatedAt,
		Keys:        make([]apitype.OperatorKey, 0, len(o.Keys)),
	}
	for _, k := range o.Keys {
		out.Keys = append(out.Keys, apitype.OperatorKey(k))
	}
	return out
}

func roleFrom(r store.Role) apitype.Role {
	return apitype.Role{
		Name:       r.Name,
		Nodes:      r.Nodes,
		Logins:     slices.Clone(r.Logins),
		Forwarding: !r.NoForwarding,
		Confirm:    r.Confirm,
		Services:   append([]string{}, r.Services...),
	}
}

func auditEventFrom(e store.AuditEvent) apitype.AuditEvent {
	return apitype.AuditEvent{
		ID: e.ID, At: e.At, Kind: e.Kind, Operator: e.Operator, Node: e.Node, KeyFingerprint: e.KeyFingerprint,
		Remote: e.Remote, Result: e.Result, Detail: e.Detail, EndedAt: e.EndedAt,
		BytesToNode: e.BytesToNode, BytesFromNode: e.BytesFromNode,
	}
}

func apiTokenFrom(t store.APIToken) apitype.APIToken {
	return apitype.APIToken{
		ID:          t.ID,
		Role:        t.Role,
		Description: t.Description,
		CreatedAt:   t.CreatedAt,
		ExpiresAt:   t.ExpiresAt,
	}
}

// convertAll converts a store listing, [] rather than null when empty.
func convertAll[T, W any](items []T, conv func(T) W) []W {
	out := make([]W, len(items))
	for i, x := range items {
		out[i] = conv(x)
	}
	return out
}
