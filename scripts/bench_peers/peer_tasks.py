"""The Celery side of `make bench-peers`: one app, one trivial task.

`echo` is the peer's version of the bench's single-node goal: one tiny task that hands its input
back. The broker and the result backend are both the private Redis that scripts/bench-peers.sh
starts, named by BENCH_PEERS_REDIS_URL. Celery's defaults are kept (prefork pool, JSON, results
through Redis pub/sub), except that the worker does not wait for gossip at start (--without-mingle
on its command line), which only shortens the start.
"""

import os

from celery import Celery

REDIS_URL = os.environ["BENCH_PEERS_REDIS_URL"]

app = Celery("peer_tasks", broker=REDIS_URL, backend=REDIS_URL)
# Said outright, since Celery 5 warns when it is left unset; it is the default behaviour.
app.conf.broker_connection_retry_on_startup = True


@app.task(name="echo")
def echo(x):
    return x
