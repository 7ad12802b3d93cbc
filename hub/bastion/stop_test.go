package bastion

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel"
)

// pipeStream is one end of an in-memory connection as a tunnel stream.
type pipeStream struct{ net.Conn }

func (pipeStream) CloseWrite() error { return nil }

type dialFunc func(ctx context.Context, req JumpRequest) (tunnel.Stream, error)

func (f dialFunc) Dial(ctx context.Context, req JumpRequest) (tunnel.Stream, error) {
	return f(ctx, req)
}

// TestStopEndsJump: JumpRequest.Stop ends a relayed jump at once, or one
// still being dialled, and the jump is recorded as ended with the cause.
func TestStopEndsJump(t *testing.T) {
	for _, tc := range []struct {
		name       string
		duringDial bool
		cause      error
		result     string
	}{
		{"live jump, access withdrawn", false, fmt.Errorf("%w: operator removed", ErrAccessWithdrawn),
			"ended: access withdrawn"},
		{"live jump, other cause", false, errors.New("shutting down"), "ended"},
		{"while dialling", true, fmt.Errorf("%w: roles narrowed", ErrAccessWithdrawn), "ended: access withdrawn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op := testenv.NewKey(t).Signer
			records := make(chan JumpRecord, 1)
			stops := make(chan func(error), 1)
			_, addr := startBastion(t, Config{
				Addr:       "127.0.0.1:0",
				HostSigner: testenv.NewKey(t).Signer,
				Authorize: func(user string, key gossh.PublicKey) bool {
					return user == "op" && string(key.Marshal()) == string(op.PublicKey().Marshal())
				},
				Dialer: dialFunc(func(ctx context.Context, req JumpRequest) (tunnel.Stream, error) {
					if tc.duringDial {
						req.Stop(tc.cause)
						<-ctx.Done()
						return nil, ctx.Err()
					}
					stops <- req.Stop
					node, hub := net.Pipe()
					go io.Copy(io.Discard, node)
					t.Cleanup(func() { node.Close() })
					return pipeStream{hub}, nil
				}),
				OnJump: func(r JumpRecord) { records <- r },
			})
			client, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{
				User: "op", Auth: []gossh.AuthMethod{gossh.PublicKeys(op)},
				HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			conn, err := client.Dial("tcp", "n1:22")
			if tc.duringDial {
				if err == nil {
					t.Fatal("jump stopped while dialling was opened")
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				(<-stops)(tc.cause)
				conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := conn.Read(make([]byte, 1)); err != io.EOF {
					t.Fatalf("read after Stop: %v, want EOF", err)
				}
			}
			select {
			case r := <-records:
				if r.Result != tc.result || r.Error != tc.cause.Error() || r.Operator != "op" || r.KeyFingerprint == "" {
					t.Errorf(
						"record: result %q error %q (operator %q, key %q), want %q %q",
						r.Result, r.Error, r.Operator, r.KeyFingerprint, tc.result, tc.cause,
					)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no jump record after Stop")
			}
		})
	}
}

// TestWithdrawLetsTheNodeSpeak: Withdraw stops relaying what the operator
// sends at once, but what the node sends still reaches the operator until
// the node closes the stream (or grace passes); the jump is recorded as
// ended by access withdrawal either way.
func TestWithdrawLetsTheNodeSpeak(t *testing.T) {
	for _, tc := range []struct {
		name      string
		nodeEnds  bool
		grace     time.Duration
		endBefore time.Duration
	}{
		{"node says goodbye and closes", true, 20 * time.Second, 10 * time.Second},
		{"node stays silent", false, 300 * time.Millisecond, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op := testenv.NewKey(t).Signer
			records := make(chan JumpRecord, 1)
			type live struct {
				withdraw func(error, time.Duration)
				node     net.Conn
			}
			jumps := make(chan live, 1)
			_, addr := startBastion(t, Config{
				Addr:       "127.0.0.1:0",
				HostSigner: testenv.NewKey(t).Signer,
				Authorize:  func(user string, key gossh.PublicKey) bool { return user == "op" },
				Dialer: dialFunc(func(ctx context.Context, req JumpRequest) (tunnel.Stream, error) {
					node, hub := net.Pipe()
					t.Cleanup(func() { node.Close() })
					jumps <- live{req.Withdraw, node}
					return pipeStream{hub}, nil
				}),
				OnJump: func(r JumpRecord) { records <- r },
			})
			client, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{User: "op",
				Auth:            []gossh.AuthMethod{gossh.PublicKeys(op)},
				HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			conn, err := client.Dial("tcp", "n1:22")
			if err != nil {
				t.Fatal(err)
			}
			j := <-jumps
			// The node receives everything the operator sent before.
			go conn.Write([]byte("before"))
			j.node.SetReadDeadline(time.Now().Add(10 * time.Second))
			if b := make([]byte, 6); mustRead(t, j.node, b) != "before" {
				t.Fatalf("node read %q before the withdrawal", b)
			}
			cause := fmt.Errorf("%w: operator removed", ErrAccessWithdrawn)
			at := time.Now()
			j.withdraw(cause, tc.grace)
			nodeGot := make(chan string, 1)
			go func() {
				b := make([]byte, 64)
				j.node.SetReadDeadline(time.Now().Add(tc.grace + 5*time.Second))
				n, _ := j.node.Read(b)
				nodeGot <- string(b[:n])
			}()
			if _, err := conn.Write([]byte("after")); err != nil {
				t.Fatal(err)
			}
			if tc.nodeEnds {
				if _, err := j.node.Write([]byte("goodbye")); err != nil {
					t.Fatalf("node's last word: %v", err)
				}
				conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				if b := make([]byte, 7); mustRead(t, conn, b) != "goodbye" {
					t.Fatalf("operator read %q, want the node's goodbye", b)
				}
				j.node.Close()
			}
			conn.SetReadDeadline(time.Now().Add(tc.endBefore))
			if _, err := io.Copy(io.Discard, conn); err != nil {
				t.Fatalf("relay did not end: %v", err)
			}
			if took := time.Since(at); took > tc.endBefore {
				t.Errorf("relay ended %s after Withdraw", took)
			}
			conn.Close() // as the operator's ssh does once the node's side ended
			if got := <-nodeGot; got != "" {
				t.Errorf("node received %q after the withdrawal", got)
			}
			select {
			case r := <-records:
				if r.Result != "ended: access withdrawn" || r.Error != cause.Error() {
					t.Errorf("record: result %q error %q, want ended: access withdrawn, %q", r.Result, r.Error, cause)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no jump record after Withdraw")
			}
		})
	}
}

func mustRead(t *testing.T, r io.Reader, b []byte) string {
	t.Helper()
	if _, err := io.ReadFull(r, b); err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}
