"""Submits a plan mixing Rust and Python task types and prints its progress live: a Rust node
writes a sentence, the Python worker of examples/python/worker.py counts its words, and a Rust
node reports the count, with `$ref`s carrying the outputs through the Python node.

    python examples/python/client.py [--server 127.0.0.1:50051]
"""

import argparse
import os

import hermes_agents as hermes

parser = argparse.ArgumentParser()
parser.add_argument("--server", default=os.environ.get("HERMES_SERVER", "127.0.0.1:50051"))
parser.add_argument("--token", default=os.environ.get("HERMES_TOKEN"))
args = parser.parse_args()

plan = hermes.Plan(nodes=[
    hermes.Node("write", "text.template",
                {"template": "Hermes routes every step to the best agent for the step.", "values": {}}),
    hermes.Node("count", "text.word-count", {"text": {"$ref": "write.text"}, "top": 2}),
    hermes.Node("report", "text.template", {
        "template": "{{ n }} words; most common: {{ top }}",
        "values": {"n": {"$ref": "count.words"}, "top": {"$ref": "count.top"}},
    }),
], output_node="report")

with hermes.Client(args.server, token=args.token) as client:
    goal_id = client.submit(plan)
    print(f"submitted {goal_id}")
    for event in client.watch(goal_id):
        node = event.data.get("node_id", "")
        print(f"  {event.seq:>3} {event.kind:<18} {node}")
    goal = client.get(goal_id)
    print(f"{goal.status}: {goal.output}")
