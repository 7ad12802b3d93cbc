package onboardproto

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

// FuzzOnboardRequest decodes an onboarding request body as the hub does
// (strict JSON) and validates it: never a panic, and what validates stays
// within the bounds the hub relies on.
func FuzzOnboardRequest(f *testing.F) {
	seeds := []string{
		// a well-formed request
		`{"credential":"abcdefgh.abcdefghijklmnopqrstuvwxyz234567","name":"shop-1","csr":"AQID",` +
			`"facts":{"hostname":"h","os":"Debian","os_id":"debian","os_version":"12","arch":"amd64"},` +
			`"machine":{"uuid":"4c4c4544-0042-3510-8052-b4c04f384d32","uuid_source":"/sys/class/dmi/id/product_uuid",` +
			`"os_id_like":"debian","cpus":4,"memory_bytes":1024},"agent_version":"v1"}`,
		`{"credential":"x","csr":"AQID","machine":{"uuid":"short"}}`,                     // uuid too short
		`{"credential":"x","csr":"AQID","machine":{"uuid":"../../etc/passwd"}}`,          // uuid not an identifier
		`{"credential":"x","csr":"AQID","machine":{"uuid":"abcdefgh","cpus":-1}}`,        // negative count
		`{"credential":"x","csr":"AQID","machine":{"uuid":"abcdefgh"},"labels":{"":""}}`, // empty label key
		`{"credential":"x","csr":"AQID","machine":{"uuid":"abcdefgh"},"admin":true}`,     // unknown field
		`{"credential":"x\u0000","csr":"AQID","machine":{"uuid":"abcdefgh"}}`,            // NUL
		`{"credential":"x","csr":"not base64","machine":{"uuid":"abcdefgh"}}`,            // bad base64
		`[]`, `null`, `{"credential":1}`, ``,
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var r Request
		dec := json.NewDecoder(strings.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if r.Credential == "" || len(r.CSR) == 0 || len(r.CSR) > 8<<10 || !uuidLike.MatchString(r.Machine.UUID) ||
			len(r.Labels) > wirecheck.MaxLabels {
			t.Fatalf("validated out of bounds: %+v", r)
		}
	})
}

// FuzzParseUserData: user-data that parses has only absolute clean paths,
// decodable contents, valid modes and non-empty argv lists.
func FuzzParseUserData(f *testing.F) {
	seeds := []string{
		"#cloud-config\nwrite_files:\n  - path: /etc/x\n    permissions: \"0600\"\n    encoding: b64\n" +
			"    content: aGk=\nruncmd:\n  - [systemctl, daemon-reload]\n",
		"#cloud-config\nruncmd:\n  - echo hi\n",                              // shell string
		"#cloud-config\nwrite_files:\n  - path: /a/../b\n",                   // unclean path
		"#cloud-config\nbootcmd: [[reboot]]\n",                               // another module
		"#cloud-config\nwrite_files:\n  - path: /x\n    permissions: 0644\n", // unquoted octal
		"#cloud-config\n---\n---\n",                                          // several documents
		"#cloud-config\nruncmd: [[]]\n",                                      // empty argv
		"#!/bin/sh\nreboot\n",                                                // a script
		"#cloud-config\n&a [*a]\n",                                           // alias loop
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseUserData(s)
		if err != nil {
			return
		}
		for _, w := range u.WriteFiles {
			if _, err := w.Bytes(); err != nil {
				t.Fatalf("%s: %v", w.Path, err)
			}
			if _, err := w.Mode(); err != nil || !strings.HasPrefix(w.Path, "/") {
				t.Fatalf("%s: %v", w.Path, err)
			}
		}
		for _, argv := range u.RunCmd {
			if len(argv) == 0 || argv[0] == "" {
				t.Fatalf("empty command in %q", s)
			}
		}
	})
}
