"""The shared mount's layout: one directory, mounted at the same path on every host.

What it owns: the names under the shared directory and the helpers that create and use them::

    SHARED/ssh/              the cluster's SSH keys (``appliance keys``; secondaries read them)
    SHARED/data/             datasets, read by every host
    SHARED/models/<run>/     checkpoints of one training run; rank 0 writes them, atomically
    SHARED/locks/            run-<run>.lock (the job lock of a run), host-<name>@<hostname>.lock
                             (per-host locks: the file name carries the host name)
    SHARED/jobs/<id>/        one launch by ``appliance primary``: job.json, hosts/<host>.json
                             (reachable, authenticated), ranks/<rank>.json (host, pid: written as
                             each rank starts), logs/rank.N/{stdout,stderr}, exit.json

``Layout(root)`` names the paths; ``run_lock()`` guards ``models/<run>`` (a second job on the same
run fails with ``LockHeld`` naming the first job's host, pid and start time; a dead holder is
detected and its lock taken over); ``host_lock()`` is a lock per host; ``save_atomically()``
writes a file so readers see the old or the new content, never a torn one.

Env vars: none read here (``APPLIANCE_SHARED`` is read in ``appliance/config.py``; rank
processes find their job directory in ``APPLIANCE_JOB_DIR_SHARED``, set by the primary).
Failure modes: ``ValueError`` for run or host names that are not plain file names; ``LockHeld``;
``OSError`` from the file system.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from typing import Any, Callable, Iterator, Optional

from .locks import FileLock, LockHeld

SUBDIRS = ("ssh", "data", "models", "locks", "jobs")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    if not _NAME.match(name or ""):
        raise ValueError(f"{kind} {name!r}: use letters, digits, '.', '_' and '-' (not starting with '.' or '-')")
    return name


class Layout:
    """Paths under one shared directory."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.path.abspath(os.fspath(root))

    def __repr__(self) -> str:
        return f"Layout({self.root!r})"

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def ssh(self) -> str:
        return self.path("ssh")

    @property
    def jobs(self) -> str:
        return self.path("jobs")

    def run_dir(self, run: str) -> str:
        return self.path("models", check_name("run", run))

    def job_dir(self, job_id: str) -> str:
        return self.path("jobs", check_name("job id", job_id))

    def run_lock_path(self, run: str) -> str:
        return self.path("locks", f"run-{check_name('run', run)}.lock")

    def host_lock_path(self, name: str, host: Optional[str] = None) -> str:
        host = host or socket.gethostname()
        return self.path("locks", f"host-{check_name('lock', name)}@{check_name('host', host)}.lock")

    def ensure(self) -> "Layout":
        """Create the standard subdirectories (the root must exist: it is the mount)."""
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"shared directory {self.root} does not exist")
        for d in SUBDIRS:
            os.makedirs(self.path(d), exist_ok=True)
        return self


def save_atomically(write: Callable[[Any], None], path: str, mode: str = "wb") -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, fsync it, rename it over ``path``,
    then fsync the directory: a reader (or a crash) sees the old or the new file, never a torn one."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{socket.gethostname()}.{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str, data: Any) -> None:
    save_atomically(lambda f: f.write(json.dumps(data, indent=1, sort_keys=True) + "\n"), path, "w")


def read_json(path: str) -> Optional[Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


@contextlib.contextmanager
def run_lock(layout: Layout, run: str, what: str = "", **kw: Any) -> Iterator[FileLock]:
    """Hold the job lock of ``run`` (and create ``models/<run>``) for the duration of the block."""
    os.makedirs(layout.path("locks"), exist_ok=True)
    lock = FileLock(layout.run_lock_path(run), what=what, **kw)
    try:
        lock.acquire()
    except LockHeld as e:
        raise LockHeld(e.path, e.owner, f"run {run!r} ({layout.run_dir(run)}) is being written by "
                       f"{e.owner.describe() if e.owner else 'another job'}; wait for that job to end, "
                       "or give this one another run name") from None
    try:
        os.makedirs(layout.run_dir(run), exist_ok=True)
        yield lock
    finally:
        lock.release()


def host_lock(layout: Layout, name: str, host: Optional[str] = None, what: str = "", **kw: Any) -> FileLock:
    """A lock for ``name`` on one host (default this one): ``locks/host-<name>@<hostname>.lock``."""
    os.makedirs(layout.path("locks"), exist_ok=True)
    return FileLock(layout.host_lock_path(name, host), what=what, **kw)


def new_job_id() -> str:
    """Sortable and unique enough across hosts: UTC time plus random hex."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()
