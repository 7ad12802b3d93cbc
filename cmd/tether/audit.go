package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newAuditCmd() *cobra.Command {
	var q apiclient.AuditQuery
	var since string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log: joins, jumps (who, where, key, bytes, result), revocations, changes",
		Long: `Show the append-only audit log, oldest first (the newest --limit events).
--since takes an RFC 3339 time or a duration back from now (e.g. 1h).`,
	}
	listCommand(cmd, func(c *apiclient.Client, ctx context.Context) ([]apitype.AuditEvent, error) {
		if since != "" {
			if d, err := time.ParseDuration(since); err == nil {
				q.Since = time.Now().Add(-d)
			} else if t, err := time.Parse(time.RFC3339, since); err == nil {
				q.Since = t
			} else {
				return nil, fmt.Errorf("--since %q: want a duration (1h) or an RFC 3339 time", since)
			}
		}
		return c.ListAudit(ctx, q)
	}, "TIME\tKIND\tRESULT\tOPERATOR\tNODE\tKEY\tREMOTE\tBYTES TO/FROM NODE\tDURATION\tDETAIL",
		func(e apitype.AuditEvent) string {
			dur, bytes := "", ""
			if !e.EndedAt.IsZero() {
				dur = e.EndedAt.Sub(e.At).Round(time.Millisecond).String()
			}
			if e.Kind == "jump" || e.Kind == "service_connect" || e.Kind == "service_route" {
				bytes = fmt.Sprintf("%d/%d", e.BytesToNode, e.BytesFromNode)
			}
			return strings.Join([]string{e.At.Local().Format(time.RFC3339), e.Kind, e.Result, e.Operator, e.Node,
				e.KeyFingerprint, e.Remote, bytes, dur, e.Detail}, "\t")
		})
	cmd.Flags().StringVar(&q.Node, "node", "", "only events for this node")
	cmd.Flags().StringVar(&q.Operator, "operator", "", "only events for this operator")
	cmd.Flags().StringVar(&since, "since", "", "only events since this time or duration ago")
	cmd.Flags().IntVar(&q.Limit, "limit", 1000, "at most this many (newest) events")
	return cmd
}
