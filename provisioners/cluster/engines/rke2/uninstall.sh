#!/bin/sh
# Tether built-in engine "rke2": uninstall RKE2 with the uninstall script the official
# installer leaves behind (/usr/local/bin for the tarball method, /opt/rke2/bin when
# /usr/local is read-only, /usr/bin for the rpm method).
#
# Idempotent: exits 0 when rke2 is not installed.
set -eu

for script in /usr/local/bin/rke2-uninstall.sh /opt/rke2/bin/rke2-uninstall.sh /usr/bin/rke2-uninstall.sh; do
	if [ -x "$script" ]; then
		echo "rke2: running $script"
		"$script"
		echo "rke2: uninstalled"
		exit 0
	fi
done

PATH="$PATH:/usr/local/bin:/opt/rke2/bin"
if command -v rke2 >/dev/null 2>&1; then
	echo "rke2: $(command -v rke2) exists but no rke2-uninstall.sh was found; rke2 was not installed by get.rke2.io, remove it by hand" >&2
	exit 1
fi
echo "rke2: not installed; nothing to do"
