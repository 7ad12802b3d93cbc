#!/usr/bin/env bash
# make demo: a hub and three agents (embedded SSH) on this machine, in ./demo.
# Prints one ssh command that jumps through the hub into a node, with host
# keys pinned in demo/known_hosts (no trust-on-first-use prompt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIR=${DEMO_DIR:-$ROOT/demo}
API_PORT=${DEMO_API_PORT:-7443}
SSH_PORT=${DEMO_SSH_PORT:-2222}
BIN=$ROOT/bin
NODES=(node-1 node-2 node-3)
OPERATOR=${DEMO_OPERATOR:-demo}
LOGIN=$(id -un)

stop() {
  if [ -f "$DIR/pids" ]; then
    while read -r pid; do kill "$pid" 2>/dev/null || true; done < "$DIR/pids"
    rm -f "$DIR/pids"
    echo "demo stopped (state kept in $DIR; rm -rf $DIR to start afresh)"
  fi
}

case "${1:-start}" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

stop >/dev/null
mkdir -p "$DIR"
for port in "$API_PORT" "$SSH_PORT"; do
  if (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
    echo "port $port on 127.0.0.1 is in use; set DEMO_API_PORT / DEMO_SSH_PORT" >&2
    exit 1
  fi
done

"$BIN/tether" hub --data-dir "$DIR/hub" --listen "127.0.0.1:$API_PORT" --ssh-listen "127.0.0.1:$SSH_PORT" >"$DIR/hub.log" 2>&1 &
echo $! >>"$DIR/pids"
for _ in $(seq 100); do
  [ -f "$DIR/hub/hub.json" ] && grep -q "\"pid\":$(head -1 "$DIR/pids")" "$DIR/hub/hub.json" && break
  sleep 0.1
done
[ -f "$DIR/hub/hub.json" ] || { echo "hub did not start; see $DIR/hub.log" >&2; cat "$DIR/hub.log" >&2; exit 1; }

# The operator key: the user's own ed25519 key if there is one, else a demo key.
KEY=$HOME/.ssh/id_ed25519
if [ ! -f "$KEY.pub" ]; then
  KEY=$DIR/demo_key
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C tether-demo -f "$KEY"
fi
if ! "$BIN/tether" operator list --data-dir "$DIR/hub" | grep -q "^$OPERATOR "; then
  "$BIN/tether" operator add "$OPERATOR" --data-dir "$DIR/hub" --key "$KEY.pub" 2>/dev/null
fi

JOIN=""
for n in "${NODES[@]}"; do
  if [ ! -f "$DIR/$n/node.json" ] && [ -z "$JOIN" ]; then
    JOIN=$("$BIN/tether" token create --data-dir "$DIR/hub" --ttl 10m --uses ${#NODES[@]} --label env=demo)
  fi
  "$BIN/tether-edge" run ${JOIN:+--join "$JOIN"} --state-dir "$DIR/$n" --name "$n" --ssh embedded >"$DIR/$n.log" 2>&1 &
  echo $! >>"$DIR/pids"
done

for _ in $(seq 150); do
  online=$("$BIN/tether" nodes --data-dir "$DIR/hub" -o json | grep -c '"online": true' || true)
  [ "$online" -ge ${#NODES[@]} ] && break
  sleep 0.2
done

# The hub certifies its own and every node's SSH host key; `tether config
# ssh` writes the host CA as @cert-authority, so nothing is trusted on first use.
KNOWN=$DIR/known_hosts
"$BIN/tether" config ssh --data-dir "$DIR/hub" --user "$OPERATOR" --known-hosts "$KNOWN" --identity-file "$KEY" >"$DIR/ssh_config" 2>/dev/null

"$BIN/tether" nodes --data-dir "$DIR/hub"
cat <<MSG

Tether demo is running: hub on 127.0.0.1:$API_PORT (tunnels + API) and 127.0.0.1:$SSH_PORT (SSH bastion),
three agents with embedded SSH. Jump into a node:

  ssh -F $DIR/ssh_config $LOGIN@node-1.tether

(it jumps through $OPERATOR@127.0.0.1:$SSH_PORT; hub and nodes are verified by host certificates
from the hub's CA, pinned in $KNOWN: no host-key prompt)

More:  bin/tether nodes --data-dir $DIR/hub      logs: $DIR/*.log      stop: make demo-stop
MSG
