package main

import (
	"testing"

	"github.com/tether-dev/tether/internal/depaware"
)

// TestDepaware: the onboarding form, built with the Makefile's FORM_TAGS,
// links exactly the third-party packages of depaware.txt; growth or
// shrinkage is reviewed there.
func TestDepaware(t *testing.T) { depaware.Check(t, "FORM_TAGS") }
