"""A plain-requests style HTTP tool wrapped as a worker: `web.status` fetches a URL with the
standard library and reports its status. It reaches the network, so a transient failure is
declared retryable: the dispatcher tries the node again under its retry policy.

    HERMES_NATS_URL=$(hermes nats-url) python examples/python/http_tool.py
"""

import urllib.error
import urllib.request

import hermes_agents as hermes

worker = hermes.Worker(agent_id="py-web", pool="python")


@worker.task("web.status", description="Fetches a URL; returns {url, status, bytes}.", timeout=20,
             retry_on=(urllib.error.URLError, TimeoutError))
def status(url: str) -> dict:
    if not url.startswith(("http://", "https://")):
        raise hermes.errors.InvalidArgument(f"`{url}` is not an http(s) URL")
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
    return {"url": url, "status": response.status, "bytes": len(body)}


if __name__ == "__main__":
    worker.run()
