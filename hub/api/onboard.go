package api

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/onboard"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/packaging"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// ErrOnboardRefused is wrapped by every failure of the onboarding endpoint
// (a bad request, a refused credential, a duplicate machine, no OS
// profile). The handler audits each itself, with its reason and the
// credential id; a guard in front of the API tells them by errors.Is on its
// Outcome and does not audit them again.
var ErrOnboardRefused = errors.New("onboarding refused")

// Refusal reasons of the onboarding endpoint, as audited ("reason=...").
const (
	ReasonUnknown     = "unknown"   // no such credential, wrong secret, or malformed
	ReasonRevoked     = "revoked"   // `tether onboarding revoke`
	ReasonExpired     = "expired"   // past its --ttl
	ReasonExhausted   = "exhausted" // all --uses spent
	ReasonDuplicate   = "duplicate_machine"
	ReasonNoProfile   = "no_profile"
	ReasonInvalid     = "invalid"
	ReasonConflict    = "name_taken"
	ReasonNodeRevoked = "node_revoked"
)

// reasonOf names a credential or onboarding refusal for the audit log.
func reasonOf(err error) string {
	switch {
	case errors.Is(err, store.ErrCredentialRevoked):
		return ReasonRevoked
	case errors.Is(err, store.ErrCredentialExpired):
		return ReasonExpired
	case errors.Is(err, store.ErrCredentialUsedUp):
		return ReasonExhausted
	case errors.Is(err, store.ErrMachineKeyMismatch):
		return ReasonDuplicate
	case errors.Is(err, onboard.ErrNoProfile):
		return ReasonNoProfile
	}
	return ReasonUnknown
}

// onboardCA serves the hub's CA certificate, unauthenticated: only the
// on-site comparison of its fingerprint with the one the admin gave makes
// it trusted.
func (h *handler) onboardCA(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.Header().Set("X-Tether-CA-Pin", h.CA.Pin())
	_, _ = w.Write(pki.EncodeCerts(h.CA.Certificate()))
}

// onboardReq is an onboarding request as the handler works on it.
type onboardReq struct {
	onboardproto.Request
	credID, secret string
	csr            *x509.CertificateRequest
	keyID          string // SHA-256 of the CSR's public key, hex
	name           string
}

// onboard creates the node of a machine in the field, or finds it again.
// The order is join's: everything that needs no secret is checked first,
// then the credential (constant time), the machine binding and the OS
// profile, and only then is a certificate signed; the credential's use is
// consumed in the transaction that creates the node and binds the machine.
func (h *handler) onboard(w http.ResponseWriter, r *http.Request) {
	var o onboardReq
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, onboardproto.MaxRequest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o.Request); err != nil {
		h.refuseOnboard(w, r, &o, ReasonInvalid, fail(ErrInvalid, "invalid request body: %s", err.Error()))
		return
	}
	if err := h.validateOnboard(&o); err != nil {
		reason := ReasonInvalid
		if statusOf(err) == http.StatusForbidden {
			reason = ReasonUnknown
		}
		h.refuseOnboard(w, r, &o, reason, err)
		return
	}
	ctx := r.Context()
	cred, err := h.authenticateOnboarding(ctx, o.credID, o.secret)
	if err != nil {
		h.refuseOnboard(w, r, &o, reasonOf(err), err)
		return
	}
	caller := access.Caller{Onboarding: true, Role: cred.Role, Name: "onboarding:" + cred.ID}
	if err := h.Door.AuthorizeOnboard(caller); err != nil {
		h.refuseOnboard(w, r, &o, ReasonUnknown, fail(ErrRefused, "onboarding refused: %s", err.Error()))
		return
	}
	if len(h.hubAddrs(r.Context())) == 0 {
		h.writeErr(w, r, fail(errInternal,
			"onboarding: the hub has no advertised address; start it with --advertise HOST:PORT"))
		return
	}

	// The same machine again (same UUID, same key) is a retry: it gets
	// its node back and spends nothing.
	var prev *store.Node
	switch m, err := h.Store.GetMachine(ctx, o.Machine.UUID); {
	case err == nil:
		if m.PublicKey != o.keyID {
			h.refuseOnboard(w, r, &o, ReasonDuplicate, duplicateMachine(o.Machine.UUID, m))
			return
		}
		n, err := h.Store.GetNode(ctx, m.NodeID)
		if err != nil {
			h.writeErr(w, r, internal("onboarding: read the machine's node", err))
			return
		}
		if !n.RevokedAt.IsZero() {
			h.refuseOnboard(w, r, &o, ReasonNodeRevoked,
				fail(ErrRefused, "onboarding refused: this machine is node %q, which was revoked; "+
					"an admin must remove it first (`tether nodes rm %s`)", n.Name, n.Name))
			return
		}
		prev = &n
	case !errors.Is(err, store.ErrNotFound):
		h.writeErr(w, r, internal("onboarding: read the machine binding", err))
		return
	default:
		if err := cred.Usable(time.Now()); err != nil {
			h.refuseOnboard(w, r, &o, reasonOf(err), credentialRefusal(err))
			return
		}
	}

	profiles, err := h.Store.ListOSProfiles(ctx)
	if err != nil {
		h.writeErr(w, r, internal("onboarding: read the OS profiles", err))
		return
	}
	profile, matchedBy, err := onboard.Match(profiles, o.Facts.OSID, o.Facts.OSVersion, o.Machine.OSIDLike)
	if err != nil {
		h.refuseOnboard(w, r, &o, ReasonNoProfile, route.Failure(ErrNotFound, err, "onboarding: "+err.Error()))
		return
	}

	// Only the credential's labels are the hub's: roles select on them.
	// Labels asked for on site are the machine's word (whoever holds the
	// credential could otherwise label a node into a role's selection), so
	// they go to the node's labels file and come back as reported labels.
	n := store.Node{ID: newID(), Name: o.name, Labels: maps.Clone(cred.Labels), Hostname: o.Facts.Hostname, OS: o.Facts.OS,
		Arch: o.Facts.Arch, MachineID: o.Facts.MachineID, AgentVersion: o.AgentVersion, Facts: o.Facts}
	if prev != nil {
		n = *prev
	}
	resp, chain, err := h.issueOnboarded(ctx, &o, n, profile, matchedBy)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	cert := chain[0]
	existing := prev != nil
	if existing {
		if err := h.Store.UpdateNodeCert(ctx, n.ID, cert.SerialNumber.Text(16), cert.NotAfter); err != nil {
			h.writeErr(w, r, internal("onboarding: record the node certificate", err))
			return
		}
	} else {
		n.CertSerial, n.CertExpires = cert.SerialNumber.Text(16), cert.NotAfter
		stored, found, err := h.Store.Onboard(ctx, cred.ID, func(c store.OnboardingCredential) error {
			// Checked again inside the transaction: the credential may
			// have been replaced while the certificate was signed.
			if !pki.SecretMatches(c.SecretHash, o.secret) {
				return store.ErrCredentialUnknown
			}
			return nil
		}, store.Machine{UUID: o.Machine.UUID, PublicKey: o.keyID}, n)
		switch {
		case errors.Is(err, store.ErrMachineKeyMismatch):
			h.refuseOnboard(w, r, &o, ReasonDuplicate, fail(ErrConflict, "onboarding refused: %s", clean(err)))
			return
		case errors.Is(err, store.ErrCredentialUnknown), errors.Is(err, store.ErrCredentialRevoked),
			errors.Is(err, store.ErrCredentialExpired), errors.Is(err, store.ErrCredentialUsedUp):
			h.refuseOnboard(w, r, &o, reasonOf(err), credentialRefusal(err))
			return
		case errors.Is(err, store.ErrNameTaken):
			h.refuseOnboard(w, r, &o, ReasonConflict, fail(ErrConflict,
				"onboarding refused: node name %q is taken by another machine; %s", o.name, anotherName))
			return
		case err != nil:
			h.writeErr(w, r, internal("onboarding: record the node", err))
			return
		}
		if found {
			// A concurrent request of the same machine created it first:
			// this one is its retry, for the node that was stored.
			existing = true
			if resp, _, err = h.issueOnboarded(ctx, &o, stored, profile, matchedBy); err != nil {
				h.writeErr(w, r, err)
				return
			}
		}
		n = stored
	}
	resp.Existing = existing
	detail := fmt.Sprintf("node id %s, machine %s (%s), credential %s, profile %s by %s", n.ID, o.Machine.UUID,
		o.Machine.UUIDSource, cred.ID, profile.Name, matchedBy)
	if existing {
		detail += ", retry: existing node, no use spent"
	}
	h.audit(store.AuditEvent{Kind: "onboard", Node: n.Name, Remote: r.RemoteAddr, Result: "ok", Detail: detail})
	h.Logger.Info("machine onboarded", "node", n.Name, "id", n.ID, "machine", o.Machine.UUID, "credential_id", cred.ID,
		"profile", profile.Name, "existing", existing)
	writeJSON(w, http.StatusOK, resp)
}

// issueOnboarded signs the node certificate for n and renders the
// response, user-data included (a template that fails here fails before
// anything is stored).
func (h *handler) issueOnboarded(
	ctx context.Context, o *onboardReq, n store.Node, p store.OSProfile, matchedBy string,
) (onboardproto.Response, []*x509.Certificate, error) {
	chain, err := h.IssueNode(ctx, o.csr.Raw, pki.Identity{Kind: pki.KindNode, ID: n.ID}, n.Name, h.NodeCertTTL)
	if err != nil {
		h.Logger.Error("onboarding: certificate authority failed", "name", n.Name, "credential_id", o.credID, "err", err)
		return onboardproto.Response{}, nil, RetryAfter(route.Failure(ErrUnavailable, err,
			"onboarding: the certificate authority could not sign the node certificate; "+
				"try again shortly (no credential use was spent)"), issuerRetryAfter)
	}
	hubs := h.hubAddrs(ctx)
	resp := onboardproto.Response{
		NodeID: n.ID, Name: n.Name, Profile: p.Name, MatchedBy: matchedBy,
		Cert: string(pki.EncodeCerts(chain...)), CA: string(pki.EncodeCerts(h.CA.Certificate())),
		NodeCA: string(pki.EncodeCerts(h.NodeCA)),
		Hubs:   hubs,
	}
	// node.json as the agent reads it (edge.NodeConfig).
	cfg, err := json.MarshalIndent(struct {
		NodeID   string    `json:"node_id"`
		Name     string    `json:"name"`
		Hubs     []string  `json:"hubs"`
		JoinedAt time.Time `json:"joined_at"`
	}{n.ID, n.Name, hubs, time.Now().UTC().Truncate(time.Second)}, "", "  ")
	if err != nil {
		return onboardproto.Response{}, nil, internal("onboarding: encode the node config", err)
	}
	d := onboard.Data{
		NodeID: n.ID, Name: n.Name, Hubs: hubs, Profile: p.Name, MatchedBy: matchedBy,
		StateDir: onboard.StateDir, Cert: resp.Cert, CA: resp.CA, NodeCA: resp.NodeCA, NodeConfig: string(cfg) + "\n",
		Labels: n.Labels, LabelsFile: onboard.LabelsFile(o.Labels), LabelsPath: onboard.LabelsPath,
		Unit: packaging.EdgeUnit, UnitPath: onboard.UnitPath,
		Facts: o.Facts, Machine: o.Machine,
	}
	if resp.UserData, err = onboard.Render(p.CloudInit, d); err != nil {
		return onboardproto.Response{}, nil, route.Failure(errInternal, err,
			fmt.Sprintf("onboarding: OS profile %q's cloud-init template failed for this machine (nothing was created); "+
				"an admin must fix it: %s", p.Name, clean(err)))
	}
	resp.MetaData = fmt.Sprintf("instance-id: tether-%s\nlocal-hostname: %s\n", n.ID, n.Name)
	return resp, chain, nil
}

// anotherName says how each onboarding client asks for a node name, for a
// name that is taken or refused: the machine's host name is the default,
// and machines of one image share it.
const anotherName = "onboard it again under another name: `tether-edge onboard --name NODE` on the machine, " +
	"or with `tether onboard bulk`, name=NODE on its inventory line or --name-pattern (e.g. 'pi-{host}')"

// validateOnboard checks everything about a request that needs no secret.
func (h *handler) validateOnboard(o *onboardReq) error {
	if err := o.Validate(); err != nil {
		return fail(ErrInvalid, "%s", err.Error())
	}
	var err error
	if o.credID, o.secret, err = pki.SplitToken(o.Credential); err != nil {
		return fail(ErrRefused,
			"onboarding refused: malformed credential: want ID.SECRET as `tether onboarding create` printed it")
	}
	if o.name = o.Name; o.name == "" {
		o.name = nameFromHostname(o.Facts.Hostname)
	}
	if err := pki.ValidateName(o.name); err != nil {
		return fail(ErrInvalid, "node %s; %s", err.Error(), anotherName)
	}
	if slices.Contains(h.ReservedNames, o.name) {
		return fail(ErrInvalid, "node name %q is reserved (it names the hub); %s", o.name, anotherName)
	}
	if err := apitype.ValidateLabels(o.Labels); err != nil {
		return fail(ErrInvalid, "%s", err.Error())
	}
	if o.csr, err = x509.ParseCertificateRequest(o.CSR); err == nil {
		err = o.csr.CheckSignature()
	}
	if err != nil {
		return fail(ErrInvalid, "onboarding: invalid CSR: %s", err.Error())
	}
	sum := sha256.Sum256(o.csr.RawSubjectPublicKeyInfo)
	o.keyID = hex.EncodeToString(sum[:])
	return nil
}

// nameFromHostname is the node name a machine gets without --name: its
// host name's first label, lowercased, other characters as dashes.
func nameFromHostname(host string) string {
	host, _, _ = strings.Cut(strings.ToLower(host), ".")
	b := []byte(host)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-")
}

// unknownCredentialHash stands in for the stored hash of a credential id
// that does not exist, so that an unknown id costs the same comparison as
// a wrong secret.
var unknownCredentialHash = pki.HashSecret("tether: no such onboarding credential")

// authenticateOnboarding checks the credential's secret (constant time),
// and that it is neither revoked nor expired. Uses are checked only when a
// node is to be created: a retry of a machine already onboarded spends
// none, so it is served by an exhausted credential.
func (h *handler) authenticateOnboarding(ctx context.Context, id, secret string) (store.OnboardingCredential, error) {
	c, err := h.Store.GetOnboardingCredential(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		_ = pki.SecretMatches(unknownCredentialHash, secret)
		return c, credentialRefusal(store.ErrCredentialUnknown)
	case err != nil:
		return c, internal("onboarding: read the credential", err)
	}
	if !pki.SecretMatches(c.SecretHash, secret) {
		return c, credentialRefusal(store.ErrCredentialUnknown)
	}
	if err := c.Usable(time.Now()); err != nil && !errors.Is(err, store.ErrCredentialUsedUp) {
		return c, credentialRefusal(err)
	}
	return c, nil
}

func credentialRefusal(err error) error {
	return route.Failure(ErrRefused, err,
		"onboarding refused: "+err.Error()+
			"; ask the hub's admin for a new onboarding credential (`tether onboarding create`)")
}

func duplicateMachine(uuid string, m store.Machine) error {
	return fail(ErrConflict, "onboarding refused: machine UUID %s is already node id %s (onboarded %s) with another key: "+
		"a second machine with the same UUID, or this one reinstalled without its key (node.key in the agent's state dir). "+
		"If this machine replaces the old one, an admin removes the old node first (`tether nodes rm NAME`)",
		uuid, m.NodeID, m.CreatedAt.UTC().Format(time.RFC3339))
}

// refuseOnboard answers a failed onboarding and audits it with its reason,
// the machine and the credential id (never the secret).
func (h *handler) refuseOnboard(w http.ResponseWriter, r *http.Request, o *onboardReq, reason string, err error) {
	cred := o.credID
	if cred == "" {
		cred, _, _ = strings.Cut(o.Credential, ".")
		cred = fmt.Sprintf("%.16q", cred)
	}
	msg := err.Error()
	if m, ok := route.Message(err); ok {
		msg = m
	}
	h.audit(store.AuditEvent{Kind: "onboard", Node: fmt.Sprintf("%.64s", o.name), Remote: r.RemoteAddr, Result: "refused",
		Detail: fmt.Sprintf("reason=%s credential %s machine %.64q: %.512s", reason, cred, o.Machine.UUID, msg)})
	h.Logger.Info("onboarding refused", "reason", reason, "credential_id", cred, "machine", o.Machine.UUID, "remote",
		r.RemoteAddr)
	h.writeErr(w, r, &onboardRefusal{err})
}

// onboardRefusal marks an error the onboarding handler audited.
type onboardRefusal struct{ error }

func (e *onboardRefusal) Unwrap() []error { return []error{e.error, ErrOnboardRefused} }
