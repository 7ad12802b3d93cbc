package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

var testHubID = strings.Repeat("ab", 32)

func TestRouteRequestRoundTrip(t *testing.T) {
	for _, r := range []RouteRequest{
		{Target: "n7", Service: 1, Purpose: PurposeJump, Operator: "alice", Origin: testHubID},
		{Target: "n7.sub.berlin", Service: 2, Port: 5432, Purpose: PurposeService, ServiceName: "berlin-db", Origin: testHubID, Trace: "t1"},
	} {
		var b bytes.Buffer
		if err := WriteRouteRequest(&b, &r); err != nil {
			t.Fatalf("write %+v: %v", r, err)
		}
		b.WriteString("payload")
		got, err := ReadRouteRequest(&b)
		if err != nil {
			t.Fatalf("read %+v: %v", r, err)
		}
		if *got != r {
			t.Errorf("round trip: got %+v, want %+v", *got, r)
		}
		if b.String() != "payload" {
			t.Errorf("reader consumed payload bytes: %q left", b.String())
		}
	}
}

func TestRouteRequestInvalid(t *testing.T) {
	ok := RouteRequest{Target: "n7", Service: 1, Purpose: PurposeJump, Origin: testHubID}
	for name, mut := range map[string]func(*RouteRequest){
		"empty target":        func(r *RouteRequest) { r.Target = "" },
		"upper-case target":   func(r *RouteRequest) { r.Target = "N7" },
		"empty label":         func(r *RouteRequest) { r.Target = "n7..berlin" },
		"too deep":            func(r *RouteRequest) { r.Target = "n" + strings.Repeat(".s", MaxSiteDepth+1) },
		"ssh with port":       func(r *RouteRequest) { r.Port = 22 },
		"tcp without port":    func(r *RouteRequest) { r.Service = 2 },
		"route service":       func(r *RouteRequest) { r.Service = 3 },
		"unknown purpose":     func(r *RouteRequest) { r.Purpose = "exfiltrate" },
		"service unnamed":     func(r *RouteRequest) { r.Purpose = PurposeService },
		"origin not a hub id": func(r *RouteRequest) { r.Origin = "root" },
	} {
		r := ok
		mut(&r)
		if err := r.Validate(); !errors.Is(err, ErrBadSite) || !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: Validate = %v, want ErrBadSite", name, err)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
}

func TestReadRouteRequestBadFrames(t *testing.T) {
	for name, in := range map[string][]byte{
		"zero length": {0, 0},
		"oversize":    {0xff, 0xff},
		"truncated":   {0, 10, '{'},
		"not json":    append([]byte{0, 3}, "abc"...),
		"invalid":     append([]byte{0, 2}, "{}"...),
	} {
		if _, err := ReadRouteRequest(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: read a bad frame without error", name)
		}
	}
}

func TestSiteMessagesValidate(t *testing.T) {
	good := []*Message{
		{Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "berlin", Capabilities: []string{CapSite},
			Site: &SiteHello{Name: "berlin", HubID: testHubID, Subtree: []string{testHubID}}}},
		{Type: TypeWelcome, Welcome: &Welcome{NodeID: "x", Name: "berlin", Site: &SiteWelcome{Path: "berlin.region", Ancestors: []string{testHubID}}}},
		{Type: TypeSiteTrust, SiteTrust: &SiteTrust{Ancestors: []AncestorTrust{{HubID: testHubID, Suffix: "berlin", Roles: []TrustRole{{Name: "ops", Selector: "role=pos", Logins: []string{"root"}}}}}}},
		{Type: TypeDesired, Desired: []DesiredObject{{Kind: "mission", Name: "pos-agent", Origin: testHubID, Generation: 3, Spec: json.RawMessage(`{}`)}}},
		{Type: TypeDesired, Desired: []DesiredObject{{Kind: "mission", Name: "pos-agent", Origin: testHubID, Generation: 4, Deleted: true}}},
		{Type: TypeDesiredAck, DesiredAcks: []DesiredAck{{Kind: "mission", Name: "pos-agent", Origin: testHubID, Generation: 3}}},
		{Type: TypeSiteStatus, SiteStatus: &SiteStatus{Seq: 1, At: time.Now(), Health: SiteHealthy, NodesOnline: 2, NodesTotal: 3,
			Sites: []SubSite{{Name: "sub", HubID: testHubID, Status: &SiteStatus{Health: SiteStale}}}}},
		{Type: TypeServiceBindings, ServiceBindings: []ServiceBinding{{Name: "berlin-db", Listen: "127.0.0.1:15432"}, {Name: "v6", Listen: "[::1]:80"}}},
		{Type: TypeServiceBindings},
		{Type: TypeSiteNodes, SiteNodes: &SiteNodes{Full: true, Done: true, Nodes: []SiteNode{{Name: "n7.sub", ID: "id", Online: true}}}},
	}
	for _, m := range good {
		if err := m.Validate(); err != nil {
			t.Errorf("%s: valid message refused: %v", m.Type, err)
		}
	}
	bad := map[string]*Message{
		"site cap without section": {Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "berlin", Capabilities: []string{CapSite}}},
		"site name with a dot":     {Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "b", Site: &SiteHello{Name: "a.b", HubID: testHubID, Subtree: []string{testHubID}}}},
		"empty subtree":            {Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "b", Site: &SiteHello{Name: "b", HubID: testHubID}}},
		"welcome bad path":         {Type: TypeWelcome, Welcome: &Welcome{NodeID: "x", Site: &SiteWelcome{Path: "Berlin", Ancestors: []string{testHubID}}}},
		"trust without ancestors":  {Type: TypeSiteTrust, SiteTrust: &SiteTrust{}},
		"desired generation 0":     {Type: TypeDesired, Desired: []DesiredObject{{Kind: "mission", Name: "m", Origin: testHubID, Spec: json.RawMessage(`{}`)}}},
		"desired without spec":     {Type: TypeDesired, Desired: []DesiredObject{{Kind: "mission", Name: "m", Origin: testHubID, Generation: 1}}},
		"empty desired":            {Type: TypeDesired},
		"status online > total":    {Type: TypeSiteStatus, SiteStatus: &SiteStatus{Health: SiteHealthy, NodesOnline: 4, NodesTotal: 3}},
		"status unknown health":    {Type: TypeSiteStatus, SiteStatus: &SiteStatus{Health: "fine"}},
		"binding on all addresses": {Type: TypeServiceBindings, ServiceBindings: []ServiceBinding{{Name: "db", Listen: "0.0.0.0:15432"}}},
		"binding without port":     {Type: TypeServiceBindings, ServiceBindings: []ServiceBinding{{Name: "db", Listen: "127.0.0.1:0"}}},
		"inventory bad name":       {Type: TypeSiteNodes, SiteNodes: &SiteNodes{Nodes: []SiteNode{{Name: "../etc"}}}},
	}
	for name, m := range bad {
		if err := m.Validate(); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: Validate = %v, want ErrBadMessage", name, err)
		}
	}
	deep := &SiteStatus{Health: SiteHealthy}
	for range MaxSiteDepth + 2 {
		deep = &SiteStatus{Health: SiteHealthy, Sites: []SubSite{{Name: "s", HubID: testHubID, Status: deep}}}
	}
	if err := (&Message{Type: TypeSiteStatus, SiteStatus: deep}).Validate(); !errors.Is(err, ErrBadSite) {
		t.Errorf("status nested too deep: Validate = %v, want ErrBadSite", err)
	}
}

func FuzzReadRouteRequest(f *testing.F) {
	var b bytes.Buffer
	_ = WriteRouteRequest(&b, &RouteRequest{Target: "n7.berlin", Service: 2, Port: 80, Purpose: PurposeJob, Origin: testHubID})
	f.Add(b.Bytes())
	f.Add([]byte{0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ReadRouteRequest(bytes.NewReader(in))
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("read a request that does not validate: %v", err)
		}
		var out bytes.Buffer
		if err := WriteRouteRequest(&out, r); err != nil {
			t.Fatalf("cannot write back a request that was read: %v", err)
		}
	})
}
