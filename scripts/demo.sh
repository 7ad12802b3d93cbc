#!/usr/bin/env bash
# make demo: a hub and three agents (embedded SSH) on this machine, in ./demo.
# Prints one ssh command that jumps through the hub into a node, with host
# keys pinned in demo/known_hosts (no trust-on-first-use prompt). Running it
# again reuses ./demo: on other ports, with another key in ~/.ssh, or after
# make demo-stop.
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
TETHER=$BIN/tether

# stop ends the processes of the last start and waits (up to 10 s) until
# they are gone, so that their ports are free for the next one.
stop() {
  [ -f "$DIR/pids" ] || return 0
  local pids=()
  while read -r pid; do pids+=("$pid"); done < "$DIR/pids"
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
  rm -f "$DIR/pids"
  echo "demo stopped (state kept in $DIR; rm -rf $DIR to start afresh)"
}

# fail prints why the demo did not come up and the logs to look at.
fail() {
  echo "make demo: $1" >&2
  shift
  for log in "$@"; do
    echo "--- last lines of $log" >&2
    tail -n 15 "$log" >&2 || true
  done
  stop >/dev/null
  exit 1
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
    echo "make demo: port $port on 127.0.0.1 is in use (by another hub?); pick free ports," \
      "e.g. DEMO_API_PORT=$((API_PORT + 20000)) DEMO_SSH_PORT=$((SSH_PORT + 20000)) make demo" >&2
    exit 1
  fi
done

"$TETHER" hub --data-dir "$DIR/hub" --listen "127.0.0.1:$API_PORT" --ssh-listen "127.0.0.1:$SSH_PORT" >"$DIR/hub.log" 2>&1 &
echo $! >>"$DIR/pids"
for _ in $(seq 100); do
  [ -f "$DIR/hub/hub.json" ] && grep -q "\"pid\":$(head -1 "$DIR/pids")" "$DIR/hub/hub.json" && break
  sleep 0.1
done
grep -qs "\"pid\":$(head -1 "$DIR/pids")" "$DIR/hub/hub.json" || fail "the hub did not start" "$DIR/hub.log"
CLI=(--data-dir "$DIR/hub")

# The operator key: the user's own ed25519 key if there is one, else a demo
# key. Whichever it is, operator demo holds it (a key that appeared in ~/.ssh
# since the last run is added), since ssh_config below names it.
KEY=$HOME/.ssh/id_ed25519
if [ ! -f "$KEY.pub" ]; then
  KEY=$DIR/demo_key
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C tether-demo -f "$KEY"
fi
FP=$(ssh-keygen -l -f "$KEY.pub" | awk '{print $2}')
OP=$("$TETHER" operator list "${CLI[@]}" | awk -v op="$OPERATOR" '$1 == op')
if [ -z "$OP" ]; then
  "$TETHER" operator add "$OPERATOR" "${CLI[@]}" --key "$KEY.pub"
elif [[ $OP != *"$FP"* ]]; then
  "$TETHER" operator key add "$OPERATOR" "${CLI[@]}" --key "$KEY.pub"
fi

# An agent dials the hub address its join string named. A node that joined
# when the hub listened on another port is joined again (same name, new
# identity): otherwise it would dial the old port for ever.
JOIN=""
for n in "${NODES[@]}"; do
  if [ -f "$DIR/$n/node.json" ] && ! grep -qF "\"127.0.0.1:$API_PORT\"" "$DIR/$n/node.json"; then
    echo "$n joined the hub on another port: joining it again on 127.0.0.1:$API_PORT"
    "$TETHER" nodes rm "$n" "${CLI[@]}" 2>/dev/null || true
    rm -rf "${DIR:?}/$n"
  fi
  if [ ! -f "$DIR/$n/node.json" ] && [ -z "$JOIN" ]; then
    JOIN=$("$TETHER" token create "${CLI[@]}" --ttl 10m --uses ${#NODES[@]} --label env=demo)
  fi
  "$BIN/tether-edge" run ${JOIN:+--join "$JOIN"} --state-dir "$DIR/$n" --name "$n" --ssh embedded >"$DIR/$n.log" 2>&1 &
  echo $! >>"$DIR/pids"
done

online=0
for _ in $(seq 150); do
  online=$("$TETHER" nodes "${CLI[@]}" -o json | grep -c '"online": true' || true)
  [ "$online" -ge ${#NODES[@]} ] && break
  sleep 0.2
done
if [ "$online" -lt ${#NODES[@]} ]; then
  "$TETHER" nodes "${CLI[@]}" >&2 || true
  logs=("$DIR/hub.log")
  for n in "${NODES[@]}"; do logs+=("$DIR/$n.log"); done
  fail "only $online of ${#NODES[@]} nodes came online within 30 s" "${logs[@]}"
fi

# The hub certifies its own and every node's SSH host key; `tether config
# ssh` writes the host CA as @cert-authority, so nothing is trusted on first use.
KNOWN=$DIR/known_hosts
"$TETHER" config ssh "${CLI[@]}" --user "$OPERATOR" --known-hosts "$KNOWN" --identity-file "$KEY" \
  >"$DIR/ssh_config" 2>"$DIR/config.log" || fail "tether config ssh failed" "$DIR/config.log"

"$TETHER" nodes "${CLI[@]}"
cat <<MSG

Tether demo is running: hub on 127.0.0.1:$API_PORT (tunnels + API) and 127.0.0.1:$SSH_PORT (SSH bastion),
three agents with embedded SSH. Jump into a node:

  ssh -F $DIR/ssh_config $LOGIN@node-1.tether

(it jumps through $OPERATOR@127.0.0.1:$SSH_PORT with $KEY; hub and nodes are verified by host
certificates from the hub's CA, pinned in $KNOWN: no host-key prompt)

More:  bin/tether nodes --data-dir $DIR/hub      logs: $DIR/*.log      stop: make demo-stop
MSG
