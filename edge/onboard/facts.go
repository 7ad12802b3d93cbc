package onboard

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// Where the machine facts are read from, relative to the machine's root.
const (
	productUUIDPath   = "/sys/class/dmi/id/product_uuid"
	productSerialPath = "/sys/class/dmi/id/product_serial"
	machineIDPath     = "/etc/machine-id"
	osReleasePath     = "/etc/os-release"
	osReleaseFallback = "/usr/lib/os-release"
	kernelPath        = "/proc/sys/kernel/osrelease"
	cpuinfoPath       = "/proc/cpuinfo"
	meminfoPath       = "/proc/meminfo"
	mountsPath        = "/proc/mounts"
	sysBlockPath      = "/sys/block"
	// The EFI global variable SecureBoot: 4 bytes of attributes, then 1
	// (enabled) or 0 (disabled).
	secureBootPath = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
	efiPath        = "/sys/firmware/efi"
)

// Unknown is how a fact that could not be read is shown.
const Unknown = "unknown"

// Fact is one fact as shown to the person onboarding: its value (Unknown
// when it could not be read) and where it came from.
type Fact struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

// Facts is what onboarding tells the hub about this machine, and the same
// facts with their sources for the table and -o json.
type Facts struct {
	Facts   control.Facts
	Machine onboardproto.MachineFacts
	Shown   []Fact
}

// GatherFacts reads the machine's facts under root ("/" on a real machine;
// a fake tree in tests). The hostname, architecture and management
// interface (default route, MAC, address) are the live machine's, from
// edge.GatherFacts, whatever root is.
func GatherFacts(root string) Facts {
	at := func(p string) string { return filepath.Join(root, p) }
	var out Facts
	out.Facts = edge.GatherFacts()
	f, m := &out.Facts, &out.Machine
	add := func(name, value, source string) {
		if value == "" {
			value = Unknown
		}
		out.Shown = append(out.Shown, Fact{Name: name, Value: value, Source: source})
	}

	id := machineUUID(root)
	m.UUID, m.UUIDSource = id.value, id.source
	add("machine uuid", m.UUID, id.sourceNote())
	m.Serial = dmiValue(at(productSerialPath))
	add("serial", m.Serial, productSerialPath)

	osSrc := osReleasePath
	osr := edge.ReadOSRelease(at(osReleasePath))
	if len(osr) == 0 {
		osSrc = osReleaseFallback
		osr = edge.ReadOSRelease(at(osReleaseFallback))
	}
	f.OSID, f.OSVersion, m.OSIDLike = osr["ID"], osr["VERSION_ID"], osr["ID_LIKE"]
	if osr["PRETTY_NAME"] != "" {
		f.OS = osr["PRETTY_NAME"]
	}
	add("os id", f.OSID, osSrc+" ID")
	add("os version", f.OSVersion, osSrc+" VERSION_ID")
	add("os id_like", m.OSIDLike, osSrc+" ID_LIKE")

	m.Kernel = firstLine(at(kernelPath))
	add("kernel", m.Kernel, kernelPath)
	add("arch", f.Arch, "the agent's build (GOARCH)")
	if r, err := os.Open(at(cpuinfoPath)); err == nil {
		m.CPU, m.CPUs = parseCPUInfo(r)
		r.Close()
	}
	add("cpu", m.CPU, cpuinfoPath+" model name")
	add("cpus", countString(m.CPUs), cpuinfoPath+" processor lines")
	if r, err := os.Open(at(meminfoPath)); err == nil {
		m.MemoryBytes = parseMemTotal(r)
		r.Close()
	}
	mem := countString64(m.MemoryBytes)
	if mem != "" {
		mem = fmt.Sprintf("%s (%.1f GiB)", mem, float64(m.MemoryBytes)/(1<<30))
	}
	add("memory", mem, meminfoPath+" MemTotal (bytes)")
	var sbSource string
	m.SecureBoot, sbSource = secureBoot(root)
	add("secure boot", m.SecureBoot, sbSource)
	m.DiskEncrypted = rootEncrypted(root)
	add("root on dm-crypt", m.DiskEncrypted, mountsPath+" + "+sysBlockPath+"/dm-*/dm/uuid")

	add("mgmt interface", f.Interface, "/proc/net/route default route")
	add("mgmt mac", f.MAC, "the default-route interface")
	add("mgmt address", f.Address, "the default-route interface")
	// The hub's machine id fact follows the same root (a fake root's
	// machine-id in tests).
	if mid := firstLine(at(machineIDPath)); mid != "" {
		f.MachineID = mid
	}
	return out
}

type sourced struct{ value, source string }

func (s sourced) sourceNote() string {
	if s.source == machineIDPath {
		return machineIDPath + " (no DMI product_uuid)"
	}
	if s.source == "" {
		return productUUIDPath + ", " + machineIDPath
	}
	return s.source
}

// machineUUID is the DMI product UUID, else /etc/machine-id (a VM or board
// without DMI); empty when neither can be read. Firmware placeholders
// ("Not Settable", all zeros or all Fs) are not an identity.
func machineUUID(root string) sourced {
	if v := dmiValue(filepath.Join(root, productUUIDPath)); v != "" && !placeholderUUID(v) {
		return sourced{strings.ToLower(v), productUUIDPath}
	}
	if v := firstLine(filepath.Join(root, machineIDPath)); v != "" && !placeholderUUID(v) {
		return sourced{v, machineIDPath}
	}
	return sourced{}
}

func placeholderUUID(v string) bool {
	hex := strings.ReplaceAll(strings.ToLower(v), "-", "")
	return strings.Trim(hex, "0") == "" || strings.Trim(hex, "f") == ""
}

// dmiValue reads a DMI attribute; vendors' "not set" texts count as unset.
func dmiValue(path string) string {
	v := firstLine(path)
	switch strings.ToLower(v) {
	case "", "none", "not specified", "not settable", "to be filled by o.e.m.", "default string", "0",
		"system serial number":
		return ""
	}
	return v
}

// firstLine is the first line of a small file, trimmed; "" when unreadable.
func firstLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 4096))
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}

func countString(n int) string {
	if n <= 0 {
		return ""
	}
	return strconv.Itoa(n)
}

func countString64(n int64) string {
	if n <= 0 {
		return ""
	}
	return strconv.FormatInt(n, 10)
}

// parseCPUInfo reads /proc/cpuinfo: the first "model name" (x86) or
// "Model"/"Hardware" (ARM boards) and the number of "processor" entries.
func parseCPUInfo(r io.Reader) (model string, n int) {
	var alt string
	sc := bufio.NewScanner(io.LimitReader(r, 4<<20))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			n++
		case "model name":
			if model == "" {
				model = v
			}
		case "Model", "Hardware":
			if alt == "" {
				alt = v
			}
		}
	}
	if model == "" {
		model = alt
	}
	if len(model) > 200 {
		model = model[:200]
	}
	return model, n
}

// parseMemTotal reads MemTotal from /proc/meminfo, in bytes; 0 when absent.
func parseMemTotal(r io.Reader) int64 {
	sc := bufio.NewScanner(io.LimitReader(r, 1<<20))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "MemTotal:" {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || kb <= 0 || kb > 1<<43 {
			return 0
		}
		if len(f) >= 3 && f[2] != "kB" {
			return 0
		}
		return kb * 1024
	}
	return 0
}

// secureBoot reads the EFI SecureBoot variable: "enabled" or "disabled";
// "disabled" also when the machine booted without EFI (no Secure Boot
// possible, and the source says so); "" when EFI is there but the variable
// cannot be read.
func secureBoot(root string) (value, source string) {
	b, err := os.ReadFile(filepath.Join(root, secureBootPath))
	if err == nil && len(b) == 5 {
		switch b[4] {
		case 1:
			return "enabled", secureBootPath
		case 0:
			return "disabled", secureBootPath
		}
		return "", secureBootPath
	}
	if _, err := os.Stat(filepath.Join(root, efiPath)); os.IsNotExist(err) {
		if _, err := os.Stat(filepath.Join(root, "/sys/firmware")); err == nil {
			return "disabled", efiPath + " absent (BIOS boot: no Secure Boot)"
		}
	}
	return "", secureBootPath
}

// rootEncrypted says whether / is on dm-crypt: "yes", "no", or "" when the
// mount table cannot be read. A device-mapper device counts as encrypted
// when it, or a device it is stacked on (LVM on LUKS), is a CRYPT- target.
func rootEncrypted(root string) string {
	f, err := os.Open(filepath.Join(root, mountsPath))
	if err != nil {
		return ""
	}
	dev := parseRootDevice(f)
	f.Close()
	if dev == "" {
		return ""
	}
	dm := dmName(root, dev)
	if dm == "" {
		return "no" // a plain partition, tmpfs, overlay…: not dm-crypt
	}
	seen := map[string]bool{}
	var crypt func(string) (bool, bool)
	crypt = func(dm string) (encrypted, known bool) {
		if seen[dm] || len(seen) > 32 {
			return false, true
		}
		seen[dm] = true
		uuid := firstLine(filepath.Join(root, sysBlockPath, dm, "dm", "uuid"))
		if uuid == "" {
			return false, false
		}
		if strings.HasPrefix(uuid, "CRYPT-") {
			return true, true
		}
		slaves, _ := os.ReadDir(filepath.Join(root, sysBlockPath, dm, "slaves"))
		allKnown := true
		for _, s := range slaves {
			if !strings.HasPrefix(s.Name(), "dm-") {
				continue
			}
			enc, known := crypt(s.Name())
			if enc {
				return true, true
			}
			allKnown = allKnown && known
		}
		return false, allKnown
	}
	enc, known := crypt(dm)
	switch {
	case enc:
		return "yes"
	case known:
		return "no"
	}
	return ""
}

// dmName maps a root device (/dev/dm-3, /dev/mapper/vg-root) to its
// dm-N name under /sys/block, or "" when it is not a device-mapper device.
func dmName(root, dev string) string {
	if strings.HasPrefix(dev, "/dev/dm-") {
		return strings.TrimPrefix(dev, "/dev/")
	}
	name, ok := strings.CutPrefix(dev, "/dev/mapper/")
	if !ok {
		return ""
	}
	entries, _ := os.ReadDir(filepath.Join(root, sysBlockPath))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "dm-") {
			continue
		}
		if firstLine(filepath.Join(root, sysBlockPath, e.Name(), "dm", "name")) == name {
			return e.Name()
		}
	}
	return ""
}

// parseRootDevice reads /proc/mounts and returns the device mounted on /
// (the last such line wins, as the kernel stacks mounts); "" when none.
func parseRootDevice(r io.Reader) string {
	var dev string
	sc := bufio.NewScanner(io.LimitReader(r, 4<<20))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[1] == "/" {
			dev = unescapeMount(f[0])
		}
	}
	return dev
}

// unescapeMount undoes /proc/mounts' octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
