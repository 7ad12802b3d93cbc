package artifacts

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// EdgeMainPackage is tether-edge's main package, as the Go build info of
// its binaries names it.
const EdgeMainPackage = "github.com/tether-dev/tether/cmd/tether-edge"

// ErrNotAgent is wrapped by CheckAgentBinary's refusals.
var ErrNotAgent = errors.New("not a tether-edge binary for the platform and version")

// elfArch is how an ELF header names a Go architecture.
type elfArch struct {
	machine elf.Machine
	class   elf.Class
	order   binary.ByteOrder
}

var elfArches = map[string]elfArch{
	"amd64":    {elf.EM_X86_64, elf.ELFCLASS64, binary.LittleEndian},
	"386":      {elf.EM_386, elf.ELFCLASS32, binary.LittleEndian},
	"arm64":    {elf.EM_AARCH64, elf.ELFCLASS64, binary.LittleEndian},
	"arm":      {elf.EM_ARM, elf.ELFCLASS32, binary.LittleEndian},
	"riscv64":  {elf.EM_RISCV, elf.ELFCLASS64, binary.LittleEndian},
	"loong64":  {elf.EM_LOONGARCH, elf.ELFCLASS64, binary.LittleEndian},
	"ppc64le":  {elf.EM_PPC64, elf.ELFCLASS64, binary.LittleEndian},
	"ppc64":    {elf.EM_PPC64, elf.ELFCLASS64, binary.BigEndian},
	"s390x":    {elf.EM_S390, elf.ELFCLASS64, binary.BigEndian},
	"mips64le": {elf.EM_MIPS, elf.ELFCLASS64, binary.LittleEndian},
	"mips64":   {elf.EM_MIPS, elf.ELFCLASS64, binary.BigEndian},
	"mipsle":   {elf.EM_MIPS, elf.ELFCLASS32, binary.LittleEndian},
	"mips":     {elf.EM_MIPS, elf.ELFCLASS32, binary.BigEndian},
}

// CheckAgentBinary checks, before an agent artifact is pushed, that the
// file at path is tether-edge built for platform (GOOS/GOARCH) at version,
// what the agents will report after the upgrade:
//   - its ELF header names the platform's architecture (and, for linux,
//     the System V or Linux ABI): a script or a binary of another platform
//     is refused;
//   - its Go build info names tether-edge's main package, and the GOOS and
//     GOARCH it was built for;
//   - it holds a Go string variable whose value is version. The version
//     is edge.Version, set at link time with -X (as make build does);
//     -X values are not in the build info, and -trimpath (which release
//     builds use) leaves the -ldflags out of it too, so the binary itself
//     is read: a string header (address, length) in its data that points
//     at the version's bytes, which is what -X (or the source's default,
//     "dev") leaves there. Running the binary to ask would need the
//     platform's CPU.
func CheckAgentBinary(path, platform, version string) error {
	goos, goarch, _ := strings.Cut(platform, "/")
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("artifacts: --binary %s=%s: %w: %s", platform, path, ErrNotAgent, fmt.Sprintf(format, args...))
	}
	want, known := elfArches[goarch]
	if !known {
		return refuse("architecture %q is not one tether-edge is built for (%s)",
			goarch, strings.Join(sortedKeys(elfArches), ", "))
	}
	f, err := elf.Open(path)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return refuse("not an ELF executable (a script, or a binary for another OS?): %v", err)
		}
		return fmt.Errorf("artifacts: --binary %s=%s: %w", platform, path, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return refuse("an ELF %s, not an executable", f.Type)
	}
	if f.Machine != want.machine || f.Class != want.class || f.ByteOrder != want.order {
		return refuse("an executable for %s (%s, %s), not for %s", f.Machine, f.Class, f.ByteOrder, goarch)
	}
	if goos == "linux" && f.OSABI != elf.ELFOSABI_NONE && f.OSABI != elf.ELFOSABI_LINUX {
		return refuse("an executable for the %s ABI, not for linux", f.OSABI)
	}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return refuse("no Go build info (%v): not tether-edge", err)
	}
	if bi.Path != EdgeMainPackage {
		return refuse("the Go program %s, not tether-edge (%s)", orDash(bi.Path), EdgeMainPackage)
	}
	var builtOS, builtArch string
	for _, s := range bi.Settings {
		switch s.Key {
		case "GOOS":
			builtOS = s.Value
		case "GOARCH":
			builtArch = s.Value
		}
	}
	if builtOS != goos || builtArch != goarch {
		return refuse("tether-edge built for %s/%s, not for %s", orDash(builtOS), orDash(builtArch), platform)
	}
	found, err := holdsString(f, want, version)
	if err != nil {
		return fmt.Errorf("artifacts: --binary %s=%s: read: %w", platform, path, err)
	}
	if !found {
		return refuse("it does not report version %q (tether-edge --version): build it with "+
			"-ldflags '-X github.com/tether-dev/tether/edge.Version=%s' (make build VERSION=%s does), or give its own --version",
			version, version, version)
	}
	return nil
}

// holdsString reports whether f has a Go string variable with value s: a
// (pointer, length) pair in a writable section whose pointer is the
// address of s's bytes in an allocated section. Go's linkers write the
// pointer in place, also in position-independent executables (where a
// relocation adds the load address at run time).
func holdsString(f *elf.File, arch elfArch, s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	type loaded struct {
		addr uint64
		b    []byte
	}
	addrs := map[uint64]bool{}
	var writable []loaded
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_ALLOC == 0 || sec.Flags&elf.SHF_EXECINSTR != 0 {
			continue
		}
		b, err := sec.Data()
		if err != nil {
			return false, err
		}
		if sec.Flags&elf.SHF_WRITE != 0 {
			writable = append(writable, loaded{sec.Addr, b})
		}
		for off := 0; ; {
			i := bytes.Index(b[off:], []byte(s))
			if i < 0 {
				break
			}
			addrs[sec.Addr+uint64(off+i)] = true
			off += i + 1
		}
	}
	if len(addrs) == 0 {
		return false, nil
	}
	ptr := 8
	word := func(b []byte) uint64 { return arch.order.Uint64(b) }
	if arch.class == elf.ELFCLASS32 {
		ptr, word = 4, func(b []byte) uint64 { return uint64(arch.order.Uint32(b)) }
	}
	n := uint64(len(s))
	for _, w := range writable {
		for off := 0; off+2*ptr <= len(w.b); off += ptr {
			if word(w.b[off+ptr:]) == n && addrs[word(w.b[off:])] {
				return true, nil
			}
		}
	}
	return false, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
