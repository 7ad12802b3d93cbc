//go:build !noform

package onboard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	huh "charm.land/huh/v2"
)

func (f *Form) run(fields ...huh.Field) error {
	form := huh.NewForm(huh.NewGroup(fields...)).WithAccessible(f.Accessible).WithShowHelp(true)
	var watch *eofWatch
	if f.Accessible {
		in := f.In
		if in == nil {
			in = os.Stdin
		}
		watch = &eofWatch{r: in}
		form = form.WithInput(watch)
	} else if f.In != nil {
		form = form.WithInput(f.In)
	}
	if f.Out != nil {
		form = form.WithOutput(f.Out)
	}
	ctx := f.Ctx
	if ctx == nil {
		ctx = context.Background()
	}
	err := form.RunWithContext(ctx)
	if errors.Is(err, huh.ErrUserAborted) {
		return ErrAborted
	}
	if err == nil && watch != nil && watch.eof {
		return ErrInputEnded
	}
	return err
}

// Input implements Prompter.
func (f *Form) Input(fl Field) (string, error) {
	v := fl.Value
	desc := fl.Description
	for {
		in := huh.NewInput().Title(fl.Title).Description(desc).Value(&v)
		if fl.Syntax != nil {
			in = in.Validate(fl.Syntax)
		}
		if fl.Secret {
			in = in.EchoMode(huh.EchoModePassword)
		}
		if err := f.run(in); err != nil {
			return "", err
		}
		if fl.Check == nil {
			return v, nil
		}
		err := fl.Check(v)
		if err == nil {
			return v, nil
		}
		desc = fmt.Sprintf("%s\n✗ %v", fl.Description, err)
		if f.Out != nil && f.Accessible {
			fmt.Fprintf(f.Out, "✗ %v\n", err)
		}
	}
}

// Confirm implements Prompter.
func (f *Form) Confirm(title, description string) (bool, error) {
	ok := false
	err := f.run(huh.NewConfirm().Title(title).Description(description).Affirmative("Yes").Negative("No").Value(&ok))
	return ok, err
}

// Choose implements Prompter.
func (f *Form) Choose(title string, options [][2]string, def string) (string, error) {
	v := def
	opts := make([]huh.Option[string], len(options))
	for i, o := range options {
		opts[i] = huh.NewOption(o[0]+": "+o[1], o[0])
	}
	err := f.run(huh.NewSelect[string]().Title(title).Options(opts...).Value(&v))
	return v, err
}

// eofWatch notes that its reader ended: the accessible prompts answer the
// default at end of input and cannot say so themselves.
type eofWatch struct {
	r   io.Reader
	eof bool
}

func (e *eofWatch) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if errors.Is(err, io.EOF) {
		e.eof = true
	}
	return n, err
}
