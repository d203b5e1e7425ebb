"""Process-group facts, shared by the launcher's local workers and the remote stub.

What it owns: ``pgid_alive()``, the one definition of "a rank's process group still runs"
(used by ``workers.LocalWorker`` on this machine and by ``remote.Stub`` on another host, which
must not end before its rank's whole group is gone). It imports nothing of the launcher, so the
stub can use it on any host.

Env vars: none. Failure modes: none raised; an unreadable /proc counts as "alive" (the caller
then waits for its own bound instead of declaring a group gone that may not be).
"""
from __future__ import annotations

import os


def pgid_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is running (zombies waiting to be reaped do not count)."""
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
