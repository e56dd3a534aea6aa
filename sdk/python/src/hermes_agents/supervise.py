"""The crash supervisor, as the Rust executor's (`hermes_executor::supervise`): `Worker.run()`
re-runs the program as its own child and waits for it, so that it can tell a crash from a kill.

A task can crash the process that runs it: a fault in a native extension, an abort, the
kernel's OOM killer. Redelivered, it would crash the next process too, until MaxDeliver. Only the
parent of a process sees why it died, so:

- the child exits on its own (a normal exit, a drain after SIGTERM, which the supervisor
  forwards, as it forwards SIGINT and SIGHUP): the supervisor exits with its code;
- the child dies of SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS or SIGKILL (the OOM killer):
  the supervisor starts a new child and hands it the tasks the crashed one had in flight. The new
  child counts a crash on each (the crash markers in `hermes_ledger`, shared with the Rust
  executor), and a task counted twice is quarantined to the DLQ.

The supervisor knows which tasks its child runs without any write to the bus, as the Rust
supervisor does: the child tells it on a pipe it inherits (`HERMES_SUPERVISOR_TASKS_FD`), one line
when a task starts (`+<crash marker key>`, then the task's memory token after a space for a worker
on its own NATS identity, which reaches the ledger only with it) and the same line with `-` when it
ends. When the child crashes, the supervisor hands the lines still in flight to the next child in
a memory file (`HERMES_CRASHED_TASKS_FD`).

The child is started through `setpriv --pdeathsig KILL` where it exists, so it dies with the
supervisor: a `kill -9` of the supervisor takes both down and counts as nothing.
`HERMES_NO_SUPERVISOR=1` runs unsupervised (crashes are then not counted, and the process
manager's restart applies).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

SUPERVISED_ENV = "HERMES_SUPERVISED"
NO_SUPERVISOR_ENV = "HERMES_NO_SUPERVISOR"
#: The child's end of the pipe on which it tells the supervisor which tasks it runs.
TASKS_FD_ENV = "HERMES_SUPERVISOR_TASKS_FD"
#: A memory file holding the tasks the previous child had in flight when it crashed, one a line.
CRASHED_TASKS_FD_ENV = "HERMES_CRASHED_TASKS_FD"
#: A line longer than this might not be written whole beside another task's.
_PIPE_BUF = 4096
#: The signals a crash dies of: SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGKILL, SIGSEGV, SIGSYS.
CRASH_SIGNALS = frozenset({4, 6, 7, 8, 9, 11, 31})

_PIPE: object = None


def _tasks_pipe():
    """The pipe to the supervisor, in a supervised child: taken from the environment once, and
    not inherited by the processes a task starts."""
    global _PIPE
    if _PIPE is None:
        _PIPE = False
        fd = os.environ.get(TASKS_FD_ENV, "")
        if fd.isdigit():
            try:
                os.set_inheritable(int(fd), False)
                _PIPE = os.fdopen(int(fd), "w", buffering=1)
            except OSError:
                _PIPE = False
    return _PIPE or None


def _tell(line: str) -> bool:
    pipe = _tasks_pipe()
    if pipe is None or "\n" in line or len(line.encode()) + 1 > _PIPE_BUF:
        return False
    try:
        pipe.write(line + "\n")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def running(told: str):
    """Tells the supervisor a task runs here while the block runs: `told` is its crash marker's
    key, and its memory token after a space where the ledger is reached through memory."""
    said = _tell("+" + told)
    try:
        yield
    finally:
        if said:
            _tell("-" + told)


def crashed_tasks() -> list[str]:
    """What the supervisor told this process the crashed one before it had in flight (each a crash
    marker's key, with the task's memory token after a space where there is one); read once."""
    fd = os.environ.pop(CRASHED_TASKS_FD_ENV, "")
    if not fd.isdigit():
        return []
    try:
        with os.fdopen(int(fd), "r") as told:
            return [line for line in told.read().splitlines() if line]
    except OSError:
        return []


def _follow(pipe_r: int, in_flight: dict[str, int]) -> None:
    """Keeps `in_flight` (what the child said, in the order it started) until the pipe ends."""
    started = 0
    with os.fdopen(pipe_r, "r", errors="replace") as pipe:
        for line in pipe:
            line = line.rstrip("\n")
            if line.startswith("+"):
                started += 1
                in_flight[line[1:]] = started
            elif line.startswith("-"):
                in_flight.pop(line[1:], None)


def _handover(told: list[str]) -> int | None:
    """A memory file holding `told`, one a line, positioned at its start, for the next child."""
    if not told:
        return None
    fd = os.memfd_create("hermes-crashed-tasks", 0)
    os.write(fd, "".join(t + "\n" for t in told).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def should_supervise() -> bool:
    """Whether this process is to become a supervisor: not the supervised child, supervision not
    turned off, and a command line it can run again."""
    return (SUPERVISED_ENV not in os.environ and os.environ.get(NO_SUPERVISOR_ENV) != "1"
            and bool(getattr(sys, "orig_argv", None)))


def _die_with_parent() -> None:
    """Without `setpriv`: the same `prctl(PR_SET_PDEATHSIG, SIGKILL)`, in the forked child."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def supervise(name: str) -> int:
    """Runs this program again as a supervised child until it exits on its own; returns its exit
    code. Crashed children are replaced, with a backoff from 0.2 s doubling to 10 s."""
    argv = list(sys.orig_argv)
    argv[0] = sys.executable
    setpriv = shutil.which("setpriv")
    if setpriv:
        argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
    preexec = None if setpriv else _die_with_parent
    crashed: list[str] = []
    backoff = 0.2
    child: subprocess.Popen | None = None

    def forward(sig, _frame):
        if child is not None and child.poll() is None:
            child.send_signal(sig)

    # SIGHUP too: its default would end the supervisor, and the child with it (pdeathsig), where
    # it is meant to make the child read its TLS files again.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        pipe_r, pipe_w = os.pipe()
        handover = _handover(crashed)
        env = dict(os.environ, **{SUPERVISED_ENV: "1", TASKS_FD_ENV: str(pipe_w)})
        env.pop(CRASHED_TASKS_FD_ENV, None)
        if handover is not None:
            env[CRASHED_TASKS_FD_ENV] = str(handover)
        passed = (pipe_w,) if handover is None else (pipe_w, handover)
        try:
            child = subprocess.Popen(argv, env=env, preexec_fn=preexec, pass_fds=passed)
        except OSError as e:
            print(f"{name}: cannot start its worker process: {e}", file=sys.stderr)
            return 2
        finally:
            # Only the child writes: the pipe ends when it does.
            for fd in passed:
                os.close(fd)
        in_flight: dict[str, int] = {}
        follower = threading.Thread(target=_follow, args=(pipe_r, in_flight), daemon=True)
        follower.start()
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
        # What the child wrote before it died is in the pipe: read to its end.
        follower.join(timeout=10)
        if -code in CRASH_SIGNALS:
            crashed = sorted(in_flight, key=in_flight.get)
            print(f"{name}: the worker process crashed (signal {-code}) with {len(crashed)} task(s) in flight; "
                  "starting a new one; each of those tasks counts one crash", file=sys.stderr, flush=True)
            time.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
            continue
        # As the Rust supervisor: a child killed by any other signal exits 1.
        return code if code >= 0 else 1
