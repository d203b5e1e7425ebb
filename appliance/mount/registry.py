"""The secondaries registered on the shared mount: which hosts are part of the cluster now.

What it owns: ``Registration`` (the JSON record ``SHARED/secondaries/<name>.json``: the host
name the others reach the secondary by, its SSH port and slots, the container it runs in
(``<name>@<engine id>``, ``APPLIANCE_CONTAINER``), its own host name, when it registered and a
token per registration) and the operations on it: ``register()`` (write it atomically),
``beat()`` (touch it: its modification time is the heartbeat; False once the record is gone or
belongs to another registration of that name), ``unregister()`` (remove it, only if it is still
ours), ``registrations()`` (every readable record with its heartbeat time) and ``live()`` (those
whose heartbeat is younger than ``stale_after_s``, oldest registration first). Every record is
checked field by field (an object; a plain name; port and slots whole numbers, not booleans; a
finite ``started``); anything else in the directory (not JSON, not UTF-8, a directory, a FIFO,
a symlink loop, a file over ``MAX_RECORD_BYTES``) is skipped, without blocking, and said through
``registrations``' ``on_skip``.

Who writes: a secondary container registers itself once its sshd answers and beats while it
runs (``appliance.cluster.heartbeat``); ``appliance secondary --stop`` unregisters it before it
stops the container. Who reads: the primary's host discovery (``appliance.cluster.discover``).
A killed or frozen secondary stops beating: it drops out of ``live()`` after ``stale_after_s``
seconds (``is_live``: modification times, so the hosts' clocks and the share's must roughly
agree); its record stays until a secondary of that name registers again, and is ignored.

Env vars: none read here. Failure modes: ``ValueError`` for a name that is not a plain file name;
records that cannot be read or parsed are skipped by the readers (one being written is atomic, so
that means damage or a stranger's file); ``OSError`` from the file system propagates from the
writers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import math
import os
import secrets
import time
from typing import Callable, Optional

from .atomic import read_small, write_json
from .layout import Layout, check_name

MAX_RECORD_BYTES = 64 * 1024  # a record is a few hundred bytes; anything longer is not one


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
    def from_json(cls, data: object) -> "Registration":
        """A record's JSON as a ``Registration``; ``ValueError`` saying which field is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object but {type(data).__name__}")
        for key in ("name", "ssh_port", "slots"):
            if key not in data:
                raise ValueError(f"no {key!r}")
        if not isinstance(data["name"], str):
            raise ValueError("'name' is not a string")
        check_name("secondary", data["name"])
        for key, low, high in (("ssh_port", 1, 65535), ("slots", 1, None)):
            v = data[key]
            if type(v) is not int or v < low or (high is not None and v > high):  # noqa: E721 - bool is not a count
                raise ValueError(f"{key!r} must be a whole number from {low}" + (f" to {high}" if high else "")
                                 + f", got {json.dumps(v)[:40]}")
        for key in ("container", "hostname", "token"):
            if not isinstance(data.get(key, ""), str):
                raise ValueError(f"{key!r} is not a string")
        started = data.get("started", 0.0)
        if type(started) not in (int, float) or not math.isfinite(started):
            raise ValueError(f"'started' must be a finite number, got {json.dumps(started)[:40]}")
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["started"] = float(started)
        return cls(**values)


def _path(layout: Layout, name: str) -> str:
    return layout.secondary_path(name)


def _load(path: str) -> tuple[Optional[Registration], Optional[float]]:
    """(record, heartbeat) of ``path``; (None, None) when it is gone; ``ValueError`` saying why it
    is not a record."""
    text, mtime = read_small(path, MAX_RECORD_BYTES)
    if text is None:
        return None, None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON ({type(e).__name__})") from None
    return Registration.from_json(data), mtime


def _read(path: str) -> tuple[Optional[Registration], Optional[float]]:
    try:
        return _load(path)
    except ValueError:  # NotReadable too
        return None, None


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


def registrations(layout: Layout, on_skip: Optional[Callable[[str, str], None]] = None
                  ) -> list[tuple[Registration, float]]:
    """Every readable record with its heartbeat (modification) time, oldest registration first;
    ``on_skip(path, why)`` once for each file that is not a usable record."""
    found = []
    for path in sorted(glob.glob(os.path.join(glob.escape(layout.secondaries), "*.json"))):
        try:
            reg, mtime = _load(path)
        except ValueError as e:
            if on_skip is not None:
                on_skip(path, str(e))
            continue
        if reg is None or mtime is None:
            continue  # removed meanwhile
        if os.path.basename(path) != f"{reg.name}.json":
            if on_skip is not None:
                on_skip(path, f"it names {reg.name!r}, not the file's name")
            continue
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
