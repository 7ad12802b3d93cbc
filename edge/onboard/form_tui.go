//go:build !noform

package onboard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	tea "charm.land/bubbletea/v2"
	huh "charm.land/huh/v2"
	"github.com/charmbracelet/x/ansi"
)

// run asks one question: title is its title, answer what its last frame
// shows as the answer once it is given. huh leaves a form's last frame on
// the terminal as the record of what was answered, and an input's frame
// shows only the part of a value around the cursor: a proxy URL or label
// list wider than the terminal stayed there cut (`> .very-long-host…:3128`
// for `http://proxy.very-long-host…:3128`). So the form runs in a program
// of ours whose last frame is the question with the whole answer, wrapped.
func (f *Form) run(title, desc string, answer func() string, fields ...huh.Field) error {
	form := huh.NewForm(huh.NewGroup(fields...)).WithAccessible(f.Accessible).WithShowHelp(true)
	ctx := f.Ctx
	if ctx == nil {
		ctx = context.Background()
	}
	if f.Accessible {
		// Line prompts: nothing is redrawn, every answer stays as typed.
		in := f.In
		if in == nil {
			in = os.Stdin
		}
		watch := &eofWatch{r: in}
		form = form.WithInput(watch)
		if f.Out != nil {
			form = form.WithOutput(f.Out)
		}
		err := form.RunWithContext(ctx)
		if errors.Is(err, huh.ErrUserAborted) {
			return ErrAborted
		}
		if err == nil && watch.eof {
			return ErrInputEnded
		}
		return err
	}
	// What huh's own run does, with the last frame ours.
	form.SubmitCmd, form.CancelCmd = tea.Quit, tea.Interrupt
	out := f.Out
	if out == nil {
		out = os.Stderr
	}
	opts := []tea.ProgramOption{tea.WithContext(ctx), tea.WithOutput(out)}
	if f.In != nil {
		opts = append(opts, tea.WithInput(f.In))
	}
	if f.size != [2]int{} {
		opts = append(opts, tea.WithWindowSize(f.size[0], f.size[1]))
	}
	// The width is known up front when the size is: an answer submitted
	// before the program's first WindowSizeMsg (input already buffered,
	// a loaded machine) still gets a last frame that fits.
	m := &answeredForm{form: form, title: title, desc: desc, answer: answer, width: f.size[0]}
	_, err := tea.NewProgram(m, opts...).Run()
	f.lastFrame = m.View().Content
	switch {
	case err == nil && form.State == huh.StateCompleted:
		return nil
	case form.State == huh.StateAborted, errors.Is(err, tea.ErrInterrupted), ctx.Err() != nil:
		return ErrAborted
	case err != nil:
		return fmt.Errorf("onboard: form: %w", err)
	}
	return nil
}

// answeredForm is a huh form whose last frame, once completed, is its
// question and the whole answer (finalFrame).
type answeredForm struct {
	form        *huh.Form
	title, desc string
	answer      func() string
	width       int
	// lines is the height of the form's last frame. The last frame is at
	// least as high: the renderer keeps a shrinking frame's bottom line where
	// it was, and would leave the top of the previous one above it.
	lines int
}

func (m *answeredForm) Init() tea.Cmd { return m.form.Init() }

func (m *answeredForm) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	if ws, ok := msg.(tea.WindowSizeMsg); ok {
		m.width = ws.Width
	}
	_, cmd := m.form.Update(msg)
	return m, cmd
}

func (m *answeredForm) View() tea.View {
	if m.form.State == huh.StateCompleted {
		frame := strings.TrimSuffix(finalFrame(m.title, m.desc, m.answer(), m.width), "\n")
		if n := strings.Count(frame, "\n") + 1; n < m.lines {
			frame += strings.Repeat("\n", m.lines-n)
		}
		return tea.NewView(frame)
	}
	content := m.form.View()
	m.lines = strings.Count(content, "\n") + 1
	v := tea.NewView(content)
	v.ReportFocus = true
	return v
}

// finalFrame is a question's title, description and answer, each wrapped
// to width (80 if unknown) in huh's frame: the renderer cuts lines wider
// than the terminal, so every line fits.
func finalFrame(title, desc, answer string, width int) string {
	if width <= 0 {
		width = 80
	}
	limit := max(width-ansi.StringWidth("┃ > "), 8)
	var b strings.Builder
	for _, text := range []string{title, desc} {
		if text == "" {
			continue
		}
		for _, l := range strings.Split(ansi.Wrap(text, limit+2, " "), "\n") {
			b.WriteString("┃ " + l + "\n")
		}
	}
	for i, l := range strings.Split(ansi.Wrap(answer, limit, " ,"), "\n") {
		prefix := "┃   "
		if i == 0 {
			prefix = "┃ > "
		}
		b.WriteString(prefix + l + "\n")
	}
	return b.String()
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
		shown := func() string { return v }
		if fl.Secret {
			shown = func() string { return "••••••••" } // not even its length
		}
		if err := f.run(fl.Title, desc, shown, in); err != nil {
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
	answer := func() string {
		if ok {
			return "Yes"
		}
		return "No"
	}
	err := f.run(title, description, answer,
		huh.NewConfirm().Title(title).Description(description).Affirmative("Yes").Negative("No").Value(&ok))
	return ok, err
}

// Choose implements Prompter.
func (f *Form) Choose(title string, options [][2]string, def string) (string, error) {
	v := def
	opts := make([]huh.Option[string], len(options))
	for i, o := range options {
		opts[i] = huh.NewOption(o[0]+": "+o[1], o[0])
	}
	answer := func() string {
		for _, o := range options {
			if o[0] == v {
				return o[0] + ": " + o[1]
			}
		}
		return v
	}
	err := f.run(title, "", answer, huh.NewSelect[string]().Title(title).Options(opts...).Value(&v))
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
