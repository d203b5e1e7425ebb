"""Naming the straggler: the rank the others keep waiting for (pure logic, no I/O).

What it owns: ``find_straggler(windows, rule)``, the rule over one window of every rank's counter
differences, and ``StragglerTracker``, which applies it as windows come and says when a straggler
is named and when it recovers. The rule: over the window, the median over the other ranks of
their negotiation wait per step is above the threshold (``min_wait_s``, and ``min_share`` of the
step time), and this rank's lateness per step (how long the others waited for it) is the largest,
above the threshold, and ``clear_ratio`` times above the next rank's. The line reads
``straggler: rank 5 on node3 keeps the others waiting 41 ms per step (38% of step time)``. It is
named on the first window that satisfies the rule and cleared after ``clear_after_s`` of windows
that do not name it.

Env vars: none. Failure modes: none (a rank without steps in the window takes no part).
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Optional, Sequence


@dataclasses.dataclass(frozen=True)
class RankWindow:
    """One rank's counter differences over the window."""
    rank: int
    host: str
    dstep: float
    dt: float
    dwait_s: float
    dlate_s: float


@dataclasses.dataclass(frozen=True)
class Rule:
    min_wait_s: float = 0.010
    min_share: float = 0.05
    clear_ratio: float = 2.0
    clear_after_s: float = 3.0


@dataclasses.dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    late_per_step_s: float
    step_time_s: float

    @property
    def share(self) -> float:
        return self.late_per_step_s / self.step_time_s if self.step_time_s > 0 else 0.0

    def line(self) -> str:
        return (f"straggler: rank {self.rank} on {self.host} keeps the others waiting "
                f"{self.late_per_step_s * 1e3:.0f} ms per step ({self.share * 100:.0f}% of step time)")


def find_straggler(windows: Sequence[RankWindow], rule: Rule = Rule()) -> Optional[Straggler]:
    """The straggler of one window, or None (see the module docstring)."""
    usable = [w for w in windows if w.dstep > 0 and w.dt > 0]
    if len(usable) < 2:
        return None
    late = sorted(usable, key=lambda w: w.dlate_s / w.dstep, reverse=True)
    top, second = late[0], late[1]
    top_late = top.dlate_s / top.dstep
    step_time = statistics.median(w.dt / w.dstep for w in usable)
    threshold = max(rule.min_wait_s, rule.min_share * step_time)
    others_wait = statistics.median(w.dwait_s / w.dstep for w in usable if w is not top)
    if others_wait <= threshold or top_late <= threshold:
        return None
    if top_late < rule.clear_ratio * max(second.dlate_s / second.dstep, 0.0) or top_late <= 0:
        return None
    return Straggler(top.rank, top.host, top_late, step_time)


class StragglerTracker:
    """Applies the rule window after window; ``update`` returns the line to say on a change."""

    def __init__(self, rule: Rule = Rule()):
        self.rule = rule
        self.current: Optional[Straggler] = None
        self._miss_since: Optional[float] = None

    def update(self, windows: Sequence[RankWindow], now: float) -> Optional[str]:
        found = find_straggler(windows, self.rule)
        if found is not None:
            self._miss_since = None
            named = self.current is None or found.rank != self.current.rank
            self.current = found
            return found.line() if named else None
        if self.current is None:
            return None
        if self._miss_since is None:
            self._miss_since = now
        if now - self._miss_since >= self.rule.clear_after_s:
            gone, self.current, self._miss_since = self.current, None, None
            return f"straggler cleared: rank {gone.rank} on {gone.host} keeps pace again"
        return None


__all__ = ["RankWindow", "Rule", "Straggler", "StragglerTracker", "find_straggler"]
