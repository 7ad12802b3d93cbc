package api

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// TestWireNames: the API types keep the JSON names clients and
// openapi.yaml know, and carry no secret, whatever the store's records
// hold.
func TestWireNames(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		v    any
		want []string
	}{
		{
			"Node",
			nodeFrom(store.Node{
				ID: "i", Name: "n", Labels: map[string]string{"a": "b"}, Hostname: "h", OS: "linux", Arch: "amd64",
				MachineID: "m", AgentVersion: "v", Transport: "quic", Online: true, LastSeen: at, CreatedAt: at,
				CertSerial: "1", CertExpires: at, RevokedAt: at, ClusterEngine: "k3s", ClusterState: "active",
			}),
			[]string{
				"id", "name", "labels", "hostname", "os", "arch", "machine_id", "agent_version", "transport", "online",
				"last_seen", "created_at", "cert_serial", "cert_expires", "revoked_at", "cluster_engine", "cluster_state",
			},
		},
		{
			"Token",
			tokenFrom(store.Token{
				ID: "i", SecretHash: []byte("secret"), Labels: map[string]string{}, UsesLeft: 1, ExpiresAt: at,
				CreatedAt: at, Kind: "site",
			}),
			[]string{"id", "labels", "uses_left", "expires_at", "created_at", "kind"},
		},
		{
			"Operator",
			operatorFrom(store.Operator{
				Name: "o", PublicKey: "ssh-ed25519 AAAA", Fingerprint: "SHA256:x", Roles: []string{"all"}, CreatedAt: at,
			}),
			[]string{"name", "public_key", "fingerprint", "keys", "roles", "created_at"},
		},
		{
			"Role",
			roleFrom(store.Role{Name: "r", Nodes: "*", Logins: []string{"root"}}),
			[]string{"name", "nodes", "logins", "forwarding", "confirm", "services"},
		},
		{
			"AuditEvent",
			auditEventFrom(store.AuditEvent{
				ID: 1, At: at, Kind: "k", Operator: "o", Node: "n", KeyFingerprint: "f", Remote: "r",
				Result: "ok", Detail: "d", EndedAt: at, BytesToNode: 1, BytesFromNode: 1,
			}),
			[]string{
				"id", "at", "kind", "operator", "node", "key_fingerprint", "remote", "result", "detail", "ended_at",
				"bytes_to_node", "bytes_from_node",
			},
		},
		{
			"APIToken",
			apiTokenFrom(store.APIToken{
				ID: "i", SecretHash: []byte("secret"), Role: "r", Description: "d", CreatedAt: at, ExpiresAt: at,
			}),
			[]string{"id", "role", "description", "created_at", "expires_at"},
		},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		got := slices.Sorted(maps.Keys(m))
		want := slices.Sorted(slices.Values(tc.want))
		if !slices.Equal(got, want) {
			t.Errorf("%s JSON names %v, want %v", tc.name, got, want)
		}
	}
}
