package api

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// issuerRetryAfter is what a joining agent is told to wait when the
// certificate authority (an external step-ca) could not sign.
const issuerRetryAfter = 10 * time.Second

// join enrols a node. The order is what keeps the endpoint cheap to
// attack: validate the request, authenticate the token (constant time),
// and only then sign, so a request without the secret never costs a
// signature or an outbound issuance at an external CA. The token use is
// consumed in the transaction that creates the node; a certificate signed
// for a join that then loses a race for the last use names a node id that
// never reaches the store, so the hub refuses it at connect.
func (h *handler) join(w http.ResponseWriter, r *http.Request) {
	result := "error"
	defer func() {
		if h.Metrics != nil {
			h.Metrics.Joins.WithLabelValues(result).Inc()
		}
	}()
	var req control.JoinRequest
	if !decode(w, r, &req) {
		result = "bad_request"
		return
	}
	tokenID, secret, csr, err := h.validateJoin(req)
	if err != nil {
		result = joinResultOf(err)
		h.writeErr(w, r, err)
		return
	}
	if err := h.authenticateJoin(r.Context(), tokenID, secret, req.Kind); err != nil {
		result = joinResultOf(err)
		h.refuseJoin(w, r, req.Name, tokenID, err)
		return
	}
	nodeID := newID()
	chain, err := h.IssueNode(r.Context(), csr.Raw, pki.Identity{Kind: pki.KindNode, ID: nodeID}, req.Name, h.NodeCertTTL)
	if err != nil {
		// The request was checked above; what fails now is the
		// authority (a step-ca outage, or the hub's own CA), not the
		// client, so it is told to come back rather than refused.
		result = "unavailable"
		h.Logger.Error("join: certificate authority failed", "name", req.Name, "token_id", tokenID, "err", err)
		h.writeErr(w, r, RetryAfter(route.Failure(ErrUnavailable, err,
			"join: the certificate authority could not sign the node certificate; try again shortly (the join token "+
				"was not used)"), issuerRetryAfter))
		return
	}
	cert := chain[0]
	n := store.Node{
		ID: nodeID, Name: req.Name, Hostname: req.Facts.Hostname, OS: req.Facts.OS, Arch: req.Facts.Arch,
		MachineID: req.Facts.MachineID, AgentVersion: req.AgentVersion, Facts: req.Facts,
		CertSerial: cert.SerialNumber.Text(16), CertExpires: cert.NotAfter,
	}
	n, err = h.Store.Join(r.Context(), tokenID, func(t store.Token) error {
		// Checked again inside the transaction: the token may have been
		// deleted, spent or replaced while the certificate was signed.
		if !pki.SecretMatches(t.SecretHash, secret) {
			return store.ErrTokenUnknown
		}
		return tokenKindMatches(t, req.Kind)
	}, n)
	switch {
	case errors.Is(err, store.ErrTokenUnknown), errors.Is(err, store.ErrTokenExpired),
		errors.Is(err, store.ErrTokenUsedUp):
		result = "refused"
		h.refuseJoin(w, r, req.Name, tokenID, err)
		return
	case errors.Is(err, store.ErrNameTaken):
		result = "conflict"
		if req.Kind == control.JoinSite {
			h.writeErr(w, r, fail(ErrConflict,
				"join refused: name %q is taken at the parent hub (nodes and sites share one namespace there); "+
					"choose another --site, or remove the old one there with `tether nodes rm %s`", req.Name, req.Name))
			return
		}
		h.writeErr(w, r, fail(ErrConflict,
			"join refused: node name %q is already registered; choose another --name, "+
				"or remove the old node with `tether nodes rm %s`", req.Name, req.Name))
		return
	case err != nil:
		h.writeErr(w, r, internal("join: record the node", err))
		return
	}
	result = "ok"
	h.audit(store.AuditEvent{
		Kind:   "join",
		Node:   n.Name,
		Remote: r.RemoteAddr,
		Result: "ok",
		Detail: "node id " + n.ID + ", token " + tokenID,
	})
	h.Logger.Info("node joined", "node", n.Name, "id", n.ID, "token_id", tokenID, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, control.JoinResponse{
		NodeID: n.ID, Name: n.Name,
		Cert: string(pki.EncodeCerts(chain...)), CA: string(pki.EncodeCerts(h.CA.Certificate())),
		NodeCA: string(pki.EncodeCerts(h.NodeCA)),
		Hubs:   h.hubAddrs(r.Context()),
	})
}

// validateJoin checks everything about a join request that needs no
// secret: shape, node name, token syntax, and the CSR (parsed, and signed
// by the key it names).
func (h *handler) validateJoin(req control.JoinRequest) (
	tokenID, secret string, csr *x509.CertificateRequest, err error,
) {
	if err := req.Validate(); err != nil {
		return "", "", nil, fail(ErrInvalid, "%s", err.Error())
	}
	if err := pki.ValidateName(req.Name); err != nil {
		return "", "", nil, fail(ErrInvalid, "node %s", err.Error())
	}
	if slices.Contains(h.ReservedNames, req.Name) {
		// A node's host certificate names it; it must never be valid for
		// the bastion's own names.
		return "", "", nil, fail(ErrInvalid, "node name %q is reserved (it names the hub); choose another --name", req.Name)
	}
	if req.Kind == control.JoinSite {
		if err := validate.SiteName(req.Name, h.SSHTrust.NodeSuffix); err != nil {
			return "", "", nil, fail(ErrInvalid, "join refused: %s", err.Error())
		}
	}
	tokenID, secret, err = pki.SplitToken(req.Token)
	if err != nil {
		return "", "", nil, fail(ErrRefused, "join refused: %s", err.Error())
	}
	csr, err = x509.ParseCertificateRequest(req.CSR)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		return "", "", nil, fail(ErrInvalid, "join: invalid CSR: %s", err.Error())
	}
	return tokenID, secret, csr, nil
}

// unknownTokenHash stands in for the stored hash of a token id that does
// not exist, so that an unknown id costs the same comparison as a wrong
// secret.
var unknownTokenHash = pki.HashSecret("tether: no such join token")

// authenticateJoin checks the join token's secret (constant time), then
// its expiry and uses. It consumes nothing.
func (h *handler) authenticateJoin(ctx context.Context, id, secret, kind string) error {
	t, err := h.Store.GetToken(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		_ = pki.SecretMatches(unknownTokenHash, secret)
		return store.ErrTokenUnknown
	case err != nil:
		return internal("join: read the join token", err)
	}
	if !pki.SecretMatches(t.SecretHash, secret) {
		return store.ErrTokenUnknown
	}
	if !time.Now().Before(t.ExpiresAt) {
		return fmt.Errorf("%w at %s", store.ErrTokenExpired, t.ExpiresAt.Format(time.RFC3339))
	}
	if t.UsesLeft <= 0 {
		return store.ErrTokenUsedUp
	}
	return tokenKindMatches(t, kind)
}

// tokenKindError: a node token used by a site hub, or a site token by a
// node. It is a refusal (403) that says which token is needed.
type tokenKindError struct{ msg string }

func (e *tokenKindError) Error() string        { return e.msg }
func (e *tokenKindError) Is(target error) bool { return target == ErrJoinRefused }

// tokenKindMatches refuses a node token for a site hub and a site token
// for a node: a site's certificate is trusted for a whole subtree of
// names, so only a token made for that may buy one.
func tokenKindMatches(t store.Token, kind string) error {
	switch {
	case t.IsSite() && kind != control.JoinSite:
		return &tokenKindError{"this is a site token; it registers only site hubs (`tether hub --parent JOIN --site " +
			"NAME`); a node joins with a node token (`tether token create`)"}
	case !t.IsSite() && kind == control.JoinSite:
		return &tokenKindError{"this is a node token; a site hub joins with a site token (`tether site token create` on " +
			"the parent)"}
	}
	return nil
}

// refuseJoin answers a join whose token was refused, and audits it with
// the token id (never the secret).
func (h *handler) refuseJoin(w http.ResponseWriter, r *http.Request, name, tokenID string, err error) {
	if statusOf(err) != http.StatusForbidden {
		h.writeErr(w, r, err)
		return
	}
	h.audit(store.AuditEvent{
		Kind:   "join",
		Node:   name,
		Remote: r.RemoteAddr,
		Result: "refused",
		Detail: "token " + tokenID + ": " + err.Error(),
	})
	h.Logger.Info("join refused", "token_id", tokenID, "name", name, "remote", r.RemoteAddr, "reason", err)
	msg := "join refused: " + err.Error() + "; ask an admin for a new join string (`tether token create`)"
	var kind *tokenKindError
	if errors.As(err, &kind) {
		msg = "join refused: " + kind.msg // says which token to ask for
	}
	h.writeErr(w, r, route.Failure(ErrJoinRefused, err, msg))
}

// joinResultOf is the tether_joins_total result label for a failed join.
func joinResultOf(err error) string {
	switch statusOf(err) {
	case http.StatusBadRequest:
		return "bad_request"
	case http.StatusForbidden:
		return "refused"
	case http.StatusConflict:
		return "conflict"
	case http.StatusServiceUnavailable:
		return "unavailable"
	}
	return "error"
}
