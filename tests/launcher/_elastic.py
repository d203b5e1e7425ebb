"""Helpers for the elastic tests: an elastic job of ``tests/workers/elastic_steps.py`` run through
``appliance.launcher.launch`` in a thread, a discovery script whose hosts a test changes while
the job runs, and readers of the evidence the workers leave (see that worker's docstring).

``ElasticJob`` is a context manager: on exit it waits (bounded) for the launch and then kills
every worker process it recorded (``pid.W``), pass or fail; ``leftovers()`` lists those still
alive, which every test asserts to be none.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parents[1] / "workers" / "elastic_steps.py"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class ElasticJob:
    def __init__(self, out: Path, steps: int, commit: int = 1, step_s: float = 0.05, hosts: str | None = None):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.steps, self.commit, self.step_s = steps, commit, step_s
        self.script = self.out / "discover.sh"
        self.hosts_file = self.out / "hosts"
        if hosts is not None:
            self.set_hosts(hosts)
        self.script.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        self.script.chmod(0o755)
        self.result = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.started = time.monotonic()

    def command(self) -> list[str]:
        return [sys.executable, str(WORKER), str(self.out), str(self.steps), str(self.commit), str(self.step_s)]

    def set_hosts(self, text: str) -> None:
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text(text.replace(",", "\n") + "\n")
        os.replace(tmp, self.hosts_file)

    def switch(self, name: str, worker: int, step: int) -> None:
        (self.out / f"{name}.{worker}").write_text(str(step))

    def start(self, np: int, timeout: float = 90, **kw) -> "ElasticJob":
        from appliance.launcher import launch

        kw.setdefault("host_discovery_script", None if "hosts" in kw else str(self.script))
        if kw["host_discovery_script"] is None:
            del kw["host_discovery_script"]
        env = {"APPLIANCE_DISCOVERY_INTERVAL": "0.2", "APPLIANCE_STOP_GRACE": "1", "APPLIANCE_FAILURE_GRACE": "1",
               **kw.pop("env", {})}

        def run() -> None:
            try:
                self.result = launch(self.command(), np, env=env, timeout=timeout, **kw)
            except BaseException as e:  # noqa: BLE001 - the test reads it
                self.error = e

        self.started = time.monotonic()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def wait(self, limit: float = 120):
        assert self._thread is not None
        self._thread.join(limit)
        assert not self._thread.is_alive(), f"the launch did not end within {limit} s"
        if self.error is not None:
            raise self.error
        return self.result

    # -- evidence -------------------------------------------------------------------------------
    def _files(self, name: str) -> dict[int, str]:
        found = {}
        for p in self.out.glob(f"{name}.*"):
            suffix = p.name.rsplit(".", 1)[1]
            if suffix.isdigit():
                found[int(suffix)] = p.read_text()
        return found

    def done(self) -> dict[int, dict]:
        return {w: json.loads(t) for w, t in self._files("done").items()}

    def progress(self) -> dict[int, dict]:
        out = {}
        for w, t in self._files("step").items():
            try:
                out[w] = json.loads(t)
            except ValueError:
                pass
        return out

    def pids(self) -> dict[int, int]:
        return {w: int(t) for w, t in self._files("pid").items() if t.strip()}

    def wait_for(self, predicate, limit: float = 60.0, what: str = "") -> None:
        end = time.monotonic() + limit
        while not predicate():
            if self._thread is not None and not self._thread.is_alive():
                raise AssertionError(f"the job ended before {what}: {self.result and self.result.reason}")
            if time.monotonic() > end:
                raise AssertionError(f"not within {limit} s: {what}; progress {self.progress()}")
            time.sleep(0.05)

    def wait_size(self, size: int, step_after: int = 0, limit: float = 60.0) -> None:
        self.wait_for(lambda: any(p["size"] == size and p["step"] > step_after for p in self.progress().values()),
                      limit, f"a step at size {size}")

    def max_step(self) -> int:
        return max((p["step"] for p in self.progress().values()), default=0)

    def leftovers(self, limit: float = 5.0) -> list[int]:
        end = time.monotonic() + limit
        while True:
            left = [p for p in self.pids().values() if alive(p)]
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.05)

    def __enter__(self) -> "ElasticJob":
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._thread.join(60)
        for pid in self.pids().values():
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def listening_ports(pid: int | None = None) -> set[int]:
    """TCP ports a process (default: this one, the launcher of ``launch()``) listens on."""
    fd_dir = Path(f"/proc/{pid or os.getpid()}/fd")
    inodes = set()
    for fd in fd_dir.iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def check_consistent(done: dict[int, dict], steps: int) -> list[int]:
    """Every finished worker agrees on the state; ``w`` is exactly the sum of the sizes the
    committed steps ran at (no committed step lost or counted twice). Returns the sizes."""
    assert done, "no worker finished"
    first = next(iter(done.values()))
    for d in done.values():
        assert d["step"] == steps and d["sizes"] == first["sizes"] and d["w"] == first["w"], done
    assert len(first["sizes"]) == steps
    assert first["w"] == [float(sum(first["sizes"]))] * 4, first
    return first["sizes"]
