package onboardproto

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// UserData is the part of cloud-init user-data that onboarding uses, and
// all of it: Response.UserData parses into it. The hub renders it
// from an OS profile's template and refuses a template whose output does
// not parse here; the onboarding CLI applies it either through cloud-init
// (its NoCloud seed) or itself, with the same result, because nothing else
// is allowed:
//
//	#cloud-config
//	write_files:            # written in this order
//	  - path: /var/lib/tether-edge/node.crt   # absolute, clean
//	    permissions: "0600"                   # octal, as cloud-init reads it
//	    encoding: b64                         # "" or text/plain (content as is), b64 or base64
//	    content: LS0tLS1CRUdJTi...
//	runcmd:                 # run in this order after the files, each an argv list (no shell)
//	  - [systemctl, daemon-reload]
//	  - [systemctl, enable, --now, tether-edge]
//
// Any other key (top level or in a file) is refused, as is a runcmd entry
// given as a shell string.
type UserData struct {
	WriteFiles []WriteFile `yaml:"write_files"`
	RunCmd     [][]string  `yaml:"runcmd"`
}

// WriteFile is one write_files entry.
type WriteFile struct {
	Path        string `yaml:"path"`
	Content     string `yaml:"content"`
	Permissions string `yaml:"permissions"`
	Encoding    string `yaml:"encoding,omitempty"`
}

// Bounds on user-data.
const (
	MaxUserData      = 1 << 20
	maxUserDataFiles = 64
	maxRunCmds       = 64
	maxArgs          = 64
)

// CloudConfigHeader starts cloud-init user-data in cloud-config format.
const CloudConfigHeader = "#cloud-config"

// ParseUserData parses and checks user-data of the shape UserData
// documents.
func ParseUserData(s string) (*UserData, error) {
	if len(s) > MaxUserData {
		return nil, fmt.Errorf("user-data: larger than %d bytes", MaxUserData)
	}
	if first, _, _ := strings.Cut(s, "\n"); strings.TrimRight(first, " \t\r") != CloudConfigHeader {
		return nil, fmt.Errorf("user-data: the first line must be %q", CloudConfigHeader)
	}
	dec := yaml.NewDecoder(strings.NewReader(s))
	dec.KnownFields(true)
	var u UserData
	if err := dec.Decode(&u); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("user-data: empty: want write_files and runcmd")
		}
		return nil, fmt.Errorf(
			"user-data: %w (only write_files (path, content, permissions, encoding) and runcmd (argv lists) are allowed)",
			err,
		)
	}
	var rest yaml.Node
	if err := dec.Decode(&rest); !errors.Is(err, io.EOF) {
		return nil, errors.New("user-data: more than one YAML document")
	}
	if len(u.WriteFiles) > maxUserDataFiles || len(u.RunCmd) > maxRunCmds {
		return nil, fmt.Errorf("user-data: more than %d files or %d commands", maxUserDataFiles, maxRunCmds)
	}
	for i, f := range u.WriteFiles {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("user-data: write_files[%d]: path %.256q must be absolute and clean", i, f.Path)
		}
		if _, err := f.Mode(); err != nil {
			return nil, fmt.Errorf("user-data: write_files[%d] (%s): %w", i, f.Path, err)
		}
		if _, err := f.Bytes(); err != nil {
			return nil, fmt.Errorf("user-data: write_files[%d] (%s): %w", i, f.Path, err)
		}
	}
	for i, argv := range u.RunCmd {
		if len(argv) == 0 || len(argv) > maxArgs || argv[0] == "" {
			return nil, fmt.Errorf("user-data: runcmd[%d]: want a command and at most %d arguments", i, maxArgs-1)
		}
		for _, a := range argv {
			if strings.ContainsRune(a, 0) {
				return nil, fmt.Errorf("user-data: runcmd[%d]: NUL in an argument", i)
			}
		}
	}
	return &u, nil
}

// Mode is the file's permissions ("" means 0644, as cloud-init).
func (f WriteFile) Mode() (os.FileMode, error) {
	if f.Permissions == "" {
		return 0o644, nil
	}
	m, err := strconv.ParseUint(strings.TrimPrefix(f.Permissions, "0o"), 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("permissions %.32q: want an octal mode such as \"0600\"", f.Permissions)
	}
	return os.FileMode(m & 0o777), nil
}

// Bytes is the file's content, decoded.
func (f WriteFile) Bytes() ([]byte, error) {
	switch f.Encoding {
	case "", "text/plain":
		return []byte(f.Content), nil
	case "b64", "base64":
		clean := strings.Map(func(r rune) rune {
			if r == ' ' || r == '\n' || r == '\r' || r == '\t' {
				return -1
			}
			return r
		}, f.Content)
		b, err := base64.StdEncoding.DecodeString(clean)
		if err != nil {
			return nil, fmt.Errorf("content: invalid base64: %w", err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("encoding %.32q: want b64 (or none)", f.Encoding)
}
