package service

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

const (
	root   = "1111111111111111111111111111111111111111111111111111111111111111"
	region = "2222222222222222222222222222222222222222222222222222222222222222"
)

func svc(target string, port uint16, binds ...store.ServiceBinding) store.Service {
	return store.Service{Name: "db", Origin: root, Target: target, Port: port, Generation: 1, Bindings: binds}
}

func bind(consumer string, port uint16) store.ServiceBinding {
	return store.ServiceBinding{Consumer: consumer, Port: port}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		sv   store.Service
		want string // "" valid
	}{
		{"plain", svc("n3", 5432, bind("m2", 15432)), ""},
		{"below sites", svc("n3.berlin.region", 5432, bind("m2.munich.region", 15432), bind("m3", 1)), ""},
		{"no consumers", svc("n3", 22), ""},
		{"bad name", store.Service{Name: "Db!", Target: "n3", Port: 1}, "service name"},
		{"bad target", svc("n3..berlin", 5432), "target"},
		{"empty target", svc("", 5432), "target"},
		{"port zero", svc("n3", 0), "port 0"},
		{"consumer is target", svc("n3", 5432, bind("n3", 15432)), "its own target"},
		{"consumer twice", svc("n3", 5432, bind("m2", 1), bind("m2", 2)), "bound twice"},
		{"local port zero", svc("n3", 5432, bind("m2", 0)), "local port 0"},
		{"bad consumer", svc("n3", 5432, bind("m2 ; rm", 1)), "consumer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.sv)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid service refused: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestRelative(t *testing.T) {
	for _, tc := range []struct {
		path, suffix, want string
		ok                 bool
	}{
		{"n3", "", "n3", true},
		{"n3.berlin", "", "n3.berlin", true},
		{"n3.berlin", "berlin", "n3", true},
		{"n3.sub.berlin.region", "berlin.region", "n3.sub", true},
		{"n3.munich", "berlin", "", false},
		{"n3.xberlin", "berlin", "", false},
		{"berlin", "berlin", "", false},
	} {
		got, ok := Relative(tc.path, tc.suffix)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Relative(%q, %q) = %q, %v; want %q, %v", tc.path, tc.suffix, got, ok, tc.want, tc.ok)
		}
	}
}

// suffixes of a hub "berlin" under region, under root.
func berlinSuffixes(origin string) (string, bool) {
	switch origin {
	case root:
		return "berlin.region", true
	case region:
		return "berlin", true
	}
	return "", false
}

func TestBindingsFor(t *testing.T) {
	a := svc("n3.munich.region", 5432, bind("m2.berlin.region", 15432), bind("m3.berlin.region", 15432),
		bind("m2.munich.region", 1))
	b := store.Service{Name: "cache", Origin: region, Target: "c1.munich", Port: 6379, Generation: 1,
		Bindings: []store.ServiceBinding{bind("m2.berlin", 16379), bind("m2.sub.berlin", 16379)}}
	clash := store.Service{Name: "zz", Origin: region, Target: "c1.munich", Port: 1, Generation: 1,
		Bindings: []store.ServiceBinding{bind("m2.berlin", 15432)}}
	unknown := store.Service{
		Name:     "aa",
		Origin:   strings.Repeat("3", 64),
		Target:   "x",
		Port:     1,
		Bindings: []store.ServiceBinding{bind("m2", 9)},
	}
	got := BindingsFor([]store.Service{unknown, b, a, clash}, berlinSuffixes, "m2")
	want := []siteproto.ServiceBinding{{Name: "cache", Listen: "127.0.0.1:16379"}, {Name: "db", Listen: "127.0.0.1:15432"}}
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Fatalf("bindings of m2 at berlin: %s, want %s", gj, wj)
	}
	if got := BindingsFor([]store.Service{a}, berlinSuffixes, "n9"); len(got) != 0 {
		t.Fatalf("a node that consumes nothing got %v", got)
	}
}

func TestCheckConsumer(t *testing.T) {
	sv := svc("n3.munich.region", 5432, bind("m2.berlin.region", 15432), bind("m9.sub.berlin.region", 1))
	if err := CheckConsumer(sv, "berlin.region", "m2"); err != nil {
		t.Fatalf("bound consumer refused: %v", err)
	}
	for _, node := range []string{"m3", "n3", "m9"} {
		if err := CheckConsumer(sv, "berlin.region", node); !errors.Is(err, ErrRefused) {
			t.Errorf("node %s is not bound here, yet: %v", node, err)
		}
	}
	// The same name at another site is another node.
	if err := CheckConsumer(sv, "munich.region", "m2"); !errors.Is(err, ErrRefused) {
		t.Errorf("m2 of munich passed as m2 of berlin: %v", err)
	}
}

func TestCheckRoute(t *testing.T) {
	sv := svc("n3.munich.region", 5432, bind("m2.berlin.region", 15432))
	good := siteproto.RouteRequest{
		Target:      "n3.munich.region",
		Service:     2,
		Port:        5432,
		Purpose:     siteproto.PurposeService,
		Origin:      root,
		ServiceName: "db",
	}
	// At region (suffix "region"), from child berlin.
	if err := CheckRoute(sv, "region", "berlin", &good); err != nil {
		t.Fatalf("good route refused: %v", err)
	}
	for _, tc := range []struct {
		name  string
		child string
		edit  func(r *siteproto.RouteRequest)
	}{
		{"other port", "berlin", func(r *siteproto.RouteRequest) { r.Port = 22 }},
		{"other target", "berlin", func(r *siteproto.RouteRequest) { r.Target = "n4.munich.region" }},
		{"ssh", "berlin", func(r *siteproto.RouteRequest) { r.Service, r.Port = 1, 0 }},
		{"other origin", "berlin", func(r *siteproto.RouteRequest) { r.Origin = region }},
		{"other service", "berlin", func(r *siteproto.RouteRequest) { r.ServiceName = "cache" }},
		{"jump purpose", "berlin", func(r *siteproto.RouteRequest) { r.Purpose = siteproto.PurposeJump }},
		{"site without consumers", "munich", func(*siteproto.RouteRequest) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.edit(&r)
			if err := CheckRoute(sv, "region", tc.child, &r); !errors.Is(err, ErrRefused) {
				t.Fatalf("route %+v from %s carried: %v", r, tc.child, err)
			}
		})
	}
}

func TestSpecRoundTrip(t *testing.T) {
	sv := svc("n3.berlin", 5432, bind("m2.munich", 15432))
	got, err := FromSpec(sv.Origin, sv.Name, sv.Generation, SpecOf(sv))
	if err != nil {
		t.Fatal(err)
	}
	if got.Target != sv.Target || got.Port != sv.Port || len(got.Bindings) != 1 || got.Bindings[0] != sv.Bindings[0] {
		t.Fatalf("round trip: %+v, want %+v", got, sv)
	}
	if _, err := FromSpec(root, "db", 1,
		json.RawMessage(`{"target":"n3","port":1,"extra":1}`)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown field accepted: %v", err)
	}
}

func FuzzFromSpec(f *testing.F) {
	f.Add([]byte(`{"target":"n3.berlin","port":5432,"bindings":[{"consumer":"m2.munich","port":15432}]}`))
	f.Add([]byte(`{"target":"","port":0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		sv, err := FromSpec(root, "db", 1, b)
		if err != nil {
			return
		}
		if Validate(sv) != nil {
			t.Fatalf("FromSpec accepted an invalid service: %+v", sv)
		}
		if _, err := FromSpec(root, "db", 1, SpecOf(sv)); err != nil {
			t.Fatalf("a decoded service does not round-trip: %v", err)
		}
	})
}

func TestCheckFromParent(t *testing.T) {
	sv := svc("n3.berlin.region", 5432, bind("m2.munich.region", 15432))
	// At berlin (suffix "berlin.region" under the root), from the region.
	good := siteproto.RouteRequest{
		Target:      "n3",
		Service:     2,
		Port:        5432,
		Purpose:     siteproto.PurposeService,
		Origin:      root,
		ServiceName: "db",
	}
	if err := CheckFromParent(sv, "berlin.region", &good); err != nil {
		t.Fatalf("good route refused: %v", err)
	}
	for _, tc := range []struct {
		name, suffix string
		edit         func(r *siteproto.RouteRequest)
	}{
		{"other node", "berlin.region", func(r *siteproto.RouteRequest) { r.Target = "n4" }},
		{"other port", "berlin.region", func(r *siteproto.RouteRequest) { r.Port = 22 }},
		{"ssh", "berlin.region", func(r *siteproto.RouteRequest) { r.Service, r.Port = 1, 0 }},
		{"other origin", "berlin.region", func(r *siteproto.RouteRequest) { r.Origin = region }},
		{"target not below this hub", "munich.region", func(r *siteproto.RouteRequest) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.edit(&r)
			if err := CheckFromParent(sv, tc.suffix, &r); !errors.Is(err, ErrRefused) {
				t.Fatalf("route %+v carried at %s: %v", r, tc.suffix, err)
			}
		})
	}
}
