#!/usr/bin/env bash
# `make demo`: build, start `hermes up` in the background, submit the example plan and watch it
# to the end, then stop the stack. The stack's logs go to .hermes/demo.log.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --bins -p hermes-cli --features hermes-cli/local
mkdir -p .hermes
addr="${HERMES_DEMO_LISTEN:-127.0.0.1:50551}"
log=.hermes/demo.log
http="${HERMES_DEMO_HTTP_LISTEN:-127.0.0.1:8551}"
# The example plan reads examples/data: the checkout is the agents' workspace here (by default
# it is .hermes/workspace, so a goal cannot touch the directory hermes up was started from).
./target/debug/hermes up --grpc-listen "$addr" --http-listen "$http" --workspace . >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
# Loading the embedded planner model takes a few seconds before the ready line.
for _ in $(seq 1 1200); do
  if grep -q "^hermes up: grpc" "$log"; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "hermes up failed to start; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
grep -q "^hermes up: grpc" "$log" || { echo "hermes up did not become ready; see $log" >&2; exit 1; }
echo "stack is up ($(grep '^hermes up: grpc' "$log")); submitting examples/plans/sales-report.yaml"
./target/debug/hermes submit --plan examples/plans/sales-report.yaml --watch --server "$addr"
echo
echo "The web console: run ./target/debug/hermes up and open http://127.0.0.1:8080/ (docs/console.md)."
