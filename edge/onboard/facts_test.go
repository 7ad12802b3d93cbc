package onboard

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestGatherFacts(t *testing.T) {
	sb := func(v byte) string { return string([]byte{6, 0, 0, 0, v}) }
	tests := []struct {
		name  string
		files map[string]string
		links map[string]string
		check func(t *testing.T, f Facts)
	}{
		{"dmi uuid, serial, luks root", map[string]string{
			productUUIDPath:   "4C4C4544-0042-3510-8052-B4C04F333231\n",
			productSerialPath: "ABC123\n",
			osReleasePath:     "ID=ubuntu\nVERSION_ID=\"24.04\"\nID_LIKE=debian\n",
			kernelPath:        "6.8.0-45-generic\n",
			cpuinfoPath: "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\n\nprocessor\t: 1\n" +
				"model name\t: Intel(R) Xeon(R)\n",
			meminfoPath:               "MemTotal:       16318480 kB\nMemFree: 1 kB\n",
			secureBootPath:            sb(1),
			mountsPath:                "sysfs /sys sysfs rw 0 0\n/dev/mapper/root / ext4 rw 0 0\n",
			"/sys/block/dm-0/dm/name": "root\n",
			"/sys/block/dm-0/dm/uuid": "CRYPT-LUKS2-0123abcd-root\n",
		}, nil, func(t *testing.T, f Facts) {
			m := f.Machine
			if m.UUID != "4c4c4544-0042-3510-8052-b4c04f333231" || m.UUIDSource != productUUIDPath || m.Serial != "ABC123" {
				t.Errorf("uuid/serial %+v", m)
			}
			if f.Facts.OSID != "ubuntu" || f.Facts.OSVersion != "24.04" || m.OSIDLike != "debian" ||
				m.Kernel != "6.8.0-45-generic" {
				t.Errorf("os %+v %+v", f.Facts, m)
			}
			if m.CPU != "Intel(R) Xeon(R)" || m.CPUs != 2 || m.MemoryBytes != 16318480*1024 {
				t.Errorf("cpu/mem %+v", m)
			}
			if m.SecureBoot != "enabled" || m.DiskEncrypted != "yes" {
				t.Errorf("secure boot %q, encrypted %q", m.SecureBoot, m.DiskEncrypted)
			}
		}},
		{"machine-id fallback, LVM on LUKS, secure boot off", map[string]string{
			productUUIDPath:                "00000000-0000-0000-0000-000000000000\n",
			machineIDPath:                  "0123456789abcdef0123456789abcdef\n",
			secureBootPath:                 sb(0),
			mountsPath:                     "/dev/dm-1 / xfs rw 0 0\n",
			"/sys/block/dm-1/dm/uuid":      "LVM-abc\n",
			"/sys/block/dm-0/dm/uuid":      "CRYPT-LUKS2-x\n",
			"/sys/block/dm-1/slaves/.keep": "",
		}, map[string]string{"/sys/block/dm-1/slaves/dm-0": "../../dm-0"}, func(t *testing.T, f Facts) {
			m := f.Machine
			if m.UUID != "0123456789abcdef0123456789abcdef" || m.UUIDSource != machineIDPath {
				t.Errorf("uuid %+v", m)
			}
			if m.SecureBoot != "disabled" || m.DiskEncrypted != "yes" {
				t.Errorf("secure boot %q, encrypted %q", m.SecureBoot, m.DiskEncrypted)
			}
			if !hasFact(f, "machine uuid", "no DMI product_uuid") {
				t.Errorf("fallback not said: %+v", f.Shown)
			}
		}},
		{"nothing readable is unknown, never guessed", map[string]string{}, nil, func(t *testing.T, f Facts) {
			m := f.Machine
			if m.UUID != "" || m.Serial != "" || m.Kernel != "" || m.CPU != "" || m.CPUs != 0 || m.MemoryBytes != 0 ||
				m.SecureBoot != "" || m.DiskEncrypted != "" {
				t.Errorf("guessed: %+v", m)
			}
			for _, name := range []string{
				"machine uuid", "serial", "kernel", "cpu", "memory", "secure boot", "root on dm-crypt", "os id",
			} {
				if !hasValue(f, name, Unknown) {
					t.Errorf("%s not unknown: %+v", name, f.Shown)
				}
			}
		}},
		{"plain partition root, BIOS boot", map[string]string{
			mountsPath:         "/dev/sda1 / ext4 rw 0 0\n",
			"/sys/firmware/.k": "",
		}, nil, func(t *testing.T, f Facts) {
			if f.Machine.DiskEncrypted != "no" || f.Machine.SecureBoot != "disabled" {
				t.Errorf("encrypted %q secure boot %q", f.Machine.DiskEncrypted, f.Machine.SecureBoot)
			}
			if !hasFact(f, "secure boot", "BIOS boot") {
				t.Errorf("secure boot's source does not say why: %+v", f.Shown)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for p, c := range tt.files {
				write(t, root, p, c)
			}
			for p, target := range tt.links {
				if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
					t.Fatal(err)
				}
			}
			f := GatherFacts(root)
			for _, s := range f.Shown {
				if s.Source == "" {
					t.Errorf("fact %s has no source", s.Name)
				}
			}
			tt.check(t, f)
		})
	}
}

func hasFact(f Facts, name, inSource string) bool {
	for _, s := range f.Shown {
		if s.Name == name && strings.Contains(s.Source, inSource) {
			return true
		}
	}
	return false
}

func hasValue(f Facts, name, value string) bool {
	for _, s := range f.Shown {
		if s.Name == name && s.Value == value {
			return true
		}
	}
	return false
}

func TestLocalChecks(t *testing.T) {
	big := func(string) (uint64, error) { return 1 << 30, nil }
	tests := []struct {
		name   string
		euid   int
		files  map[string]string
		free   func(string) (uint64, error)
		joined bool
		force  bool
		want   map[string]CheckStatus
		setup  func(t *testing.T, state string)
	}{
		{
			"all good",
			0,
			map[string]string{
				productUUIDPath: "4c4c4544-0042-3510-8052-b4c04f333231", productSerialPath: "S1", "/run/systemd/system/.k": "",
			},
			big,
			false,
			false,
			map[string]CheckStatus{
				"running as root": Pass, "systemd": Pass, "machine uuid": Pass, "serial number": Pass, "free disk": Pass,
				"not onboarded yet": Pass,
			},
			nil,
		},
		{
			"not root, no systemd, no serial",
			1000,
			map[string]string{productUUIDPath: "4c4c4544-0042-3510-8052-b4c04f333231"},
			big,
			false,
			false,
			map[string]CheckStatus{"running as root": Fail, "systemd": Warn, "serial number": Warn},
			nil,
		},
		{"machine-id only", 0, map[string]string{machineIDPath: "0123456789abcdef0123456789abcdef"}, big, false, false,
			map[string]CheckStatus{"machine uuid": Warn}, nil},
		{"no uuid at all", 0, nil, big, false, false, map[string]CheckStatus{"machine uuid": Fail}, nil},
		{"disk full", 0, nil, func(string) (uint64, error) { return 1 << 20, nil }, false, false,
			map[string]CheckStatus{"free disk": Fail}, nil},
		{"disk unreadable", 0, nil, func(string) (uint64, error) { return 0, errors.New("EIO") }, false, false,
			map[string]CheckStatus{"free disk": Warn}, nil},
		{"onboarded already", 0, nil, big, true, false, map[string]CheckStatus{"not onboarded yet": Fail}, nil},
		{"onboarded, --force", 0, nil, big, true, true, map[string]CheckStatus{"not onboarded yet": Warn}, nil},
		{"damaged identity", 0, nil, big, false, false, map[string]CheckStatus{"not onboarded yet": Fail},
			func(t *testing.T, state string) {
				write(t, state, "node.json", "{")
			}},
		{"unfinished onboarding, damaged identity: resumed", 0, nil, big, false, false,
			map[string]CheckStatus{"not onboarded yet": Pass}, func(t *testing.T, state string) {
				write(t, state, "node.json", "{")
				if err := writeProgress(state, progress{Hub: "hub:7443", Started: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for p, c := range tt.files {
				write(t, root, p, c)
			}
			state := filepath.Join(t.TempDir(), "state")
			if tt.joined {
				h := newFakeHub(t)
				c := testConfig(t, h, fakeRoot(t, "dddddddd-2222-3333-4444-555555555555"))
				c.Machine.StateDir = state
				if _, err := Run(t.Context(), c); err != nil {
					t.Fatal(err)
				}
			}
			if tt.setup != nil {
				tt.setup(t, state)
			}
			m := Machine{Root: root, StateDir: state, EUID: tt.euid, FreeBytes: tt.free}
			got := LocalChecks(m, GatherFacts(root), tt.force)
			for _, c := range got {
				if want, ok := tt.want[c.Name]; ok && c.Status != want {
					t.Errorf("%s = %s (%s), want %s", c.Name, c.Status, c.Detail, want)
				}
				if c.Status != Pass && c.Fix == "" {
					t.Errorf("%s %s says nothing to do", c.Name, c.Status)
				}
			}
			var b strings.Builder
			WriteChecks(&b, got)
			if !strings.Contains(b.String(), "CHECK") {
				t.Error("no table")
			}
		})
	}
}

func TestSkewCheck(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		hub    time.Time
		want   CheckStatus
		detail string
	}{
		{now, Pass, "within a second"},
		{now.Add(-10 * time.Second), Pass, "10s ahead of"},
		{now.Add(90 * time.Second), Warn, "1m30s behind"},
		{now.Add(-10 * time.Minute), Fail, "10m0s ahead of"},
		{time.Time{}, Warn, "no Date"},
	}
	for _, tt := range tests {
		c := SkewCheck(tt.hub, now)
		if c.Status != tt.want || !strings.Contains(c.Detail, tt.detail) {
			t.Errorf("hub %v: %s %q, want %s %q", tt.hub, c.Status, c.Detail, tt.want, tt.detail)
		}
	}
}

func TestParsers(t *testing.T) {
	if m, n := parseCPUInfo(strings.NewReader(
		"processor : 0\nHardware : BCM2835\nModel : Raspberry Pi 4\n")); m != "BCM2835" || n != 1 {
		t.Errorf("arm cpuinfo: %q %d", m, n)
	}
	for in, want := range map[string]int64{
		"MemTotal: 10 kB\n": 10240, "MemTotal: x kB\n": 0, "MemTotal: 10 MB\n": 0, "": 0,
	} {
		if got := parseMemTotal(strings.NewReader(in)); got != want {
			t.Errorf("parseMemTotal(%q) = %d, want %d", in, got, want)
		}
	}
	if got := parseRootDevice(strings.NewReader(
		"/dev/a / ext4\noverlay / overlay\n/dev/b /boot ext4\n")); got != "overlay" {
		t.Errorf("root device %q", got)
	}
	if got := unescapeMount(`/dev/my\040disk`); got != "/dev/my disk" {
		t.Errorf("unescape %q", got)
	}
}
