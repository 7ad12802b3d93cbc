package main

import (
	"testing"

	"github.com/tether-dev/tether/internal/depaware"
)

// TestDepaware: the agent, built with the Makefile's EDGE_TAGS, links
// exactly the third-party packages of depaware.txt; growth or shrinkage is
// reviewed there.
func TestDepaware(t *testing.T) { depaware.Check(t, "EDGE_TAGS") }
