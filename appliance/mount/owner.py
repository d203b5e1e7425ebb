"""Who holds a lock, and whether that holder provably died: the owner record and its judgement.

What it owns: ``Owner`` (the JSON record inside a lock file: host name, pid, start time, what it
guards, a token per acquisition, the job it works for, and the facts that let anyone judge the
holder's life: its pid namespace, the start time of its process, the boot id of its kernel, and
the container it runs in), ``this_owner()`` (the record of the calling process),
``read_owner()``, and two judges that answer *why the holder is dead* (a sentence) or None
(alive, or not provably dead):

- ``dead_reason(owner, mtime, stale_after_s)``, used by every contender:
  same kernel (equal boot ids; for records without one, the same host name) and the same pid
  namespace: the holder's pid is gone, or now belongs to another process (its start time in
  /proc differs) - decided at once. Anything else (another host, another container): no
  heartbeat for ``stale_after_s`` seconds.
- ``container_gone_reason(owner, engine_id, lookup)``, used by ``appliance primary`` on the
  host, which can ask Docker: the record names a container of this Docker engine and that
  container no longer exists, is not running (exited, dead, created anew), or was started after
  the lock was taken (restarted, or another container of that name) - decided at once.

The container identity comes from the environment of pid 1 of the holder's pid namespace (the
container's init, whose environment Docker set), knob ``APPLIANCE_CONTAINER`` =
``<container name>@<engine id>``, set by the cluster plane for every container it starts; a
process's own environment is not trusted for it (an SSH session or ``-x`` could carry another
container's value). Outside such a container the identity is empty and only the first judge applies.

Env vars: ``APPLIANCE_CONTAINER``, read from /proc/1/environ only. Failure modes: none raised
for facts that cannot be read (they are left empty, which only makes the judges more careful);
``ValueError``/``TypeError`` from ``Owner.from_json`` for a damaged record.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import time
from typing import Callable, Optional

from appliance.common.knobs import ConfigError, read

from .atomic import read_with_mtime

BOOT_ID = "/proc/sys/kernel/random/boot_id"
GONE_STATES = ("exited", "dead", "created", "removing")

# What ``container_gone_reason``'s lookup answers for a container name: None when no such
# container exists, else (status, unix time it was last started).
ContainerState = Optional[tuple[str, float]]


@dataclasses.dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: float          # time.time() when taken
    what: str = ""          # what the holder does (job id, command), for the message
    pidns: str = ""         # readlink /proc/self/ns/pid of the holder
    proc_start: str = ""    # field 22 of /proc/<pid>/stat (start time in clock ticks)
    token: str = ""         # random; identifies one acquisition
    boot_id: str = ""       # /proc/sys/kernel/random/boot_id of the holder's kernel
    container: str = ""     # <container name>@<engine id> of the holder's container, or ""
    job: str = ""           # the job the holder works for ("": none): its processes may hand the lock over

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        ago = max(0, int(time.time() - self.started))
        what = f"{self.what} " if self.what else ""
        return f"{what}on host {self.host} (pid {self.pid}, since {when}, {ago} s ago)"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Owner":
        data = json.loads(text)
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    @property
    def container_name(self) -> str:
        return split_container(self.container)[0]


def split_container(value: str) -> tuple[str, str]:
    """(container name, engine id) of an ``APPLIANCE_CONTAINER`` value; ("", "") when malformed."""
    name, sep, engine = (value or "").rpartition("@")
    return (name, engine) if sep and name and engine else ("", "")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def boot_id() -> str:
    return _read(BOOT_ID)


def pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def proc_start(pid: int) -> Optional[str]:
    """Start time of ``pid`` in clock ticks since boot, or None when no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = stat[stat.rfind(")") + 2:].split()
    return rest[19] if len(rest) > 19 else ""


def container_identity(proc: str = "/proc") -> str:
    """``APPLIANCE_CONTAINER`` of pid 1 of this pid namespace (the container's init), or ""."""
    try:
        with open(os.path.join(proc, "1", "environ"), "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key == b"APPLIANCE_CONTAINER":
            env["APPLIANCE_CONTAINER"] = value.decode(errors="replace")
    try:
        value = read("APPLIANCE_CONTAINER", env)
    except ConfigError:
        return ""
    return value if split_container(value)[0] else ""


def this_owner(what: str = "", host: Optional[str] = None, job: str = "") -> Owner:
    """The record this process would write."""
    pid = os.getpid()
    return Owner(host=host or socket.gethostname(), pid=pid, started=time.time(), what=what,
                 pidns=pidns(), proc_start=proc_start(pid) or "", token=secrets.token_hex(8),
                 boot_id=boot_id(), container=container_identity(), job=job)


def read_owner(path: str) -> tuple[Optional[Owner], Optional[float]]:
    """(owner, mtime) of the lock at ``path``; (None, None) when there is none, (None, mtime)
    when its record cannot be parsed (still being written, or damaged)."""
    text, mtime = read_with_mtime(path)
    if text is None:
        return None, None
    try:
        return Owner.from_json(text), mtime
    except (ValueError, TypeError):
        return None, mtime


def same_kernel(owner: Owner) -> bool:
    """Whether the holder ran on this machine's running kernel (so its pid namespace id means
    the same namespace here). Boot ids decide; records without one fall back to the host name."""
    mine = boot_id()
    if owner.boot_id and mine:
        return owner.boot_id == mine
    return owner.host == socket.gethostname()


def dead_reason(owner: Optional[Owner], mtime: float, stale_after_s: float,
                now: Optional[float] = None) -> Optional[str]:
    """Why the holder of a lock is dead (see the module docstring), or None while it may live."""
    now = time.time() if now is None else now
    if owner is not None and owner.pidns and owner.pidns == pidns() and same_kernel(owner):
        start = proc_start(owner.pid)
        if start is None:
            return f"its process (pid {owner.pid}) is gone"
        if start and owner.proc_start and start != owner.proc_start:
            return f"its process is gone (pid {owner.pid} now belongs to another process)"
        return None
    silent = now - mtime
    if silent >= stale_after_s:
        return f"no heartbeat for {silent:.0f} s"
    return None


def container_gone_reason(owner: Optional[Owner], engine_id: str,
                          lookup: Callable[[str], ContainerState]) -> Optional[str]:
    """Why the holder is dead, judged by its container on the Docker engine ``engine_id``
    (``lookup`` asks that engine); None when the record names no container of that engine or
    the container still runs the holder."""
    if owner is None:
        return None
    name, engine = split_container(owner.container)
    if not name or not engine_id or engine != engine_id:
        return None
    state = lookup(name)
    if state is None:
        return f"its container {name} is gone"
    status, started = state
    if status in GONE_STATES:
        return f"its container {name} is {status}"
    if started > owner.started:
        return f"its container {name} was started again after the lock was taken"
    return None
