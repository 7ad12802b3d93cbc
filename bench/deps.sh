#!/usr/bin/env bash
# Installs what the bench scenarios compare against, when missing: OpenSSH
# (client and server), socat (P2's relay reference) and Ansible (P6's
# reference), all from Debian, through scripts/ensure-deps.sh; and frp
# (P2's reverse-tunnel reference: tcp, stcp and QUIC), built from the Go
# module proxy into .tools/bin. Ansible and frp are optional: without them
# P6 and P2 run and say which reference they lack.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ensure="$root/scripts/ensure-deps.sh"
"$ensure" socat
"$ensure" ansible || echo "bench: continuing without Ansible (P6 reports no Ansible reference)" >&2

# frp is a Go module. Its release tags build with `go install …@version`,
# but its web dashboards are built by npm into a directory the module does
# not ship, so the build uses frp's own `noweb` tag (no dashboard; the
# proxies are the same code). A throwaway module pins the version: the
# proxy's version list is not needed that way.
FRP_VERSION="${FRP_VERSION:-v0.70.1}"
tools="$root/.tools/bin"
if [ "$("$tools/frps" --version 2>/dev/null || true)" != "${FRP_VERSION#v}" ] || [ "$("$tools/frpc" --version 2>/dev/null || true)" != "${FRP_VERSION#v}" ]; then
	echo "bench: building frp $FRP_VERSION into $tools (once; about a minute)" >&2
	mod="$(mktemp -d)"
	trap 'rm -rf "$mod"' EXIT
	printf 'module frpbuild\n\ngo 1.24\n\nrequire github.com/fatedier/frp %s\n' "$FRP_VERSION" >"$mod/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/fatedier/frp/cmd/frpc"\n\t_ "github.com/fatedier/frp/cmd/frps"\n)\n' >"$mod/tools.go"
	if ! (cd "$mod" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 &&
		CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$tools" go install -trimpath -tags noweb \
			github.com/fatedier/frp/cmd/frps github.com/fatedier/frp/cmd/frpc); then
		echo "bench: continuing without frp (P2 reports no frp reference)" >&2
	fi
fi
