"""What an elastic job says and decides while it waits: for members, and for slots.

What it owns: ``say_late`` (once per round, the members it still waits for) and
``short_of_slots`` (the ``--elastic-timeout`` clock while fewer slots than needed are listed),
helpers of the round transitions (``rounds``), taking the machine (``state.MachineState``).

Env vars: none. Failure modes: none raised; ``short_of_slots`` ends the job through ``MachineState.end``.
"""
from __future__ import annotations

import math
from typing import Any

LATE_S = 10.0  # a round that has waited this long for members says which (once)


def say_late(m: Any, late: list, what: str, since: float, now: float) -> None:
    """Once per round, when it has waited ``LATE_S`` for members: name them and the deadline."""
    cur = m.round
    if late and not cur.late_said and now - since > min(LATE_S, m.e.timeout_s / 2):
        cur.late_said = True
        names = ", ".join(w.name() for w in late[:4]) + (f" and {len(late) - 4} more" if len(late) > 4 else "")
        m.say(f"round {cur.id} waits for {names} {what} (at most {m.e.timeout_s:g} s, --elastic-timeout)")


def short_of_slots(m: Any, needed: int, flag: str, now: float, keep: bool) -> bool:
    """Fewer than ``needed`` slots are listed: start (or check) the ``--elastic-timeout`` clock.
    ``keep``: the round's workers keep training meanwhile (they alone hold the state)."""
    have = min(m.membership.total_slots(now), math.inf if m.e.max_np is None else m.e.max_np)
    if have >= needed:
        if m.short_since is not None and keep:
            m.say(f"{have} slots are listed again")
        m.short_since = None
        return False
    if m.short_since is None:
        m.short_since = now
        m.say(f"waiting for {needed} slots ({have} available; at most {m.e.timeout_s:g} s)"
              + ("; the ranks keep training meanwhile" if keep else ""))
    elif now - m.short_since > m.e.timeout_s:
        m.end(1, f"fewer than {flag} {needed} slots were available for {m.e.timeout_s:g} s (--elastic-timeout); "
                 f"hosts: {m.hosts_line(now)}")
    return True


__all__ = ["LATE_S", "say_late", "short_of_slots"]
