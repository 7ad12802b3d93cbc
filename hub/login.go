package hub

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/store"
)

const (
	challengeTTL  = time.Minute
	maxChallenges = 10000
	// maxChallengesPerOperator keeps one operator's name (public) from
	// being used to crowd out everyone else's logins.
	maxChallengesPerOperator = 16
	loginSignature           = "tether-login-v1"
)

// challenges are single-use login nonces.
type challenges struct {
	mu      sync.Mutex // guards pending
	pending map[string]challenge
}

type challenge struct {
	operator string
	expires  time.Time
}

func (c *challenges) issue(operator string) (string, time.Time, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", time.Time{}, err
	}
	nonce := base64.RawURLEncoding.EncodeToString(b)
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[string]challenge{}
	}
	for k, v := range c.pending {
		if now.After(v.expires) {
			delete(c.pending, k)
		}
	}
	if len(c.pending) >= maxChallenges {
		return "", time.Time{}, errors.New("too many pending logins; try again in a minute")
	}
	perOperator := 0
	for _, v := range c.pending {
		if v.operator == operator {
			perOperator++
		}
	}
	if perOperator >= maxChallengesPerOperator {
		return "", time.Time{}, fmt.Errorf("%w: too many pending logins for %q; try again in a minute", api.ErrLoginRefused, operator)
	}
	exp := now.Add(challengeTTL)
	c.pending[nonce] = challenge{operator: operator, expires: exp}
	return nonce, exp, nil
}

// take consumes a nonce: it is valid once, for one operator, for a minute.
func (c *challenges) take(nonce, operator string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.pending[nonce]
	delete(c.pending, nonce)
	return ok && ch.operator == operator && time.Now().Before(ch.expires)
}

// LoginPayload is what an operator signs with their registered key.
func LoginPayload(operator, nonce string) []byte {
	return []byte(loginSignature + "\x00" + operator + "\x00" + nonce)
}

// loginChallenge implements api.Login.
func (s *Server) loginChallenge(_ context.Context, operator string) (string, time.Time, error) {
	if _, ok := s.door.Snapshot().Operator(operator); !ok {
		err := fmt.Errorf("%w: no operator named %q", api.ErrLoginRefused, operator)
		s.audit(store.AuditEvent{At: time.Now(), Kind: "login", Operator: operator, Result: "refused", Detail: err.Error()})
		return "", time.Time{}, err
	}
	return s.challenges.issue(operator)
}

// login checks the signed challenge and issues a short-lived user
// certificate whose principals are the logins of the operator's roles.
func (s *Server) login(_ context.Context, req api.LoginRequest, remote string) (api.LoginResponse, error) {
	fail := func(err error) (api.LoginResponse, error) {
		s.audit(store.AuditEvent{At: time.Now(), Kind: "login", Operator: req.Operator, Remote: remote, Result: "refused", Detail: err.Error()})
		return api.LoginResponse{}, err
	}
	if !s.challenges.take(req.Nonce, req.Operator) {
		return fail(fmt.Errorf("%w: unknown, used or expired challenge; run tether login again", api.ErrLoginRefused))
	}
	o, ok := s.door.Snapshot().Operator(req.Operator)
	if !ok {
		return fail(fmt.Errorf("%w: no operator named %q", api.ErrLoginRefused, req.Operator))
	}
	sig := &gossh.Signature{Format: req.SignatureFormat, Blob: req.Signature}
	if err := o.Key.Verify(LoginPayload(req.Operator, req.Nonce), sig); err != nil {
		return fail(fmt.Errorf("%w: signature does not verify with %s's registered key", api.ErrLoginRefused, req.Operator))
	}
	// Only a proven key learns what it is granted.
	o, logins, err := s.door.LoginGrant(req.Operator)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", api.ErrLoginRefused, err))
	}
	cert, err := s.userCA.SignUser(o.Key, access.UserCertKeyIDPrefix+req.Operator, logins, s.cfg.UserCertTTL)
	if err != nil {
		return api.LoginResponse{}, err
	}
	s.audit(store.AuditEvent{At: time.Now(), Kind: "login", Operator: req.Operator, KeyFingerprint: gossh.FingerprintSHA256(o.Key),
		Remote: remote, Result: "ok", Detail: fmt.Sprintf("user certificate for %s until %s", strings.Join(logins, ","),
			time.Unix(int64(cert.ValidBefore), 0).UTC().Format(time.RFC3339))})
	return api.LoginResponse{Certificate: string(gossh.MarshalAuthorizedKey(cert)), ValidBefore: time.Unix(int64(cert.ValidBefore), 0).UTC(), Principals: logins}, nil
}
