package control

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

// TestHelloLabelsBounded: the labels a node reports travel in its hello,
// bounded in number and size; their vocabulary is the hub's to check.
func TestHelloLabelsBounded(t *testing.T) {
	many := map[string]string{}
	for i := range wirecheck.MaxLabels + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		ok     bool
	}{
		{"none", nil, true},
		{"some", map[string]string{"env": "dev", "rack": "r7"}, true},
		{"too many", many, false},
		{"long key", map[string]string{strings.Repeat("k", wirecheck.MaxShort+1): "v"}, false},
		{"long value", map[string]string{"k": strings.Repeat("v", wirecheck.MaxShort+1)}, false},
		{"not UTF-8", map[string]string{"k": "\xff"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Message{
				Type:  TypeHello,
				Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "n1", Labels: tc.labels},
			}
			err := m.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrBadMessage)) {
				t.Fatalf("Validate = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
