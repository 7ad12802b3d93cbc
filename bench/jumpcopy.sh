#!/usr/bin/env bash
# bench/jumpcopy.sh: bulk copy through `ssh -J` (P1, rough form).
#
# Copies SIZE_MIB (default 1024) MiB of zeros with `ssh -J HUB NODE 'cat >/dev/null'`
# to a real loopback sshd, cipher aes128-gcm, through:
#   - tether over QUIC, tether over TLS+yamux (TCP)
#   - the reference in the same run: OpenSSH -J through a stock OpenSSH bastion (a second sshd)
# and prints MB/s and the ratio to the reference. Loopback only; every process is
# stopped on exit. Appends the table with machine details to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SIZE_MIB=${SIZE_MIB:-1024}
RUNS=${RUNS:-3}
W=$(mktemp -d /tmp/tether-bench.XXXXXX)
PIDS=()
KEEP=0
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ "$KEEP" = 1 ] || rm -rf "$W"; }
trap cleanup EXIT
[ "$(id -u)" -eq 0 ] && mkdir -p /run/sshd

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
LOGIN=$(id -un)
ssh-keygen -q -t ed25519 -N '' -f "$W/op"

start_sshd() { # name port extra-config
  local d="$W/$1"; mkdir -p "$d"
  ssh-keygen -q -t ed25519 -N '' -f "$d/hostkey"
  cp "$W/op.pub" "$d/authorized_keys"
  cat >"$d/sshd_config" <<CFG
Port $2
ListenAddress 127.0.0.1
HostKey $d/hostkey
AuthorizedKeysFile $d/authorized_keys
PidFile none
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
AllowTcpForwarding yes
$3
CFG
  /usr/sbin/sshd -D -e -f "$d/sshd_config" 2>"$d/log" &
  PIDS+=($!)
}
NODE_PORT=$(freeport); BASTION_PORT=$(freeport); API_PORT=$(freeport); HUB_SSH=$(freeport)
start_sshd node "$NODE_PORT" ""
start_sshd bastion "$BASTION_PORT" ""

"$ROOT/bin/tether" hub --data-dir "$W/hub" --listen 127.0.0.1:$API_PORT --ssh-listen 127.0.0.1:$HUB_SSH --log-level warn 2>"$W/hub.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -f "$W/hub/hub.json" ] && break; sleep 0.1; done
"$ROOT/bin/tether" operator add bench --data-dir "$W/hub" --key "$W/op.pub" 2>/dev/null
JOIN=$("$ROOT/bin/tether" token create --data-dir "$W/hub" --uses 2)
for t in quic tcp; do
  "$ROOT/bin/tether-edge" run --join "$JOIN" --state-dir "$W/n-$t" --name "n-$t" --ssh 127.0.0.1:$NODE_PORT --transport $t --log-level warn 2>"$W/n-$t.log" &
  PIDS+=($!)
done
for _ in $(seq 100); do
  [ "$("$ROOT/bin/tether" nodes --data-dir "$W/hub" -o json | grep -c '"online": true')" -eq 2 ] && break; sleep 0.1
done

cat >"$W/ssh_config" <<CFG
Host *
  IdentityFile $W/op
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  Ciphers aes128-gcm@openssh.com
  Compression no
CFG

copy() { # label, ssh args...
  local best=0 mbs label=$1; shift
  for _ in $(seq "$RUNS"); do
    local s e
    s=$(date +%s.%N)
    if ! head -c $((SIZE_MIB << 20)) /dev/zero | ssh -F "$W/ssh_config" "$@" 'cat >/dev/null'; then
      echo "copy ($label) failed; logs in $W" >&2; KEEP=1; exit 1
    fi
    e=$(date +%s.%N)
    mbs=$(python3 -c "print(round($SIZE_MIB*1.048576/($e-$s),1))")
    best=$(python3 -c "print(max($best,$mbs))")
  done
  echo "$best"
}

REF=$(copy ref -J "$LOGIN@127.0.0.1:$BASTION_PORT" -p "$NODE_PORT" "$LOGIN@127.0.0.1")
Q=$(copy quic -J "bench@127.0.0.1:$HUB_SSH" "$LOGIN@n-quic")
T=$(copy tcp -J "bench@127.0.0.1:$HUB_SSH" "$LOGIN@n-tcp")
ratio() { python3 -c "print(round($1/$2,2))"; }

TABLE=$(cat <<TBL
| scenario | MB/s (best of $RUNS) | vs OpenSSH -J |
|---|---|---|
| P1 ${SIZE_MIB} MiB ssh -J, OpenSSH bastion (reference) | $REF | 1.00 |
| P1 ${SIZE_MIB} MiB ssh -J, tether QUIC | $Q | $(ratio "$Q" "$REF") |
| P1 ${SIZE_MIB} MiB ssh -J, tether TLS+yamux | $T | $(ratio "$T" "$REF") |
TBL
)
echo "$TABLE"
{
  echo
  echo "## jumpcopy $(date -u +%Y-%m-%dT%H:%MZ) ($(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, kernel $(uname -r), $(go version | awk '{print $3}'), $(ssh -V 2>&1)"
  echo
  echo "$TABLE"
} >>"$ROOT/bench/RESULTS.md"
