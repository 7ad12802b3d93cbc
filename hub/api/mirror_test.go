package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/hub/upgrade"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// fill sets every field reachable from v to a non-zero value: one element
// per slice and map, allocated pointers, a fixed time.
func fill(v reflect.Value, depth int) {
	if depth > 6 {
		return
	}
	switch v.Interface().(type) {
	case time.Time:
		v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		return
	case json.RawMessage:
		v.Set(reflect.ValueOf(json.RawMessage(`{"a":1}`)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("s")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth+1)
		fill(e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	}
}

// TestMirrorTypes: the apitype structs that mirror a feature's own types
// (so the client links no feature) read and write the same JSON as the
// types the handlers serve.
func TestMirrorTypes(t *testing.T) {
	for _, tc := range []struct {
		name           string
		served, mirror any
	}{
		{"MissionCreateRequest", &mission.CreateRequest{}, &apitype.MissionCreateRequest{}},
		{"Mission", &mission.Summary{}, &apitype.Mission{}},
		{"MissionDetail", &mission.Detail{}, &apitype.MissionDetail{}},
		{"KubeOneSpec", &kubeone.Spec{}, &apitype.KubeOneSpec{}},
		{"KubeOneCluster", &kubeone.Cluster{}, &apitype.KubeOneCluster{}},
		{"KubeOneStatus", &kubeone.Status{}, &apitype.KubeOneStatus{}},
		{"UpgradeSpec", &store.UpgradeSpec{}, &apitype.UpgradeSpec{}},
		{"UpgradeNode", &store.UpgradeNode{}, &apitype.UpgradeNode{}},
	} {
		fill(reflect.ValueOf(tc.served).Elem(), 0)
		want, err := json.Marshal(tc.served)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(want))
		dec.DisallowUnknownFields()
		if err := dec.Decode(tc.mirror); err != nil {
			t.Errorf("%s: the served JSON does not decode into apitype's: %v", tc.name, err)
			continue
		}
		got, err := json.Marshal(tc.mirror)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: apitype's JSON differs from the served one:\n got %s\nwant %s", tc.name, got, want)
		}
	}
}

// TestUpgradeNodeFrom: the handler's conversion drops nothing.
func TestUpgradeNodeFrom(t *testing.T) {
	var n store.UpgradeNode
	fill(reflect.ValueOf(&n).Elem(), 0)
	want, _ := json.Marshal(n)
	got, _ := json.Marshal(upgrade.NodeView(n))
	if !bytes.Equal(got, want) {
		t.Errorf("upgrade.NodeView:\n got %s\nwant %s", got, want)
	}
}

// TestKindStatus: the client's reading of a status agrees with the
// handlers' statusOf.
func TestKindStatus(t *testing.T) {
	kinds := []error{
		ErrInvalid,
		ErrConflict,
		ErrUnauthenticated,
		ErrRefused,
		ErrNotFound,
		ErrRateLimited,
		ErrUnavailable,
	}
	for _, k := range kinds {
		if got, want := apitype.KindStatus(k), statusOf(k); got != want {
			t.Errorf("%v: apitype says %d, statusOf %d", k, got, want)
		}
	}
}

// TestUpgradeSteps: apitype names the upgrade protocol's steps and kinds.
func TestUpgradeSteps(t *testing.T) {
	for _, s := range []apitype.UpgradeStep{apitype.StepPending, apitype.StepAwaitingConfirmation, apitype.StepDownloading,
		apitype.StepVerifying, apitype.StepInstalling, apitype.StepHealthCheck, apitype.StepSucceeded, apitype.StepFailed,
		apitype.StepRolledBack, apitype.StepSkipped, apitype.StepCancelled} {
		if !upgradeproto.Step(s).Valid() {
			t.Errorf("apitype step %q is not a step of the upgrade protocol", s)
		}
		if s.Terminal() != upgradeproto.Step(s).Terminal() {
			t.Errorf("step %q: apitype says terminal %t, the protocol %t", s, s.Terminal(), !s.Terminal())
		}
	}
	if apitype.UpgradeAgent != apitype.UpgradeKind(upgradeproto.KindAgent) ||
		apitype.UpgradeBundle != apitype.UpgradeKind(upgradeproto.KindBundle) {
		t.Errorf("apitype's upgrade kinds differ from the protocol's")
	}
}
