// Package wirecheck is what the wire contracts under tunnel/ share to check a
// decoded message: the one error every malformed message wraps, so that a site
// or upgrade body carried on the control stream fails as a control message
// does, the bounds on its strings, and how binary frames (stream headers,
// resumable streams) read, write and check the reasons shown to people.
package wirecheck

import (
	"errors"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"
)

// ErrBadMessage wraps every decoding or validation failure of a contract.
var ErrBadMessage = errors.New("control: bad message")

// Bounds on what one message carries.
const (
	MaxShort  = 256  // names, versions, facts
	MaxKeys   = 4096 // authorized keys per node
	MaxKeyLen = 16 << 10
	MaxNotice = 1024
	MaxCaps   = 32
	MaxLabels = 64 // the hub's label rules allow fewer; this bounds the frame
)

// String checks that s is UTF-8 and at most max bytes long.
func String(field, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%w: %s longer than %d bytes", ErrBadMessage, field, max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not UTF-8", ErrBadMessage, field)
	}
	return nil
}

// Reason checks a reason shown to people (in an operator's terminal, a
// log): at most max bytes of UTF-8 without control characters, so that no
// escape sequence reaches a terminal. The error wraps bad.
func Reason(s string, max int, bad error) error {
	if len(s) > max {
		return fmt.Errorf("%w: reason is %d bytes, max %d", bad, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: reason is not valid UTF-8", bad)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: reason contains control character %U", bad, r)
		}
	}
	return nil
}

// ReadFull is io.ReadFull that marks a premature end of input as a
// truncated frame (wrapping bad, and still io.EOF or io.ErrUnexpectedEOF so
// callers can tell a peer that sent nothing).
func ReadFull(r io.Reader, b []byte, bad error) error {
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: truncated frame: %w", bad, err)
		}
		return err
	}
	return nil
}

// WriteAll writes b with one Write call, turning a short write into an
// error: a frame goes out whole or not at all.
func WriteAll(w io.Writer, b []byte) error {
	n, err := w.Write(b)
	if err != nil {
		return err
	}
	if n != len(b) {
		return io.ErrShortWrite
	}
	return nil
}
