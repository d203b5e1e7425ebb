"""Worker processes: the interface of a started rank, one local worker, and the group that
always stops them.

What it owns:
- ``Worker``: the interface every started rank offers (local or SSH): ``wait()``,
  ``signal(sig)`` to its whole process group, ``group_alive()``, ``drain(timeout)``, and
  ``fault``, the rank's fault report (one JSON object, written by the runtime to
  ``APPLIANCE_FAULT_FILE`` when it fails the job; ``None`` when there is none).
- ``LocalWorker``: a subprocess started from an argv list in its own session, stdin closed, its
  stdout and stderr relayed to the ``output.OutputSink`` line by line (``output.relay``); its
  ``fault`` is read from its ``APPLIANCE_FAULT_FILE`` once it has exited.
- ``WorkerGroup``: a context manager over started workers. It reports exits in the order they
  happen and on exit always stops everything it holds: SIGTERM then SIGCONT (a stopped rank
  handles it at once) to every process group (including groups whose leader already exited, for
  stray grandchildren), a grace period, then
  SIGKILL, then it waits, every wait bounded. Given a ``reaper.Reaper``, it registers every
  local rank's process group there (and unregisters it once gone), so the ranks also die when
  the launcher itself is killed.

Env vars: none read here (the grace period comes from ``LaunchConfig.stop_grace_s``).
Failure modes: a command that cannot be executed raises ``SpawnError`` naming rank and command;
signalling a vanished group is not an error; nothing here blocks without a bound.
"""
from __future__ import annotations

import functools
import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Mapping, Protocol, Sequence

from . import binding
from .output import OutputSink, relay
from .reaper import Reaper, pgid_alive

class SpawnError(RuntimeError):
    """A worker could not be started; carries the rank and host."""

    def __init__(self, rank: int, host: str, message: str, returncode: int = 127):
        super().__init__(message)
        self.rank, self.host, self.returncode = rank, host, returncode


class Worker(Protocol):
    """A started rank, wherever it runs."""

    rank: int
    host: str
    pid: int

    def wait(self) -> int:
        """Block until the rank's process exits; its return code (negative: killed by that signal)."""

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the rank's whole process group; no error if it is gone."""

    def group_alive(self) -> bool:
        """Whether any process of the rank's group is still running (zombies do not count)."""

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the rank's output to be relayed completely."""

    @property
    def fault(self) -> dict | None:
        """The rank's fault report (the ``APPLIANCE_FAULT_FILE`` contract) once it exited, else None."""


def read_json(path: str) -> dict | None:
    """The JSON object in ``path``, or None when absent, unreadable or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_fault(path: str | None) -> dict | None:
    """The fault report at ``path`` (one JSON object), or None when absent or unreadable."""
    return read_json(path) if path else None


class LocalWorker:
    """A rank on this machine: a subprocess in its own session with relayed output."""

    def __init__(self, rank: int, host: str, argv: Sequence[str], env: Mapping[str, str],
                 cwd: str | None, sink: OutputSink):
        self.rank, self.host = rank, host
        sink.open_rank(rank)
        try:
            with binding.bound(env):
                self._proc = subprocess.Popen(
                    list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except FileNotFoundError:
            raise SpawnError(rank, host, f"command not found: {argv[0]!r}", 127) from None
        except PermissionError:
            raise SpawnError(rank, host, f"command not executable: {argv[0]!r}", 126) from None
        except OSError as e:
            raise SpawnError(rank, host, f"cannot start {argv[0]!r}: {e.strerror}", 126) from None
        self.pid = self._proc.pid  # == its process group id (own session)
        self._fault_file = env.get("APPLIANCE_FAULT_FILE") or None
        self._fault: dict | None = None
        self._relays = [
            threading.Thread(target=relay, args=(pipe, functools.partial(sink.line, rank, name)),
                             name=f"relay-{rank}-{name}", daemon=True)
            for pipe, name in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr"))
        ]
        try:
            for t in self._relays:
                t.start()
        except RuntimeError as e:  # "can't start new thread": out of threads or address space
            self.signal(signal.SIGKILL)
            self._proc.wait()
            raise SpawnError(rank, host, f"cannot start a thread to relay its output ({e}): the launcher "
                                         "is out of threads or memory (ulimit -u / -v)", 126) from None

    def wait(self) -> int:
        return self._proc.wait()

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        return self._proc.poll() is None or pgid_alive(self.pid)

    @property
    def fault(self) -> dict | None:
        if self._fault is None and self._proc.poll() is not None:
            self._fault = read_fault(self._fault_file)
        return self._fault

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._relays:
            t.join(max(0.0, deadline - time.monotonic()))


class WorkerGroup:
    """The started ranks of one job; ``with WorkerGroup(grace) as g:`` stops them all on exit."""

    def __init__(self, grace_s: float = 3.0, kill_wait_s: float = 5.0, reaper: Reaper | None = None):
        self.grace_s, self.kill_wait_s = grace_s, kill_wait_s
        self.workers: list[Worker] = []
        self.returncodes: dict[int, int] = {}  # rank -> return code, for ranks that exited
        self._exits: queue.Queue[tuple[Worker, int]] = queue.Queue()
        self._stopped = False
        self.reaper = reaper  # settable until the first add()
        self._watched: set[int] = set()  # process groups of local ranks the reaper still guards

    def add(self, worker: Worker) -> None:
        if self.reaper is not None and isinstance(worker, LocalWorker):
            self.reaper.watch(worker.pid)
            self._watched.add(worker.pid)
        try:
            threading.Thread(target=self._wait, args=(worker,), name=f"wait-{worker.rank}", daemon=True).start()
        except RuntimeError as e:  # "can't start new thread": the rank would run unwatched, so stop it now
            worker.signal(signal.SIGKILL)
            raise SpawnError(worker.rank, worker.host, f"cannot start a thread to wait for it ({e}): the launcher "
                                                       "is out of threads or memory (ulimit -u / -v)", 126) from None
        self.workers.append(worker)

    def _forget_gone(self, workers: Sequence[Worker]) -> None:
        for w in workers:
            if w.pid in self._watched and isinstance(w, LocalWorker) and not w.group_alive():
                self._watched.discard(w.pid)
                if self.reaper is not None:
                    self.reaper.forget(w.pid)

    def _wait(self, worker: Worker) -> None:
        try:
            code = worker.wait()
        except Exception:  # noqa: BLE001 - a lost connection counts as a failed rank
            code = 255
        self._exits.put((worker, code))

    def next_exit(self, timeout: float) -> tuple[Worker, int] | None:
        """The next rank to exit and its code, or None after ``timeout`` seconds."""
        try:
            worker, code = self._exits.get(timeout=timeout)
        except queue.Empty:
            return None
        self.returncodes[worker.rank] = code
        self._forget_gone([worker])
        return worker, code

    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.rank not in self.returncodes]

    def terminate(self, workers: Sequence[Worker]) -> None:
        """SIGTERM (and SIGCONT) to these workers' process groups; ``reap(workers)`` or ``stop``
        follow up with SIGKILL. Their exits are reported by ``next_exit`` as any other."""
        for w in workers:
            w.signal(signal.SIGTERM)
            w.signal(signal.SIGCONT)

    def _collect(self, deadline: float) -> None:
        while len(self.returncodes) < len(self.workers) and time.monotonic() < deadline:
            self.next_exit(min(0.05, max(0.0, deadline - time.monotonic())))

    def stop(self) -> None:
        """TERM (and CONT, so a stopped rank acts on it now rather than at the KILL) every group, wait
        up to the grace period, KILL what is left, wait (bounded)."""
        if self._stopped:
            return
        self._stopped = True
        for w in self.workers:
            w.signal(signal.SIGTERM)
            w.signal(signal.SIGCONT)
        deadline = time.monotonic() + self.grace_s
        while True:
            self._collect(min(deadline, time.monotonic() + 0.05))
            if len(self.returncodes) == len(self.workers) and not any(w.group_alive() for w in self.workers):
                break
            if time.monotonic() >= deadline:
                break
            if len(self.returncodes) == len(self.workers):
                time.sleep(0.05)  # only stray group members left: poll them gently
        for w in self.workers:
            if w.group_alive():
                w.signal(signal.SIGKILL)
        self._collect(time.monotonic() + self.kill_wait_s)
        deadline = time.monotonic() + 2.0
        for w in self.workers:
            w.drain(max(0.0, deadline - time.monotonic()))
        self._forget_gone(self.workers)

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
