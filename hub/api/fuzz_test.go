package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// FuzzRequestBodies feeds arbitrary bytes to the API's body decoder as each
// request type, then to the validation its handler runs next. Whatever the
// input, decode either fills the value or answers 400 with a JSON error
// (never a panic or another status), and the validators return errors
// instead of panicking.
func FuzzRequestBodies(f *testing.F) {
	seeds := []string{
		`{"token":"tjoin_abc.def","name":"node-1","csr":"AAAA","labels":{"site":"lab"}}`,
		`{"operator":"alice"}`,
		`{"operator":"alice","nonce":"x","signature":"AAAA","csr":"AAAA"}`,
		`{"uses":1,"ttl_seconds":3600,"labels":{"a":"b"}}`,
		`{"name":"alice","public_key":"ssh-ed25519 AAAA","roles":["all"]}`,
		`{"nodes":"site=lab,!env=prod","logins":["root"]}`,
		`{"command":"true","selector":"site=lab","parallel":10,"timeout_seconds":5,"max_failures":"10%"}`,
		`{"script":"#!/bin/sh\necho hi","uploads":[{"name":"a","dest":"/tmp/../etc/x","sha256":"00","mode":420}]}`,
		`{"only_failed":true}`,
		`{"engine":"k3s"}`,
		`{"role":"ops","ttl_seconds":86400}`,
		`{"name":"edge1","control_plane":["n1","n2","n3"],"workers":["n4"],` +
			`"kubernetes":"1.30.5","cni":"canal","manifest_extra":"features: {}"}`,
		`{"control_plane":["n1"],"workers":["n1"]}`,
		`{"name":"berlin","role":"onboarder","uses":50,"ttl_seconds":604800,"labels":{"site":"berlin"}}`,
		`{"name":"debian-12","distro":"debian","version":"12","family":"debian",` +
			`"cloud_init":"#cloud-config\nruncmd:\n  - [true]\n"}`,
		`{"name":"pos","script":"echo hi","state_check":"true","check_interval_seconds":60,` +
			`"sites":["berlin","sub.berlin"],"match_labels":{"role":"pos"}}`,
		`{"name":"x"} trailing`, `[1,2,3]`, `{"uses":1e999}`, `{"unknown":1}`, `null`, ``, "\x00",
	}
	for i, s := range seeds {
		f.Add(uint8(i), []byte(s))
	}
	blobs, err := blobs.New(f.TempDir(), 1<<20)
	if err != nil {
		f.Fatal(err)
	}
	types := []func() any{
		func() any { return new(control.JoinRequest) },
		func() any { return new(apitype.LoginChallengeRequest) },
		func() any { return new(apitype.LoginRequest) },
		func() any { return new(apitype.TokenCreateRequest) },
		func() any { return new(apitype.OperatorAddRequest) },
		func() any { return new(apitype.RolePutRequest) },
		func() any { return new(apitype.JobCreateRequest) },
		func() any { return new(apitype.JobRerunRequest) },
		func() any { return new(apitype.ClusterRegisterRequest) },
		func() any { return new(apitype.APITokenCreateRequest) },
		func() any { return new(kubeone.Spec) },
		func() any { return new(apitype.KubeOneMembersRequest) },
		func() any { return new(apitype.OnboardingCreateRequest) },
		func() any { return new(apitype.OSProfileAddRequest) },
		func() any { return new(apitype.MissionCreateRequest) },
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		v := types[int(kind)%len(types)]()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		if !decode(rec, req, v) {
			var e control.ErrorResponse
			if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error == "" {
				t.Fatalf("refused body %q: status %d, body %q; want 400 with a JSON error", body, rec.Code, rec.Body.String())
			}
			return
		}
		switch r := v.(type) {
		case *control.JoinRequest:
			_ = r.Validate()
		case *apitype.LoginChallengeRequest:
			_ = pki.ValidateName(r.Operator)
		case *apitype.OperatorAddRequest:
			_ = pki.ValidateName(r.Name)
			_, _ = ParseAuthorizedKey(r.PublicKey)
		case *apitype.RolePutRequest:
			if sel, err := roles.ParseSelector(r.Nodes); err == nil {
				_ = sel.Matches(map[string]string{"site": "lab"})
			}
		case *apitype.OSProfileAddRequest:
			_ = validateOSProfile(*r)
		case *apitype.JobCreateRequest:
			spec := store.JobSpec{Command: r.Command, Script: r.Script, ScriptName: r.ScriptName, Env: r.Env,
				Parallel: r.Parallel, TimeoutSeconds: r.TimeoutSeconds, MaxFailures: r.MaxFailures, Selector: r.Selector}
			for _, u := range r.Uploads {
				spec.Uploads = append(spec.Uploads, store.Upload(u))
			}
			_ = jobs.Validate(&spec, blobs)
			_, _ = jobs.ParseMaxFailures(r.MaxFailures)
		case *kubeone.Spec:
			_, _ = r.Check()
		case *apitype.KubeOneMembersRequest:
			_, _ = kubeone.CheckMembers(r.ControlPlane, r.Workers)
		case *apitype.MissionCreateRequest:
			_ = mission.Spec{
				Script:               r.Script,
				StateCheck:           r.StateCheck,
				CheckIntervalSeconds: r.CheckIntervalSeconds,
				TimeoutSeconds:       r.TimeoutSeconds,
				Placement:            mission.Placement{Sites: r.Sites, MatchLabels: r.MatchLabels},
			}.Validate()
		}
	})
}
