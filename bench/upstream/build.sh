#!/usr/bin/env bash
# Builds the bench hub (bench/cmd/hubprof) against the go.mod's quic-go with
# the patches in this directory applied: changes we measured and would need
# upstream, kept here so the measurement can be repeated. The product's
# build never uses them.
#
#   bench/upstream/build.sh [OUT]      # default OUT: bin/hubprof-upstream
#   ulimit -n $(ulimit -Hn); TBENCH_HUB=bin/hubprof-upstream bin/tbench -size full -results - p4
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/bin/hubprof-upstream}"
cd "$root"
go mod download github.com/quic-go/quic-go
src="$(go list -m -f '{{.Dir}}' github.com/quic-go/quic-go)"
version="$(go list -m -f '{{.Version}}' github.com/quic-go/quic-go)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -R "$src" "$work/quic-go"
chmod -R u+w "$work/quic-go"
for p in "$here"/quic-go-*.patch; do
	if ! patch --quiet -p1 -d "$work/quic-go" <"$p"; then
		echo "build.sh: $(basename "$p") does not apply to quic-go $version: refresh it, or delete it if quic-go now does the same" >&2
		exit 1
	fi
done
cp go.mod go.sum "$work/"
printf '\nreplace github.com/quic-go/quic-go => %s/quic-go\n' "$work" >>"$work/go.mod"
go build -modfile="$work/go.mod" -o "$out" ./bench/cmd/hubprof
echo "built $out (quic-go $version with $(cd "$here" && echo quic-go-*.patch))"
