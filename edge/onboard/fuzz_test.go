package onboard

import (
	"bytes"
	"testing"

	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// FuzzUserData: the hub's user-data is parsed (onboardproto.ParseUserData)
// before onboarding applies any of it; no input may panic, and what is
// accepted has only absolute, clean paths and non-empty commands.
func FuzzUserData(f *testing.F) {
	f.Add([]byte("#cloud-config\nwrite_files:\n- path: /etc/a\n  content: x\n  permissions: '0600'\nruncmd:\n" +
		"- [systemctl, enable, --now, tether-edge]\n"))
	f.Add([]byte("#cloud-config\nwrite_files:\n- path: /a\n  encoding: b64\n  content: aGk=\n")) // base64 content
	f.Add([]byte("#cloud-config\nruncmd: [[a], []]\n"))                                          // an empty argv
	f.Add([]byte("#cloud-config\n&a [*a]\n"))                                                    // a YAML alias
	f.Fuzz(func(t *testing.T, data []byte) {
		cc, err := onboardproto.ParseUserData(string(data))
		if err != nil {
			return
		}
		for _, w := range cc.WriteFiles {
			if len(w.Path) == 0 || w.Path[0] != '/' || bytes.Contains([]byte(w.Path), []byte("/../")) {
				t.Fatalf("accepted path %q", w.Path)
			}
		}
		for _, argv := range cc.RunCmd {
			if len(argv) == 0 || argv[0] == "" {
				t.Fatal("accepted an empty command")
			}
		}
	})
}

// FuzzMachineParsers: /proc/cpuinfo, /proc/meminfo and /proc/mounts are
// read under a root a test (or a broken machine) can fill with anything.
func FuzzMachineParsers(f *testing.F) {
	f.Add([]byte("processor\t: 0\nmodel name\t: Xeon\n")) // cpuinfo
	f.Add([]byte("MemTotal:       16318480 kB\n"))        // meminfo
	f.Add([]byte("/dev/mapper/root / ext4 rw 0 0\n"))     // mounts
	f.Add([]byte(`/dev/a\040b\ / ext4 rw 0 0` + "\n"))    // escapes, a trailing backslash
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, n := parseCPUInfo(bytes.NewReader(data)); n < 0 {
			t.Fatal("negative cpu count")
		}
		if m := parseMemTotal(bytes.NewReader(data)); m < 0 {
			t.Fatal("negative memory")
		}
		_ = parseRootDevice(bytes.NewReader(data))
	})
}
