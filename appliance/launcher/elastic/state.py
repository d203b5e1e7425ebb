"""What the elastic machine's transitions share: the job's state and the moves every concern makes.

What it owns: ``MachineState`` (one elastic job as the machine knows it: its phase, workers,
current round, membership, the hosts checked, being checked and pending, the actions decided so
far, and the helpers every transition reads: the live workers, the round's members, the line that
names the hosts) and the moves that rounds, failures and hosts all make: ``remove`` (a worker is
told to go or stopped, ``records.WorkerState``), ``break_round`` (the running or forming round
ends) and ``when`` (how long a host stays out, in words). ``machine.Machine`` adds the event
dispatch; ``rounds``, ``failures`` and ``hosts`` implement the transitions its docstring tables.

Env vars: none (the launch's ``LaunchConfig`` with its ``ElasticConfig``, handed whole, carries
what the launcher read). Failure modes: none raised; the job's end is the ``End`` action (``end``).
"""
from __future__ import annotations

import math
from typing import Callable

from appliance.launcher.config import LaunchConfig
from .events import Action, End, Remove, Say
from .membership import Membership
from .pending import PendingHosts
from .records import Phase, Round, WorkerRec, WorkerState as S


class MachineState:
    """One elastic job's state and the helpers its transitions share (see the module docstring)."""

    def __init__(self, config: LaunchConfig, rand: Callable[[], float] | None = None):
        assert config.elastic is not None
        self.config, self.e = config, config.elastic  # the launch (-np, stop grace, -v) and its elastic rules
        kw = {} if rand is None else {"rand": rand}
        self.membership = Membership(self.e.min_np, self.e.max_np, self.e.cooldown_range, self.e.reset_limit, **kw)
        self.phase = Phase.WAITING
        self.workers: dict[int, WorkerRec] = {}
        self.round: Round | None = None
        self.rounds = 0
        self.released_any = False
        self.discovered = False
        self.opened: set[str] = set()
        self.opening: set[str] = set()
        self.short_since: float | None = None
        self.discovery_error = ""
        self.notices = 0
        self.silent: frozenset = frozenset()
        self.outcome: End | None = None
        self.failing_since = 0.0
        self.clamped: set[str] = set()  # hosts whose slot count was said to be cut down
        self.pending = PendingHosts()   # listed hosts that do not answer yet (Kubernetes)
        self._out: list[Action] = []

    def emit(self, action: Action) -> None:
        self._out.append(action)

    def take(self) -> list[Action]:
        """The actions decided since the last call."""
        out, self._out = self._out, []
        return out

    def say(self, text: str) -> None:
        self.emit(Say(text))

    def end(self, code: int, reason: str = "", rank: int | None = None, host: str | None = None) -> None:
        if self.phase is Phase.ENDED:
            return
        self.outcome = End(code, reason, rank, host)
        self.phase = Phase.ENDED
        self.emit(self.outcome)

    def live(self) -> list[WorkerRec]:
        return [w for w in self.workers.values() if w.alive and not w.leaving]

    def members(self) -> list[WorkerRec]:
        return [self.workers[m] for m in self.round.members] if self.round is not None else []

    def is_member(self, w: WorkerRec) -> bool:
        return (self.round is not None and w.wid in self.round.members
                and self.phase in (Phase.FORMING, Phase.RUNNING, Phase.BREAKING))

    def hosts_line(self, now: float) -> str:
        out = ", ".join(f"{h}:{s}" for h, s in self.membership.available(now)) or "none"
        black = [h for h in self.membership.hosts if self.membership.is_blacklisted(h, now)]
        leaving = sorted({w.host for w in self.live() if w.departing})
        return (out + (f"; blacklisted: {', '.join(black)}" if black else "")
                + (f"; leaving: {', '.join(leaving)}" if leaving else ""))


def when(until: float, now: float) -> str:
    return "for good" if until == math.inf else f"for {until - now:.0f} s"


def remove(m: MachineState, w: WorkerRec, why: str, now: float) -> None:
    """Take ``w`` out: asked to go at its held join (it exits 0 by itself), else stopped (TERM)."""
    if w.leaving or not w.alive:
        return
    ask = w.state is S.JOINED  # at a join: told to leave, it exits 0 by itself (TERM only after the grace)
    w.why = why
    w.move(S.ASKED if ask else S.STOPPING, now)
    m.emit(Remove(w.wid, why, ask=ask))


def break_round(m: MachineState, why: str, now: float) -> None:
    if m.phase in (Phase.FORMING, Phase.RUNNING):
        m.phase = Phase.BREAKING
        m.round.broken_at = now
        if m.config.verbose:
            m.say(f"round {m.round.id} ends: {why}")


__all__ = ["MachineState", "break_round", "remove", "when"]
