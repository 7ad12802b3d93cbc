// Package edgecli is the command tree of the agent's CLI (tether-edge and
// its sibling tether-edge-onboard) on the standard library's flag package.
//
// The agent does not use cobra (the hub's tether CLI does): cobra renders
// its help with text/template, whose reflect-based method calls make the
// linker keep every exported method of every reachable type, which is
// about a sixth of the agent binary. This package keeps what the agent's
// small CLI needs of cobra's behaviour: subcommands, --flag and -flag,
// --flag=value, flags after positional arguments, persistent flags,
// repeatable flags, --help on every command and a help command.
package edgecli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Command is one command of the tree.
type Command struct {
	// Use is the command's name, then its arguments' synopsis: "apply NAME".
	Use     string
	Short   string
	Long    string
	Example string
	// Args checks the positional arguments (nil: none allowed, as
	// cobra.NoArgs, for a command with Run).
	Args func(args []string) error
	// Run runs the command; nil for a command that only groups
	// subcommands.
	Run func(ctx context.Context, c *Command, args []string) error

	// Flags are the command's own flags; Persistent ones also apply to
	// every subcommand.
	// (Zero FlagSets are ready to use.)
	Flags      flag.FlagSet
	Persistent flag.FlagSet
	// Version, on the root, adds -v and --version, printing "NAME VERSION".
	Version string

	parent  *Command
	sub     []*Command
	changed map[string]bool
	short   map[string]string // one-letter alias -> flag name
	out     io.Writer         // the root's: where Execute writes help
}

// New is a command named by use (see Use).
func New(use, short string) *Command {
	return &Command{Use: use, Short: short}
}

// Name is the command's name.
func (c *Command) Name() string { return strings.Fields(c.Use)[0] }

// Path is the command line up to this command: "tether-edge upgrade apply".
func (c *Command) Path() string {
	if c.parent == nil {
		return c.Name()
	}
	return c.parent.Path() + " " + c.Name()
}

// Add makes subs subcommands of c.
func (c *Command) Add(subs ...*Command) {
	for _, s := range subs {
		s.parent = c
		c.sub = append(c.sub, s)
	}
}

// Alias makes -letter a second name of the flag name (as "-o" for
// "--output").
func (c *Command) Alias(letter, name string) {
	f := c.Flags.Lookup(name)
	if f == nil {
		panic("edgecli: alias of unknown flag " + name)
	}
	c.Flags.Var(f.Value, letter, f.Usage)
	if c.short == nil {
		c.short = map[string]string{}
	}
	c.short[letter] = name
}

// Changed reports whether the flag name was given on the command line.
func (c *Command) Changed(name string) bool { return c.changed[name] }

// NoArgs, MaximumArgs and ExactArgs check positional arguments.
func NoArgs(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected argument %q", args[0])
	}
	return nil
}

func MaximumArgs(n int) func([]string) error {
	return func(args []string) error {
		if len(args) > n {
			return fmt.Errorf("accepts at most %d argument(s), received %d", n, len(args))
		}
		return nil
	}
}

func ExactArgs(n int) func([]string) error {
	return func(args []string) error {
		if len(args) != n {
			return fmt.Errorf("accepts %d argument(s), received %d", n, len(args))
		}
		return nil
	}
}

// ErrUsage marks an error in the command line (an unknown command or flag,
// a wrong number of arguments); its message says which.
var ErrUsage = errors.New("usage")

type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }
func (e *usageError) Unwrap() error { return ErrUsage }

// Execute runs the command args name (os.Args[1:]) under root; help goes
// to out.
func (root *Command) Execute(ctx context.Context, args []string, out io.Writer) error {
	root.out = out
	if len(root.sub) > 0 && root.find("completion") == nil {
		root.Add(completionCmd(root))
	}
	if len(args) > 0 && args[0] == "__complete" {
		root.complete(args[1:], out)
		return nil
	}
	c := root
	// The command words come first, as with cobra; flags of a parent
	// given before its subcommand's name are parsed with the subcommand.
	var flagsBefore []string
	for len(args) > 0 {
		a := args[0]
		if a == "help" && c == root {
			return root.help(args[1:], out)
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			// A flag of an ancestor before the subcommand's name: take it
			// (and its value) along.
			n := 1
			if !strings.Contains(a, "=") && !isBool(c, strings.TrimLeft(a, "-")) && len(args) > 1 {
				n = 2
			}
			if a == "--" {
				break
			}
			if len(c.sub) == 0 || isHelp(a) || isVersion(c, a) {
				break
			}
			flagsBefore = append(flagsBefore, args[:n]...)
			args = args[n:]
			continue
		}
		s := c.find(a)
		if s == nil {
			break
		}
		c, args = s, args[1:]
	}
	args = append(flagsBefore, args...)
	fs := c.flagSet()
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.Usage(out)
				return nil
			}
			return &usageError{fmt.Sprintf("%v (see %s --help)", err, c.Path())}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			pos = append(pos, args[1:]...)
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	c.changed = map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		name := f.Name
		if long, ok := c.short[name]; ok {
			name = long
		}
		c.changed[name] = true
	})
	if c == root && root.Version != "" && c.changed["version"] {
		fmt.Fprintln(out, root.Name(), root.Version)
		return nil
	}
	if c.Run == nil {
		if len(pos) > 0 {
			return &usageError{fmt.Sprintf("unknown command %q for %q (see %s --help)", pos[0], c.Path(), c.Path())}
		}
		c.Usage(out)
		return nil
	}
	check := c.Args
	if check == nil {
		check = NoArgs
	}
	if err := check(pos); err != nil {
		return &usageError{fmt.Sprintf("%v (see %s --help)", err, c.Path())}
	}
	return c.Run(ctx, c, pos)
}

func isHelp(a string) bool { return a == "-h" || a == "--help" || a == "-help" }

// isVersion reports whether a asks c, the root, for its version.
func isVersion(c *Command, a string) bool {
	return c.parent == nil && c.Version != "" && (a == "--version" || a == "-version" || a == "-v")
}

func isBool(c *Command, name string) bool {
	name, _, _ = strings.Cut(name, "=")
	for p := c; p != nil; p = p.parent {
		for _, fs := range []*flag.FlagSet{&p.Flags, &p.Persistent} {
			if f := fs.Lookup(name); f != nil {
				b, ok := f.Value.(interface{ IsBoolFlag() bool })
				return ok && b.IsBoolFlag()
			}
		}
	}
	return false
}

func (c *Command) find(name string) *Command {
	for _, s := range c.sub {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

// flagSet is c's flags with its own and its ancestors' persistent ones.
func (c *Command) flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet(c.Path(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	add := func(from *flag.FlagSet) {
		from.VisitAll(func(f *flag.Flag) {
			if fs.Lookup(f.Name) == nil {
				fs.Var(f.Value, f.Name, f.Usage)
			}
		})
	}
	add(&c.Flags)
	for p := c; p != nil; p = p.parent {
		add(&p.Persistent)
	}
	if c.parent == nil && c.Version != "" && fs.Lookup("version") == nil {
		v := fs.Bool("version", false, "print the version")
		if fs.Lookup("v") == nil {
			fs.BoolVar(v, "v", false, "print the version")
			if c.short == nil {
				c.short = map[string]string{}
			}
			c.short["v"] = "version"
		}
	}
	return fs
}

func (root *Command) help(args []string, out io.Writer) error {
	c := root
	for _, a := range args {
		s := c.find(a)
		if s == nil {
			return &usageError{fmt.Sprintf("unknown help topic %q (see %s --help)", a, root.Name())}
		}
		c = s
	}
	c.Usage(out)
	return nil
}

// Usage writes c's help: its description, usage line, subcommands,
// examples and flags.
func (c *Command) Usage(w io.Writer) {
	desc := c.Long
	if desc == "" {
		desc = c.Short
	}
	fmt.Fprintf(w, "%s\n\nUsage:\n", strings.TrimSpace(desc))
	parent := ""
	if c.parent != nil {
		parent = c.parent.Path() + " "
	}
	if c.Run != nil {
		fmt.Fprintf(w, "  %s%s [flags]\n", parent, c.Use)
	}
	if len(c.sub) > 0 {
		fmt.Fprintf(w, "  %s [command]\n", c.Path())
		fmt.Fprintf(w, "\nAvailable Commands:\n")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, s := range c.sub {
			fmt.Fprintf(tw, "  %s\t%s\n", s.Name(), s.Short)
		}
		if c.parent == nil {
			fmt.Fprintf(tw, "  help\tHelp about any command\n")
		}
		tw.Flush()
	}
	if c.Example != "" {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	fmt.Fprintf(w, "\nFlags:\n")
	own := [][2]string{{"-h, --help", "help for " + c.Name()}}
	if c.parent == nil && c.Version != "" {
		own = append(own, [2]string{"-v, --version", "print the version"})
	}
	printFlags(w, own, &c.Flags, &c.Persistent)
	var global []*flag.FlagSet
	for p := c.parent; p != nil; p = p.parent {
		global = append(global, &p.Persistent)
	}
	if lines := flagLines(global...); len(lines) > 0 {
		fmt.Fprintf(w, "\nGlobal Flags:\n")
		printFlags(w, nil, global...)
	}
	if len(c.sub) > 0 {
		fmt.Fprintf(w, "\nUse \"%s [command] --help\" for more information about a command.\n", c.Path())
	}
}

func printFlags(w io.Writer, extra [][2]string, sets ...*flag.FlagSet) {
	lines := append(flagLines(sets...), extra...)
	slices.SortStableFunc(lines, func(a, b [2]string) int {
		return strings.Compare(strings.TrimLeft(a[0], " -"), strings.TrimLeft(b[0], " -"))
	})
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	for _, l := range lines {
		fmt.Fprintf(tw, "  %s\t%s\n", l[0], l[1])
	}
	tw.Flush()
}

// flagLines is the help of the flags in sets: a one-letter flag that is an
// alias (the same Value as a long one) is shown beside it.
func flagLines(sets ...*flag.FlagSet) [][2]string {
	var lines [][2]string
	for _, fs := range sets {
		if fs == nil {
			continue
		}
		alias := map[string]string{}
		fs.VisitAll(func(f *flag.Flag) {
			if len(f.Name) == 1 {
				fs.VisitAll(func(g *flag.Flag) {
					if len(g.Name) > 1 && g.Value == f.Value {
						alias[g.Name] = f.Name
					}
				})
			}
		})
		fs.VisitAll(func(f *flag.Flag) {
			if len(f.Name) == 1 && slices.Contains(slices.Collect(maps.Values(alias)), f.Name) {
				return
			}
			name := "    --" + f.Name
			if l := alias[f.Name]; l != "" {
				name = "-" + l + ", --" + f.Name
			}
			typ, usage := flag.UnquoteUsage(f)
			if strings.Contains(f.Usage, "`") {
				// A `quoted` word is text here, not the value's name.
				typ, _ = flag.UnquoteUsage(&flag.Flag{Value: f.Value})
				usage = f.Usage
			}
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				typ = ""
			} else if _, ok := f.Value.(*UintList); ok {
				typ = "uint"
			}
			if typ != "" {
				name += " " + typ
			}
			if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "0s" && def != "[]" {
				if typ == "string" {
					def = strconv.Quote(def)
				}
				usage += " (default " + def + ")"
			}
			lines = append(lines, [2]string{name, usage})
		})
	}
	return lines
}

// UintList is a repeatable flag of unsigned integers; each use may also
// hold a comma-separated list (--allow-port 22 --allow-port 80,443).
type UintList []uint

func (l *UintList) String() string {
	if l == nil || len(*l) == 0 {
		return "[]"
	}
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.FormatUint(uint64(v), 10)
	}
	return "[" + strings.Join(s, ",") + "]"
}

func (l *UintList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(p), 10, 0)
		if err != nil {
			return fmt.Errorf("%q is not an unsigned integer", p)
		}
		*l = append(*l, uint(n))
	}
	return nil
}

// Main runs root with os.Args and exits with status(err) on an error,
// printing it as "NAME: error".
func Main(ctx context.Context, root *Command, status func(error) int) {
	if err := root.Execute(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", root.Name(), err)
		os.Exit(status(err))
	}
}

// DefaultStateDir is the agent's state dir when --state-dir is not given:
// TETHER_STATE_DIR, else /var/lib/tether-edge.
func DefaultStateDir() string {
	if d := os.Getenv("TETHER_STATE_DIR"); d != "" {
		return d
	}
	return "/var/lib/tether-edge"
}
