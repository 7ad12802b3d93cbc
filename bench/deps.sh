#!/usr/bin/env bash
# Installs what the bench scenarios compare against, when missing: OpenSSH
# (client and server), socat (P2's relay reference) and Ansible (P6's
# reference), all from Debian, through scripts/ensure-deps.sh. Ansible is
# optional: without it P6 runs and says it has no Ansible reference.
set -euo pipefail
ensure="$(dirname "$0")/../scripts/ensure-deps.sh"
"$ensure" socat
"$ensure" ansible || echo "bench: continuing without Ansible (P6 reports no Ansible reference)" >&2
