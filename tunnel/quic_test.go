package tunnel

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/quic-go/quic-go"
)

// TestIsConnectionErr pins which quic-go errors mean "the session is over".
// A stream's Read can return the connection's error before the connection's
// context is cancelled, so this classification alone must decide.
func TestIsConnectionErr(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"idle timeout", &quic.IdleTimeoutError{}, true},
		{"wrapped idle timeout", fmt.Errorf("read: %w", &quic.IdleTimeoutError{}), true},
		{"handshake timeout", &quic.HandshakeTimeoutError{}, true},
		{"peer closed", &quic.ApplicationError{Remote: true, ErrorCode: quicCodeClosed}, true},
		{"transport error", &quic.TransportError{ErrorCode: quic.ProtocolViolation}, true},
		{"stateless reset", &quic.StatelessResetError{}, true},
		{"stream reset", &quic.StreamError{StreamID: 4, ErrorCode: 1, Remote: true}, false},
		{"read deadline", os.ErrDeadlineExceeded, false},
		{"other", errors.New("boom"), false},
	}
	for _, tt := range tests {
		if got := isConnectionErr(tt.err); got != tt.want {
			t.Errorf("%s: isConnectionErr(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
