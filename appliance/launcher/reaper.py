"""The reaper: local ranks die with their launcher, whatever killed it (SIGKILL included).

What it owns:
- ``Reaper``, a context manager the launcher opens before it starts any rank. It starts this
  file as a script (``python -I -S reaper.py LAUNCHER_PID GRACE [DIR...]``: standard library
  only, so it is up in milliseconds) in a session of its own, so a signal to the launcher's
  process group or terminal (Ctrl-C, a closed terminal, ``kill -- -PGID``) does not reach it.
  The launcher keeps the write end of a pipe to the reaper's stdin and writes ``+PGID`` for every
  local rank it starts, ``-PGID`` once that rank's process group is gone (Linux never reuses a
  number while it still names a live group, so a forgotten group is never signalled by mistake),
  and ``quit`` when the job ended normally.
- The reaper side (``main``): when its stdin reaches end of file without ``quit`` (the launcher
  is gone: only the kernel closing the launcher's descriptors gets here), it sends SIGTERM to
  every group still listed, waits up to GRACE seconds for them to vanish, sends SIGKILL, removes
  the launcher-private directories DIR (the fault-report directory) and exits. The launcher
  gives GRACE = min(APPLIANCE_STOP_GRACE, 1) so every process of every local rank, grandchildren
  included, is gone within 2 s of the launcher's death.
- ``pgid_alive(pgid)``: whether a process group still has a live (non-zombie) member; used here,
  by ``workers.py`` and by the remote stub.

Not used: ``PR_SET_PDEATHSIG`` on local ranks. It needs a ``preexec_fn`` (which Python documents
as unsafe while the launcher's relay threads run, and which forfeits ``posix_spawn``), it reaches
only the rank's own process, not its grandchildren, and it fires when the *thread* that forked
exits. The reaper covers whole groups without any of that. (The remote stub, single-threaded
where it forks, does use it.)

Env vars: none. Failure modes: if the reaper cannot be started the launcher says so once and
runs without it (every other way of ending a job still stops the ranks); a reaper that dies
early only loses this protection; writes to a dead reaper are ignored.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

BOUND_S = 1.0  # longest wait between SIGTERM and SIGKILL after the launcher died


def pgid_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Something has that group id; zombies waiting for a parent's reap still count for kill(),
    # so look for a live member.
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


class Reaper:
    """The launcher's half (see the module docstring). ``with Reaper(grace, [dir]) as r: r.watch(pgid)``."""

    def __init__(self, grace_s: float = BOUND_S, cleanup: Sequence[str] = ()):
        self.grace_s = max(0.0, min(float(grace_s), BOUND_S))
        self.cleanup = [str(d) for d in cleanup]
        self.error: str | None = None  # why no reaper runs, if it could not start
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> "Reaper":
        argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), repr(self.grace_s),
                *self.cleanup]
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, cwd="/", start_new_session=True)
        except OSError as e:
            self.error = f"cannot start the reaper ({e.strerror}): local ranks would outlive a killed launcher"
        return self

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None or self._proc.stdin.closed:
                return
            try:
                os.write(self._proc.stdin.fileno(), line.encode() + b"\n")
            except OSError:
                pass  # the reaper died: nothing to protect with

    def watch(self, pgid: int) -> None:
        """Stop process group ``pgid`` if the launcher dies."""
        self._send(f"+{int(pgid)}")

    def forget(self, pgid: int) -> None:
        """Group ``pgid`` is gone: never signal that number again."""
        self._send(f"-{int(pgid)}")

    def close(self) -> None:
        """The job ended normally: the reaper exits without signalling anything."""
        self._send("quit")
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        # It exits by itself at once; reap it in the background instead of waiting for its teardown.
        threading.Thread(target=_reap_child, args=(proc,), name="reaper-exit", daemon=True).start()

    def __enter__(self) -> "Reaper":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reap_child(proc: subprocess.Popen) -> None:
    proc.wait()  # no timeout: a blocking waitpid holds no GIL (a timed wait polls with it)


# --- the reaper process --------------------------------------------------------------------------
def _signal_all(groups: set[int], sig: int) -> None:
    for g in groups:
        try:
            os.killpg(g, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(groups: set[int], grace_s: float) -> None:
    """SIGTERM every group, wait up to ``grace_s`` for them to vanish, SIGKILL the rest (bounded)."""
    _signal_all(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = set(groups)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = {g for g in left if pgid_alive(g)}
    _signal_all(left, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = {g for g in left if pgid_alive(g)}


def main(argv: Sequence[str]) -> int:
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)
    grace_s, dirs = float(argv[1]), list(argv[2:])  # argv[0]: the launcher's pid, for `ps`
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if line == b"quit":
            return 0
        try:
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
        except ValueError:
            continue
    # End of file without "quit": the launcher is gone.
    reap(groups, grace_s)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
