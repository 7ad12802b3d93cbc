#!/usr/bin/env bash
# Installs what the bench scenarios compare against, when missing: OpenSSH
# (client and server), socat (P2's relay reference) and Ansible (P6's
# reference), all from Debian. As root it runs apt-get and says what it
# installs; otherwise it says exactly what to install.
set -euo pipefail
"$(dirname "$0")/../scripts/ensure-deps.sh" socat
missing=()
command -v ansible >/dev/null 2>&1 || missing+=(ansible)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages for the bench references: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]} (the scenarios run without them, minus those references)" >&2
  exit 0
fi
echo "installing Debian packages for the bench references: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
