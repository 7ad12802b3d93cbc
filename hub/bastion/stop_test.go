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
		{"live jump, access withdrawn", false, fmt.Errorf("%w: operator removed", ErrAccessWithdrawn), "ended: access withdrawn"},
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
			client, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{User: "op", Auth: []gossh.AuthMethod{gossh.PublicKeys(op)},
				HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second})
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
					t.Errorf("record: result %q error %q (operator %q, key %q), want %q %q", r.Result, r.Error, r.Operator, r.KeyFingerprint, tc.result, tc.cause)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no jump record after Stop")
			}
		})
	}
}
