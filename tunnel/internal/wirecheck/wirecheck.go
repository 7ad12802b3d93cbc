// Package wirecheck is what the wire contracts under tunnel/ share to check a
// decoded message: the one error every malformed message wraps, so that a site
// or upgrade body carried on the control stream fails as a control message
// does, and the bounds on its strings.
package wirecheck

import (
	"errors"
	"fmt"
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
