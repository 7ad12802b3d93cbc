package api

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

var (
	labelKeyRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
	labelValueRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$|^$`)
)

// ValidateLabels checks label keys and values (Kubernetes-like rules) so they
// can be used in selectors later without quoting.
func ValidateLabels(l map[string]string) error {
	if len(l) > 64 {
		return fmt.Errorf("at most 64 labels, got %d", len(l))
	}
	for k, v := range l {
		if !labelKeyRE.MatchString(k) {
			return fmt.Errorf("invalid label key %q: lowercase letters, digits, '.', '_', '/', '-', at most 63 characters", k)
		}
		if !labelValueRE.MatchString(v) {
			return fmt.Errorf("invalid value %q for label %q: letters, digits, '.', '_', '-', at most 63 characters", v, k)
		}
	}
	return nil
}

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
