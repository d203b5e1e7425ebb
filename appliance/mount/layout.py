"""The shared mount's layout: one directory, mounted at the same path on every host.

What it owns: the names under the shared directory::

    SHARED/ssh/              the cluster's SSH keys (``appliance keys``; secondaries read them)
    SHARED/data/             datasets, read by every host
    SHARED/models/<run>/     checkpoints of one training run; rank 0 writes them, atomically
    SHARED/locks/            run-<run>.lock (the job lock of a run), host-<name>@<hostname>.lock
                             (per-host locks: the file name carries the host name)
    SHARED/jobs/<id>/        one launch by ``appliance primary``: job.json, hosts/<host>.json
                             (reachable, authenticated), ranks/<rank>.json (host, pid: written as
                             each rank starts), logs/rank.N/{stdout,stderr}, exit.json
    SHARED/secondaries/      <name>.json: one per running secondary, its heartbeat in the file's
                             modification time (``registry.py``); an elastic primary discovers them

``Layout(root)`` names the paths (``locks.py`` takes the locks, ``atomic.py`` writes the files);
``new_job_id()`` makes the ids of ``jobs/``.

Env vars: none read here (``APPLIANCE_SHARED`` is read in ``appliance/cluster/config.py``).
Failure modes: ``ValueError`` for run, job or host names that are not plain file names;
``FileNotFoundError`` from ``ensure()`` when the root (the mount) is missing.
"""
from __future__ import annotations

import os
import re
import socket
import time
from typing import Optional

SUBDIRS = ("ssh", "data", "models", "locks", "jobs", "secondaries")
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

    @property
    def locks(self) -> str:
        return self.path("locks")

    @property
    def secondaries(self) -> str:
        return self.path("secondaries")

    def secondary_path(self, name: str) -> str:
        return self.path("secondaries", f"{check_name('secondary', name)}.json")

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


def new_job_id() -> str:
    """Sortable and unique enough across hosts: UTC time plus random hex."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()
