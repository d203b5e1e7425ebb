"""Lock files on the shared mount: one holder at a time, the holder named, dead holders taken over.

What it owns: ``FileLock`` (a context manager over one lock file), ``break_lock()`` (remove a
dead holder's lock, safely against concurrent breakers), ``sweep()`` (break every lock under a
directory whose holder a given judge proves dead: ``appliance primary`` uses it, with Docker as
the judge, before a job starts), ``Takeover`` (what was taken over from whom, and why), and the
two locks of the layout: ``run_lock()`` (the job lock of a run: ``models/<run>`` has one writer;
``RunLock``, the same held by whichever process of the job writes now) and ``host_lock()`` (per-host locks: their file names carry the host name); ``layout.py`` names
their files, ``owner.py`` the record inside them and the rules that judge a holder dead.

How: the owner record is written to a private temporary file which is then hard-linked to the
lock path; ``link()`` fails when the path exists, atomically, also on NFS. Without hard links
(some FUSE file systems) ``O_CREAT|O_EXCL`` is used instead. While held, a thread touches the
file every ``heartbeat_s`` seconds. A lock whose holder is provably dead (``owner.dead_reason``:
its process gone in this pid namespace on this kernel, at once; otherwise no heartbeat for
``stale_after_s``) is broken under a short-lived ``<lock>.break`` file, and only if it still
holds the same owner token, so two contenders never both win; each takeover is reported
(``FileLock.broken``, and ``on_takeover``: ``run_lock(say=...)`` prints one line naming the dead
holder and why it is known dead). Release removes the file only if it still holds our token.

Within one job the lock may change hands: a ``FileLock(job=J)`` takes a lock whose record names
the same job J at once, living holder or not (a *handover*, reported like a takeover). This is
how the run lock follows rank 0 of an elastic job, where rank 0 may be lost and another process
of the job becomes the writer (``RunLock``): the job, not one process, owns the run. The old
holder's heartbeat then finds the file someone else's and stops (``lost``); its release leaves
the file alone. Another job (another J, or none) still sees the lock held.
Env vars: none (``owner.py`` reads ``APPLIANCE_CONTAINER`` of pid 1). Failure modes:
``LockHeld`` (a ``RuntimeError``) names the living holder; I/O errors on the share propagate as
``OSError``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import os
import threading
import time
from typing import Any, Callable, Iterator, Optional

from .layout import Layout
from .owner import Owner, dead_reason, read_owner, this_owner

BREAK_TIMEOUT_S = 10.0   # a .break file older than this belongs to a breaker that died


class LockHeld(RuntimeError):
    """The lock belongs to a living holder; ``owner`` says who (None: unreadable, being written)."""

    def __init__(self, path: str, owner: Optional[Owner], message: str = ""):
        who = owner.describe() if owner else "another process (its record is still being written)"
        super().__init__(message or f"{path} is held by {who}")
        self.path, self.owner = path, owner


@dataclasses.dataclass(frozen=True)
class Takeover:
    """A dead holder's lock removed: ``owner`` None when its record was unreadable."""
    path: str
    owner: Optional[Owner]
    reason: str
    handover: bool = False   # from a process of the same job, dead or not

    def describe(self, what: str = "") -> str:
        holder = self.owner.describe() if self.owner else "an unreadable record"
        if self.handover:
            return f"took over {what or self.path} from {holder}: {self.reason}"
        return f"took over {what or self.path}: its holder, {holder}, is dead ({self.reason})"


def break_lock(path: str, stale: Optional[Owner]) -> str:
    """Remove the lock at ``path`` if it still holds ``stale``'s token (None: an unreadable
    record). Returns "removed" (we removed it), "changed" (it is gone or holds another owner
    now: look again) or "busy" (another breaker is at it: look again a little later)."""
    breaker = path + ".break"
    try:
        fd = os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            if time.time() - os.stat(breaker).st_mtime > BREAK_TIMEOUT_S:
                os.unlink(breaker)  # its breaker died mid-way
                return "changed"
        except FileNotFoundError:
            return "changed"
        return "busy"
    try:
        os.close(fd)
        current, _ = read_owner(path)
        same = (current is None and stale is None) or (
            current is not None and stale is not None and current.token == stale.token)
        if not same:
            return "changed"
        try:
            os.unlink(path)
        except FileNotFoundError:
            return "changed"
        return "removed"
    finally:
        os.unlink(breaker)


def sweep(directory: str, judge: Callable[[Optional[Owner]], Optional[str]]) -> list[Takeover]:
    """Break every ``*.lock`` in ``directory`` whose holder ``judge`` proves dead (it answers
    the reason, or None); the locks it removed."""
    done: list[Takeover] = []
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), "*.lock"))):
        owner, mtime = read_owner(path)
        if mtime is None or owner is None:
            continue  # released meanwhile, or a record being written: not for a sweep
        reason = judge(owner)
        if reason and break_lock(path, owner) == "removed":
            done.append(Takeover(path, owner, reason))
    return done


class FileLock:
    """``with FileLock(path, what="job 1a2b"):`` - exclusive across processes, containers and hosts
    sharing ``path``'s file system. ``wait_s`` > 0 retries that long before raising ``LockHeld``."""

    def __init__(self, path: str | os.PathLike, *, what: str = "", wait_s: float = 0.0,
                 heartbeat_s: float = 5.0, stale_after_s: float = 30.0, host: Optional[str] = None,
                 on_takeover: Optional[Callable[[Takeover], None]] = None, job: str = ""):
        if heartbeat_s <= 0 or stale_after_s <= heartbeat_s:
            raise ValueError("need 0 < heartbeat_s < stale_after_s")
        self.path = os.fspath(path)
        self.what, self.wait_s, self.host, self.job = what, wait_s, host, job
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.owner: Optional[Owner] = None
        self.lost = False   # set when the heartbeat finds the file gone or someone else's
        self.broken: list[Owner] = []   # dead holders whose lock this one removed while acquiring
        self.takeovers: list[Takeover] = []   # the same, with the reasons
        self.on_takeover = on_takeover
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # --- acquire ----------------------------------------------------------------------------
    def acquire(self) -> Owner:
        if self.owner is not None:
            raise RuntimeError(f"{self.path}: already held by this FileLock")
        owner = this_owner(self.what, self.host, self.job)
        deadline = time.monotonic() + self.wait_s
        while True:
            if self._try_create(owner):
                break
            current, mtime = read_owner(self.path)
            if mtime is None:
                continue  # released between our attempt and the read: try again at once
            handover = bool(self.job) and current is not None and current.job == self.job
            reason = (f"the lock belongs to job {self.job}, which this process works for now" if handover
                      else dead_reason(current, mtime, self.stale_after_s))
            if current is None and reason is None:
                pass  # a record still being written (or damaged and young): treat as held
            elif reason is not None:
                outcome = break_lock(self.path, current)
                if outcome == "removed":
                    self._took_over(Takeover(self.path, current, reason, handover))
                if outcome != "busy":
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

    def _took_over(self, takeover: Takeover) -> None:
        self.takeovers.append(takeover)
        if takeover.owner is not None:
            self.broken.append(takeover.owner)
        if self.on_takeover is not None:
            self.on_takeover(takeover)

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


def _run_lock(layout: Layout, run: str, what: str, say: Optional[Callable[[str], None]], kw: dict) -> FileLock:
    os.makedirs(layout.locks, exist_ok=True)
    if say is not None:
        kw["on_takeover"] = lambda t: say(t.describe(f"the lock of run {run!r} ({t.path})"))
    return FileLock(layout.run_lock_path(run), what=what, **kw)


def _acquire_run_lock(lock: FileLock, layout: Layout, run: str) -> None:
    try:
        lock.acquire()
    except LockHeld as e:
        raise LockHeld(e.path, e.owner, f"run {run!r} ({layout.run_dir(run)}) is being written by "
                       f"{e.owner.describe() if e.owner else 'another job'}; wait for that job to end, "
                       "or give this one another run name (were it dead, its lock would be taken over at "
                       f"the latest {lock.stale_after_s:.0f} s after its last heartbeat)") from None
    try:
        os.makedirs(layout.run_dir(run), exist_ok=True)
    except BaseException:
        lock.release()
        raise


@contextlib.contextmanager
def run_lock(layout: Layout, run: str, what: str = "", say: Optional[Callable[[str], None]] = None,
             **kw: Any) -> Iterator[FileLock]:
    """Hold the job lock of ``run`` (and create ``models/<run>``) for the duration of the block;
    ``say`` gets one line for each dead holder's lock taken over on the way."""
    lock = _run_lock(layout, run, what, say, kw)
    _acquire_run_lock(lock, layout, run)
    try:
        yield lock
    finally:
        lock.release()


class RunLock:
    """The job lock of ``run`` for a job whose writer may change (rank 0 of an elastic job):
    ``follow(True)`` in the process that writes now takes it (from another process of job ``job``
    at once, handed over; from another job: ``LockHeld``, as ``run_lock``), ``follow(False)``
    lets it go if this process holds it, ``close()`` (or the end of a ``with``) too. Without a
    ``job`` it is ``run_lock`` in two steps."""

    def __init__(self, layout: Layout, run: str, job: str, what: str = "",
                 say: Optional[Callable[[str], None]] = None, **kw: Any):
        self.layout, self.run = layout, run
        self.lock = _run_lock(layout, run, what, say, dict(kw, job=job))

    @property
    def held(self) -> bool:
        return self.lock.owner is not None and not self.lock.lost

    def follow(self, writer: bool) -> bool:
        """Hold the lock when ``writer``, else let it go; True when this call took it."""
        if not writer:
            self.lock.release()
            return False
        if self.held:
            return False
        if self.lock.owner is not None:  # lost to another process of the job, which handed it back
            self.lock.release()
        _acquire_run_lock(self.lock, self.layout, self.run)
        return True

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def host_lock(layout: Layout, name: str, host: Optional[str] = None, what: str = "", **kw: Any) -> FileLock:
    """A lock for ``name`` on one host (default this one): ``locks/host-<name>@<hostname>.lock``."""
    os.makedirs(layout.locks, exist_ok=True)
    return FileLock(layout.host_lock_path(name, host), what=what, **kw)
