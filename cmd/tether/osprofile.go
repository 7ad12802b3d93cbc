package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newOSProfileCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "osprofile",
		Short: "Add, list and remove OS profiles (how onboarded machines are set up, per OS)",
	}
	cmd.AddCommand(newOSProfileAddCmd(), newOSProfileListCmd(), newOSProfileRmCmd())
	return cmd
}

func newOSProfileAddCmd() *cobra.Command {
	var cf clientFlags
	var req apitype.OSProfileAddRequest
	var tmpl string
	cmd := &cobra.Command{
		Use:   "add NAME",
		Short: "Add an OS profile",
		Long: `Add an OS profile. A machine being onboarded gets the profile whose --distro
and --version are its /etc/os-release ID and VERSION_ID; failing that, one whose
--family is its ID or one of its ID_LIKE words (a profile of its own distro
first, newest version first; then by name).

  tether osprofile add debian-12 --distro debian --version 12 --family debian

--cloud-init names a Go text/template that renders the machine's cloud-init
user-data (see docs/onboarding.md for its data
and the allowed shape: write_files and runcmd only). The hub parses it and
renders it with sample data before storing it. Without it, the built-in
template is used.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Name = args[0]
			if tmpl != "" {
				b, err := os.ReadFile(tmpl)
				if err != nil {
					return fmt.Errorf("--cloud-init: %w", err)
				}
				if len(b) > apitype.MaxCloudInitTmpl {
					return fmt.Errorf("--cloud-init %s: larger than %d bytes", tmpl, apitype.MaxCloudInitTmpl)
				}
				req.CloudInit = string(b)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			p, err := c.AddOSProfile(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Printf("OS profile %s added: %s %s\n", p.Name, p.Distro, p.Version)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&req.Distro, "distro", "", "os-release ID, e.g. debian, ubuntu, rocky (required)")
	cmd.Flags().StringVar(&req.Version, "version", "", "os-release VERSION_ID, e.g. 12, 24.04 (required)")
	cmd.Flags().StringVar(&req.Family, "family", "",
		"fallback for machines without a distro+version profile: an ID_LIKE word, e.g. debian, rhel")
	cmd.Flags().StringVar(&tmpl, "cloud-init", "",
		"cloud-init user-data template file (Go text/template); default: the built-in one")
	_ = cmd.MarkFlagRequired("distro")
	_ = cmd.MarkFlagRequired("version")
	return cmd
}

func newOSProfileListCmd() *cobra.Command {
	return listCommand(&cobra.Command{Use: "list", Short: "List OS profiles"},
		(*apiclient.Client).ListOSProfiles, "NAME\tDISTRO\tVERSION\tFAMILY\tTEMPLATE",
		func(p apitype.OSProfile) string {
			t := "built-in"
			if p.CloudInit != "" {
				t = fmt.Sprintf("custom (%d bytes)", len(p.CloudInit))
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", p.Name, p.Distro, p.Version, p.Family, t)
		})
}

func newOSProfileRmCmd() *cobra.Command {
	return argCommand(&cobra.Command{Use: "rm NAME", Short: "Remove an OS profile"}, (*apiclient.Client).RemoveOSProfile)
}
