"""The Python worker the tests run as a process of its own (so it can be killed): its agent id,
NATS URL, task types (`TASKS`, default all) and side-effect file come from the environment."""

import asyncio
import logging
import os
import pathlib

import hermes_agents as hermes

logging.basicConfig(level=logging.INFO)
worker = hermes.Worker(agent_id=os.environ["WORKER_ID"], pool="python", nats_url=os.environ["NATS_URL"],
                       max_concurrency=int(os.environ.get("MAX_CONCURRENCY", "4")), heartbeat_s=1.0, ack_wait_s=float(os.environ.get("ACK_WAIT_S", "30")))
TASKS = set(filter(None, os.environ.get("TASKS", "").split(",")))


def task(name, **options):
    """`worker.task`, for the task types this process was told to serve."""
    def register(fn):
        if not TASKS or name in TASKS:
            worker.task(name, **options)(fn)
        return fn
    return register


@task("py.double", description="Doubles a number; returns {value}.")
def double(value: float) -> dict:
    return {"value": value * 2}


@task("py.fail", retry_on=(ConnectionError,))
def fail(kind: str) -> dict:
    if kind == "transient":
        raise ConnectionError("the service is restarting")
    raise ValueError("no such order")


@task("py.ship", side_effects=True, timeout=60)
async def ship(order: str, ctx: hermes.TaskContext) -> dict:
    """Appends the order to the shipping log once, then takes its time."""
    log = pathlib.Path(os.environ["SHIP_LOG"])

    def append() -> int:
        with log.open("a") as f:
            f.write(f"{order} by {worker.agent_id}\n")
        return len(log.read_text().splitlines())

    line = await ctx.once("append", append)
    await asyncio.sleep(float(os.environ.get("SHIP_SLEEP_S", "0")))
    return {"order": order, "line": line, "agent": worker.agent_id}


@task("time.sleep", description="Waits ms milliseconds, then returns {slept_ms} (as the Rust tool).", timeout=70)
async def sleep(ms: int) -> dict:
    if ms > 60000:
        raise hermes.errors.InvalidArgument("ms must be at most 60000")
    await asyncio.sleep(ms / 1000)
    return {"slept_ms": ms}


@task("py.stamp", side_effects=True)
def stamp(order: str) -> dict:
    """One call with a side effect and no steps: claimed whole in the ledger."""
    log = pathlib.Path(os.environ["SHIP_LOG"])
    with log.open("a") as f:
        f.write(f"stamp {order}\n")
    return {"stamped": order}


@task("py.measure", description="Counts a text's lines and returns it twice; returns {lines, chars, twice}.")
def measure(text: str) -> dict:
    return {"lines": len(text.splitlines()), "chars": len(text), "twice": text + text}


@task("test.abort", description="Test only: aborts the worker process, as a fault in a native extension would.")
def abort() -> dict:
    os.abort()


@task("py.shape", output_schema={"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}})
def shape(total) -> dict:
    return {"total": total}


@task("py.nap", timeout=60)
@task("py.hup-nap", timeout=60)
@task("py.drain-nap", timeout=60)
async def nap(ms: int) -> dict:
    await asyncio.sleep(ms / 1000)
    return {"slept_ms": ms}




@task("py.work", description="Works 50 ms, or as the file BEHAVIOUR_FILE says: `slow` (800 ms), `fail` "
      "(fails at once with the worker's own INTERNAL error).")
async def work(n: int) -> dict:
    behaviour = pathlib.Path(os.environ["BEHAVIOUR_FILE"]).read_text().strip()
    if behaviour == "fail":
        raise hermes.errors.HermesError("the worker is broken", code="INTERNAL")
    await asyncio.sleep(0.8 if behaviour == "slow" else 0.05)
    return {"n": n, "agent": worker.agent_id}


if __name__ == "__main__":
    worker.run()
