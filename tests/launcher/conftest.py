"""Fixtures for launcher tests: worker scripts that leave evidence in files, and cleanup.

Workers are ``python -c`` scripts (no dependency on the collective runtime). Every worker
records its pid in ``OUT/pid.<rank>``; the ``job`` fixture kills every recorded process group
and every launcher it started when the test ends, whatever happened.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

PREAMBLE = r'''
import json, os, signal, subprocess, sys, time
OUT = sys.argv[1]
RANK = int(os.environ["HOROVOD_RANK"])
SIZE = int(os.environ["HOROVOD_SIZE"])
def mark(name, data=""):
    tmp = os.path.join(OUT, ".%s.%d.tmp" % (name, RANK))
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, os.path.join(OUT, "%s.%d" % (name, RANK)))
def wait_for(*names, limit=30.0):
    end = time.time() + limit
    while not all(os.path.exists(os.path.join(OUT, n)) for n in names):
        if time.time() > end:
            sys.exit(99)
        time.sleep(0.02)
def grandchild():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mark("grandchild", str(p.pid))
    return p
mark("pid", str(os.getpid()))
'''


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class Job:
    def __init__(self, out):
        self.out = str(out)
        self.launchers: list[subprocess.Popen] = []

    def argv(self, body: str) -> list[str]:
        return [sys.executable, "-c", PREAMBLE + body, self.out]

    def read(self, name: str, rank: int) -> str:
        with open(os.path.join(self.out, f"{name}.{rank}")) as f:
            return f.read()

    def env(self, rank: int) -> dict:
        return json.loads(self.read("env", rank))

    def files(self, name: str) -> dict[int, str]:
        found = {}
        for entry in os.listdir(self.out):
            base, _, rank = entry.rpartition(".")
            if base == name and rank.isdigit():
                found[int(rank)] = self.read(name, int(rank))
        return found

    def pids(self) -> list[int]:
        return [int(v) for name in ("pid", "grandchild") for v in self.files(name).values()]

    def wait_files(self, name: str, count: int, limit: float = 20.0) -> dict[int, str]:
        end = time.monotonic() + limit
        while True:
            found = self.files(name)
            if len(found) >= count:
                return found
            for p in self.launchers:
                if p.poll() is not None:
                    raise AssertionError(f"launcher exited {p.returncode} before {count} {name} files: "
                                         f"{p.stderr.read().decode(errors='replace') if p.stderr else ''}")
            if time.monotonic() > end:
                raise AssertionError(f"only {sorted(found)} of {count} {name} files after {limit} s")
            time.sleep(0.05)

    def cli(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        """``python -m appliance launch ARGS`` in its own session, output piped."""
        p = subprocess.Popen([sys.executable, "-m", "appliance", "launch", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True,
                             env=None if env is None else {**os.environ, **env})
        self.launchers.append(p)
        return p

    alive = staticmethod(lambda pid: alive(pid))
    wait_dead = staticmethod(lambda pids, limit=5.0: wait_dead(pids, limit))

    def cleanup(self) -> None:
        for p in self.launchers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            try:
                p.communicate(timeout=5)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        for pid in self.pids():
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def wait_dead(pids, limit: float = 5.0) -> list[int]:
    """Pids still alive after ``limit`` seconds (empty when all are gone)."""
    end = time.monotonic() + limit
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


@pytest.fixture
def job(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    j = Job(out)
    try:
        yield j
    finally:
        j.cleanup()
