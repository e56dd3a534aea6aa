#!/usr/bin/env bash
# `make bench-peers`: Hermes beside a peer, Celery, and beside the raw JetStream floor, in one run
# on this machine. It installs the pinned Redis and Celery into .tools/ (scripts/install-peers.sh),
# runs the Hermes bench's peer rows (HERMES_BENCH_ROWS=peers: the floor and the single-node goal,
# 1 in flight and N in flight), then starts a private Redis on a free loopback port and a Celery
# worker with 2 prefork processes on it, runs the same two shapes through Celery
# (scripts/bench_peers/celery_bench.py), and prints the three side by side with their ratios.
# Redis and the worker are stopped, and the temporary folder removed, however the script ends.
#
#   BENCH_PEERS_SCALE=smoke  20 round trips and 200 tasks with 50 in flight (make test), else
#                            500 round trips and 10,000 tasks with 1,000 in flight
#   HERMES_BENCH_BIN=PATH    an already-built hermes-bench to run instead of
#                            `cargo run --release -p hermes-bench --features hermes-bench/local`
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "${1:-$root/.tools}"
tools="$(cd "${1:-$root/.tools}" && pwd)"
scale="${BENCH_PEERS_SCALE:-full}"
case "$scale" in
  full | smoke) ;;
  *) echo "bench-peers: BENCH_PEERS_SCALE is 'smoke' or 'full', not '$scale'" >&2; exit 2 ;;
esac

"$root/scripts/install-peers.sh" "$tools"
venv="$tools/peers-venv"
export HERMES_NATS_SERVER_BIN="${HERMES_NATS_SERVER_BIN:-$tools/bin/nats-server}"

work=$(mktemp -d -t hermes-bench-peers.XXXXXX)
redis_pid=""
worker_pid=""
running=""

# Ends a process we started and waits for it: TERM, then KILL after `grace` seconds. With `group`,
# the signals go to its process group (the Celery worker and its pool; a run and its children).
stop() {
  local pid="$1" grace="$2" group="${3:-}" target="$1"
  [ -n "$group" ] && target="-$pid"
  kill -TERM -- "$target" 2>/dev/null || return 0
  for _ in $(seq $((grace * 10))); do
    kill -0 -- "$target" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "$target" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "$running" "$worker_pid"; do
    if [ -n "$pid" ]; then
      stop "$pid" 10 group
    fi
  done
  if [ -n "$redis_pid" ]; then
    stop "$redis_pid" 5
  fi
  if [ "$rc" -ne 0 ]; then
    for log in "$work/celery.log" "$work/redis.log"; do
      if [ -s "$log" ]; then
        echo "--- the last lines of $(basename "$log"):" >&2
        tail -n 20 "$log" >&2
      fi
    done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Runs a command in a process group of its own, its output copied to the file OUT, and waits for
# it: in the background, so that a signal to this script is handled at once, and the whole group
# (cargo, the bench and its nats-server; the Celery driver) is stopped with the script.
run_logged() {
  local out="$1"
  shift
  setsid bash -c 'set -o pipefail; out="$1"; shift; "$@" | tee "$out"' run_logged "$out" "$@" &
  running=$!
  wait "$running"
  running=""
}

# 1. Hermes and the floor, before any peer process is started.
echo "bench-peers: the Hermes bench's peer rows ($scale scale)"
hermes_env=(HERMES_BENCH_ROWS=peers HERMES_BENCH_SCALE="$scale")
if [ -n "${HERMES_BENCH_BIN:-}" ]; then
  run_logged "$work/hermes.out" env "${hermes_env[@]}" "$HERMES_BENCH_BIN"
else
  cd "$root"
  run_logged "$work/hermes.out" env "${hermes_env[@]}" "${CARGO:-cargo}" run --release \
    -p hermes-bench --features hermes-bench/local
fi
if ! grep -q '^PEER hermes {' "$work/hermes.out"; then
  echo "bench-peers: the Hermes bench printed no 'PEER hermes {...}' line (HERMES_BENCH_ROWS=peers)" >&2
  exit 1
fi

# 2. A private Redis on a free loopback port: no persistence, its files in the temporary folder.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir "$work/redis"
"$tools/redis/bin/redis-server" --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
  --dir "$work/redis" --logfile "$work/redis.log" --daemonize no &
redis_pid=$!
for _ in $(seq 100); do
  if [ "$("$tools/redis/bin/redis-cli" -p "$port" ping 2>/dev/null)" = "PONG" ]; then
    break
  fi
  kill -0 "$redis_pid" 2>/dev/null || { echo "bench-peers: redis-server exited at start" >&2; exit 1; }
  sleep 0.1
done
[ "$("$tools/redis/bin/redis-cli" -p "$port" ping 2>/dev/null)" = "PONG" ] \
  || { echo "bench-peers: redis-server did not answer on port $port within 10 s" >&2; exit 1; }
redis_url="redis://127.0.0.1:$port/0"

# 3. The Celery worker: 2 prefork processes, in a process group of its own so that stopping it
#    stops its pool too.
export BENCH_PEERS_REDIS_URL="$redis_url"
export PYTHONPATH="$root/scripts/bench_peers${PYTHONPATH:+:$PYTHONPATH}"
setsid "$venv/bin/celery" --workdir "$work" -A peer_tasks worker --pool prefork --concurrency 2 \
  --without-mingle --loglevel WARNING --logfile "$work/celery.log" >>"$work/celery.log" 2>&1 &
worker_pid=$!

# 4. The same shapes through Celery.
echo
echo "bench-peers: Celery, 2 worker processes, Redis on 127.0.0.1:$port ($scale scale)"
run_logged "$work/celery.out" env BENCH_PEERS_SCALE="$scale" "$venv/bin/python" \
  "$root/scripts/bench_peers/celery_bench.py"
stop "$worker_pid" 10 group
worker_pid=""
stop "$redis_pid" 5
redis_pid=""

# 5. The table.
celery_version=$("$venv/bin/python" -c 'import celery; print(celery.__version__)')
redis_version=$("$tools/redis/bin/redis-server" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')
echo
python3 "$root/scripts/bench_peers/peers_table.py" "$work/hermes.out" "$work/celery.out" \
  "All three ran on this machine ($(nproc) cores) in this one run, one after another: the floor and
Hermes (hermes-bench, one nats-server), then Celery $celery_version with 2 worker processes (prefork)
and a private Redis $redis_version as its broker and result backend."
