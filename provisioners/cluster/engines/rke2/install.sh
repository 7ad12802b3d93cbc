#!/bin/sh
# Tether built-in engine "rke2": install RKE2 with the official installer (get.rke2.io),
# then enable and start its service.
#
# Idempotent, as the cluster-agent state machine requires of engine scripts (a hub
# restart re-runs a step cut short): when rke2 is already installed,
# its service is active, and it is at the pinned version (if INSTALL_RKE2_VERSION is set),
# it exits 0 without touching anything; otherwise it (re-)runs the official installer
# and (re-)enables and starts the service, all of which converge an existing installation.
#
# Environment (from engine.yaml env, passed through to the official installer):
#   INSTALL_RKE2_VERSION  exact version to install, e.g. v1.31.4+rke2r1 (wins over the channel)
#   INSTALL_RKE2_CHANNEL  release channel when no version is pinned (default: stable)
#   INSTALL_RKE2_TYPE     server (default) or agent; selects rke2-server or rke2-agent
#   INSTALL_RKE2_METHOD, ...  any other variable the installer reads
#   TETHER_RKE2_INSTALLER_URL  where to fetch the installer (default https://get.rke2.io),
#                              for nodes that reach the internet through a mirror
set -eu

installer_url="${TETHER_RKE2_INSTALLER_URL:-https://get.rke2.io}"
pin="${INSTALL_RKE2_VERSION:-}"
type="${INSTALL_RKE2_TYPE:-server}"
case "$type" in
server | agent) ;;
*)
	echo "rke2: INSTALL_RKE2_TYPE=$type is neither server nor agent; fix the engine's env" >&2
	exit 1
	;;
esac
service="rke2-$type"

# The tarball method installs to /usr/local/bin, or /opt/rke2/bin when /usr/local is
# read-only; the rpm method to /usr/bin. A non-interactive SSH PATH may miss /opt.
PATH="$PATH:/usr/local/bin:/opt/rke2/bin"
export PATH

installed_version() {
	rke2 --version 2>/dev/null | sed -n 's/^rke2 version \([^ ]*\).*/\1/p' | head -n 1
}

if command -v rke2 >/dev/null 2>&1 && systemctl is-active --quiet "$service" 2>/dev/null; then
	if [ -z "$pin" ]; then
		echo "rke2: already installed and $service is active; nothing to do"
		exit 0
	fi
	current="$(installed_version)"
	if [ "$current" = "$pin" ]; then
		echo "rke2: $pin already installed and $service is active; nothing to do"
		exit 0
	fi
	echo "rke2: installed version ${current:-unknown} differs from INSTALL_RKE2_VERSION=$pin; re-running the installer"
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "rke2: installing needs root; run as root or through sudo" >&2
	exit 1
fi
for tool in curl systemctl; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "rke2: $tool is needed to install rke2; install it first" >&2
		exit 1
	fi
done

if [ -z "$pin" ] && [ -z "${INSTALL_RKE2_CHANNEL:-}" ]; then
	INSTALL_RKE2_CHANNEL=stable
	export INSTALL_RKE2_CHANNEL
fi
INSTALL_RKE2_TYPE="$type"
export INSTALL_RKE2_TYPE

# Download first, then run: with "curl | sh" a failed download feeds sh nothing and the
# pipeline exits 0, which would report a failed install as a success.
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
if ! curl -sfL --retry 3 -o "$tmp" "$installer_url"; then
	echo "rke2: downloading the installer from $installer_url failed; check the node's internet access or set TETHER_RKE2_INSTALLER_URL" >&2
	exit 1
fi
sh "$tmp"

# The installer only lays down files; the service is ours to enable and start.
# "start" blocks until the node is up (Type=notify), which takes minutes on a server.
systemctl enable "$service.service"
systemctl start "$service.service"

if ! systemctl is-active --quiet "$service"; then
	echo "rke2: $service did not become active; see 'journalctl -u $service'" >&2
	exit 1
fi
echo "rke2: installed; $service is active"
