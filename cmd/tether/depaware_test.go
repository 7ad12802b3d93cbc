package main

import (
	"testing"

	"github.com/tether-dev/tether/internal/depaware"
)

// TestDepaware: the hub binary links exactly the third-party packages of
// depaware.txt; growth or shrinkage is reviewed there.
func TestDepaware(t *testing.T) { depaware.Check(t, "") }
