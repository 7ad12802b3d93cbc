package main

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

// completionTimeout bounds how long a shell completion waits for the hub:
// a tab press must not hang on a hub that is down or far away.
const completionTimeout = 3 * time.Second

// completionMaxJobs is how many of the newest jobs a job id completion
// offers.
const completionMaxJobs = 100

// fromHub fetches what a completion offers with the client the command
// itself would use (cf, as parsed from the line being completed), without
// waiting for a hub that is starting. ok is false when the hub could not be
// asked or refused: the completion then offers nothing, quietly.
func fromHub[T any](cmd *cobra.Command, cf *clientFlags,
	fetch func(context.Context, *apiclient.Client) (T, error)) (T, bool) {
	var zero T
	quick := *cf
	quick.wait = 0
	c, err := quick.client()
	if err != nil {
		return zero, false
	}
	defer c.Close()
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	v, err := fetch(ctx, c)
	if err != nil {
		return zero, false
	}
	return v, true
}

// nodeCompletions are the names of the nodes the caller may see that start
// with prefix, other than those in skip, each with its state as the
// description.
func nodeCompletions(cmd *cobra.Command, cf *clientFlags, prefix string, skip []string) []cobra.Completion {
	nodes, ok := fromHub(cmd, cf,
		func(ctx context.Context, c *apiclient.Client) ([]apitype.Node, error) { return c.ListNodes(ctx) })
	if !ok {
		return nil
	}
	var out []cobra.Completion
	for _, n := range nodes {
		if !strings.HasPrefix(n.Name, prefix) || slices.Contains(skip, n.Name) {
			continue
		}
		state := "offline"
		switch {
		case !n.RevokedAt.IsZero():
			state = "revoked"
		case n.Online:
			state = "online"
		}
		out = append(out, cobra.CompletionWithDesc(n.Name, state))
	}
	return out
}

// completeNodeArgs completes positional node names (nodes rm, revoke,
// label), each offered once.
func completeNodeArgs(cf *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return nodeCompletions(cmd, cf, toComplete, args), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeNodeArg completes the node name of a command that takes just one
// (cluster register NODE): nothing once it is given.
func completeNodeArg(cf *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return nodeCompletions(cmd, cf, toComplete, nil), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeNodeFlag completes a flag that takes one node name.
func completeNodeFlag(cf *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return nodeCompletions(cmd, cf, toComplete, nil), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeNodeList completes a flag that takes comma-separated node names
// (run --nodes n1,n2): the name after the last comma, keeping those before
// it and offering none of them again. No space follows, so another comma
// can.
func completeNodeList(cf *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		cut := strings.LastIndex(toComplete, ",") + 1
		head := toComplete[:cut]
		out := nodeCompletions(cmd, cf, toComplete[cut:], strings.Split(head, ","))
		for i := range out {
			out[i] = head + out[i]
		}
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
}

// completeJobArg completes a job id as the first argument, newest first,
// from the jobs keep accepts (nil: all), each described by its state and
// what it runs.
func completeJobArg(cf *clientFlags, keep func(apitype.Job) bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		jobs, ok := fromHub(cmd, cf, func(ctx context.Context, c *apiclient.Client) ([]apitype.Job, error) {
			return c.ListJobs(ctx, completionMaxJobs)
		})
		if !ok {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, j := range jobs {
			if strings.HasPrefix(j.ID, toComplete) && (keep == nil || keep(j)) {
				out = append(out, cobra.CompletionWithDesc(j.ID, j.State+", "+what(j.Spec)))
			}
		}
		// Newest first, as `tether jobs` lists them, not sorted by the shell.
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveKeepOrder
	}
}

// completeJobNode completes a node name of the job named by the first
// argument (jobs logs ID --node), or any node's before the id is given.
func completeJobNode(cf *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) == 0 {
			return nodeCompletions(cmd, cf, toComplete, nil), cobra.ShellCompDirectiveNoFileComp
		}
		d, ok := fromHub(cmd, cf, func(ctx context.Context, c *apiclient.Client) (apitype.JobDetail, error) {
			return c.GetJob(ctx, args[0])
		})
		if !ok {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, n := range d.Nodes {
			if strings.HasPrefix(n.Node, toComplete) {
				out = append(out, cobra.CompletionWithDesc(n.Node, n.State))
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
