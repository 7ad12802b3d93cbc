package apitype

import "time"

// KubeOneMembersRequest is the body of PUT /v1/kubeone/{name}/members.
type KubeOneMembersRequest struct {
	ControlPlane []string `json:"control_plane"`
	Workers      []string `json:"workers,omitempty"`
}

// KubeOneManifest is the answer of GET /v1/kubeone/{name}/manifest.
type KubeOneManifest struct {
	Manifest string `json:"manifest"` // YAML
}

// KubeOneRunRequest is the body of POST /v1/kubeone/{name}/apply and
// /reset (Action is filled from the path).
type KubeOneRunRequest struct {
	Action string `json:"-"`
	// Auto starts the run once every member's tunnel is up, instead of
	// refusing while one is not (apply only).
	Auto           bool `json:"auto,omitempty"`
	TimeoutSeconds int  `json:"timeout_seconds,omitempty"` // default 3600
}

// The KubeOne types mirror hub/kubeone's JSON (a test holds them to it).

// KubeOneSpec is the body of POST /v1/kubeone (`tether kubeone create`).
type KubeOneSpec struct {
	Name         string   `json:"name"`
	ControlPlane []string `json:"control_plane"` // node names
	Workers      []string `json:"workers,omitempty"`
	Kubernetes   string   `json:"kubernetes"` // e.g. 1.30.5
	Login        string   `json:"login,omitempty"`
	CNI          string   `json:"cni,omitempty"`
	// ManifestExtra is YAML merged into the generated manifest.
	ManifestExtra string `json:"manifest_extra,omitempty"`
}

// KubeOneCluster is a KubeOne cluster as the API shows it: never a
// private key.
type KubeOneCluster struct {
	Name         string   `json:"name"`
	Kubernetes   string   `json:"kubernetes"`
	Login        string   `json:"login"`
	CNI          string   `json:"cni"`
	ControlPlane []string `json:"control_plane"` // node names
	Workers      []string `json:"workers,omitempty"`
	// ManifestExtra is the extra manifest fields (YAML), if any.
	ManifestExtra string `json:"manifest_extra,omitempty"`
	// BastionUser is the cluster identity's bastion login.
	BastionUser string       `json:"bastion_user"`
	PublicKey   string       `json:"public_key"`
	Status      string       `json:"status"`
	LastApply   KubeOneApply `json:"last_apply,omitzero"`
	CreatedAt   time.Time    `json:"created_at"`
	UpdatedAt   time.Time    `json:"updated_at"`
	// Warnings are about what was allowed but is unwise (only in the
	// answer to a change).
	Warnings []string `json:"warnings,omitempty"`
}

// KubeOneApply is a cluster's last `kubeone apply` or `reset` job.
type KubeOneApply struct {
	Job    string    `json:"job,omitempty"`
	Result string    `json:"result,omitempty"`
	At     time.Time `json:"at,omitzero"`
}

// KubeOneStatus answers GET /v1/kubeone/{name}/status: a cluster with the
// state of each member's tunnel, its last apply, and (once installed) the
// health of its API server.
type KubeOneStatus struct {
	Name        string                `json:"name"`
	Kubernetes  string                `json:"kubernetes"`
	Status      string                `json:"status"`
	BastionUser string                `json:"bastion_user"`
	Members     []KubeOneMemberStatus `json:"members"`
	// MembersUp counts the members whose tunnel is up.
	MembersUp int           `json:"members_up"`
	LastApply *KubeOneApply `json:"last_apply,omitempty"`
	// Kube is the API server's health through the tunnel, if checked.
	Kube *KubeHealth `json:"kube,omitempty"`
}

// KubeOneMemberStatus is one member of a KubeOne cluster and its tunnel.
type KubeOneMemberStatus struct {
	Node      string    `json:"node"`
	NodeID    string    `json:"node_id"`
	Role      string    `json:"role"` // control-plane | worker
	Online    bool      `json:"online"`
	Transport string    `json:"transport,omitempty"` // quic | tcp, of the live or last session
	LastSeen  time.Time `json:"last_seen,omitzero"`
	Address   string    `json:"address,omitempty"` // the node's reported address (privateAddress)
	Revoked   bool      `json:"revoked,omitempty"`
}

// KubeHealth is a cluster API server's /readyz as fetched through the
// tunnel.
type KubeHealth struct {
	Ready     bool      `json:"ready"`
	Detail    string    `json:"detail,omitempty"`
	CheckedAt time.Time `json:"checked_at"`
}
