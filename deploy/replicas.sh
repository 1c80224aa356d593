#!/usr/bin/env bash
# Runs N `brisk serve` replicas on this host with HAProxy in front of them.
#
# Usage:
#   deploy/replicas.sh [--replicas N] [--front-host H] [--front-port F]
#                      [--base-port P] [--brisk PATH] [--logs DIR]
#                      --model M [other `brisk serve` flags]
#
#   --replicas N    replicas to start (default 2)
#   --front-host H  address HAProxy listens on (default 127.0.0.1; 0.0.0.0 for every interface)
#   --front-port F  port HAProxy listens on (default 8080)
#   --base-port P   replica i listens on 127.0.0.1:P+i (default F+1; 0: free ports
#                   picked by each replica, read from its listening line)
#   --brisk PATH    the brisk binary (default $BRISK, else `brisk` on PATH)
#   --logs DIR      keep the rendered haproxy.cfg and every log in DIR (default: a
#                   temporary directory, removed at exit)
# Every other flag goes to each `brisk serve` unchanged, except --host and
# --port, which this script sets. Replicas share the host's cores: give each
# `--threads` (cores / N) rather than the default of every core.
#
# It prints `replica I: pid PID, URL` per replica, `haproxy: pid PID, config
# FILE`, then `ready: http://H:F` once every replica's /health answers 200 and
# HAProxy answers /health too, and stays in the foreground. SIGINT (Ctrl-C)
# or SIGTERM stops it: HAProxy stops accepting connections but finishes the
# open ones, the replicas get SIGTERM and drain, then everything exits.
# Needs haproxy and curl; no root (HAProxy runs in the foreground as the
# invoking user).
set -euo pipefail

replicas=2 front_host=127.0.0.1 front_port=8080 base_port="" logs="" brisk="${BRISK:-brisk}"
serve_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas="$2"; shift 2 ;;
    --front-host) front_host="$2"; shift 2 ;;
    --front-port) front_port="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    --brisk) brisk="$2"; shift 2 ;;
    --logs) logs="$2"; shift 2 ;;
    --host|--host=*|--port|--port=*) echo "replicas.sh: $1 is set by this script (see --front-host, --base-port)" >&2; exit 2 ;;
    *) serve_args+=("$1"); shift ;;
  esac
done
[ -z "$base_port" ] && base_port=$((front_port + 1))
[[ "$replicas" =~ ^[1-9][0-9]*$ ]] || { echo "replicas.sh: --replicas must be a positive integer" >&2; exit 2; }
# Debian installs haproxy in /usr/sbin, which a normal user's PATH may lack.
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
for tool in haproxy curl; do
  command -v "$tool" >/dev/null || { echo "replicas.sh: $tool not found (scripts/install_deps.sh installs it)" >&2; exit 2; }
done
command -v "$brisk" >/dev/null || { echo "replicas.sh: brisk binary '$brisk' not found (--brisk PATH)" >&2; exit 2; }
template="$(dirname "$0")/haproxy.cfg.in"

if [ -n "$logs" ]; then
  mkdir -p "$logs"
  dir="$logs"
else
  dir="$(mktemp -d "${TMPDIR:-/tmp}/brisk-replicas.XXXXXX")"
fi

replica_pids=() haproxy_pid=""
cleanup() {
  trap - EXIT INT TERM
  # SIGUSR1 is HAProxy's soft stop: no new connections, open ones go on, so
  # answers from draining replicas still reach their clients.
  [ -n "$haproxy_pid" ] && kill -USR1 "$haproxy_pid" 2>/dev/null || true
  for pid in "${replica_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${replica_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "$haproxy_pid" ]; then
    # With the replicas gone nothing is left to finish; give it a moment.
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$haproxy_pid" 2>/dev/null || break; sleep 0.2; done
    kill -TERM "$haproxy_pid" 2>/dev/null || true
    wait "$haproxy_pid" 2>/dev/null || true
  fi
  if [ -z "$logs" ]; then rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 0' INT TERM  # exit runs the EXIT trap

fail() {
  echo "replicas.sh: $1" >&2
  [ -f "${2:-}" ] && tail -n 20 "$2" >&2
  exit 1
}

# Replicas start together (each loads the model) and are waited for in turn.
# A Ctrl-C at the terminal reaches them too: they drain on SIGINT as on SIGTERM.
for ((i = 0; i < replicas; i++)); do
  port=0
  [ "$base_port" -ne 0 ] && port=$((base_port + i))
  "$brisk" serve "${serve_args[@]}" --host 127.0.0.1 --port "$port" >"$dir/replica-$i.log" 2>&1 &
  replica_pids+=($!)
done
ports=()
for ((i = 0; i < replicas; i++)); do
  log="$dir/replica-$i.log"
  port=""
  for _ in $(seq 600); do  # up to 5 minutes to load a large model
    port="$(sed -n 's|.* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$log" | head -n 1)"
    [ -n "$port" ] && break
    kill -0 "${replica_pids[$i]}" 2>/dev/null || fail "replica $i exited before listening:" "$log"
    sleep 0.5
  done
  [ -n "$port" ] || fail "replica $i did not listen within 5 minutes:" "$log"
  code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)"
  [ "$code" = 200 ] || fail "replica $i /health answered $code" "$log"
  # A free port (--base-port 0) can be the front port, which nothing holds
  # yet: HAProxy could not bind it, and the readiness probe below would reach
  # the replica instead.
  [ "$port" = "$front_port" ] && fail "replica $i was given port $port, the front port: pick another --front-port (or a --base-port)" "$log"
  ports+=("$port")
  echo "replica $i: pid ${replica_pids[$i]}, http://127.0.0.1:$port"
done

servers=""
for ((i = 0; i < replicas; i++)); do
  servers+="    server r$i 127.0.0.1:${ports[$i]} check"$'\n'
done
# Placeholders are replaced outside comments only; @SERVERS@ is a line of its own.
awk -v bind="$front_host:$front_port" -v servers="${servers%$'\n'}" \
  '/^[[:space:]]*#/ {print; next} $0 == "@SERVERS@" {print servers; next} {gsub(/@FRONT_BIND@/, bind); print}' \
  "$template" >"$dir/haproxy.cfg"
haproxy -c -q -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 || fail "haproxy rejected $dir/haproxy.cfg:" "$dir/haproxy.log"
# Its own session, so a Ctrl-C at the terminal (which HAProxy takes as a hard
# stop) does not cut open streams; cleanup() soft-stops it instead.
setsid haproxy -db -f "$dir/haproxy.cfg" >>"$dir/haproxy.log" 2>&1 &
haproxy_pid=$!
echo "haproxy: pid $haproxy_pid, config $dir/haproxy.cfg"
front="http://$front_host:$front_port"
[ "$front_host" = 0.0.0.0 ] && probe="http://127.0.0.1:$front_port" || probe="$front"
for _ in $(seq 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$probe/health" || true)" = 200 ] && break
  kill -0 "$haproxy_pid" 2>/dev/null || fail "haproxy exited:" "$dir/haproxy.log"
  sleep 0.1
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$probe/health" || true)" = 200 ] || fail "$front/health is not 200" "$dir/haproxy.log"
kill -0 "$haproxy_pid" 2>/dev/null || fail "haproxy exited:" "$dir/haproxy.log"
echo "ready: $front"

# Replicas may die (HAProxy routes around them); HAProxy dying ends the setup.
wait "$haproxy_pid" || true
fail "haproxy exited" "$dir/haproxy.log"
