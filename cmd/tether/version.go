package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(*cobra.Command, []string) { fmt.Println("tether", hub.Version) },
	}
}
