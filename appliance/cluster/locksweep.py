"""Before a job starts: take over the locks on the share whose holder's container is gone.

What it owns: ``sweep_dead_container_locks(client, layout, say)``, which ``appliance primary``
calls on the host (where Docker is) before it starts the primary container. Every lock under
``SHARED/locks/`` whose owner record names a container of this Docker engine
(``APPLIANCE_CONTAINER``, set by ``docker.container_kwargs`` and read by the holder from its
container's init) is broken at once when that container no longer exists, is not running, or
was started again after the lock was taken (``appliance.mount.container_gone_reason``); one line
per lock taken over names the dead holder and its container. A killed primary container thus
leaves no run lock behind for the next job: without this the lock would be judged by its
heartbeat only (30 s), since the new job's rank 0 runs in another pid namespace and cannot see
that the old one is gone.

Locks of other engines (other hosts), of holders outside appliance containers, and of living
containers are left alone. Env vars: none. Failure modes: none raised: a Docker error while
asking about a container leaves that lock alone (not provably dead), as does a lock that changed
meanwhile; the job's rank 0 then judges it by the usual rules.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from ..mount import Layout, Owner, Takeover, container_gone_reason, sweep
from . import docker


def sweep_dead_container_locks(client: Any, layout: Layout, say: Callable[[str], None]) -> list[Takeover]:
    if not os.path.isdir(layout.locks):
        return []
    try:
        me = docker.engine_id(client)
    except Exception:  # noqa: BLE001 - no verdict without the engine's id
        return []

    def judge(owner: Optional[Owner]) -> Optional[str]:
        try:
            return container_gone_reason(owner, me, lambda name: docker.container_state(client, name))
        except Exception:  # noqa: BLE001 - Docker could not answer: not provably dead
            return None

    done = sweep(layout.locks, judge)
    for t in done:
        say(t.describe())
    return done
