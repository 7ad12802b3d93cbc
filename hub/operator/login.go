package operator

import (
	"container/list"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/hub/store"
)

const (
	challengeTTL = time.Minute
	// maxChallenges bounds the nonces pending at once. A full table
	// forgets its oldest nonce rather than refusing a new one, so no flood
	// can keep an operator from getting a challenge; it would have to
	// issue maxChallenges newer ones in the seconds between the owner's
	// challenge and login, which the per-source limit below makes a
	// many-address affair.
	maxChallenges = 10000
	// ChallengeBurst is how many challenges one source gets at once: a
	// person runs tether login a few times a minute at most; a script
	// asking for nonces is slowed to challengeEvery.
	ChallengeBurst = 20
	challengeEvery = 3 * time.Second // 20 a minute, sustained
	loginSignature = "tether-login-v1"
)

// challenges are single-use login nonces. Any syntactically valid operator
// name gets one, whether or not the operator exists, so that the answer
// (status, shape, time taken) tells nothing about which names exist; a
// nonce for a name that is not an operator simply never verifies.
type challenges struct {
	mu      sync.Mutex // guards the following fields
	pending map[string]*list.Element
	order   *list.List         // of *challenge, oldest first (all share one TTL)
	limit   *ratelimit.Limiter // challenges asked for, per source
}

type challenge struct {
	nonce    string
	operator string
	expires  time.Time
}

// initLocked makes the zero challenges usable.
func (c *challenges) initLocked() {
	if c.pending == nil {
		c.pending, c.order = map[string]*list.Element{}, list.New()
		c.limit = ratelimit.New(ratelimit.Config{Burst: ChallengeBurst, Every: challengeEvery})
	}
}

// allow counts one challenge asked for by remote's source, or says how
// long it has to wait.
func (c *challenges) allow(remote string) (bool, time.Duration) {
	c.mu.Lock()
	c.initLocked()
	c.mu.Unlock()
	src := ratelimit.Source(remote)
	ok, retry := c.limit.Allow(src)
	if ok {
		c.limit.Fail(src)
	}
	return ok, retry
}

func (c *challenges) issue(operator string) (string, time.Time, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", time.Time{}, fmt.Errorf("login challenge: randomness: %w", err)
	}
	nonce := base64.RawURLEncoding.EncodeToString(b)
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.initLocked()
	for e := c.order.Front(); e != nil; e = c.order.Front() {
		ch := e.Value.(*challenge)
		if now.Before(ch.expires) && c.order.Len() < maxChallenges {
			break
		}
		c.order.Remove(e)
		delete(c.pending, ch.nonce)
	}
	exp := now.Add(challengeTTL)
	c.pending[nonce] = c.order.PushBack(&challenge{nonce: nonce, operator: operator, expires: exp})
	return nonce, exp, nil
}

// take consumes a nonce: it is valid once, for one operator, for a minute.
func (c *challenges) take(nonce, operator string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.pending[nonce]
	if !ok {
		return false
	}
	c.order.Remove(e)
	delete(c.pending, nonce)
	ch := e.Value.(*challenge)
	return ch.operator == operator && time.Now().Before(ch.expires)
}

// unknownOperatorKey stands in for the key of an operator name that does
// not exist: a login for it verifies a signature like any other, and fails.
var unknownOperatorKey = func() gossh.PublicKey {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	k, err := gossh.NewPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return k
}()

// LoginPayload is what an operator signs with their registered key.
func LoginPayload(operator, nonce string) []byte {
	return []byte(loginSignature + "\x00" + operator + "\x00" + nonce)
}

// Challenge issues a login nonce for operator to sign. Every challenge is audited
// through the per-source audit limit, for a known operator or not, so
// that both take the same path and the same time; a flood fills neither
// the audit log nor the pending table.
func (s *Service) Challenge(_ context.Context, operator, remote string) (string, time.Time, error) {
	if ok, retry := s.challenges.allow(remote); !ok {
		s.cfg.RateLimited.Inc()
		return "", time.Time{}, route.RetryAfter(fmt.Errorf("%w: too many login challenges from %s; try again in %s",
			apitype.ErrRateLimited, ratelimit.Source(remote), retry.Round(time.Second)), retry)
	}
	_, known := s.cfg.Door.Snapshot().Operator(operator)
	nonce, exp, err := s.challenges.issue(operator)
	if err != nil {
		return "", time.Time{}, err
	}
	e := store.AuditEvent{
		At:       time.Now(),
		Kind:     "login_challenge",
		Operator: operator,
		Result:   "ok",
		Detail:   "login challenge issued",
	}
	if !known {
		e.Result = "refused"
		e.Detail = "login challenge for a name that is no operator (answered like any other; its nonce never verifies)"
	}
	s.cfg.Audit.Limited(remote, e)
	return nonce, exp, nil
}

// Login checks the signed challenge and issues a short-lived user
// certificate whose principals are the logins of the operator's roles.
func (s *Service) Login(ctx context.Context, req apitype.LoginRequest, remote string) (apitype.LoginResponse, error) {
	fail := func(err error) (apitype.LoginResponse, error) {
		s.cfg.Audit.Limited(
			remote,
			store.AuditEvent{
				At:       time.Now(),
				Kind:     "login",
				Operator: req.Operator,
				Result:   "refused",
				Detail:   err.Error(),
			},
		)
		return apitype.LoginResponse{}, err
	}
	if !s.challenges.take(req.Nonce, req.Operator) {
		return fail(fmt.Errorf("%w: unknown, used or expired challenge; run tether login again", ErrLoginRefused))
	}
	// A name that is no operator costs the same work and gets the same
	// answer as a wrong signature: a login must not tell which operator
	// names exist. Any of the operator's keys may sign; the certificate is
	// issued over the one that did.
	candidates := []gossh.PublicKey{unknownOperatorKey}
	o, ok := s.cfg.Door.Snapshot().Operator(req.Operator)
	switch {
	case req.PublicKey != "":
		// One verification, for an operator or not: the named key if it
		// is one of theirs, else the stand-in that never verifies.
		claimed, _, _, _, err := gossh.ParseAuthorizedKey([]byte(req.PublicKey))
		if err == nil && ok && o.HasKey(claimed) {
			candidates = []gossh.PublicKey{claimed}
		}
	case ok:
		// A client that does not name its key: try each of theirs.
		candidates = o.Keys
	}
	sig := &gossh.Signature{Format: req.SignatureFormat, Blob: req.Signature}
	payload := loginPayloadOf(req)
	var key gossh.PublicKey
	for _, k := range candidates {
		if k.Verify(payload, sig) == nil {
			key = k
			break
		}
	}
	if key == nil || !ok {
		return fail(
			fmt.Errorf(
				"%w: no operator %q with this key (check --user and --key; an admin adds operators with `tether operator add`)",
				ErrLoginRefused,
				req.Operator,
			),
		)
	}
	// Only a proven key learns what it is granted.
	o, logins, err := s.cfg.Door.LoginGrant(req.Operator)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrLoginRefused, err))
	}
	if !o.HasKey(key) {
		// The key was removed between the two snapshot reads.
		return fail(fmt.Errorf("%w: no operator %q with this key", ErrLoginRefused, req.Operator))
	}
	cert, err := s.cfg.UserCA.SignUser(key, access.UserCertKeyIDPrefix+req.Operator, logins, s.cfg.UserCertTTL)
	if err != nil {
		return apitype.LoginResponse{}, err
	}
	adminCert, err := s.loginAdminCert(ctx, req, o, key, remote)
	if err != nil {
		return fail(err)
	}
	apiCert := ""
	if adminCert == "" {
		if apiCert, err = s.loginOperatorCert(ctx, req, key, remote); err != nil {
			return fail(err)
		}
	}
	s.cfg.Audit.Write(
		store.AuditEvent{
			At:             time.Now(),
			Kind:           "login",
			Operator:       req.Operator,
			KeyFingerprint: gossh.FingerprintSHA256(key),
			Remote:         remote,
			Result:         "ok",
			Detail: fmt.Sprintf("user certificate for %s until %s", strings.Join(logins, ","),
				time.Unix(int64(cert.ValidBefore), 0).UTC().Format(time.RFC3339)),
		},
	)
	return apitype.LoginResponse{
		Certificate: string(gossh.MarshalAuthorizedKey(cert)),
		ValidBefore: time.Unix(int64(cert.ValidBefore), 0).UTC(),
		Principals:  logins,
		AdminCert:   adminCert,
		APICert:     apiCert,
	}, nil
}
