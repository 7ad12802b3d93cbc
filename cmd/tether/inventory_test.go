package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// TestAnsibleInventoryShape holds `tether inventory --ansible` to Ansible's
// documented dynamic inventory format (`--list`): top-level groups with
// "hosts" (and "all" with "children"), and "_meta" -> "hostvars" -> host ->
// variables. Reported labels are hostvars, never groups.
func TestAnsibleInventoryShape(t *testing.T) {
	nodes := []apitype.Node{
		{
			Name:           "n1",
			Online:         true,
			Labels:         map[string]string{"env": "prod", "k8s.io/role": "worker"},
			ReportedLabels: map[string]string{"env": "dev"},
		},
		{Name: "n2", Labels: map[string]string{"env": "prod", "9lives": ""}},
		{Name: "bare"},
	}
	b, err := json.Marshal(ansibleInventory(inventoryHosts(nodes, "tether"), "-o ProxyCommand='ssh -W %h:%p alice@hub'",
		"root"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Hostvars map[string]map[string]any `json:"hostvars"`
	}
	if err := json.Unmarshal(doc["_meta"], &meta); err != nil {
		t.Fatalf("_meta: %v", err)
	}
	groups := map[string][]string{}
	for name, raw := range doc {
		if name == "_meta" {
			continue
		}
		var g struct {
			Hosts    []string `json:"hosts"`
			Children []string `json:"children"`
		}
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&g); err != nil {
			t.Fatalf("group %q is not {hosts, children}: %v: %s", name, err, raw)
		}
		for _, c := range name {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') ||
				name[0] >= '0' && name[0] <= '9' {
				t.Errorf("group name %q has characters Ansible warns about", name)
			}
		}
		if name == "all" {
			groups[name] = g.Children
			continue
		}
		groups[name] = g.Hosts
	}
	for name, want := range map[string][]string{
		"env_prod":           {"n1", "n2"},
		"k8s_io_role_worker": {"n1"},
		"_9lives":            {"n2"},
		"tether_online":      {"n1"},
		"ungrouped":          {"bare"},
		"all":                {"_9lives", "env_prod", "k8s_io_role_worker", "tether_online", "ungrouped"},
	} {
		if !slices.Equal(groups[name], want) {
			t.Errorf("group %s = %v, want %v", name, groups[name], want)
		}
	}
	if _, ok := groups["env_dev"]; ok {
		t.Error("a reported label made a group")
	}
	v := meta.Hostvars["n1"]
	if v["ansible_host"] != "n1.tether" || v["ansible_user"] != "root" ||
		!strings.Contains(v["ansible_ssh_common_args"].(string), "ProxyCommand") ||
		v["tether_online"] != true || v["tether_reported_labels"].(map[string]any)["env"] != "dev" {
		t.Errorf("hostvars of n1: %v", v)
	}
	if len(meta.Hostvars) != 3 {
		t.Errorf("hostvars for %d hosts, want 3", len(meta.Hostvars))
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"plain":          "plain",
		"%h:%p":          "%h:%p",
		"a b":            "'a b'",
		"it's":           `'it'\''s'`,
		"":               "''",
		"/tmp/x y/known": "'/tmp/x y/known'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
