#!/bin/sh
# Builds the tether-edge and tether packages with nfpm (`make package`).
#
#   packaging/package.sh BIN_DIR OUT_DIR PKG_VERSION [FORMAT...]
#
# BIN_DIR holds the built tether, tether-edge and tether-edge-onboard (the
# interactive onboarding form `tether-edge onboard` runs, shipped in the
# tether-edge package beside it); FORMAT is deb and/or rpm
# (default both); NFPM names the nfpm binary (default .tools/bin/nfpm) and
# GOARCH the architecture (default: go env GOARCH). The units are the ones in
# packaging/systemd/ with an ExecStart= at /usr/local/bin pointed at /usr/bin,
# where packages put binaries (/usr/local/bin is the admin's; the agent's
# unit names a bare tether-edge, which systemd finds in either). Each maintainer script is
# packaging/scripts/common.sh followed by the package's own script.
set -eu
[ $# -ge 3 ] || { echo "usage: $0 BIN_DIR OUT_DIR PKG_VERSION [deb|rpm...]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
PKG_VERSION=$3
shift 3
formats=${*:-deb rpm}
nfpm=${NFPM:-$root/.tools/bin/nfpm}
case $nfpm in /*) ;; *) nfpm=$PWD/$nfpm ;; esac
GOARCH=${GOARCH:-$(go env GOARCH)}
export PKG_VERSION GOARCH

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for pkg in tether-edge tether; do
	d=$stage/$pkg
	mkdir -p "$d/scripts"
	cp "$bin/$pkg" "$d/$pkg"
	[ "$pkg" != tether-edge ] || cp "$bin/tether-edge-onboard" "$d/tether-edge-onboard"
	sed 's|/usr/local/bin/|/usr/bin/|g' "$root/packaging/systemd/$pkg.service" >"$d/$pkg.service"
	cp "$root/packaging/etc/$pkg.env" "$d/$pkg.env"
	for s in "$root/packaging/scripts/$pkg"/*; do
		{
			printf '#!/bin/sh\n# %s %s maintainer script (built from packaging/scripts/)\nset -e\n' "$pkg" "$(basename "$s")"
			cat "$root/packaging/scripts/common.sh" "$s"
		} >"$d/scripts/$(basename "$s")"
		chmod 0755 "$d/scripts/$(basename "$s")"
	done
	for f in $formats; do
		(cd "$d" && "$nfpm" package --config "$root/packaging/nfpm/$pkg.yaml" --packager "$f" --target "$out/") >/dev/null
	done
done
ls "$out"
