#!/bin/sh
# Tether built-in engine "k3s": uninstall k3s with the uninstall scripts the official
# installer leaves behind.
#
# Idempotent: exits 0 when k3s is not installed.
set -eu

ran=0
for script in /usr/local/bin/k3s-uninstall.sh /usr/local/bin/k3s-agent-uninstall.sh; do
	if [ -x "$script" ]; then
		echo "k3s: running $script"
		"$script"
		ran=1
	fi
done

if [ "$ran" -eq 1 ]; then
	echo "k3s: uninstalled"
	exit 0
fi
if command -v k3s >/dev/null 2>&1; then
	echo "k3s: $(command -v k3s) exists but no k3s-uninstall.sh was found; k3s was not installed by get.k3s.io, remove it by hand" >&2
	exit 1
fi
echo "k3s: not installed; nothing to do"
