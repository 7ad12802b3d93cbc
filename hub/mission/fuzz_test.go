package mission

import (
	"encoding/json"
	"testing"
)

// FuzzParseSpec: a mission spec from a parent is decoded and validated;
// whatever the bytes, it is refused with an error or accepted within the
// bounds, never a panic.
func FuzzParseSpec(f *testing.F) {
	// a full spec
	f.Add([]byte(`{"script":"echo hi","placement":{"sites":["berlin","sub.berlin"],"match_labels":{"role":"pos"}}}`))
	f.Add([]byte(`{"script":"x","state_check":"true","check_interval_seconds":5}`)) // the shortest interval
	f.Add([]byte(`{"script":""}`))                                                  // empty script
	f.Add([]byte(`{"script":"x","placement":{"sites":["a..b"]}}`))                  // bad site path
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, err := ParseSpec(raw)
		if err != nil {
			return
		}
		if len(s.Script) == 0 || len(s.Script) > MaxScript || len(s.StateCheck) > MaxStateCheck ||
			len(s.Placement.Sites) > MaxPlacementSites {
			t.Fatalf("accepted out-of-bounds spec: %d-byte script, %d-byte check, %d sites", len(s.Script), len(s.StateCheck),
				len(s.Placement.Sites))
		}
		_ = s.Placement.PlacesHub("berlin")
		_ = s.Placement.MatchesNode("berlin", map[string]string{"role": "pos"})
	})
}

// FuzzReport: a sub-site's missions report is read into the parent's
// view and flattened; malformed or hostile nesting never panics.
func FuzzReport(f *testing.F) {
	f.Add([]byte(`{"missions":[{"origin":"o","name":"m","generation":1,"nodes":[{"node":"n1","phase":"applied"}],` +
		`"sites":[{"name":"sub","mission":{"origin":"o","name":"m","nodes":[{"node":"n2"}]}}]}]}`)) // nested
	f.Add([]byte(`{"missions":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, st := range parseReport(json.RawMessage(raw)) {
			_, _ = Flatten(*st)
		}
	})
}
