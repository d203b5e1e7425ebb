"""What the elastic state machine knows of its workers and rounds: records and the job's phase, no logic.

What it owns: ``Phase`` (where the job stands: waiting for slots, a round forming, running or
breaking, the job finishing or failing, ended), ``WorkerState`` (where one worker process stands:
starting, joined, training, ending, being removed, exited or left) with ``MOVES``, every move a
worker makes (``WorkerRec.move`` asserts the move is listed, naming both states), ``WorkerRec``
(one worker process of the job: the number the machine gave it at spawn, its host and slot, its
state, exit code, what its last join sent, the last round it was released into and its rank
there, whether it failed, and why it is leaving or asked to) and ``Round``
(one layout of the job: its members, slots, whether state must be synced, and whether a member
failed). ``machine`` creates and changes them; nothing here touches a process or a socket (the
I/O shell, ``driver``, keeps the processes, tickets and streams by worker number).

Env vars: none. Failure modes: ``AssertionError`` from ``WorkerRec.move`` for a move ``MOVES`` does not
list (a bug of the machine, never of the input).
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


class WorkerState(enum.Enum):
    """Where one worker process stands; ``MOVES`` lists every move the machine makes."""
    STARTING = "starting"    # started; no join of it held and not in a round (its first join is to come)
    JOINED = "joined"        # a join of it is held (unanswered): it waits for a round
    TRAINING = "training"    # released into round ``last`` and not back since
    ENDING = "ending"        # its join was answered "the job is ending": it exits by itself
    ASKED = "asked"          # removed at a join (answered "removed"): it exits 0 by itself, TERM after the grace
    STOPPING = "stopping"    # removed outside a join: SIGTERM sent, SIGKILL after the grace
    KILLED = "killed"        # SIGKILLed: nothing more to send
    EXITED = "exited"        # its process ended by itself (``exit_code``)
    LEFT = "left"            # its process ended after it was removed, or its exit is a leave (SIGTERM)


S = WorkerState
LEAVING = frozenset({S.ASKED, S.STOPPING, S.KILLED})   # removed, not exited yet
ENDED = frozenset({S.EXITED, S.LEFT})                   # the process is gone

# (from, to) -> the event or decision that makes the move: the one table of a worker's life.
MOVES: dict[tuple[WorkerState, WorkerState], str] = {
    (S.STARTING, S.JOINED): "its first join",
    (S.STARTING, S.STOPPING): "removed before it joined (TERM)",
    (S.STARTING, S.EXITED): "it exited, or could not start",
    (S.JOINED, S.JOINED): "a newer join supersedes the held one",
    (S.JOINED, S.TRAINING): "its round is released",
    (S.JOINED, S.ASKED): "removed at its join (answered \"removed\")",
    (S.JOINED, S.ENDING): "its join answered: the job is ending (a worker finished)",
    (S.JOINED, S.EXITED): "it exited while its join was held",
    (S.TRAINING, S.JOINED): "back from its round (a commit after a host change, a runtime error)",
    (S.TRAINING, S.STOPPING): "removed while it trains (TERM)",
    (S.TRAINING, S.EXITED): "it exited while training",
    (S.ENDING, S.STOPPING): "removed while the job ends (TERM)",
    (S.ENDING, S.EXITED): "it exited",
    (S.ASKED, S.STOPPING): "it did not exit within the grace: TERM",
    (S.ASKED, S.KILLED): "named lost by a member: KILL at once",
    (S.ASKED, S.LEFT): "it exited",
    (S.STOPPING, S.KILLED): "it did not exit within the grace, or was named lost: KILL",
    (S.STOPPING, S.LEFT): "it exited",
    (S.KILLED, S.LEFT): "it exited",
    (S.EXITED, S.LEFT): "its exit is a leave (SIGTERM on Kubernetes, or after it asked to leave)",
}


@dataclasses.dataclass
class WorkerRec:
    wid: int
    host: str
    index: int                      # its slot on the host
    state: WorkerState = WorkerState.STARTING
    since: float = 0.0              # when it entered its state
    exit_code: int | None = None
    why: str = ""                   # why it was removed or left (LEAVING, LEFT)
    join: dict = dataclasses.field(default_factory=dict)  # its last join request
    last: int = 0                   # the last round it was released into
    rank: int | None = None         # its rank in the last round it was released into
    failed: bool = False            # it failed (exit, start, timeout, silence): its host was blacklisted
    departing: str = ""             # it asked to leave (SIGTERM): why; it goes at its round's next commit

    def move(self, to: WorkerState, now: float) -> None:
        """Move to ``to``; a move ``MOVES`` does not list is a bug of the machine."""
        if (self.state, to) not in MOVES:
            raise AssertionError(f"{self.name()}: no move from {self.state.name} to {to.name}")
        self.state, self.since = to, now

    def exited(self, code: int, now: float) -> None:
        """Its process ended with ``code``: LEFT when it was being removed, else EXITED."""
        self.exit_code = code
        self.move(WorkerState.LEFT if self.state in LEAVING else WorkerState.EXITED, now)

    @property
    def alive(self) -> bool:
        return self.state not in ENDED

    @property
    def leaving(self) -> bool:
        """Removed by the machine (stopping or gone), or gone by leaving the job."""
        return self.state in LEAVING or self.state is WorkerState.LEFT

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


__all__ = ["ENDED", "LEAVING", "MOVES", "Phase", "Round", "WorkerRec", "WorkerState"]
