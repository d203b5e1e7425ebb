"""The secondaries registered on the shared mount: which hosts are part of the cluster now.

What it owns: ``Registration`` (the JSON record ``SHARED/secondaries/<name>.json``: the host
name the others reach the secondary by, its SSH port and slots, the container it runs in
(``<name>@<engine id>``, ``APPLIANCE_CONTAINER``), its own host name, when it registered and a
token per registration) and the operations on it: ``register()`` (write it atomically),
``beat()`` (touch it: its modification time is the heartbeat; False once the record is gone or
belongs to another registration of that name), ``unregister()`` (remove it, only if it is still
ours), ``registrations()`` (every readable record with its heartbeat time) and ``live()`` (those
whose heartbeat is younger than ``stale_after_s``, oldest registration first).

Who writes: a secondary container registers itself once its sshd answers and beats while it
runs (``appliance.cluster.heartbeat``); ``appliance secondary --stop`` unregisters it before it
stops the container. Who reads: the primary's host discovery (``appliance.cluster.discover``).
A killed or frozen secondary stops beating: it drops out of ``live()`` after ``stale_after_s``
seconds (``is_live``: modification times, so the hosts' clocks and the share's must roughly
agree); its record stays until a secondary of that name registers again, and is ignored.

Env vars: none read here. Failure modes: ``ValueError`` for a name that is not a plain file name;
records that cannot be parsed are skipped by the readers (one being written is atomic, so that
means damage); ``OSError`` from the file system propagates from the writers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import secrets
import time
from typing import Optional

from .atomic import read_with_mtime, write_json
from .layout import Layout, check_name


@dataclasses.dataclass(frozen=True)
class Registration:
    name: str               # the host name the primary reaches it by (-H, discovery)
    ssh_port: int
    slots: int
    container: str = ""     # <container name>@<engine id>, or "" outside an appliance container
    hostname: str = ""      # gethostname() where it runs
    started: float = 0.0    # time.time() when it registered
    token: str = ""         # one per registration

    @classmethod
    def create(cls, name: str, ssh_port: int, slots: int, container: str = "", hostname: str = "") -> "Registration":
        check_name("secondary", name)
        return cls(name=name, ssh_port=int(ssh_port), slots=int(slots), container=container, hostname=hostname,
                   started=time.time(), token=secrets.token_hex(8))

    @classmethod
    def from_json(cls, data: dict) -> "Registration":
        fields = {f.name for f in dataclasses.fields(cls)}
        reg = cls(**{k: v for k, v in data.items() if k in fields})
        check_name("secondary", reg.name)
        if not (isinstance(reg.ssh_port, int) and 0 < reg.ssh_port < 65536 and isinstance(reg.slots, int)
                and reg.slots > 0):
            raise ValueError(f"secondary {reg.name}: bad port or slots")
        return reg


def _path(layout: Layout, name: str) -> str:
    return layout.secondary_path(name)


def _read(path: str) -> tuple[Optional[Registration], Optional[float]]:
    text, mtime = read_with_mtime(path)
    if text is None:
        return None, None
    try:
        return Registration.from_json(json.loads(text)), mtime
    except (ValueError, TypeError):
        return None, mtime


def register(layout: Layout, reg: Registration) -> str:
    """Write ``reg`` (atomically; a record of the same name is replaced). Returns its path."""
    os.makedirs(layout.secondaries, exist_ok=True)
    path = _path(layout, reg.name)
    write_json(path, dataclasses.asdict(reg))
    return path


def beat(layout: Layout, reg: Registration) -> bool:
    """One heartbeat: touch ``reg``'s record; False when it is gone or is another registration's."""
    path = _path(layout, reg.name)
    current, _ = _read(path)
    if current is None or current.token != reg.token:
        return False
    os.utime(path)
    return True


def unregister(layout: Layout, name: str, token: Optional[str] = None) -> bool:
    """Remove the record of ``name`` (only if it holds ``token``, when given); whether it did."""
    path = _path(layout, name)
    if token is not None:
        current, _ = _read(path)
        if current is None or current.token != token:
            return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        return True
    return False


def registrations(layout: Layout) -> list[tuple[Registration, float]]:
    """Every readable record with its heartbeat (modification) time, oldest registration first."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(layout.secondaries), "*.json")):
        reg, mtime = _read(path)
        if reg is not None and mtime is not None and os.path.basename(path) == f"{reg.name}.json":
            found.append((reg, mtime))
    return sorted(found, key=lambda r: (r[0].started, r[0].name))


def is_live(beat_at: float, now: float, stale_after_s: float) -> bool:
    """Whether a record last touched at ``beat_at`` still counts at ``now`` (a clock a little
    behind the share's, a beat from the future, counts)."""
    return now - beat_at < stale_after_s


def live(layout: Layout, stale_after_s: float, now: Optional[float] = None) -> list[Registration]:
    """The registrations whose last heartbeat is younger than ``stale_after_s``, oldest first."""
    now = time.time() if now is None else now
    return [reg for reg, beat_at in registrations(layout) if is_live(beat_at, now, stale_after_s)]
