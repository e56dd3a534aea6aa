"""A Python worker wrapping a plain function: `text.word-count` joins the pool like any Rust tool.

    pip install ./sdk/python
    HERMES_NATS_URL=$(hermes nats-url) python examples/python/worker.py

(`hermes nats-url` prints the URL, with its password, of the nats-server that the `hermes up`
running on `.hermes` started; see docs/python.md.)
"""

import collections

import hermes_agents as hermes

worker = hermes.Worker(agent_id="py-words", pool="python", max_concurrency=8)


@worker.task("text.word-count", description="Counts the words of a text; returns {words, top}.")
def word_count(text: str, top: int = 3) -> dict:
    counts = collections.Counter(w.strip(".,;:!?").lower() for w in text.split())
    return {"words": sum(counts.values()), "top": [w for w, _ in counts.most_common(top)]}


if __name__ == "__main__":
    worker.run()
