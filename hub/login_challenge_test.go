package hub

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	hubop "github.com/tether-dev/tether/hub/operator"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// loginFrom is an HTTP client of the login endpoints that connects from
// source address src (127.0.0.x), trusting the hub by its CA pin.
type loginFrom struct {
	t    *testing.T
	addr string
	hc   *http.Client
}

func newLoginFrom(t *testing.T, c *apiclient.Client, src string) *loginFrom {
	t.Helper()
	tok, err := c.CreateToken(context.Background(), apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, err := pki.ParseJoinString(tok.JoinString)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := pki.PinnedTLSConfig(js.CAPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	hc := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: tc, DialContext: d.DialContext},
	}
	t.Cleanup(hc.CloseIdleConnections)
	return &loginFrom{t: t, addr: js.Addrs[0], hc: hc}
}

// post sends body to path and returns the status, the raw body and the
// Retry-After header.
func (l *loginFrom) post(path string, body any) (int, []byte, string) {
	l.t.Helper()
	b, _ := json.Marshal(body)
	resp, err := l.hc.Post("https://"+l.addr+path, "application/json", bytes.NewReader(b))
	if err != nil {
		l.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out, resp.Header.Get("Retry-After")
}

func (l *loginFrom) challenge(operator string) (int, apitype.LoginChallengeResponse, string) {
	status, b, retry := l.post("/v1/login/challenge", apitype.LoginChallengeRequest{Operator: operator})
	var ch apitype.LoginChallengeResponse
	_ = json.Unmarshal(b, &ch)
	return status, ch, retry
}

// login signs nonce as operator with key and returns the status and error.
func (l *loginFrom) login(operator, nonce string, key gossh.Signer) (int, string) {
	sig, err := key.Sign(rand.Reader, hubop.LoginPayload(operator, nonce))
	if err != nil {
		l.t.Fatal(err)
	}
	status, b, _ := l.post("/v1/login",
		apitype.LoginRequest{Operator: operator, Nonce: nonce, SignatureFormat: sig.Format, Signature: sig.Blob})
	var e control.ErrorResponse
	_ = json.Unmarshal(b, &e)
	return status, e.Error
}

// TestLoginChallengeTellsNoNames: a challenge for a name that is no
// operator is answered exactly like one for an operator (status, fields,
// nonce length), and logging in with it fails with the same message as a
// wrong key for a real operator.
func TestLoginChallengeTellsNoNames(t *testing.T) {
	_, c := testHub(t)
	key := newOperator(t, c)
	l := newLoginFrom(t, c, "127.0.0.1")
	stOp, bOp, _ := l.post("/v1/login/challenge", apitype.LoginChallengeRequest{Operator: "op"})
	stGhost, bGhost, _ := l.post("/v1/login/challenge", apitype.LoginChallengeRequest{Operator: "ghost"})
	var op, ghost map[string]any
	_ = json.Unmarshal(bOp, &op)
	_ = json.Unmarshal(bGhost, &ghost)
	if stOp != http.StatusOK || stGhost != stOp || len(op) != len(ghost) ||
		len(fmt.Sprint(op["nonce"])) != len(fmt.Sprint(ghost["nonce"])) {
		t.Fatalf("challenge for an operator: %d %s; for no operator: %d %s; want the same answer", stOp, bOp, stGhost, bGhost)
	}
	other := newSigner(t)
	_, chOp, _ := l.challenge("op")
	stWrong, msgWrong := l.login("op", chOp.Nonce, other)
	stGhostLogin, msgGhost := l.login("ghost", fmt.Sprint(ghost["nonce"]), other)
	if stWrong != http.StatusForbidden || stGhostLogin != stWrong ||
		strings.ReplaceAll(msgWrong, `"op"`, "NAME") != strings.ReplaceAll(msgGhost, `"ghost"`, "NAME") {
		t.Errorf("login with a wrong key: %d %q; as no operator: %d %q; want the same answer", stWrong, msgWrong,
			stGhostLogin, msgGhost)
	}
	// The owner still gets in.
	_, ch, _ := l.challenge("op")
	if st, msg := l.login("op", ch.Nonce, key); st != http.StatusOK {
		t.Fatalf("owner's login: %d %q", st, msg)
	}
}

// newSigner is a fresh ed25519 key (internal/testenv).
func newSigner(t *testing.T) gossh.Signer { return testenv.NewKey(t).Signer }

// TestLoginChallengeFloodKeepsOwner: a source asking for challenges in a
// loop (for the owner's name) is slowed to 429 with Retry-After, and the
// owner, from another address, still gets a challenge and logs in.
func TestLoginChallengeFloodKeepsOwner(t *testing.T) {
	_, c := testHub(t)
	key := newOperator(t, c)
	flood := newLoginFrom(t, c, "127.0.0.2")
	var ok, limited int
	for range 3 * hubop.ChallengeBurst {
		switch st, _, retry := flood.challenge("op"); {
		case st == http.StatusOK:
			ok++
		case st == http.StatusTooManyRequests && retry != "":
			limited++
		default:
			t.Fatalf("flooding challenge: %d (Retry-After %q)", st, retry)
		}
	}
	if ok > hubop.ChallengeBurst || limited == 0 {
		t.Errorf("a flood of %d challenges from one address: %d answered, %d rate limited; want at most %d answered",
			3*hubop.ChallengeBurst, ok, limited, hubop.ChallengeBurst)
	}
	owner := newLoginFrom(t, c, "127.0.0.1")
	st, ch, _ := owner.challenge("op")
	if st != http.StatusOK {
		t.Fatalf("owner's challenge during a flood: %d", st)
	}
	if st, msg := owner.login("op", ch.Nonce, key); st != http.StatusOK {
		t.Fatalf("owner's login during a flood: %d %q", st, msg)
	}
}

// TestLoginChallengeAuditBounded: challenges for names that are no
// operator are audited, but a flood of them from one address leaves a
// bounded number of rows.
func TestLoginChallengeAuditBounded(t *testing.T) {
	_, c := testHub(t)
	l := newLoginFrom(t, c, "127.0.0.3")
	const tries = 200
	for i := range tries {
		l.challenge(fmt.Sprintf("ghost-%d", i))
	}
	waitAudit(t, c, "challenge for no operator", func(e apitype.AuditEvent) bool {
		return e.Operator == "ghost-0" && e.Result == "refused"
	})
	evs, err := c.ListAudit(context.Background(), apiclient.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if strings.HasPrefix(e.Operator, "ghost-") {
			n++
		}
	}
	if n > ratelimit.AuditBurst+1 {
		t.Errorf("%d challenges for unknown names left %d audit rows; want at most %d", tries, n, ratelimit.AuditBurst+1)
	}
}
