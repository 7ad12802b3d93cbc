//go:build noform

package onboard

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/term"
)

// Form's line prompts: each question on its own line with the default in
// brackets, the answer read up to the end of the line (an empty answer
// keeps the default), a refused answer shown with its reason and asked
// again. Secrets are read without echo when the input is the terminal.

func (f *Form) in() io.Reader {
	if f.In != nil {
		return f.In
	}
	return os.Stdin
}

func (f *Form) out() io.Writer {
	if f.Out != nil {
		return f.Out
	}
	return os.Stderr
}

// readLine reads one answer; the end of the input is ErrInputEnded, a
// cancelled context ErrAborted.
func (f *Form) readLine(secret bool) (string, error) {
	if f.Ctx != nil && f.Ctx.Err() != nil {
		return "", ErrAborted
	}
	src := f.in()
	if secret {
		if file, ok := src.(*os.File); ok && term.IsTerminal(int(file.Fd())) {
			b, err := term.ReadPassword(int(file.Fd()))
			fmt.Fprintln(f.out())
			if err != nil {
				return "", fmt.Errorf("onboard: read secret: %w", err)
			}
			return strings.TrimSpace(string(b)), nil
		}
	}
	if f.rd.src != src {
		f.rd = lineReader{src: src, br: bufio.NewReader(src)}
	}
	line, err := f.rd.br.ReadString('\n')
	if f.Ctx != nil && f.Ctx.Err() != nil {
		return "", ErrAborted
	}
	if err != nil && (line == "" || !errors.Is(err, io.EOF)) {
		if errors.Is(err, io.EOF) {
			return "", ErrInputEnded
		}
		return "", fmt.Errorf("onboard: read answer: %w", err)
	}
	return strings.TrimSpace(line), nil
}

// Input implements Prompter.
func (f *Form) Input(fl Field) (string, error) {
	out := f.out()
	for {
		fmt.Fprintf(out, "%s", fl.Title)
		if fl.Description != "" {
			fmt.Fprintf(out, " (%s)", fl.Description)
		}
		if fl.Value != "" && !fl.Secret {
			fmt.Fprintf(out, " [%s]", fl.Value)
		}
		fmt.Fprint(out, ": ")
		v, err := f.readLine(fl.Secret)
		if err != nil {
			return "", err
		}
		if v == "" {
			v = fl.Value
		}
		if fl.Syntax != nil {
			if err := fl.Syntax(v); err != nil {
				fmt.Fprintf(out, "✗ %v\n", err)
				continue
			}
		}
		if fl.Check != nil {
			if err := fl.Check(v); err != nil {
				fmt.Fprintf(out, "✗ %v\n", err)
				continue
			}
		}
		return v, nil
	}
}

// Confirm implements Prompter. On a terminal one key answers (y or n, enter
// for the default no), as in the full-screen form.
func (f *Form) Confirm(title, description string) (bool, error) {
	out := f.out()
	if file, ok := f.in().(*os.File); ok && term.IsTerminal(int(file.Fd())) {
		fmt.Fprintf(out, "%s\n%s\n[y/N]: ", title, description)
		return f.confirmKey(file)
	}
	for {
		fmt.Fprintf(out, "%s\n%s\n[y/N]: ", title, description)
		v, err := f.readLine(false)
		if err != nil {
			return false, err
		}
		switch strings.ToLower(v) {
		case "y", "yes":
			return true, nil
		case "", "n", "no":
			return false, nil
		}
		fmt.Fprintln(out, "✗ answer y or n")
	}
}

// Choose implements Prompter: an option by its number or its key.
func (f *Form) Choose(title string, options [][2]string, def string) (string, error) {
	out := f.out()
	for {
		fmt.Fprintln(out, title)
		for i, o := range options {
			mark := " "
			if o[0] == def {
				mark = "*"
			}
			fmt.Fprintf(out, " %s %d) %s: %s\n", mark, i+1, o[0], o[1])
		}
		fmt.Fprintf(out, "[%s]: ", def)
		v, err := f.readLine(false)
		if err != nil {
			return "", err
		}
		if v == "" {
			return def, nil
		}
		if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= len(options) {
			return options[n-1][0], nil
		}
		for _, o := range options {
			if o[0] == v {
				return v, nil
			}
		}
		fmt.Fprintf(out, "✗ %q is not one of the options\n", v)
	}
}

// confirmKey reads single keys from the terminal until one answers.
func (f *Form) confirmKey(file *os.File) (bool, error) {
	old, err := term.MakeRaw(int(file.Fd()))
	if err != nil {
		return false, fmt.Errorf("onboard: terminal: %w", err)
	}
	defer term.Restore(int(file.Fd()), old) //nolint:errcheck // best effort on the way out
	var b [1]byte
	for {
		if _, err := file.Read(b[:]); err != nil {
			return false, ErrInputEnded
		}
		switch b[0] {
		case 'y', 'Y':
			fmt.Fprint(f.out(), "yes\r\n")
			return true, nil
		case 'n', 'N', '\r', '\n':
			fmt.Fprint(f.out(), "no\r\n")
			return false, nil
		case 3: // ctrl+c
			return false, ErrAborted
		case 4: // ctrl+d
			return false, ErrInputEnded
		}
	}
}
