package cluster

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/internal/validate"
)

// Limits of an engine definition.
const (
	// DefaultTimeout bounds each script run when engine.yaml sets no timeout.
	DefaultTimeout = 30 * time.Minute
	MinTimeout     = time.Second
	MaxTimeout     = 24 * time.Hour
	// MaxScriptSize bounds install.sh and uninstall.sh: they are held in memory,
	// stored with the node and sent over SSH on every run.
	MaxScriptSize = 1 << 20
	// MaxEngineYAMLSize bounds engine.yaml, which only holds a few settings.
	MaxEngineYAMLSize = 64 << 10
)

// File names inside an engine directory.
const (
	InstallFile   = "install.sh"
	UninstallFile = "uninstall.sh"
	ConfigFile    = "engine.yaml"
)

// BuiltinSource is Engine.Source for the engines compiled into the binary.
const BuiltinSource = "builtin"

var (
	// ErrUnknownEngine: no engine of that name, neither built in nor in the engines
	// directory.
	ErrUnknownEngine = errors.New("unknown cluster engine")
	// ErrInvalidEngine: an engine directory exists but its definition is broken.
	ErrInvalidEngine = errors.New("invalid cluster engine definition")
)

// Engine is one Kubernetes engine definition: the pair of scripts the hub runs on a
// node to install and uninstall it, and how to run them.
type Engine struct {
	Name        string
	Description string
	Install     []byte // install.sh
	Uninstall   []byte // uninstall.sh
	// Timeout bounds each run of either script.
	Timeout time.Duration
	// Env is set for both scripts. Names match [A-Za-z_][A-Za-z0-9_]*.
	Env map[string]string
	// Digest is "sha256:<hex>" over both scripts and Env (canonically encoded), so the
	// controller can see that the definition it installed has changed since. Env is
	// included because it changes what install.sh does (version pins); Description and
	// Timeout are not, because they do not.
	Digest string
	// Source is BuiltinSource or the engine's directory, for messages.
	Source string
}

func (e Engine) clone() Engine {
	e.Install = bytes.Clone(e.Install)
	e.Uninstall = bytes.Clone(e.Uninstall)
	e.Env = maps.Clone(e.Env)
	return e
}

// ValidEngineName reports whether name is a DNS label (lowercase letters, digits and
// inner dashes, 1..63 characters; the rule of role names): the name ends up in node
// records, metrics labels and CLI arguments, so it is kept to the most portable form.
func ValidEngineName(name string) bool { return validate.RoleName(name) == nil }

// engineConfig is engine.yaml. Timeout is a string so that "timeout: 30" is an error
// ("missing unit") rather than 30 nanoseconds.
type engineConfig struct {
	Description string            `yaml:"description"`
	Timeout     string            `yaml:"timeout"`
	Env         map[string]string `yaml:"env"`
}

const knownConfigFields = "description, timeout, env"

// engineSettings is a validated engine.yaml.
type engineSettings struct {
	Description string
	Timeout     time.Duration
	Env         map[string]string
}

// parseEngineYAML decodes and validates engine.yaml; file names it in errors. An empty
// file means all defaults.
func parseEngineYAML(file string, data []byte) (engineSettings, error) {
	s := engineSettings{Timeout: DefaultTimeout, Env: map[string]string{}}
	if len(data) > MaxEngineYAMLSize {
		return s, fmt.Errorf("%s: %d bytes, more than the %d allowed", file, len(data), MaxEngineYAMLSize)
	}
	var cfg engineConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	switch err := dec.Decode(&cfg); {
	case errors.Is(err, io.EOF):
		return s, nil // empty document: defaults
	case err != nil:
		return s, fmt.Errorf("%s: %s (known fields: %s)", file, yamlMessage(err), knownConfigFields)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return s, fmt.Errorf("%s: more than one YAML document; keep one mapping with %s", file, knownConfigFields)
	}

	s.Description = strings.TrimSpace(cfg.Description)
	if i := strings.IndexFunc(s.Description, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s.Description[i:])
		return s, fmt.Errorf("%s: description has control character %q at byte %d; keep it to one line of text", file, r, i)
	}
	if t := strings.TrimSpace(cfg.Timeout); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil {
			return s, fmt.Errorf("%s: timeout %q is not a Go duration such as 30m or 1h30m: %w", file, cfg.Timeout, err)
		}
		if d < MinTimeout || d > MaxTimeout {
			return s, fmt.Errorf("%s: timeout %s is outside %s..%s", file, d, MinTimeout, MaxTimeout)
		}
		s.Timeout = d
	}
	for _, k := range slices.Sorted(maps.Keys(cfg.Env)) {
		if err := validate.EnvName(k); err != nil {
			return s, fmt.Errorf("%s: env: %w", file, err)
		}
		v := cfg.Env[k]
		if strings.IndexByte(v, 0) >= 0 {
			return s, fmt.Errorf("%s: env %s holds a NUL byte, which no environment can carry", file, k)
		}
		s.Env[k] = v
	}
	return s, nil
}

var unknownFieldRE = regexp.MustCompile(`^(line \d+: )?field (.*) not found in type cluster\.engineConfig$`)

// yamlMessage flattens yaml's multi-line type errors ("yaml: unmarshal errors:\n  line
// 2: field x not found in type cluster.engineConfig") into one line.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, m := range te.Errors {
			if sub := unknownFieldRE.FindStringSubmatch(m); sub != nil {
				m = sub[1] + "unknown field " + strconv.Quote(sub[2])
			}
			msgs[i] = strings.Replace(m, "cluster.engineConfig", "a mapping", 1)
		}
		return strings.Join(msgs, "; ")
	}
	return err.Error()
}

// readLimited reads file from fsys, refusing anything but a regular file of at most
// limit bytes. It checks the size while reading too, in case the file grows.
func readLimited(fsys fs.FS, name, display string, limit int64) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", display, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", display, fi.Mode().Type())
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d allowed", display, fi.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", display, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: more than the %d bytes allowed", display, limit)
	}
	return data, nil
}

func readScript(fsys fs.FS, name, display string) ([]byte, error) {
	data, err := readLimited(fsys, name, display, MaxScriptSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: missing; every engine needs %s and %s", display, InstallFile, UninstallFile)
	}
	if err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%s: empty", display)
	}
	if !bytes.HasPrefix(data, []byte("#!")) {
		return nil, fmt.Errorf("%s: does not start with \"#!\"; begin it with an interpreter line such as #!/bin/sh", display)
	}
	return data, nil
}

// loadEngine reads the engine directory dir of fsys. display is how errors name the
// directory (a path, or "builtin/<name>").
func loadEngine(fsys fs.FS, dir, name, display, source string) (Engine, error) {
	wrap := func(err error) error {
		return fmt.Errorf("cluster: engine %q: %w: %w", name, ErrInvalidEngine, err)
	}
	if !ValidEngineName(name) {
		return Engine{}, wrap(fmt.Errorf("%s: directory name is not a DNS label "+
			"(lowercase letters, digits and inner dashes, at most 63 characters); rename it", display))
	}
	install, err := readScript(fsys, path.Join(dir, InstallFile), path.Join(display, InstallFile))
	if err != nil {
		return Engine{}, wrap(err)
	}
	uninstall, err := readScript(fsys, path.Join(dir, UninstallFile), path.Join(display, UninstallFile))
	if err != nil {
		return Engine{}, wrap(err)
	}
	settings := engineSettings{Timeout: DefaultTimeout, Env: map[string]string{}}
	cfgDisplay := path.Join(display, ConfigFile)
	data, err := readLimited(fsys, path.Join(dir, ConfigFile), cfgDisplay, MaxEngineYAMLSize)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// engine.yaml is optional, but a near-miss name is almost certainly a typo whose
		// settings would otherwise be silently ignored.
		for _, alt := range []string{"engine.yml", "Engine.yaml", "engine.YAML"} {
			if _, serr := fs.Stat(fsys, path.Join(dir, alt)); serr == nil {
				return Engine{}, wrap(fmt.Errorf("%s: found %s; rename it to %s", display, alt, ConfigFile))
			}
		}
	case err != nil:
		return Engine{}, wrap(err)
	default:
		if settings, err = parseEngineYAML(cfgDisplay, data); err != nil {
			return Engine{}, wrap(err)
		}
	}
	return Engine{
		Name:        name,
		Description: settings.Description,
		Install:     install,
		Uninstall:   uninstall,
		Timeout:     settings.Timeout,
		Env:         settings.Env,
		Digest:      engineDigest(install, uninstall, settings.Env),
		Source:      source,
	}, nil
}

// engineDigest hashes a versioned, length-prefixed encoding, so no two different
// definitions share an encoding.
func engineDigest(install, uninstall []byte, env map[string]string) string {
	h := sha256.New()
	field := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte("tether cluster engine v1"))
	field(install)
	field(uninstall)
	for _, k := range slices.Sorted(maps.Keys(env)) {
		field([]byte(k))
		field([]byte(env[k]))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

//go:embed engines
var builtinFS embed.FS

// builtins parses the embedded engines once; they cannot change at run time.
var builtins = sync.OnceValues(func() (map[string]Engine, error) {
	entries, err := fs.ReadDir(builtinFS, "engines")
	if err != nil {
		return nil, fmt.Errorf("cluster: built-in engines: %w", err)
	}
	out := make(map[string]Engine, len(entries))
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		eng, err := loadEngine(builtinFS, path.Join("engines", e.Name()), e.Name(), "builtin/"+e.Name(), BuiltinSource)
		if err != nil {
			return nil, err
		}
		out[e.Name()] = eng
	}
	return out, nil
})

// Catalog is an immutable set of engines: the built-ins overlaid with an engines
// directory. Safe for concurrent use.
type Catalog struct {
	dir     string
	engines map[string]Engine
	// broken holds the definition error of each engine directory that failed to load,
	// by directory name. A broken directory hides a built-in of the same name: the
	// operator meant to replace it, and installing the built-in instead would be wrong.
	broken map[string]error
}

// LoadEngines returns the built-in engines plus one engine per subdirectory of dir
// (none when dir is ""); a subdirectory replaces the built-in of the same name.
// Entries whose names start with "." and plain files are skipped; symbolic links to
// directories are followed.
//
// A broken engine directory does not fail the whole catalog, so one half-written
// definition does not stop installs of the others: Get returns that engine's error
// (wrapping ErrInvalidEngine) and Err returns all of them. LoadEngines itself fails
// only when dir cannot be read. It reads a few small files per engine, so the
// controller can call it (or Reload) before every install to see edits.
func LoadEngines(dir string) (*Catalog, error) {
	b, err := builtins()
	if err != nil {
		return nil, err
	}
	c := &Catalog{dir: dir, engines: maps.Clone(b), broken: map[string]error{}}
	if dir == "" {
		return c, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf(
			"cluster: read engines directory: %w (create it, or configure no engines directory to use only the built-ins)",
			err,
		)
	}
	fsys := os.DirFS(dir)
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue // .git, editor state
		}
		display := filepath.Join(dir, name)
		fi, err := fs.Stat(fsys, name) // follows symbolic links
		if err != nil {
			c.broken[name] = fmt.Errorf("cluster: engine %q: %w: %s: %w", name, ErrInvalidEngine, display, err)
			delete(c.engines, name)
			continue
		}
		if !fi.IsDir() {
			continue // a README next to the engines
		}
		eng, err := loadEngine(fsys, name, name, display, display)
		if err != nil {
			c.broken[name] = err
			delete(c.engines, name)
			continue
		}
		c.engines[name] = eng
	}
	return c, nil
}

// Reload re-reads the catalog's directory and returns a new Catalog; c is unchanged.
func (c *Catalog) Reload() (*Catalog, error) { return LoadEngines(c.dir) }

// Dir is the engines directory the catalog was loaded from ("" for built-ins only).
func (c *Catalog) Dir() string { return c.dir }

// Names lists the usable engines, sorted.
func (c *Catalog) Names() []string { return slices.Sorted(maps.Keys(c.engines)) }

// Get returns a copy of the named engine. It fails with ErrInvalidEngine when the
// engine's directory is broken and with ErrUnknownEngine, listing the known names, when
// there is no such engine.
func (c *Catalog) Get(name string) (Engine, error) {
	if e, ok := c.engines[name]; ok {
		return e.clone(), nil
	}
	if err, ok := c.broken[name]; ok {
		return Engine{}, err
	}
	hint := "add a directory with install.sh and uninstall.sh to the engines directory"
	if c.dir != "" {
		hint = fmt.Sprintf("add %s with %s and %s", filepath.Join(c.dir, "<name>"), InstallFile, UninstallFile)
	}
	return Engine{}, fmt.Errorf(
		"cluster: %w %q (known: %s; %s)",
		ErrUnknownEngine, name, strings.Join(c.Names(), ", "), hint,
	)
}

// Err joins the errors of every broken engine directory, sorted by name; nil when all
// loaded. The hub logs it at start-up and after each reload.
func (c *Catalog) Err() error {
	errs := make([]error, 0, len(c.broken))
	for _, name := range slices.Sorted(maps.Keys(c.broken)) {
		errs = append(errs, c.broken[name])
	}
	return errors.Join(errs...)
}
