"""Helpers for the bootstrap tests: real worker processes that run a snippet against the
``_core_testing`` hooks and report one JSON line.

``Workers`` is a context manager: it starts each worker with ``python -c`` in its own session
(argument dict as JSON in argv[1]), and on exit kills every process group it started, whether
the test passed or not. ``collect()`` waits for all of them within a bound and returns
per-worker results (exit code, decoded JSON result or None, stderr text). A worker snippet
calls ``report(obj)`` to hand its result back; an exception becomes
``{"error": str, "code": ..., "origin_rank": ...}`` so tests can assert on the failure.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

PRELUDE = r"""
import json, sys, time
from appliance.runtime import _core_testing as T
ARGS = json.loads(sys.argv[1])
def report(obj):
    sys.stdout.write("RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()
def run(fn):
    try:
        report(fn())
    except T.BootstrapError as e:
        report({"error": str(e), "code": e.code, "origin_rank": e.origin_rank, "text": e.text})
"""


@dataclass
class WorkerResult:
    rc: int | None
    result: dict | None
    stderr: str
    stdout: str


class Workers:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, body: str, args: dict, env: dict | None = None) -> subprocess.Popen:
        full_env = dict(os.environ)
        full_env.update(env or {})
        p = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + body, json.dumps(args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=full_env, start_new_session=True,
        )
        self.procs.append(p)
        return p

    def collect(self, timeout: float, procs: list[subprocess.Popen] | None = None) -> list[WorkerResult]:
        deadline = time.monotonic() + timeout
        out = []
        for p in procs if procs is not None else self.procs:
            try:
                so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(p)
                so, se = p.communicate()
                raise AssertionError(f"worker {p.args[-1]} did not finish within {timeout} s; stderr:\n{se}")
            result = None
            for line in so.splitlines():
                if line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
            out.append(WorkerResult(p.returncode, result, se, so))
        return out

    @staticmethod
    def _kill(p: subprocess.Popen) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            self._kill(p)
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
