// Package stepca lets the hub delegate node certificate issuance to an
// existing smallstep step-ca through one of its JWK provisioners. It makes
// the two requests that takes itself (list the provisioners for the
// encrypted key, sign a CSR with a one-time token) over TLS that trusts
// only the step-ca root, and builds the token with go.step.sm/crypto as
// step's own client (certificates' ca.Provisioner.Token) does: linking that
// client would bring most of the CA server, some 500 packages, into the
// hub. Only the hub links this package.
package stepca

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.step.sm/crypto/jose"
	"go.step.sm/crypto/x509util"

	"github.com/tether-dev/tether/pki"
)

// Config names the step-ca and the provisioner the hub uses.
type Config struct {
	URL          string // e.g. https://ca.example.com:9000
	RootFile     string // the step-ca root certificate (trust for the CA's TLS and for node certificates)
	Provisioner  string // JWK provisioner name
	PasswordFile string // decrypts the provisioner key
}

const (
	// tokenLifetime is how long step's client makes a one-time token valid.
	tokenLifetime = 5 * time.Minute
	// requestTimeout is step's client's default for each request.
	requestTimeout = 15 * time.Second
	// pageLimit is the page size step's client asks the provisioner list in.
	pageLimit = 100
	// maxPages bounds the walk through that list should a CA keep
	// answering with a next cursor.
	maxPages = 1000
	// maxBody bounds what the hub reads of one answer.
	maxBody = 4 << 20
)

// Issuer signs node certificates with a step-ca.
type Issuer struct {
	base        *url.URL
	hc          *http.Client
	root        *x509.Certificate
	provisioner string           // the token's issuer
	key         *jose.JSONWebKey // the provisioner's decrypted private key
	fingerprint string           // the root the CA's TLS chains to (hex SHA-256): the token's sha
	audience    string           // the sign endpoint: the token's aud
}

// New connects to the step-ca, loads and decrypts the provisioner key.
func New(cfg Config) (*Issuer, error) {
	if cfg.URL == "" || cfg.RootFile == "" || cfg.Provisioner == "" || cfg.PasswordFile == "" {
		return nil, errors.New("stepca: --step-ca-url, --step-ca-root, --step-ca-provisioner and " +
			"--step-ca-password-file are all required")
	}
	base, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	rootPEM, err := os.ReadFile(cfg.RootFile)
	if err != nil {
		return nil, fmt.Errorf("stepca: root: %w", err)
	}
	roots, err := pki.ParseCerts(rootPEM)
	if err != nil {
		return nil, fmt.Errorf("stepca: root %s: %w", cfg.RootFile, err)
	}
	pool := x509.NewCertPool()
	for _, c := range roots {
		pool.AddCert(c)
	}
	pw, err := os.ReadFile(cfg.PasswordFile)
	if err != nil {
		return nil, fmt.Errorf("stepca: password file: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	i := &Issuer{
		base:        base,
		hc:          &http.Client{Timeout: requestTimeout, Transport: tr},
		root:        roots[0],
		provisioner: cfg.Provisioner,
		audience:    base.ResolveReference(&url.URL{Path: "/1.0/sign"}).String(),
	}
	if err := i.loadKey(context.Background(), []byte(strings.TrimRight(string(pw), "\r\n"))); err != nil {
		return nil, fmt.Errorf("stepca: provisioner %q at %s: %w", cfg.Provisioner, cfg.URL, err)
	}
	return i, nil
}

// parseURL takes the step-ca address as step does: https unless it says
// otherwise, and a host is required. Plain http cannot work: the token's
// sha claim is the root the CA's TLS chains to.
func parseURL(s string) (*url.URL, error) {
	raw := s
	if !strings.Contains(s, "://") {
		raw = "https://" + s
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("stepca: --step-ca-url %q: want https://HOST[:PORT]", s)
	}
	return u, nil
}

// Root is the step-ca root: the hub trusts node certificates chaining to it.
func (i *Issuer) Root() *x509.Certificate { return i.root }

// IssueNode asks the step-ca to sign csrDER for identity id: the one-time
// token carries the subject and the tether:// URI SAN, so the certificate
// says exactly what the hub decided, whatever the CSR asked for.
func (i *Issuer) IssueNode(ctx context.Context, csrDER []byte, id pki.Identity, commonName string,
	ttl time.Duration) ([]*x509.Certificate, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("stepca: parse CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("stepca: CSR signature: %w", err)
	}
	if csr.Subject.CommonName != commonName ||
		len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses)+len(csr.URIs) > 0 {
		return nil, fmt.Errorf("stepca: CSR must name %q and carry no SANs", commonName)
	}
	now := time.Now()
	tok, err := i.token(commonName, []string{id.URI().String()}, now)
	if err != nil {
		return nil, fmt.Errorf("stepca: token: %w", err)
	}
	req := signRequest{
		CsrPEM:   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr.Raw})),
		OTT:      tok,
		NotAfter: now.Add(ttl),
	}
	var resp signResponse
	if _, err := i.do(ctx, http.MethodPost, "/1.0/sign", nil, req, &resp); err != nil {
		return nil, fmt.Errorf("stepca: sign %q: %w", commonName, err)
	}
	leaf, err := parseCert("crt", resp.ServerPEM)
	if err != nil {
		return nil, fmt.Errorf("stepca: sign %q: %w", commonName, err)
	}
	chain := []*x509.Certificate{leaf}
	switch {
	case len(resp.CertChainPEM) > 1:
		for _, p := range resp.CertChainPEM[1:] {
			c, err := parseCert("certChain", p)
			if err != nil {
				return nil, fmt.Errorf("stepca: sign %q: %w", commonName, err)
			}
			chain = append(chain, c)
		}
	case resp.CaPEM != "":
		c, err := parseCert("ca", resp.CaPEM)
		if err != nil {
			return nil, fmt.Errorf("stepca: sign %q: %w", commonName, err)
		}
		chain = append(chain, c)
	}
	return chain, nil
}

func parseCert(field, s string) (*x509.Certificate, error) {
	certs, err := pki.ParseCerts([]byte(s))
	if err != nil || len(certs) != 1 {
		return nil, fmt.Errorf("the step-ca's %q is not one PEM certificate (%v)", field, err)
	}
	return certs[0], nil
}

// ottClaims are the claims of step's one-time token for an X.509
// certificate (cli-utils' token.Claims with WithSANS and WithSHA): aud is a
// single string, as step sends it.
type ottClaims struct {
	Issuer    string            `json:"iss"`
	Subject   string            `json:"sub"`
	Audience  string            `json:"aud"`
	NotBefore *jose.NumericDate `json:"nbf"`
	IssuedAt  *jose.NumericDate `json:"iat"`
	Expiry    *jose.NumericDate `json:"exp"`
	ID        string            `json:"jti"`
	SANs      []string          `json:"sans"`
	SHA       string            `json:"sha,omitempty"`
}

// token is the one-time token the step-ca's JWK provisioner authorizes a
// signature with: signed by the provisioner key, its kid in the header,
// issued by the provisioner to the sign endpoint for subject and sans,
// naming the root, good for five minutes, and with a random ID the CA
// refuses to see twice.
func (i *Issuer) token(subject string, sans []string, now time.Time) (string, error) {
	if i.key.KeyID == "" {
		return "", errors.New("the provisioner key has no key ID (kid)")
	}
	jti := make([]byte, 32)
	rand.Read(jti)
	so := new(jose.SignerOptions).WithType("JWT").WithHeader("kid", i.key.KeyID)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.SignatureAlgorithm(i.key.Algorithm), Key: i.key.Key}, so)
	if err != nil {
		return "", fmt.Errorf("signer for the provisioner key (alg %q): %w", i.key.Algorithm, err)
	}
	return jose.Signed(signer).Claims(ottClaims{
		Issuer:    i.provisioner,
		Subject:   subject,
		Audience:  i.audience,
		NotBefore: jose.NewNumericDate(now),
		IssuedAt:  jose.NewNumericDate(now),
		Expiry:    jose.NewNumericDate(now.Add(tokenLifetime)),
		ID:        hex.EncodeToString(jti),
		SANs:      sans,
		SHA:       i.fingerprint,
	}).CompactSerialize()
}

// loadKey finds the JWK provisioner of the configured name in the step-ca's
// list and decrypts its key with password, as step's client does (the first
// one of that name the password decrypts), and records the root the CA's
// TLS chains to.
func (i *Issuer) loadKey(ctx context.Context, password []byte) error {
	var encrypted, otherTypes []string
	cursor := ""
	for page := 0; ; page++ {
		if page == maxPages {
			return fmt.Errorf("the provisioner list goes on past %d pages", maxPages)
		}
		q := url.Values{"limit": {strconv.Itoa(pageLimit)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var resp provisionersResponse
		state, err := i.do(ctx, http.MethodGet, "/1.0/provisioners", q, nil, &resp)
		if err != nil {
			return err
		}
		if page == 0 {
			if i.fingerprint, err = rootFingerprint(state); err != nil {
				return err
			}
		}
		for _, p := range resp.Provisioners {
			switch {
			case p.Name != i.provisioner:
			case !strings.EqualFold(p.Type, "JWK"):
				otherTypes = append(otherTypes, p.Type)
			case p.EncryptedKey != "":
				encrypted = append(encrypted, p.EncryptedKey)
			}
		}
		if resp.NextCursor == "" {
			break
		}
		cursor = resp.NextCursor
	}
	var lastErr error
	for _, e := range encrypted {
		key, err := decryptKey(e, password)
		if err == nil {
			i.key = key
			return nil
		}
		lastErr = err
	}
	switch {
	case lastErr != nil:
		return fmt.Errorf("the password in --step-ca-password-file does not decrypt its key: %w", lastErr)
	case len(otherTypes) > 0:
		return fmt.Errorf("it is a provisioner of type %s: the hub needs a JWK one", strings.Join(otherTypes, ", "))
	default:
		return errors.New("the step-ca has no JWK provisioner of that name with an encrypted key " +
			"(`step ca provisioner add NAME --create` makes one)")
	}
}

// rootFingerprint is step's: the SHA-256 of the last certificate of the
// last chain the CA's TLS verified to.
func rootFingerprint(state *tls.ConnectionState) (string, error) {
	if state == nil || len(state.VerifiedChains) == 0 {
		return "", errors.New("the step-ca's TLS left no verified chain")
	}
	last := state.VerifiedChains[len(state.VerifiedChains)-1]
	if len(last) == 0 {
		return "", errors.New("the step-ca's TLS left no verified chain")
	}
	return x509util.Fingerprint(last[len(last)-1]), nil
}

func decryptKey(encrypted string, password []byte) (*jose.JSONWebKey, error) {
	jwe, err := jose.ParseEncrypted(encrypted)
	if err != nil {
		return nil, fmt.Errorf("parse the encrypted key: %w", err)
	}
	b, err := jwe.Decrypt(password)
	if err != nil {
		return nil, err
	}
	key := new(jose.JSONWebKey)
	if err := json.Unmarshal(b, key); err != nil {
		return nil, fmt.Errorf("the decrypted key: %w", err)
	}
	if key.IsPublic() {
		return nil, errors.New("the decrypted key is a public key")
	}
	return key, nil
}

// The wire types, named after smallstep's (certificates/api and
// authority/provisioner), with only the fields the hub uses.
type (
	// provisionersResponse is api.ProvisionersResponse (no JSON tags there).
	provisionersResponse struct {
		Provisioners []provisioner `json:"Provisioners"`
		NextCursor   string        `json:"NextCursor"`
	}
	// provisioner is what provisioner.JWK says of itself in that list;
	// other types share type and name.
	provisioner struct {
		Type         string `json:"type"`
		Name         string `json:"name"`
		EncryptedKey string `json:"encryptedKey"`
	}
	// signRequest is api.SignRequest: PEM strings and an RFC 3339 time.
	signRequest struct {
		CsrPEM   string    `json:"csr"`
		OTT      string    `json:"ott"`
		NotAfter time.Time `json:"notAfter"`
	}
	// signResponse is api.SignResponse.
	signResponse struct {
		ServerPEM    string   `json:"crt"`
		CaPEM        string   `json:"ca"`
		CertChainPEM []string `json:"certChain"`
	}
	// errorResponse is errs.ErrorResponse, the body of every failure.
	errorResponse struct {
		Status  int    `json:"status"`
		Message string `json:"message"`
	}
)

// do sends one request to the step-ca (in as JSON when not nil), decodes
// the JSON answer into out and returns the connection's TLS state. A
// failure names the request and carries the CA's own message.
func (i *Issuer) do(ctx context.Context, method, path string, query url.Values,
	in, out any) (*tls.ConnectionState, error) {
	u := i.base.ResolveReference(&url.URL{Path: path, RawQuery: query.Encode()})
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := i.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u.Redacted(), err)
	}
	if resp.StatusCode/100 != 2 {
		var e errorResponse
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			return nil, fmt.Errorf("%s %s: the step-ca answered %d: %s", method, u.Redacted(), resp.StatusCode, e.Message)
		}
		return nil, fmt.Errorf("%s %s: the step-ca answered %s", method, u.Redacted(), resp.Status)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("%s %s: the answer: %w", method, u.Redacted(), err)
	}
	return resp.TLS, nil
}
