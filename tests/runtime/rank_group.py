"""Helper for the runtime fault tests: N real ranks started directly (no launcher), so a test
can stop, kill or hammer one of them and watch what every other rank does.

``RankGroup`` is a context manager. It gives every rank the contract environment the launcher
would (HOROVOD_RANK/SIZE, APPLIANCE_STORE_ADDR on 127.0.0.1, APPLIANCE_JOB_SECRET,
APPLIANCE_DATA_ADDR, APPLIANCE_FAULT_FILE) plus the test's extra variables, runs
``tests/ranks/fault_worker.py CASE ARGS...`` (or ``worker``) in its own session with stderr in a file, and
on exit kills every process group it started (continuing stopped ones first), pass or fail.
``wait()`` bounds the time; ``report(r)``, ``fault(r)`` and ``stderr(r)`` read what rank r left;
``listening(r)`` lists the addresses rank r's process listens on.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fixtures import RANKS, ROOT

WORKER = RANKS / "fault_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankGroup:
    def __init__(self, np: int, case: str, *args, out: Path, env: dict | None = None, addr: str = "127.0.0.1",
                 only: list | None = None, worker: Path = WORKER):
        self.np, self.out = np, Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store_port = free_port()
        self.addr = addr
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_"))}
        base.update(PYTHONPATH=str(ROOT), APPLIANCE_TEST_OUT=str(self.out), HOROVOD_SIZE=str(np),
                    APPLIANCE_STORE_ADDR=f"{addr}:{self.store_port}", APPLIANCE_JOB_SECRET=secrets.token_hex(16),
                    APPLIANCE_JOB_ID=f"test-{self.store_port}", APPLIANCE_DATA_ADDR=addr,
                    HOROVOD_START_TIMEOUT="30")
        base.update(env or {})
        self.procs: list[subprocess.Popen] = []
        self._errs = []
        for r in range(np) if only is None else only:  # `only`: start just these ranks (the rest never come)
            e = dict(base, HOROVOD_RANK=str(r), APPLIANCE_FAULT_FILE=str(self.out / f"fault{r}.json"))
            err = open(self.out / f"stderr{r}.txt", "w")
            self._errs.append(err)
            self.procs.append(subprocess.Popen([sys.executable, str(worker), case, *map(str, args)], env=e,
                                               stdout=subprocess.DEVNULL, stderr=err, start_new_session=True))

    def __enter__(self) -> "RankGroup":
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for f in self._errs:
            f.close()

    def wait(self, timeout: float) -> list:
        """Exit codes of every rank (None for one still running after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.poll() for p in self.procs]

    def wait_for_file(self, name: str, timeout: float, count: int = 1) -> None:
        """Until ``count`` files matching ``name`` (a glob in the output dir) exist."""
        deadline = time.monotonic() + timeout
        while len(list(self.out.glob(name))) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {name} after {timeout} s:\n" + self.all_stderr())
            if any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError(f"a rank exited early: {[p.poll() for p in self.procs]}\n" + self.all_stderr())
            time.sleep(0.02)

    def touch(self, name: str) -> None:
        (self.out / name).write_text("1")

    def _json(self, name: str):
        path = self.out / name
        return json.loads(path.read_text()) if path.exists() else None

    def report(self, rank: int):
        return self._json(f"rank{rank}.json")

    def fault(self, rank: int):
        return self._json(f"fault{rank}.json")

    def stderr(self, rank: int) -> str:
        self._errs[rank].flush()
        return (self.out / f"stderr{rank}.txt").read_text(errors="replace")

    def listening(self, index: int) -> list:
        """(address, port) of every TCP socket in LISTEN state that process ``index`` holds."""
        inodes = set()
        fd_dir = Path(f"/proc/{self.procs[index].pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        out = []
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                addr, port = f[1].split(":")
                out.append((socket.inet_ntoa(bytes.fromhex(addr)[::-1]), int(port, 16)))
        return sorted(out)

    def all_stderr(self) -> str:
        return "\n".join(f"--- rank {r} ---\n{self.stderr(r)[-3000:]}" for r in range(len(self._errs)))
