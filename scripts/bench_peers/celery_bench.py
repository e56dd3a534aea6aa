"""The Celery half of `make bench-peers`, in the shapes of the Hermes bench's floor and
single-node goal rows (crates/bench/src/main.rs):

* round trip, 1 in flight: `echo.apply_async((i,))` then `.get()`, one after the other, 50
  warm-up tasks first; p50 and p99 of the samples, in microseconds;
* throughput: `in_flight` tasks kept outstanding (a new one sent as each result comes back, seen
  through the Redis result backend's pub/sub) until `tasks` have completed; tasks per second from
  the first send to the last result.

BENCH_PEERS_SCALE=smoke measures 20 samples and 200 tasks with 50 in flight, as the Hermes bench's
smoke scale does; the default is 500 samples and 10,000 tasks with 1,000 in flight. It prints one
line: `PEER celery {"p50_us": ..., "p99_us": ..., "tasks_per_s": ..., "in_flight": ...,
"tasks": ...}`. The worker (2 prefork processes) and Redis are started by scripts/bench-peers.sh.
"""

import json
import math
import os
import sys
import time

from peer_tasks import app, echo

SCALES = {
    "full": {"samples": 500, "warmup": 50, "in_flight": 1000, "tasks": 10_000},
    "smoke": {"samples": 20, "warmup": 50, "in_flight": 50, "tasks": 200},
}
# No single result waits longer than this, nor the throughput run as a whole longer than
# THROUGHPUT_DEADLINE_S: a stuck worker fails the bench instead of hanging it.
GET_TIMEOUT_S = 30.0
THROUGHPUT_DEADLINE_S = 600.0


def percentile(samples, p):
    """The same index as the Rust bench's `percentile` (round half away from zero)."""
    ordered = sorted(samples)
    return ordered[math.floor((len(ordered) - 1) * p + 0.5)]


def wait_for_worker():
    """The first task's result, so that the worker is up before anything is timed."""
    deadline = time.monotonic() + 60
    while True:
        try:
            echo.apply_async((0,)).get(timeout=5)
            return
        except Exception as err:  # the worker is still starting
            if time.monotonic() > deadline:
                sys.exit(f"celery bench: no worker answered within 60 s ({err!r})")


def round_trip(samples, warmup):
    timed = []
    for i in range(warmup + samples):
        start = time.perf_counter()
        value = echo.apply_async((i,)).get(timeout=GET_TIMEOUT_S)
        elapsed = time.perf_counter() - start
        if value != i:
            sys.exit(f"celery bench: echo({i}) returned {value!r}")
        if i >= warmup:
            timed.append(elapsed * 1e6)
    return percentile(timed, 0.5), percentile(timed, 0.99)


def throughput(tasks, in_flight):
    consumer = app.backend.result_consumer
    done = 0
    failed = []

    def on_ready(result):
        nonlocal done
        done += 1
        if not result.successful():
            failed.append(result.id)

    sent = 0
    start = time.perf_counter()
    deadline = time.monotonic() + THROUGHPUT_DEADLINE_S
    while done < tasks:
        while sent - done < in_flight and sent < tasks:
            echo.apply_async((sent,)).then(on_ready)
            sent += 1
        # Reads one result message from the backend's pub/sub (or waits up to the timeout), and
        # runs `on_ready` for it.
        consumer.drain_events(timeout=0.1)
        if time.monotonic() > deadline:
            sys.exit(f"celery bench: {done} of {tasks} tasks done after {THROUGHPUT_DEADLINE_S} s")
    elapsed = time.perf_counter() - start
    if failed:
        sys.exit(f"celery bench: {len(failed)} tasks failed, the first {failed[0]}")
    return tasks / elapsed


def main():
    scale = SCALES["smoke" if os.environ.get("BENCH_PEERS_SCALE") == "smoke" else "full"]
    wait_for_worker()
    p50, p99 = round_trip(scale["samples"], scale["warmup"])
    tasks_per_s = throughput(scale["tasks"], scale["in_flight"])
    line = {
        "p50_us": round(p50, 1),
        "p99_us": round(p99, 1),
        "tasks_per_s": round(tasks_per_s, 1),
        "in_flight": scale["in_flight"],
        "tasks": scale["tasks"],
    }
    print("PEER celery " + json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
