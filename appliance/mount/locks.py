"""Lock files on the shared mount: one holder at a time, the holder named, dead holders detected.

What it owns: ``FileLock`` (a context manager over one lock file) and ``Owner`` (the record
inside it: host name, pid, start time, what it guards, and the facts that let anyone judge
whether that holder still lives), and the two locks of the layout: ``run_lock()`` (the job lock
of a run: ``models/<run>`` has one writer) and ``host_lock()`` (per-host locks: their file names
carry the host name); ``layout.py`` names their files.

How: the owner record is written to a private temporary file which is then hard-linked to the
lock path; ``link()`` fails when the path exists, atomically, also on NFS. Without hard links
(some FUSE file systems) ``O_CREAT|O_EXCL`` is used instead. While held, a thread touches the
file every ``heartbeat_s`` seconds. A lock is *stale* when its holder is known dead:
- holder in this pid namespace on this host: its pid is gone, or now belongs to another process
  (the process start time in /proc differs) - decided at once;
- holder elsewhere (another host, or another container on this host): no heartbeat for
  ``stale_after_s`` seconds.
A stale lock is broken under a short-lived ``<lock>.break`` file, and only if it still holds the
same owner token, so two contenders never both win; release removes the file only if it still
holds our token. Env vars: none. Failure modes: ``LockHeld`` (a ``RuntimeError``) names the
living holder; I/O errors on the share propagate as ``OSError``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Iterator, Optional

from .layout import Layout

BREAK_TIMEOUT_S = 10.0   # a .break file older than this belongs to a breaker that died


@dataclasses.dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: float          # time.time() when taken
    what: str = ""          # what the holder does (job id, command), for the message
    pidns: str = ""         # readlink /proc/self/ns/pid of the holder
    proc_start: str = ""    # field 22 of /proc/<pid>/stat (start time in clock ticks)
    token: str = ""         # random; identifies one acquisition

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


class LockHeld(RuntimeError):
    """The lock belongs to a living holder; ``owner`` says who (None: unreadable, being written)."""

    def __init__(self, path: str, owner: Optional[Owner], message: str = ""):
        who = owner.describe() if owner else "another process (its record is still being written)"
        super().__init__(message or f"{path} is held by {who}")
        self.path, self.owner = path, owner


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _proc_start(pid: int) -> Optional[str]:
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


def this_owner(what: str = "", host: Optional[str] = None) -> Owner:
    """The record this process would write."""
    pid = os.getpid()
    return Owner(host=host or socket.gethostname(), pid=pid, started=time.time(), what=what,
                 pidns=_pidns(), proc_start=_proc_start(pid) or "", token=secrets.token_hex(8))


def read_owner(path: str) -> tuple[Optional[Owner], Optional[float]]:
    """(owner, mtime) of the lock at ``path``; (None, None) when there is none, (None, mtime)
    when its record cannot be parsed (still being written, or damaged)."""
    try:
        with open(path) as f:
            mtime = os.fstat(f.fileno()).st_mtime
            text = f.read()
    except FileNotFoundError:
        return None, None
    try:
        return Owner.from_json(text), mtime
    except (ValueError, TypeError):
        return None, mtime


def holder_alive(owner: Optional[Owner], mtime: float, stale_after_s: float, now: Optional[float] = None) -> bool:
    """Whether the holder of a lock still lives (see the module docstring for the rules)."""
    now = time.time() if now is None else now
    if owner is not None and owner.host == socket.gethostname() and owner.pidns and owner.pidns == _pidns():
        start = _proc_start(owner.pid)
        if start is None:
            return False
        return not (start and owner.proc_start and start != owner.proc_start)
    return now - mtime < stale_after_s


class FileLock:
    """``with FileLock(path, what="job 1a2b"):`` - exclusive across processes, containers and hosts
    sharing ``path``'s file system. ``wait_s`` > 0 retries that long before raising ``LockHeld``."""

    def __init__(self, path: str | os.PathLike, *, what: str = "", wait_s: float = 0.0,
                 heartbeat_s: float = 5.0, stale_after_s: float = 30.0, host: Optional[str] = None):
        if heartbeat_s <= 0 or stale_after_s <= heartbeat_s:
            raise ValueError("need 0 < heartbeat_s < stale_after_s")
        self.path = os.fspath(path)
        self.what, self.wait_s, self.host = what, wait_s, host
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.owner: Optional[Owner] = None
        self.lost = False   # set when the heartbeat finds the file gone or someone else's
        self.broken: list[Owner] = []   # stale holders this lock removed while acquiring
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # --- acquire ----------------------------------------------------------------------------
    def acquire(self) -> Owner:
        if self.owner is not None:
            raise RuntimeError(f"{self.path}: already held by this FileLock")
        owner = this_owner(self.what, self.host)
        deadline = time.monotonic() + self.wait_s
        while True:
            if self._try_create(owner):
                break
            current, mtime = read_owner(self.path)
            if mtime is None:
                continue  # released between our attempt and the read: try again at once
            if current is None and time.time() - mtime < self.stale_after_s:
                pass  # a record still being written (or damaged and young): treat as held
            elif not holder_alive(current, mtime, self.stale_after_s):
                if self._break(current):
                    if current is not None:
                        self.broken.append(current)
                    continue
            if time.monotonic() >= deadline:
                raise LockHeld(self.path, current)
            time.sleep(0.05)
        self.owner, self.lost = owner, False
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name=f"lock-heartbeat {self.path}", daemon=True)
        self._thread.start()
        return owner

    def _try_create(self, owner: Owner) -> bool:
        directory = os.path.dirname(self.path) or "."
        tmp = os.path.join(directory, f".{os.path.basename(self.path)}.{owner.token}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, owner.to_json().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                raise
            return self._create_exclusive(owner)  # no hard links here
        finally:
            os.unlink(tmp)

    def _create_exclusive(self, owner: Owner) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, owner.to_json().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _break(self, stale: Optional[Owner]) -> bool:
        """Remove the lock if it still holds ``stale``'s token; True when the caller may retry now."""
        breaker = self.path + ".break"
        try:
            fd = os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                if time.time() - os.stat(breaker).st_mtime > BREAK_TIMEOUT_S:
                    os.unlink(breaker)  # its breaker died mid-way
                    return True
            except FileNotFoundError:
                return True
            return False
        try:
            os.close(fd)
            current, _ = read_owner(self.path)
            same = (current is None and stale is None) or (
                current is not None and stale is not None and current.token == stale.token)
            if same:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
            return True
        finally:
            os.unlink(breaker)

    # --- hold and release -------------------------------------------------------------------
    def _ours(self) -> bool:
        current, _ = read_owner(self.path)
        return current is not None and self.owner is not None and current.token == self.owner.token

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self._ours():
                    self.lost = True
                    return
                os.utime(self.path)
            except OSError:
                pass  # the share hiccupped; the next beat tries again

    def release(self) -> None:
        if self.owner is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
            self._thread = None
        try:
            if self._ours():
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            self.owner = None

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def run_lock(layout: Layout, run: str, what: str = "", **kw: Any) -> Iterator[FileLock]:
    """Hold the job lock of ``run`` (and create ``models/<run>``) for the duration of the block."""
    os.makedirs(layout.locks, exist_ok=True)
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
    os.makedirs(layout.locks, exist_ok=True)
    return FileLock(layout.host_lock_path(name, host), what=what, **kw)
