"""What the elastic driver knows of its workers and rounds: two records, no logic.

What it owns: ``WorkerRec`` (one worker process of the job: the number the driver gave it at
spawn, its host and slot, its mechanism handle, exit code, pending join, watch stream, the last
round it was released into and its rank there, and why it is leaving) and ``Round`` (one layout
of the job: its members, slots, whether state must be synced, and whether it was released,
broken or failed). ``driver.ElasticDriver`` creates and changes them on its one thread.

Env vars: none. Failure modes: none (plain data).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .rendezvous import Stream, Ticket


@dataclasses.dataclass
class WorkerRec:
    wid: int
    host: str
    index: int                      # its slot on the host
    handle: Any = None              # the mechanism's worker
    exit_code: int | None = None
    leaving: str = ""               # why the driver removed it ("" = it is not leaving)
    leaving_since: float = 0.0
    asked_to_leave: bool = False    # answered "removed" at a join: it exits by itself, TERM only after the grace
    ticket: Ticket | None = None    # its pending join
    join: dict = dataclasses.field(default_factory=dict)
    last: int = 0                   # the last round it was released into
    in_round: bool = False          # released into ``last`` and not back since
    stream: Stream | None = None
    rank: int | None = None         # its rank in the last round it was released into

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    def name(self) -> str:
        where = f"rank {self.rank}, " if self.rank is not None else ""
        return f"worker {self.wid} ({where}host {self.host})"


@dataclasses.dataclass
class Round:
    id: int
    members: list[int]
    slots: dict
    sync: bool
    formed_at: float
    released: bool = False
    broken: bool = False
    broken_at: float = 0.0
    failed: bool = False   # a member failed or its runtime did: the next round syncs


__all__ = ["Round", "WorkerRec"]
