package control

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/siteproto"
)

// The site protocol's bodies ride on the control stream: Message.Validate
// checks each with the site protocol's own rules.

var testHubID = strings.Repeat("ab", 32)

func TestSiteMessagesValidate(t *testing.T) {
	good := []*Message{
		{
			Type: TypeHello,
			Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "berlin", Capabilities: []string{siteproto.CapSite},
				Site: &siteproto.Hello{Name: "berlin", HubID: testHubID, Subtree: []string{testHubID}}},
		},
		{
			Type: TypeWelcome,
			Welcome: &Welcome{
				NodeID: "x",
				Name:   "berlin",
				Site:   &siteproto.Welcome{Path: "berlin.region", Ancestors: []string{testHubID}},
			},
		},
		{
			Type: siteproto.TypeTrust,
			SiteTrust: &siteproto.Trust{
				Ancestors: []siteproto.AncestorTrust{
					{
						HubID:  testHubID,
						Suffix: "berlin",
						Roles:  []siteproto.TrustRole{{Name: "ops", Selector: "role=pos", Logins: []string{"root"}}},
					},
				},
			},
		},
		{
			Type: siteproto.TypeDesired,
			Desired: []siteproto.DesiredObject{
				{Kind: "mission", Name: "pos-agent", Origin: testHubID, Generation: 3, Spec: json.RawMessage(`{}`)},
			},
		},
		{
			Type: siteproto.TypeDesired,
			Desired: []siteproto.DesiredObject{
				{Kind: "mission", Name: "pos-agent", Origin: testHubID, Generation: 4, Deleted: true},
			},
		},
		{
			Type:        siteproto.TypeDesiredAck,
			DesiredAcks: []siteproto.DesiredAck{{Kind: "mission", Name: "pos-agent", Origin: testHubID, Generation: 3}},
		},
		{
			Type: siteproto.TypeStatus,
			SiteStatus: &siteproto.Status{
				Seq:         1,
				At:          time.Now(),
				Health:      siteproto.Healthy,
				NodesOnline: 2,
				NodesTotal:  3,
				Sites: []siteproto.SubSite{
					{Name: "sub", HubID: testHubID, Status: &siteproto.Status{Health: siteproto.Stale}},
				},
			},
		},
		{
			Type: siteproto.TypeServiceBindings,
			ServiceBindings: []siteproto.ServiceBinding{
				{Name: "berlin-db", Listen: "127.0.0.1:15432"},
				{Name: "v6", Listen: "[::1]:80"},
			},
		},
		{Type: siteproto.TypeServiceBindings},
		{
			Type: siteproto.TypeNodes,
			SiteNodes: &siteproto.Nodes{
				Full:  true,
				Done:  true,
				Nodes: []siteproto.Node{{Name: "n7.sub", ID: "id", Online: true}},
			},
		},
	}
	for _, m := range good {
		if err := m.Validate(); err != nil {
			t.Errorf("%s: valid message refused: %v", m.Type, err)
		}
	}
	bad := map[string]*Message{
		"site cap without section": {
			Type:  TypeHello,
			Hello: &Hello{ProtocolVersion: ProtocolVersion, Name: "berlin", Capabilities: []string{siteproto.CapSite}},
		},
		"site name with a dot": {
			Type: TypeHello,
			Hello: &Hello{
				ProtocolVersion: ProtocolVersion,
				Name:            "b",
				Site:            &siteproto.Hello{Name: "a.b", HubID: testHubID, Subtree: []string{testHubID}},
			},
		},
		"empty subtree": {
			Type: TypeHello,
			Hello: &Hello{
				ProtocolVersion: ProtocolVersion,
				Name:            "b",
				Site:            &siteproto.Hello{Name: "b", HubID: testHubID},
			},
		},
		"welcome bad path": {
			Type:    TypeWelcome,
			Welcome: &Welcome{NodeID: "x", Site: &siteproto.Welcome{Path: "Berlin", Ancestors: []string{testHubID}}},
		},
		"trust without ancestors": {Type: siteproto.TypeTrust, SiteTrust: &siteproto.Trust{}},
		"desired generation 0": {
			Type: siteproto.TypeDesired,
			Desired: []siteproto.DesiredObject{
				{Kind: "mission", Name: "m", Origin: testHubID, Spec: json.RawMessage(`{}`)},
			},
		},
		"desired without spec": {
			Type:    siteproto.TypeDesired,
			Desired: []siteproto.DesiredObject{{Kind: "mission", Name: "m", Origin: testHubID, Generation: 1}},
		},
		"empty desired": {Type: siteproto.TypeDesired},
		"status online > total": {
			Type:       siteproto.TypeStatus,
			SiteStatus: &siteproto.Status{Health: siteproto.Healthy, NodesOnline: 4, NodesTotal: 3},
		},
		"status unknown health": {Type: siteproto.TypeStatus, SiteStatus: &siteproto.Status{Health: "fine"}},
		"binding on all addresses": {
			Type:            siteproto.TypeServiceBindings,
			ServiceBindings: []siteproto.ServiceBinding{{Name: "db", Listen: "0.0.0.0:15432"}},
		},
		"binding without port": {
			Type:            siteproto.TypeServiceBindings,
			ServiceBindings: []siteproto.ServiceBinding{{Name: "db", Listen: "127.0.0.1:0"}},
		},
		"inventory bad name": {
			Type:      siteproto.TypeNodes,
			SiteNodes: &siteproto.Nodes{Nodes: []siteproto.Node{{Name: "../etc"}}},
		},
	}
	for name, m := range bad {
		if err := m.Validate(); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: Validate = %v, want ErrBadMessage", name, err)
		}
	}
	deep := &siteproto.Status{Health: siteproto.Healthy}
	for range siteproto.MaxDepth + 2 {
		deep = &siteproto.Status{
			Health: siteproto.Healthy,
			Sites:  []siteproto.SubSite{{Name: "s", HubID: testHubID, Status: deep}},
		}
	}
	if err := (&Message{Type: siteproto.TypeStatus, SiteStatus: deep}).Validate(); !errors.Is(
		err,
		siteproto.ErrBadSite,
	) {
		t.Errorf("status nested too deep: Validate = %v, want siteproto.ErrBadSite", err)
	}
}
