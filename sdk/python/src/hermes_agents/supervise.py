"""The crash supervisor, as the Rust executor's (`hermes_executor::supervise`): `Worker.run()`
re-runs the program as its own child and waits for it, so that it can tell a crash from a kill.

A task can crash the process that runs it: a fault in a native extension, an abort, the
kernel's OOM killer. Redelivered, it would crash the next process too, until MaxDeliver. Only the
parent of a process sees why it died, so:

- the child exits on its own (a normal exit, a drain after SIGTERM, which the supervisor
  forwards): the supervisor exits with its code;
- the child dies of SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS or SIGKILL (the OOM killer):
  the supervisor starts a new child and tells it which process instance crashed
  (`HERMES_CRASHED_INSTANCE`). The new child counts a crash on every task that instance had in
  flight (the crash markers in `hermes_ledger`, shared with the Rust executor), and a task
  counted twice is quarantined to the DLQ.

The child is started through `setpriv --pdeathsig KILL` where it exists, so it dies with the
supervisor: a `kill -9` of the supervisor takes both down and counts as nothing.
`HERMES_NO_SUPERVISOR=1` runs unsupervised (crashes are then not counted, and the process
manager's restart applies).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

SUPERVISED_ENV = "HERMES_SUPERVISED"
INSTANCE_ENV = "HERMES_PROCESS_INSTANCE"
CRASHED_ENV = "HERMES_CRASHED_INSTANCE"
NO_SUPERVISOR_ENV = "HERMES_NO_SUPERVISOR"
#: The signals a crash dies of: SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGKILL, SIGSEGV, SIGSYS.
CRASH_SIGNALS = frozenset({4, 6, 7, 8, 9, 11, 31})

_INSTANCE: str | None = None


def process_instance() -> str:
    """This process's instance id: the supervisor's choice, or a fresh one when unsupervised."""
    global _INSTANCE
    if _INSTANCE is None:
        _INSTANCE = os.environ.get(INSTANCE_ENV) or uuid.uuid4().hex
    return _INSTANCE


def crashed_instance() -> str | None:
    """The instance that crashed just before this process started, if the supervisor said so."""
    return os.environ.get(CRASHED_ENV) or None


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
    crashed: str | None = None
    backoff = 0.2
    child: subprocess.Popen | None = None

    def forward(sig, _frame):
        if child is not None and child.poll() is None:
            child.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        env = dict(os.environ, **{SUPERVISED_ENV: "1", INSTANCE_ENV: uuid.uuid4().hex})
        env.pop(CRASHED_ENV, None)
        if crashed:
            env[CRASHED_ENV] = crashed
        try:
            child = subprocess.Popen(argv, env=env, preexec_fn=preexec)
        except OSError as e:
            print(f"{name}: cannot start its worker process: {e}", file=sys.stderr)
            return 2
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
        if -code in CRASH_SIGNALS:
            print(f"{name}: the worker process crashed (signal {-code}); starting a new one; the tasks it was "
                  "running count one crash each", file=sys.stderr, flush=True)
            crashed = env[INSTANCE_ENV]
            time.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
            continue
        # As the Rust supervisor: a child killed by any other signal exits 1.
        return code if code >= 0 else 1
