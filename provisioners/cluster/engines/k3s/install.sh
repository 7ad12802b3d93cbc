#!/bin/sh
# Tether built-in engine "k3s": install k3s with the official installer (get.k3s.io).
#
# Idempotent, as the cluster-agent state machine requires of engine scripts (a hub
# restart re-runs a step cut short): when k3s is already installed,
# running, and at the pinned version (if INSTALL_K3S_VERSION is set), it exits 0 without
# touching anything; otherwise it (re-)runs the official installer, which itself
# converges an existing installation.
#
# Environment (from engine.yaml env, passed through to the official installer):
#   INSTALL_K3S_VERSION   exact version to install, e.g. v1.31.4+k3s1 (wins over the channel)
#   INSTALL_K3S_CHANNEL   release channel when no version is pinned (default: stable)
#   INSTALL_K3S_EXEC, K3S_URL, K3S_TOKEN, ...  any other variable the installer reads
#   TETHER_K3S_INSTALLER_URL  where to fetch the installer (default https://get.k3s.io),
#                             for nodes that reach the internet through a mirror
set -eu

installer_url="${TETHER_K3S_INSTALLER_URL:-https://get.k3s.io}"
pin="${INSTALL_K3S_VERSION:-}"

# The service is k3s for a server and k3s-agent when the installer joins an agent
# (K3S_URL set, or INSTALL_K3S_EXEC starting with "agent").
service=k3s
if [ -n "${K3S_URL:-}" ]; then
	service=k3s-agent
fi
case "${INSTALL_K3S_EXEC:-}" in
agent*) service=k3s-agent ;;
esac

service_active() {
	if command -v systemctl >/dev/null 2>&1; then
		systemctl is-active --quiet "$1"
	elif command -v rc-service >/dev/null 2>&1; then
		rc-service "$1" status >/dev/null 2>&1
	else
		return 1
	fi
}

# installed_version prints the running binary's version ("k3s version v1.31.4+k3s1 (...)").
installed_version() {
	k3s --version 2>/dev/null | sed -n 's/^k3s version \([^ ]*\).*/\1/p' | head -n 1
}

if command -v k3s >/dev/null 2>&1 && service_active "$service"; then
	if [ -z "$pin" ]; then
		echo "k3s: already installed and $service is active; nothing to do"
		exit 0
	fi
	current="$(installed_version)"
	if [ "$current" = "$pin" ]; then
		echo "k3s: $pin already installed and $service is active; nothing to do"
		exit 0
	fi
	echo "k3s: installed version ${current:-unknown} differs from INSTALL_K3S_VERSION=$pin; re-running the installer"
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "k3s: installing needs root; run as root or through sudo" >&2
	exit 1
fi
if ! command -v curl >/dev/null 2>&1; then
	echo "k3s: curl is needed to fetch the installer from $installer_url; install curl first" >&2
	exit 1
fi

if [ -z "$pin" ] && [ -z "${INSTALL_K3S_CHANNEL:-}" ]; then
	INSTALL_K3S_CHANNEL=stable
	export INSTALL_K3S_CHANNEL
fi

# Download first, then run: with "curl | sh" a failed download feeds sh nothing and the
# pipeline exits 0, which would report a failed install as a success.
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
if ! curl -sfL --retry 3 -o "$tmp" "$installer_url"; then
	echo "k3s: downloading the installer from $installer_url failed; check the node's internet access or set TETHER_K3S_INSTALLER_URL" >&2
	exit 1
fi
sh "$tmp"

if ! service_active "$service"; then
	echo "k3s: the installer finished but $service is not active; see 'journalctl -u $service'" >&2
	exit 1
fi
echo "k3s: installed; $service is active"
