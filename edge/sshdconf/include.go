package sshdconf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// sshdDir is where sshd resolves relative Include paths, whatever the
// location of the file that holds the Include.
const sshdDir = "/etc/ssh"

// maxIncludeDepth mirrors sshd's own limit on nested Include.
const maxIncludeDepth = 16

// CheckIncluded reads the main sshd_config at sshdConfig and reports whether
// sshd reads the drop-in dropIn, both absolute paths.
//
// The drop-in counts as included when a global Include line (one before any
// Match line) names it, directly or through a glob matched with
// filepath.Match, like Debian's default `Include /etc/ssh/sshd_config.d/*.conf`.
// Relative Include paths are taken from /etc/ssh, as sshd does. Files
// included before the drop-in are followed, in sshd's order (lexical within
// a glob), up to sshd's depth limit of 16.
//
// The error wraps [ErrNotIncluded] when no such Include exists, and
// [ErrShadowed] when a TrustedUserCAKeys or RevokedKeys line is read before
// the drop-in: sshd keeps the first value of those keywords, so the drop-in's
// would be ignored.
func CheckIncluded(sshdConfig string, dropIn string) error {
	if err := checkPath(sshdConfig); err != nil {
		return invalidf("sshd_config: %v", err)
	}
	if err := checkPath(dropIn); err != nil {
		return invalidf("drop-in: %v", err)
	}
	s := includeScan{dropIn: filepath.Clean(dropIn)}
	found, err := s.file(filepath.Clean(sshdConfig), 0)
	switch {
	case err != nil:
		return err
	case !found:
		return fmt.Errorf("%w: no global Include line in %s covers %s; add `Include %s/*.conf` before any Match block",
			ErrNotIncluded, sshdConfig, dropIn, filepath.Dir(dropIn))
	case len(s.shadows) > 0:
		return fmt.Errorf("%w: %s is read before %s, and sshd keeps the first value",
			ErrShadowed, strings.Join(s.shadows, ", "), dropIn)
	}
	return nil
}

// includeScan walks sshd_config files in the order sshd reads them until
// it reaches the drop-in.
type includeScan struct {
	dropIn  string
	shadows []string // "file:line Keyword" settings read before the drop-in
}

// file scans one config file and reports whether the drop-in is included
// from it (directly or from a file it includes).
func (s *includeScan) file(path string, depth int) (found bool, err error) {
	if depth > maxIncludeDepth {
		return false, fmt.Errorf("sshdconf: %s: Include nested deeper than %d", path, maxIncludeDepth)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("sshdconf: read sshd config: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	inMatch := false
	for n := 1; sc.Scan(); n++ {
		args, err := splitConfigLine(sc.Text())
		if err != nil {
			return false, fmt.Errorf("sshdconf: %s:%d: %w", path, n, err)
		}
		if len(args) == 0 || inMatch {
			continue
		}
		switch kw := strings.ToLower(args[0]); kw {
		case "match":
			// Everything after a Match line is conditional, and sshd
			// forbids HostCertificate there anyway.
			inMatch = true
		case "trustedusercakeys", "revokedkeys":
			s.shadows = append(s.shadows, fmt.Sprintf("%s:%d %s", path, n, args[0]))
		case "include":
			for _, pattern := range args[1:] {
				if !filepath.IsAbs(pattern) {
					pattern = filepath.Join(sshdDir, pattern)
				}
				if found, err := s.include(pattern, depth); found || err != nil {
					return found, err
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("sshdconf: read %s: %w", path, err)
	}
	return false, nil
}

// include handles one Include argument: the files it matches are read in
// lexical order, the drop-in taking its place among them even if it does
// not exist yet.
func (s *includeScan) include(pattern string, depth int) (found bool, err error) {
	covers, err := filepath.Match(pattern, s.dropIn)
	if err != nil {
		return false, fmt.Errorf("sshdconf: Include %q: %w", pattern, err)
	}
	files, err := filepath.Glob(pattern)
	if err != nil {
		return false, fmt.Errorf("sshdconf: Include %q: %w", pattern, err)
	}
	if covers && !slices.Contains(files, s.dropIn) {
		files = append(files, s.dropIn)
		slices.Sort(files)
	}
	for _, f := range files {
		if f == s.dropIn {
			return true, nil
		}
		if fi, err := os.Stat(f); err != nil || fi.IsDir() {
			continue // sshd skips what it cannot read as well
		}
		if found, err := s.file(f, depth+1); found || err != nil {
			return found, err
		}
	}
	return false, nil
}

// splitConfigLine splits an sshd_config line into keyword and arguments,
// the way sshd does: blanks separate words, "keyword=value" is allowed,
// double or single quotes group words, a backslash escapes a quote, a
// backslash or (outside quotes) a space, and a '#' at the start of a word
// starts a comment. It returns nil for blank and comment lines.
func splitConfigLine(line string) ([]string, error) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return nil, nil
	}
	// The keyword ends at the first blank or '='.
	end := strings.IndexAny(line, " \t=")
	if end < 0 {
		return []string{line}, nil
	}
	args := []string{line[:end]}
	rest := strings.TrimLeft(line[end:], " \t")
	if strings.HasPrefix(rest, "=") {
		rest = rest[1:]
	}
	for {
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" || rest[0] == '#' {
			return args, nil
		}
		var word strings.Builder
		var quote byte
		i := 0
	scan:
		for ; i < len(rest); i++ {
			c := rest[i]
			switch {
			case c == '\\' && i+1 < len(rest) && escapable(rest[i+1], quote):
				i++
				word.WriteByte(rest[i])
			case quote != 0 && c == quote:
				quote = 0
			case quote != 0:
				word.WriteByte(c)
			case c == '"' || c == '\'':
				quote = c
			case c == ' ' || c == '\t':
				break scan
			default:
				word.WriteByte(c)
			}
		}
		if quote != 0 {
			return nil, errors.New("unterminated quote")
		}
		args = append(args, word.String())
		rest = rest[i:]
	}
}

// escapable reports whether a backslash before c escapes it (sshd's
// argv_split rules).
func escapable(c, quote byte) bool {
	return c == '\\' || c == '"' || c == '\'' || (quote == 0 && c == ' ')
}
