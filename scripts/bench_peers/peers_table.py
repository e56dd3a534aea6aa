"""Prints the table of `make bench-peers` from the two `PEER` lines of one run:

    peers_table.py HERMES_OUTPUT CELERY_OUTPUT FOOTER

HERMES_OUTPUT is everything the Hermes bench printed with HERMES_BENCH_ROWS=peers, among which
one line `PEER hermes {...floor_*, hermes_*, in_flight, tasks}`; CELERY_OUTPUT holds the line
`PEER celery {...}` of celery_bench.py. Each ratio is the first column's value over the second's:
for the round trips below 1 is faster, for tasks/s above 1 is faster.
"""

import json
import sys


def peer_line(path, name):
    prefix = f"PEER {name} "
    with open(path, encoding="utf-8", errors="replace") as f:
        found = [line[len(prefix):] for line in f if line.startswith(prefix)]
    if len(found) != 1:
        sys.exit(f"bench-peers: expected one `{prefix.strip()}` line in {path}, found {len(found)}")
    return json.loads(found[0])


def ratio(r):
    return f"{r:.1f}" if r >= 10 else f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"


def main():
    hermes_path, celery_path, footer = sys.argv[1:4]
    h = peer_line(hermes_path, "hermes")
    c = peer_line(celery_path, "celery")
    if (h["in_flight"], h["tasks"]) != (c["in_flight"], c["tasks"]):
        sys.exit(
            f"bench-peers: Hermes ran {h['tasks']} tasks with {h['in_flight']} in flight, Celery "
            f"{c['tasks']} with {c['in_flight']}: the scales differ"
        )
    rows = [
        ("task round trip p50 (µs), 1 in flight", h["floor_p50_us"], h["hermes_p50_us"], c["p50_us"]),
        ("task round trip p99 (µs), 1 in flight", h["floor_p99_us"], h["hermes_p99_us"], c["p99_us"]),
        (f"tasks/s, {h['in_flight']} in flight", h["floor_tasks_per_s"], h["hermes_tasks_per_s"], c["tasks_per_s"]),
    ]
    head = ("measure", "floor", "Hermes", "Celery", "Hermes/floor", "Celery/floor", "Hermes/Celery")
    print(f"{head[0]:<40} {head[1]:>10} {head[2]:>10} {head[3]:>10} {head[4]:>13} {head[5]:>13} {head[6]:>14}")
    print("-" * 116)
    for name, floor, hermes, celery in rows:
        print(
            f"{name:<40} {floor:>10.0f} {hermes:>10.0f} {celery:>10.0f} "
            f"{ratio(hermes / floor):>13} {ratio(celery / floor):>13} {ratio(hermes / celery):>14}"
        )
    print()
    print(footer)
    print(
        "Ratios are the first column's value over the second's: for a round trip below 1 is faster, "
        f"for tasks/s above 1 is faster. {h['tasks']} tasks in the throughput row."
    )


if __name__ == "__main__":
    main()
