package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/artifacts"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// registryFlags are how the CLI reaches a registry: the same flags as the
// hub's.
type registryFlags struct {
	ca, auth string
}

func (f *registryFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.ca, "registry-ca", "",
		"PEM file of extra CA certificates for the registry (system roots otherwise; TLS verification cannot be turned off)")
	cmd.Flags().StringVar(&f.auth, "registry-auth", "",
		"docker-style config.json with registry credentials (default: $DOCKER_CONFIG/config.json or ~/.docker/config.json "+
			"when present)")
}

func (f *registryFlags) client() (*artifacts.Client, error) {
	log, err := newLogger()
	if err != nil {
		return nil, err
	}
	return artifacts.New(artifacts.Config{CAFile: f.ca, AuthFile: f.auth, Log: log})
}

func newArtifactCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "artifact",
		Short: "Publish and inspect upgrade artifacts in an OCI registry",
		Long: `Publish and inspect the OCI artifacts 'tether upgrade create --artifact' takes.

These commands talk to the registry directly (not to the hub), with oras-go.
References are oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:HEX.

  agent   the tether-edge binary per OS/architecture: an OCI image index
          (artifactType ` + upgradeproto.ArtifactTypeAgent + `) of one manifest per
          platform, each with the binary as its one layer
  bundle  software for the nodes: one manifest (artifactType
          ` + upgradeproto.ArtifactTypeBundle + `) whose layers are files named by
          their title: install.sh, optional health.sh and rollback.sh, payload`,
	}
	cmd.AddCommand(newArtifactPushCmd(), newArtifactInspectCmd())
	return cmd
}

func newArtifactPushCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "push agent|bundle REF ...",
		Short: "Publish an agent or a bundle artifact under a tag",
	}
	cmd.AddCommand(newArtifactPushAgentCmd(), newArtifactPushBundleCmd())
	return cmd
}

func printPushed(cmd *cobra.Command, p artifacts.Pushed, output string) error {
	if output == "json" {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(p)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "pushed %s\ndigest %s\npinned %s\n", p.Reference, p.Digest, p.Pinned)
	return nil
}

func checkOutput(o string) error {
	if o != "text" && o != "json" {
		return fmt.Errorf("-o %q: want text or json", o)
	}
	return nil
}

func newArtifactPushAgentCmd() *cobra.Command {
	var rf registryFlags
	var version, output string
	var binaries []string
	cmd := &cobra.Command{
		Use:   "agent REF --version V --binary OS/ARCH=PATH [--binary ...]",
		Short: "Publish tether-edge binaries as an agent artifact (a multi-arch index)",
		Long: `Publish tether-edge binaries as one agent artifact: per --binary a manifest
with the binary as its one layer, and an index of them tagged REF. The version
is what the agents will report after the upgrade (tether-edge --version).

Before anything is sent, each binary is checked: an ELF executable for the
--binary's architecture, whose Go build info names tether-edge and that
OS/ARCH, holding --version as its version (set at build time with
-ldflags '-X github.com/tether-dev/tether/edge.Version=V', as make build
VERSION=V does). A script, another program, another platform's build or
another version is refused, saying which.`,
		Example: `  tether artifact push agent oci://registry.example:5000/tether/edge:v1.4.0 --version v1.4.0 \
      --binary linux/amd64=dist/tether-edge-linux-amd64 --binary linux/arm64=dist/tether-edge-linux-arm64`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			var bins []artifacts.AgentBinary
			for _, b := range binaries {
				pl, path, ok := strings.Cut(b, "=")
				if !ok || pl == "" || path == "" {
					return fmt.Errorf("--binary %q: want OS/ARCH=PATH, e.g. linux/amd64=dist/tether-edge", b)
				}
				bins = append(bins, artifacts.AgentBinary{Platform: pl, Path: path})
			}
			if len(bins) == 0 {
				return fmt.Errorf("give at least one --binary OS/ARCH=PATH")
			}
			for _, b := range bins {
				if err := artifacts.CheckAgentBinary(b.Path, b.Platform, version); err != nil {
					return err
				}
			}
			c, err := rf.client()
			if err != nil {
				return err
			}
			p, err := c.PushAgent(cmd.Context(), args[0], version, bins)
			if err != nil {
				return err
			}
			return printPushed(cmd, p, output)
		},
	}
	rf.register(cmd)
	cmd.Flags().StringVar(&version, "version", "", "the agent version the binaries report (required)")
	cmd.Flags().StringArrayVar(&binaries, "binary", nil,
		"OS/ARCH=PATH of a tether-edge binary (repeatable; GOOS/GOARCH names)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	_ = cmd.MarkFlagRequired("version")
	return cmd
}

func newArtifactPushBundleCmd() *cobra.Command {
	var rf registryFlags
	var version, install, health, rollback, output string
	var files []string
	cmd := &cobra.Command{
		Use:   "bundle REF --version V --install FILE [--health FILE] [--rollback FILE] [--file PATH ...]",
		Short: "Publish an install script and payload files as a bundle artifact",
		Long: `Publish a bundle: software the hub installs on nodes through the job runner.
On the node the files land in one directory: --install as install.sh (run with
its output streamed to the hub), --health as health.sh (run after it; a failure
runs rollback.sh when there is one), --rollback as rollback.sh, and every
--file under its base name (a plain name: letters, digits, '.', '-', '_', '+').
Each file's SHA-256 is checked on the node before anything runs.`,
		Example: `  tether artifact push bundle oci://registry.example:5000/patches/openssl:42 --version 42 \
      --install install.sh --health health.sh --file libssl3_3.0.15-1_amd64.deb`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			fs := []artifacts.BundleFile{{Name: upgradeproto.BundleInstall, Path: install}}
			if health != "" {
				fs = append(fs, artifacts.BundleFile{Name: upgradeproto.BundleHealth, Path: health})
			}
			if rollback != "" {
				fs = append(fs, artifacts.BundleFile{Name: upgradeproto.BundleRollback, Path: rollback})
			}
			for _, f := range files {
				fs = append(fs, artifacts.BundleFile{Name: filepath.Base(f), Path: f})
			}
			c, err := rf.client()
			if err != nil {
				return err
			}
			p, err := c.PushBundle(cmd.Context(), args[0], version, fs)
			if err != nil {
				return err
			}
			return printPushed(cmd, p, output)
		},
	}
	rf.register(cmd)
	cmd.Flags().StringVar(&version, "version", "", "the bundle's version (required)")
	cmd.Flags().StringVar(&install, "install", "", "install script, run on the node as install.sh (required)")
	cmd.Flags().StringVar(&health, "health", "", "health script, run after the install as health.sh")
	cmd.Flags().StringVar(&rollback, "rollback", "", "rollback script, run as rollback.sh when the health script fails")
	cmd.Flags().StringArrayVar(&files, "file", nil,
		"payload file, placed beside the scripts under its base name (repeatable)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	_ = cmd.MarkFlagRequired("version")
	_ = cmd.MarkFlagRequired("install")
	return cmd
}

// inspected is `tether artifact inspect -o json`.
type inspected struct {
	Reference string                         `json:"reference"`
	Pinned    string                         `json:"pinned"`
	Digest    string                         `json:"digest"`
	Kind      upgradeproto.Kind              `json:"kind"`
	Version   string                         `json:"version"`
	Files     map[string][]upgradeproto.File `json:"files"` // by platform ("" for a bundle)
}

func newArtifactInspectCmd() *cobra.Command {
	var rf registryFlags
	var output string
	cmd := &cobra.Command{
		Use:   "inspect REF [-o json]",
		Short: "Resolve an artifact as the hub would, and show what it pins",
		Long: `Resolve REF as 'tether upgrade create' does: a tag to a digest, then the
index and manifests by digest, verified and checked as a Tether artifact. Shows
the digest an upgrade would pin, the kind, the version and every file with its
digest and size. Nothing is downloaded but the manifests.`,
		Example: `  tether artifact inspect oci://registry.example:5000/tether/edge:v1.4.0
  tether artifact inspect oci://registry.example:5000/patches/openssl:42 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := rf.client()
			if err != nil {
				return err
			}
			p, err := c.Resolve(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			r, _ := artifacts.ParseReference(args[0])
			in := inspected{
				Reference: args[0],
				Pinned:    r.Pinned(p.Digest).String(),
				Digest:    p.Digest,
				Kind:      p.Kind,
				Version:   p.Version,
				Files:     map[string][]upgradeproto.File{},
			}
			keys := p.Platforms()
			if p.Kind == upgradeproto.KindBundle {
				keys = []string{""}
			}
			for _, k := range keys {
				goos, goarch, _ := strings.Cut(k, "/")
				_, _, files, err := p.ForPlatform(goos, goarch)
				if err != nil {
					return err
				}
				in.Files[k] = files
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return json.NewEncoder(out).Encode(in)
			}
			fmt.Fprintf(out, "reference %s\npinned    %s\nkind      %s\nversion   %s\n\n", in.Reference, in.Pinned, in.Kind,
				in.Version)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PLATFORM\tFILE\tSIZE\tDIGEST")
			for _, k := range keys {
				pl := k
				if pl == "" {
					pl = "-"
				}
				for _, f := range in.Files[k] {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", pl, f.Name, f.Size, f.Digest)
				}
			}
			return tw.Flush()
		},
	}
	rf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}
