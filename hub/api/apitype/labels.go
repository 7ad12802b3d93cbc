package apitype

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tether-dev/tether/internal/validate"
)

// ValidateLabels checks label keys and values (the one rule every part of
// Tether shares, so they can be used in selectors without quoting).
func ValidateLabels(l map[string]string) error { return validate.Labels(l) }

// ParseLabels parses k=v arguments (as given to --label).
func ParseLabels(args []string) (map[string]string, error) {
	out := map[string]string{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return nil, fmt.Errorf("label %q: want KEY=VALUE", a)
		}
		out[k] = v
	}
	if err := ValidateLabels(out); err != nil {
		return nil, err
	}
	return out, nil
}

// FormatLabels is labels as k=v pairs, sorted, comma-separated (as
// listings and audit events show them).
func FormatLabels(l map[string]string) string {
	parts := make([]string, 0, len(l))
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
