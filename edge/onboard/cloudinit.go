package onboard

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/pki"
)

// DefaultSeedDir is cloud-init's NoCloud seed directory: user-data and
// meta-data there are applied at the next boot.
const DefaultSeedDir = "/var/lib/cloud/seed/nocloud"

// AgentStateDir is the agent's state dir as the hub's cloud-init names it
// (the unit's --state-dir). Files the user-data writes there go to
// --state-dir when onboarding applies them itself.
const AgentStateDir = "/var/lib/tether-edge"

// maxUserData bounds the user-data onboarding parses.
const maxUserData = 1 << 20

// CloudConfig is the part of cloud-init's #cloud-config that onboarding
// applies itself: files to write, then commands to run. Any other key is
// refused when parsing, so that nothing the hub meant is silently skipped.
type CloudConfig struct {
	WriteFiles []WriteFile `yaml:"write_files"`
	RunCmd     [][]string  `yaml:"runcmd"`
}

// WriteFile is one write_files entry.
type WriteFile struct {
	Path        string `yaml:"path"`
	Content     string `yaml:"content"`
	Permissions string `yaml:"permissions"`
	Encoding    string `yaml:"encoding"`
	Owner       string `yaml:"owner"`
}

// ParseUserData parses #cloud-config user-data of the shape the hub
// renders: write_files (path, content, permissions, optional b64 encoding)
// and runcmd as argv lists.
func ParseUserData(data []byte) (*CloudConfig, error) {
	if len(data) > maxUserData {
		return nil, fmt.Errorf("cloud-init: user-data is larger than %d bytes", maxUserData)
	}
	first, _, _ := bytes.Cut(data, []byte("\n"))
	if string(bytes.TrimSpace(first)) != "#cloud-config" {
		return nil, errors.New(`cloud-init: user-data does not start with "#cloud-config"`)
	}
	var raw map[string]yaml.Node
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("cloud-init: %w", err)
	}
	for k := range raw {
		if k != "write_files" && k != "runcmd" {
			return nil, fmt.Errorf("cloud-init: key %q is not one onboarding can apply (write_files, runcmd)", k)
		}
	}
	var cc CloudConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cc); err != nil && !errors.Is(err, io.EOF) { // EOF: an empty config
		return nil, fmt.Errorf("cloud-init: %w", err)
	}
	for i, f := range cc.WriteFiles {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("cloud-init: write_files[%d]: path %q must be absolute and clean", i, f.Path)
		}
		if _, err := f.Mode(); err != nil {
			return nil, fmt.Errorf("cloud-init: write_files[%d] %s: %w", i, f.Path, err)
		}
		if _, err := f.Data(); err != nil {
			return nil, fmt.Errorf("cloud-init: write_files[%d] %s: %w", i, f.Path, err)
		}
	}
	for i, argv := range cc.RunCmd {
		if len(argv) == 0 || argv[0] == "" {
			return nil, fmt.Errorf("cloud-init: runcmd[%d] is empty", i)
		}
	}
	return &cc, nil
}

// Mode is the file's permissions (cloud-init's default 0644).
func (f WriteFile) Mode() (os.FileMode, error) {
	if f.Permissions == "" {
		return 0o644, nil
	}
	n, err := strconv.ParseUint(f.Permissions, 8, 32)
	if err != nil || n > 0o7777 {
		return 0, fmt.Errorf("permissions %q: want octal like 0644", f.Permissions)
	}
	return os.FileMode(n), nil
}

// Data is the file's content, decoded.
func (f WriteFile) Data() ([]byte, error) {
	switch strings.ToLower(f.Encoding) {
	case "":
		return []byte(f.Content), nil
	case "b64", "base64":
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(f.Content))
		if err != nil {
			return nil, fmt.Errorf("content: bad base64: %w", err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("encoding %q: onboarding applies only b64 or plain content", f.Encoding)
}

// WriteSeed writes user-data and meta-data into a NoCloud seed dir for the
// next boot; each file atomically, so a crash leaves the old or the new.
func WriteSeed(dir, userData, metaData string) (userPath, metaPath string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("cloud-init seed dir: %w", err)
	}
	userPath, metaPath = filepath.Join(dir, "user-data"), filepath.Join(dir, "meta-data")
	// meta-data first: cloud-init does not take a seed without it, so a
	// crash in between leaves no half seed that boots.
	if err := pki.WriteFileAtomic(metaPath, []byte(metaData), 0o600); err != nil {
		return "", "", err
	}
	if err := pki.WriteFileAtomic(userPath, []byte(userData), 0o600); err != nil {
		return "", "", err
	}
	return userPath, metaPath, nil
}
