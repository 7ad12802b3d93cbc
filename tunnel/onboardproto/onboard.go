package onboardproto

import (
	"fmt"
	"regexp"

	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

// Path is the HTTP endpoint (on the hub's TLS port) where a machine
// already in the field exchanges an onboarding credential, its facts and a
// CSR for a node identity and the cloud-init user-data that installs the
// agent. The machine's private key never leaves it: the CSR carries only
// the public key, and the user-data carries no secret.
const Path = "/v1/onboard"

// CAPath serves the hub's CA (PEM) without authentication so the
// on-site person can compare its fingerprint before anything is trusted;
// the onboarding CLI never trusts it silently.
const CAPath = "/v1/onboard/ca"

// MaxRequest bounds the onboarding request body.
const MaxRequest = 64 << 10

// Request is POSTed as JSON to Path.
//
// The node is keyed by MachineUUID and the CSR's public key together: a
// retry from the same machine (same UUID, same key, e.g. after a timeout or
// a crash of the CLI) returns the same node; the same UUID with a different
// key is a second machine claiming the first one's identity and is refused.
type Request struct {
	Credential string `json:"credential"` // ID.SECRET, as printed by `tether onboarding create`
	// Name is the requested node name; empty means the hub derives one from
	// the hostname.
	Name   string            `json:"name,omitempty"`
	Labels map[string]string `json:"labels,omitempty"` // requested on site; the credential's labels win on conflict
	CSR    []byte            `json:"csr"`              // DER, base64 in JSON
	Facts  control.Facts     `json:"facts"`
	// Machine facts only onboarding needs. Each is empty when it could not
	// be read (never guessed).
	Machine      MachineFacts `json:"machine"`
	AgentVersion string       `json:"agent_version"`
}

// MachineFacts are the hardware and OS facts collected on site.
type MachineFacts struct {
	UUID          string `json:"uuid"`                     // DMI product_uuid, else /etc/machine-id
	UUIDSource    string `json:"uuid_source"`              // the file it was read from
	Serial        string `json:"serial,omitempty"`         // DMI product_serial
	OSIDLike      string `json:"os_id_like,omitempty"`     // ID_LIKE from os-release
	Kernel        string `json:"kernel,omitempty"`         // uname -r
	CPU           string `json:"cpu,omitempty"`            // model name
	CPUs          int    `json:"cpus,omitempty"`           // logical CPUs
	MemoryBytes   int64  `json:"memory_bytes,omitempty"`   // MemTotal
	SecureBoot    string `json:"secure_boot,omitempty"`    // "enabled", "disabled" or "" (unknown)
	DiskEncrypted string `json:"disk_encrypted,omitempty"` // "yes", "no" or "" (unknown): root on dm-crypt
}

// Response is the hub's answer.
type Response struct {
	NodeID string `json:"node_id"`
	Name   string `json:"name"`
	// Existing is true when this machine had been onboarded before (a
	// retry): nothing new was created and no credential use was spent.
	Existing bool   `json:"existing"`
	Profile  string `json:"profile"` // the OS profile that matched
	// MatchedBy says how: "version" (distro and version) or "family".
	MatchedBy string   `json:"matched_by"`
	Cert      string   `json:"cert"`    // PEM chain, leaf first
	CA        string   `json:"ca"`      // PEM, root of the hub's serving chain
	NodeCA    string   `json:"node_ca"` // PEM, root node certificates chain to
	Hubs      []string `json:"hubs"`
	// UserData is cloud-init user-data ("#cloud-config" …) rendered from
	// the profile's template: the agent's certificate, CA and config, its
	// unit file and labels. MetaData is the NoCloud meta-data to go with it.
	UserData string `json:"user_data"`
	MetaData string `json:"meta_data"`
}

var uuidLike = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z-]{7,63}$`)

// Validate checks an onboarding request's bounds (the hub checks meaning).
func (r *Request) Validate() error {
	if r.Credential == "" {
		return fmt.Errorf("onboard: missing credential")
	}
	if len(r.CSR) == 0 || len(r.CSR) > 8<<10 {
		return fmt.Errorf("onboard: csr missing or larger than 8 KiB")
	}
	m := r.Machine
	for field, v := range map[string]string{"credential": r.Credential, "name": r.Name, "agent_version": r.AgentVersion,
		"uuid": m.UUID, "uuid_source": m.UUIDSource, "serial": m.Serial, "os_id_like": m.OSIDLike, "kernel": m.Kernel,
		"cpu": m.CPU, "secure_boot": m.SecureBoot, "disk_encrypted": m.DiskEncrypted} {
		if err := wirecheck.String(field, v, wirecheck.MaxShort); err != nil {
			return fmt.Errorf("onboard: %w", err)
		}
	}
	if !uuidLike.MatchString(m.UUID) {
		return fmt.Errorf(
			"onboard: machine uuid %.64q is missing or not an identifier (letters, digits, dashes; 8-64)",
			m.UUID,
		)
	}
	if m.CPUs < 0 || m.MemoryBytes < 0 {
		return fmt.Errorf("onboard: negative cpu count or memory")
	}
	if len(r.Labels) > wirecheck.MaxLabels {
		return fmt.Errorf("onboard: more than %d labels", wirecheck.MaxLabels)
	}
	for k, v := range r.Labels {
		if err := wirecheck.String("label key", k, wirecheck.MaxShort); err != nil {
			return fmt.Errorf("onboard: %w", err)
		}
		if err := wirecheck.String("label value", v, wirecheck.MaxShort); err != nil {
			return fmt.Errorf("onboard: %w", err)
		}
	}
	if err := r.Facts.Validate(); err != nil {
		return fmt.Errorf("onboard: %w", err)
	}
	return nil
}
