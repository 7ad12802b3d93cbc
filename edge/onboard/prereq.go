package onboard

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tether-dev/tether/edge"
)

// CheckStatus is a prerequisite's outcome.
type CheckStatus string

// Outcomes: a failed check stops onboarding, a warning does not.
const (
	Pass CheckStatus = "pass"
	Warn CheckStatus = "warn"
	Fail CheckStatus = "fail"
)

// Check is one row of the prerequisite table.
type Check struct {
	Name   string      `json:"name"`
	Status CheckStatus `json:"status"`
	Detail string      `json:"detail"`
	Fix    string      `json:"fix,omitempty"` // what to do when it did not pass
}

// ErrPrerequisites means a prerequisite failed; the table says which and
// what to do.
var ErrPrerequisites = errors.New("onboard: a prerequisite failed (see the table for what to do)")

// MinFreeDisk is the space the agent needs in its state dir's filesystem
// (binary, identity, logs).
const MinFreeDisk = 64 << 20

// MaxClockSkew is the skew from the hub's clock that fails onboarding:
// certificates the hub issues would look not yet valid, or expired, here.
// Half of it is a warning.
const MaxClockSkew = 2 * time.Minute

// Machine is what the local checks look at; tests fake every part.
type Machine struct {
	Root     string // the machine's root filesystem ("/")
	StateDir string // the agent's state dir (not under Root: it is a flag)
	EUID     int
	// FreeBytes returns the free space of the filesystem holding path.
	FreeBytes func(path string) (uint64, error)
}

// LocalMachine is the running machine.
func LocalMachine(stateDir string) Machine {
	return Machine{Root: "/", StateDir: stateDir, EUID: os.Geteuid(), FreeBytes: statfsFree}
}

func statfsFree(path string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// HasSystemd says whether the machine was booted with systemd
// (sd_booted(3): /run/systemd/system exists).
func (m Machine) HasSystemd() bool {
	fi, err := os.Stat(filepath.Join(m.Root, "/run/systemd/system"))
	return err == nil && fi.IsDir()
}

// LocalChecks runs the prerequisite checks that need no hub: root,
// systemd, machine UUID, serial, free disk and whether the machine is
// onboarded already (force turns that failure into a warning).
func LocalChecks(m Machine, f Facts, force bool) []Check {
	var out []Check
	if m.EUID == 0 {
		out = append(out, Check{Name: "running as root", Status: Pass, Detail: "euid 0"})
	} else {
		out = append(out, Check{Name: "running as root", Status: Fail, Detail: fmt.Sprintf("euid %d", m.EUID),
			Fix: "run it as root: sudo tether-edge onboard …"})
	}
	if m.HasSystemd() {
		out = append(out, Check{Name: "systemd", Status: Pass, Detail: "/run/systemd/system present"})
	} else {
		out = append(out, Check{
			Name:   "systemd",
			Status: Warn,
			Detail: "not booted with systemd (/run/systemd/system missing)",
			Fix: "--apply starts and supervises the agent itself (it does not survive a reboot); " +
				"on a real machine boot with systemd, or use --write-only and an init that runs cloud-init",
		})
	}
	switch {
	case f.Machine.UUID == "":
		out = append(out, Check{Name: "machine uuid", Status: Fail,
			Detail: "neither " + productUUIDPath + " nor " + machineIDPath + " holds an id",
			Fix:    "set the board's UUID in the firmware, or create one: systemd-machine-id-setup"})
	case f.Machine.UUIDSource == machineIDPath:
		out = append(out, Check{Name: "machine uuid", Status: Warn,
			Detail: f.Machine.UUID + " from " + machineIDPath + " (no DMI product_uuid)",
			Fix: "fine for VMs and boards without DMI; a cloned image shares its machine-id: " +
				"run systemd-machine-id-setup on each clone"})
	default:
		out = append(out, Check{Name: "machine uuid", Status: Pass, Detail: f.Machine.UUID + " from " + f.Machine.UUIDSource})
	}
	if f.Machine.Serial == "" {
		out = append(out, Check{Name: "serial number", Status: Warn, Detail: "not set (" + productSerialPath + ")",
			Fix: "optional: the node is identified by its UUID; set the serial in the firmware to find the machine " +
				"by its label"})
	} else {
		out = append(out, Check{Name: "serial number", Status: Pass, Detail: f.Machine.Serial})
	}
	out = append(out, diskCheck(m))
	out = append(out, onboardedCheck(m, force))
	return out
}

func diskCheck(m Machine) Check {
	c := Check{Name: "free disk"}
	dir := m.StateDir
	for { // the nearest existing parent: the state dir may not exist yet
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			break
		}
		dir = filepath.Dir(dir)
	}
	free, err := m.FreeBytes(dir)
	switch {
	case err != nil:
		c.Status, c.Detail, c.Fix = Warn, fmt.Sprintf("cannot read free space of %s: %v", dir, err),
			"check that the disk holding "+m.StateDir+" has 64 MiB free"
	case free < MinFreeDisk:
		c.Status, c.Detail = Fail, fmt.Sprintf("%d MiB free on %s, the agent needs %d MiB", free>>20, dir, MinFreeDisk>>20)
		c.Fix = "free space on that filesystem, or choose another --state-dir"
	default:
		c.Status, c.Detail = Pass, fmt.Sprintf("%d MiB free on %s", free>>20, dir)
	}
	return c
}

func onboardedCheck(m Machine, force bool) Check {
	c := Check{Name: "not onboarded yet"}
	id, err := edge.LoadIdentity(m.StateDir)
	p, perr := readProgress(m.StateDir)
	switch {
	case perr == nil && !p.Done:
		// Whatever the state dir holds, it is this CLI's unfinished work:
		// the re-run finishes it with the persisted key.
		c.Status, c.Detail = Pass, fmt.Sprintf("an onboarding to %s started %s did not finish: it is finished now", p.Hub,
			p.Started.Format(time.RFC3339))
	case err == nil && force:
		c.Status, c.Detail = Warn, fmt.Sprintf("%s holds node %s (%s)", m.StateDir, id.Config.Name, id.Config.NodeID)
		c.Fix = "--force: onboarding again with the same key (the hub returns the same node)"
	case err == nil:
		c.Status, c.Detail = Fail, fmt.Sprintf("%s already holds node %s (%s)", m.StateDir, id.Config.Name, id.Config.NodeID)
		c.Fix = "nothing to do (tether-edge status shows the agent); --force onboards again with the same key, " +
			"another --state-dir makes a new node"
	case errors.Is(err, edge.ErrNotJoined):
		c.Status, c.Detail = Pass, "no identity in "+m.StateDir
	default:
		c.Status, c.Detail = Fail, err.Error()
		c.Fix = "the state dir holds a damaged identity: move " + m.StateDir +
			" away, or use --force to onboard again with its key"
		if force {
			c.Status = Warn
		}
	}
	return c
}

// SkewCheck compares the hub's clock (its HTTP Date) with ours.
func SkewCheck(hubTime, local time.Time) Check {
	c := Check{Name: "clock skew"}
	if hubTime.IsZero() {
		c.Status, c.Detail, c.Fix = Warn, "the hub sent no Date header", "check the clock by hand (date -u) against the hub's"
		return c
	}
	skew := local.Sub(hubTime).Round(time.Second)
	abs := skew.Abs()
	dir := "ahead of"
	if skew < 0 {
		dir = "behind"
	}
	detail := fmt.Sprintf("this clock is %s %s the hub's", abs, dir)
	if abs <= time.Second {
		detail = "within a second of the hub's clock"
	}
	switch {
	case abs >= MaxClockSkew:
		c.Status, c.Detail = Fail, detail
		c.Fix = "set the time (timedatectl set-ntp true, or date -s); certificates would not be valid here with this skew"
	case abs >= MaxClockSkew/2:
		c.Status, c.Detail, c.Fix = Warn, detail, "enable NTP (timedatectl set-ntp true) before it grows"
	default:
		c.Status, c.Detail = Pass, detail
	}
	return c
}

// Failed reports whether any check failed.
func Failed(cs []Check) bool {
	for _, c := range cs {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// WriteChecks prints the prerequisite table, with what to do under each
// check that did not pass.
func WriteChecks(w io.Writer, cs []Check) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, strings.ToUpper(string(c.Status)), c.Detail)
		if c.Status != Pass && c.Fix != "" {
			fmt.Fprintf(tw, "\t\t→ %s\n", c.Fix)
		}
	}
	tw.Flush()
}

// WriteFacts prints the facts table.
func WriteFacts(w io.Writer, fs []Fact) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "FACT\tVALUE\tSOURCE")
	for _, f := range fs {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Name, f.Value, f.Source)
	}
	tw.Flush()
}
