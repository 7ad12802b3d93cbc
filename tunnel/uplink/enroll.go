package uplink

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// ErrJoinRefused is returned when the hub refused the join (bad, used-up or
// expired token; name taken). Retrying will not help.
var ErrJoinRefused = errors.New("join refused by hub")

// EnrollOptions are the inputs of Enroll.
type EnrollOptions struct {
	JoinString string
	Name       string // required
	Timeout    time.Duration
	// Kind is control.JoinSite when a site hub joins its parent; "" for a
	// node.
	Kind string
	// AgentVersion is sent in the join request.
	AgentVersion string
}

// Enroll exchanges a join string for an identity and stores nothing. The
// key is generated here and never leaves the machine; the hub is trusted
// only if it proves the CA pinned in the join string.
func Enroll(ctx context.Context, o EnrollOptions) (*Identity, error) {
	js, err := pki.ParseJoinString(o.JoinString)
	if err != nil {
		return nil, err
	}
	if err := pki.ValidateName(o.Name); err != nil {
		return nil, fmt.Errorf("node %w", err)
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, err
	}
	csr, err := pki.NewCSR(key, o.Name)
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(control.JoinRequest{Token: js.Token, Name: o.Name, CSR: csr, Facts: GatherFacts(),
		AgentVersion: o.AgentVersion, Kind: o.Kind})

	// A busy hub (429 or 503 with Retry-After, e.g. a whole site behind one
	// address joining at once) is asked again after the time it names, with
	// jitter, a few times; anything else fails at once.
	var (
		resp *control.JoinResponse
		ca   *x509.Certificate
	)
	for round := 1; ; round++ {
		var errs []error
		var wait time.Duration
		resp, ca, errs, wait = tryJoin(ctx, js, body, o.Timeout)
		if resp != nil {
			break
		}
		if wait == 0 || round == joinBusyRounds {
			if len(errs) == 1 && errors.Is(errs[0], ErrJoinRefused) {
				return nil, errs[0]
			}
			if allPinMismatch(errs) { // reached, but not the hub the join string names
				return nil, fmt.Errorf("join: %w", errors.Join(errs...))
			}
			return nil, fmt.Errorf("join: no hub reachable: %w", errors.Join(errs...))
		}
		wait += rand.N(wait/2 + time.Second)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("join: %w (hub busy: %w)", ctx.Err(), errors.Join(errs...))
		case <-time.After(wait):
		}
	}
	certs, nodeCA, err := VerifyIssued([]byte(resp.Cert), []byte(resp.NodeCA), ca, key)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	hubs := resp.Hubs
	if len(hubs) == 0 {
		hubs = js.Addrs
	}
	cfg := NodeConfig{NodeID: resp.NodeID, Name: resp.Name, Hubs: hubs, JoinedAt: time.Now().UTC()}
	return NewIdentity(cfg, key, certs, ca, nodeCA), nil
}

// joinBusyRounds bounds how often a busy hub is asked again.
const joinBusyRounds = 8

// tryJoin posts the join request to each hub address in turn. It returns
// the first answer, or the errors and, if every hub was only busy, how long
// the soonest one asked to wait. A refusal (bad token, name taken) ends the
// attempt at once, as the only error.
func tryJoin(ctx context.Context, js pki.JoinString, body []byte, timeout time.Duration) (
	*control.JoinResponse, *x509.Certificate, []error, time.Duration) {
	var errs []error
	var wait time.Duration
	for _, addr := range js.Addrs {
		resp, ca, err := postJoin(ctx, addr, js.CAPin, body, timeout)
		if err == nil {
			return resp, ca, nil, 0
		}
		if errors.Is(err, ErrJoinRefused) {
			return nil, nil, []error{err}, 0
		}
		var busy *hubBusyError
		if errors.As(err, &busy) {
			if wait == 0 || busy.after < wait {
				wait = busy.after
			}
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	if len(errs) != len(js.Addrs) || !allBusy(errs) {
		wait = 0
	}
	return nil, nil, errs, wait
}

func allPinMismatch(errs []error) bool {
	return len(errs) > 0 && !slices.ContainsFunc(errs, func(err error) bool { return !errors.Is(err, pki.ErrPinMismatch) })
}

func allBusy(errs []error) bool {
	for _, err := range errs {
		var busy *hubBusyError
		if !errors.As(err, &busy) {
			return false
		}
	}
	return true
}

// hubBusyError is a 429 or 503 answer: try again after the given time.
type hubBusyError struct {
	after time.Duration
	msg   string
}

func (e *hubBusyError) Error() string { return e.msg }

func postJoin(ctx context.Context, addr, pin string, body []byte, timeout time.Duration) (
	*control.JoinResponse, *x509.Certificate, error) {
	var ca *x509.Certificate
	tc, err := pki.PinnedTLSConfig(pin, func(c *x509.Certificate) { ca = c })
	if err != nil {
		return nil, nil, err
	}
	tc.NextProtos = []string{"http/1.1"}
	client := &http.Client{Timeout: timeout,
		Transport: &http.Transport{TLSClientConfig: tc, TLSHandshakeTimeout: 10 * time.Second}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+control.JoinPath, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if errors.Is(err, pki.ErrPinMismatch) {
		return nil, nil, pki.ErrPinMismatch // without the URL: the address is named by the caller
	} else if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e control.ErrorResponse
		_ = json.Unmarshal(b, &e)
		if e.Error == "" {
			e.Error = resp.Status
		}
		switch resp.StatusCode {
		case http.StatusForbidden, http.StatusConflict, http.StatusBadRequest:
			return nil, nil, fmt.Errorf("%w: %s", ErrJoinRefused, e.Error)
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			after := time.Second
			if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
				after = min(time.Duration(secs)*time.Second, time.Minute)
			}
			return nil, nil, &hubBusyError{after: after, msg: e.Error}
		}
		return nil, nil, errors.New(e.Error)
	}
	var jr control.JoinResponse
	if err := json.Unmarshal(b, &jr); err != nil {
		return nil, nil, fmt.Errorf("decode join response: %w", err)
	}
	if ca == nil {
		return nil, nil, pki.ErrPinMismatch
	}
	return &jr, ca, nil
}
