"""What the elastic state machine knows of its workers and rounds: records and the job's phase, no logic.

What it owns: ``Phase`` (where the job stands: waiting for slots, a round forming, running or
breaking, the job finishing or failing, ended), ``WorkerRec`` (one worker process of the job: the number the
machine gave it at spawn, its host and slot, exit code, whether a join of it is held and what it
sent, the last round it was released into and its rank there, and why it is leaving or asked to) and ``Round``
(one layout of the job: its members, slots, whether state must be synced, and whether a member
failed), and ``Settings`` (what the launcher read for the job: -np, --min-np, --max-np, the
timeouts, the cool-down, whether it runs on Kubernetes). ``machine`` creates and changes them; nothing here touches a process or a socket (the
I/O shell, ``driver``, keeps the processes, tickets and streams by worker number).

Env vars: none. Failure modes: none (plain data).
"""
from __future__ import annotations

import dataclasses
import enum


class Phase(enum.Enum):
    WAITING = "waiting"        # no round: waiting for discovery, host checks or enough slots
    FORMING = "forming"        # a round is laid out; its members have not all joined yet
    RUNNING = "running"        # the round was released: its members train
    BREAKING = "breaking"      # the round ended; waiting for its members still running to join again
    FINISHING = "finishing"    # a worker exited 0: the job ends when the others have exited
    FAILING = "failing"        # every member failed or lost its host: the job fails once they have exited
    ENDED = "ended"            # the outcome is known


@dataclasses.dataclass
class WorkerRec:
    wid: int
    host: str
    index: int                      # its slot on the host
    exit_code: int | None = None
    leaving: str = ""               # why the machine removed it ("" = it is not leaving)
    leaving_since: float = 0.0
    asked_to_leave: bool = False    # answered "removed" at a join: it exits by itself, TERM only after the grace
    killed: bool = False            # SIGKILLed after the second grace: nothing more to send
    joined: bool = False            # a join of it is held (unanswered)
    join: dict = dataclasses.field(default_factory=dict)
    last: int = 0                   # the last round it was released into
    in_round: bool = False          # released into ``last`` and not back since
    rank: int | None = None         # its rank in the last round it was released into
    failed: bool = False            # it failed (exit, start, timeout, silence): its host was blacklisted
    departing: str = ""             # it asked to leave (SIGTERM): why; it goes at its round's next commit

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
    broken_at: float = 0.0
    failed: bool = False   # a member failed or its runtime did: the next round syncs
    notified: tuple = ()   # (target, result, notice number) its members were last told about
    late_said: bool = False  # it said which members it waits for
    lost_at: float | None = None  # when, after it ended, a member was first named lost (silent)



@dataclasses.dataclass(frozen=True)
class Settings:
    np: int
    min_np: int
    max_np: int | None
    timeout_s: float
    reset_limit: int | None = None
    cooldown_range: tuple[float, float] | None = None
    stop_grace_s: float = 3.0
    verbose: bool = False
    silent_s: float = 2.5
    discovery_interval_s: float = 1.0
    kubernetes: bool = False  # a listed host not answering is pending; a rank ended by SIGTERM leaves


__all__ = ["Phase", "Round", "Settings", "WorkerRec"]
