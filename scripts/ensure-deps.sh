#!/usr/bin/env bash
# Installs what `make test` needs when it is missing: OpenSSH client and
# server, systemd-analyze, ansible-core, rpm, cloud-init, sudo, prometheus, chromium, patch,
# the PostgreSQL server, python3-paramiko and sshfs (Debian packages). As root it
# runs apt-get; otherwise it says exactly what to install.
set -euo pipefail

missing=()
command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
command -v scp >/dev/null 2>&1 || missing+=(openssh-client)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
# systemd-analyze checks the shipped unit files (TestSystemdUnits).
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
# ansible-inventory and ansible read `tether inventory --ansible` and ping
# nodes through the hub (TestFleetOperatorView).
command -v ansible-inventory >/dev/null 2>&1 || missing+=(ansible-core)
# rpm queries the built .rpm packages (TestPackageRPM); cloud-init checks
# onboarding's user-data against its schema (`cloud-init schema`).
command -v rpm >/dev/null 2>&1 || missing+=(rpm)
command -v cloud-init >/dev/null 2>&1 || missing+=(cloud-init)
# KubeOne runs its commands with sudo; so does the stand-in kubeone of the
# KubeOne tests (TestKubeOne*), and the hub fetching a cluster's kubeconfig.
command -v sudo >/dev/null 2>&1 || missing+=(sudo)
# Prometheus scrapes a hub with the configuration in docs/operations.md and evaluates the
# Grafana dashboard's queries (TestGrafanaDashboard).
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
# A headless Chromium drives the web console's browser tests (TestConsole*).
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
# bench.TestUpstreamPatchesApply dry-runs bench/upstream's quic-go patches.
command -v patch >/dev/null 2>&1 || missing+=(patch)
# The store suite and the replica tests start throwaway PostgreSQL servers
# (initdb + postgres in a temp dir; internal/testenv/pgtest).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
# Debian's paramiko (Ansible's paramiko connection, Fabric, Netmiko) and
# sshfs jump through the bastion to SFTP on nodes (TestParamikoJump,
# TestSSHFSJump); paramiko goes into Debian's own python3.
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import paramiko' >/dev/null 2>&1 || missing+=(python3-paramiko)
command -v sshfs >/dev/null 2>&1 || missing+=(sshfs)
for pkg in "$@"; do
  case "$pkg" in
    iperf3|socat|ansible) command -v "$pkg" >/dev/null 2>&1 || missing+=("$pkg") ;;
  esac
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian postinst may start a system sshd on :22; tests never use it.
mkdir -p /run/sshd
