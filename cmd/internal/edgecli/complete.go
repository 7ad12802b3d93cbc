package edgecli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Shell completion: `NAME completion bash|zsh|fish` prints a script that
// asks `NAME __complete WORDS... CURRENT` for the candidates, one per line
// as "candidate<TAB>description", then ":DIRECTIVE" (4: no file names;
// 0: file names when there is no candidate). That is cobra's protocol, so
// the agent's scripts behave as the hub's.

const (
	directiveDefault    = 0
	directiveNoFileComp = 4
)

// complete answers a __complete request: args are the words after the
// command name, the last one the word being completed.
func (root *Command) complete(args []string, out io.Writer) {
	if len(args) == 0 {
		args = []string{""}
	}
	words, cur := args[:len(args)-1], args[len(args)-1]
	c := root
	for _, w := range words {
		if s := c.find(w); s != nil {
			c = s
		} else if w == "help" && c == root {
			continue
		}
	}
	directive := directiveDefault
	switch {
	case strings.HasPrefix(cur, "-"):
		directive = directiveNoFileComp
		c.flagSet().VisitAll(func(f *flag.Flag) {
			name := "--" + f.Name
			if len(f.Name) == 1 {
				name = "-" + f.Name
			}
			if strings.HasPrefix(name, cur) {
				fmt.Fprintf(out, "%s\t%s\n", name, firstLine(f.Usage))
			}
		})
	case len(c.sub) > 0:
		directive = directiveNoFileComp
		for _, s := range c.sub {
			if strings.HasPrefix(s.Name(), cur) {
				fmt.Fprintf(out, "%s\t%s\n", s.Name(), s.Short)
			}
		}
		if c == root && strings.HasPrefix("help", cur) {
			fmt.Fprintf(out, "help\tHelp about any command\n")
		}
	}
	fmt.Fprintf(out, ":%d\n", directive)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.ReplaceAll(s, "`", "")
}

// completionCmd is `NAME completion SHELL`.
func completionCmd(root *Command) *Command {
	c := New("completion SHELL", "Print the shell completion script (bash, zsh or fish)")
	name := root.Name()
	c.Long = fmt.Sprintf(`Print the completion script of %[1]s for bash, zsh or fish.

  source <(%[1]s completion bash)                                     # this shell only
  %[1]s completion bash | sudo tee /etc/bash_completion.d/%[1]s >/dev/null
  %[1]s completion zsh > "${fpath[1]}/_%[1]s"
  %[1]s completion fish > ~/.config/fish/completions/%[1]s.fish

bash needs the bash-completion package.`, name)
	c.Args = ExactArgs(1)
	c.Run = func(_ context.Context, _ *Command, args []string) error {
		fn := "__" + strings.ReplaceAll(name, "-", "_") + "_complete"
		var script string
		switch args[0] {
		case "bash":
			script = bashScript
		case "zsh":
			script = zshScript
		case "fish":
			script = fishScript
		default:
			return &usageError{fmt.Sprintf("completion %q: want bash, zsh or fish", args[0])}
		}
		_, err := io.WriteString(root.out, strings.NewReplacer("NAME", name, "FUNC", fn).Replace(script))
		return err
	}
	return c
}

const bashScript = `# bash completion for NAME (NAME completion bash)
FUNC() {
    local cur=${COMP_WORDS[COMP_CWORD]} out line
    out=$("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD-1}" "$cur" 2>/dev/null) || return
    COMPREPLY=()
    while IFS= read -r line; do
        case $line in ''|:*) continue ;; esac
        COMPREPLY+=("${line%%$'\t'*}")
    done <<<"$out"
    if [ ${#COMPREPLY[@]} -eq 0 ] && [ "${out##*:}" != 4 ]; then
        compopt -o default 2>/dev/null
    fi
}
complete -F FUNC NAME
`

const zshScript = `#compdef NAME
# zsh completion for NAME (NAME completion zsh)
FUNC() {
    local -a comps
    local out line
    out=$("${words[1]}" __complete "${(@)words[2,CURRENT-1]}" "${words[CURRENT]}" 2>/dev/null) || return
    for line in "${(@f)out}"; do
        case $line in ''|:*) continue ;; esac
        comps+=("${${line%%$'\t'*}//:/\\:}:${line#*$'\t'}")
    done
    if (( ${#comps} )); then
        _describe 'NAME' comps
    elif [[ ${out##*:} != 4 ]]; then
        _files
    fi
}
if [ "$funcstack[1]" = "_NAME" ]; then
    FUNC "$@"
else
    compdef FUNC NAME
fi
`

const fishScript = `# fish completion for NAME (NAME completion fish)
function FUNC
    set -l args (commandline -opc)
    set -e args[1]
    command NAME __complete $args (commandline -ct) 2>/dev/null | string match -v -r '^:'
end
complete -c NAME -a '(FUNC)'
`
