// Package packaging holds the files Tether installs beside its binaries
// (systemd units), embedded so the hub can hand the same unit to a machine
// it onboards as the packages install.
package packaging

import _ "embed"

// EdgeUnit is packaging/systemd/tether-edge.service.
//
//go:embed systemd/tether-edge.service
var EdgeUnit string
