"""The elastic machine's rounds: forming one, releasing it, running, breaking, growing, notices.

What it owns (the round rows of ``machine``'s table): ``form`` (lay out the next round on the
slots there are: start workers for free slots, remove the ones outside it, count the reset),
``forming`` and ``release`` (every member joined: each is answered with its place), ``running``
(the ``--min-np`` clock, ``notify`` every member at once when the target changed, ``grow`` onto
free slots), ``breaking`` (the members come back for the next round; the lost ones go,
``failures.lost``), ``finishing`` (a worker finished: the job ends when the others have) and
``spawn`` (a new worker record and its ``Spawn`` action).

Env vars: none. Failure modes: none raised; too few slots for ``--elastic-timeout``, the reset
limit used up, or no worker left with the training state end the job (``End``).
"""
from __future__ import annotations

from typing import Any

from .events import Answer, Member, Notify, Release, Spawn
from .failures import LOST_GRACE_S, failure, lost
from .hosts import open_hosts, target_slots
from .membership import HostUpdate, ResetLimitExceeded, layout
from .records import Phase, Round, WorkerRec, WorkerState as S
from .state import MachineState, break_round, remove
from .waiting import say_late, short_of_slots


def form(m: MachineState, now: float) -> None:
    first = not m.released_any
    needed = m.config.np if first else m.e.min_np
    target = target_slots(m, now)
    if open_hosts(m, target, now):
        return  # a host of the target is being checked: form once it answers
    wanted = set(target)
    have: dict[tuple[str, int], WorkerRec] = {}
    for w in m.live():
        if (w.host, w.index) in wanted and (w.host, w.index) not in have and not w.departing:
            have[(w.host, w.index)] = w
    free = [t for t in target if t not in have and t[0] in m.opened]
    if len(have) + len(free) < needed:
        if m.short_since is None:
            m.short_since = now
            m.say(f"waiting for {needed} slots ({len(have) + len(free)} available; at most {m.e.timeout_s:g} s)")
        elif now - m.short_since > m.e.timeout_s:
            m.end(1, f"fewer than {'-np' if first else '--min-np'} {needed} slots were available for "
                     f"{m.e.timeout_s:g} s (--elastic-timeout); hosts: {m.hosts_line(now)}")
        return
    m.short_since = None
    hosts_now = dict(m.membership.available(now))
    for w in m.live():
        if have.get((w.host, w.index)) is not w:
            remove(m, w, w.departing or (f"host {w.host} is no longer part of the job" if w.host not in hosts_now
                                         else "its slot is no longer part of the job"), now)
    previous = m.round
    if not first:
        if not any(w.last > 0 for w in have.values()):
            m.end(1, f"no worker of the last round is left to hold the training state (hosts now: {m.hosts_line(now)})")
            return
        try:
            m.membership.count_reset()
        except ResetLimitExceeded as e:
            m.end(1, str(e))
            return
    m.rounds += 1
    order = m.membership.order(now)
    planned = layout([(w.wid, w.host, w.index) for w in have.values()] +
                     [(-1 - i, h, s) for i, (h, s) in enumerate(free)], order)
    for i, (host, index) in enumerate(free):
        have[(host, index)] = spawn(m, host, index, planned[-1 - i], now)
    members = list(have.values())
    slots = layout([(w.wid, w.host, w.index) for w in members], order)
    ranked = sorted(members, key=lambda w: slots[w.wid].rank)
    sync = (previous is None or previous.failed or any(w.last == 0 for w in members)
            or any(w.join.get("reason") == "error" for w in members))
    m.round = Round(m.rounds, [w.wid for w in ranked], slots, sync, now)
    m.phase = Phase.FORMING
    if not first:
        grown = len(members) - len(previous.members) if previous else 0
        what = f"{len(members)} rank{'s' if len(members) != 1 else ''}" + (f" ({grown:+d})" if grown else "")
        limit = "" if m.e.reset_limit is None else f" of {m.e.reset_limit}"
        m.say(f"round {m.rounds}: {what} on {', '.join(dict.fromkeys(slots[w.wid].host for w in ranked))} "
              f"(reset {m.membership.resets}{limit})")
    if all(w.state is S.JOINED for w in members):
        release(m, now)


def release(m: MachineState, now: float) -> None:
    cur = m.round
    members = m.members()
    m.emit(Release(cur.id, tuple(Member(w.wid, w.host, cur.slots[w.wid], dict(w.join)) for w in members), cur.sync))
    for w in members:
        w.move(S.TRAINING, now)
        w.last, w.rank = cur.id, cur.slots[w.wid].rank
    m.phase = Phase.RUNNING
    m.released_any = True
    if m.config.verbose:
        m.say(f"round {cur.id} started: {len(members)} ranks, sync {cur.sync}")


def forming(m: MachineState, now: float) -> None:
    cur, members = m.round, m.members()
    if any(not w.alive or w.leaving for w in members):
        break_round(m, "a member left before the round started", now)
        breaking(m, now)
    elif all(w.state is S.JOINED for w in members):
        release(m, now)
    elif now - cur.formed_at > m.e.timeout_s:
        for w in members:
            if w.state is not S.JOINED:
                failure(m, w, f"did not join round {cur.id} within {m.e.timeout_s:g} s", now)
                remove(m, w, "did not join in time", now)
    else:
        say_late(m, [w for w in members if w.state is not S.JOINED], "to join", cur.formed_at, now)


def running(m: MachineState, now: float) -> None:
    if short_of_slots(m, m.e.min_np, "--min-np", now, keep=True):
        return
    notify(m, now)
    grow(m, now)


def breaking(m: MachineState, now: float) -> None:
    cur = m.round
    back = lost(m, [w for w in m.members() if w.state is S.TRAINING], now)
    if m.phase is not Phase.BREAKING:
        return
    if not back:
        form(m, now)
    elif cur.lost_at is not None and now - cur.lost_at > LOST_GRACE_S:  # another frozen host, not named
        for w in back:
            failure(m, w, f"did not come back within {LOST_GRACE_S:g} s after a member of round {cur.id} was "
                          "found silent", now)
            remove(m, w, "did not come back in time", now)
    elif now - cur.broken_at > m.e.timeout_s:
        for w in back:
            failure(m, w, f"did not come back within {m.e.timeout_s:g} s after round {cur.id} ended", now)
            remove(m, w, "did not come back in time", now)
    else:
        say_late(m, back, "to come back for a new round", cur.broken_at, now)


def notify(m: MachineState, now: float) -> None:
    """Discovery changed the slots the job should run on: tell every member at once (before any
    host is checked or worker started), once per target."""
    cur = m.round
    target = target_slots(m, now)
    members = {(w.host, w.index) for w in m.members()}
    if set(target) == members or (cur.notified and cur.notified[0] == tuple(target)):
        return
    result = ((HostUpdate.added if any(t not in members for t in target) else HostUpdate.no_update)
              | (HostUpdate.removed if any(t not in set(target) for t in members) else HostUpdate.no_update))
    m.notices += 1
    cur.notified = (tuple(target), int(result), m.notices)
    m.emit(Notify(tuple(cur.members), int(result), cur.id, m.notices))
    m.say(f"hosts changed ({HostUpdate(result).name}): available now {m.hosts_line(now)}; round {cur.id} "
          "moves to the new layout at its next commit")


def grow(m: MachineState, now: float) -> None:
    """Start workers for the target's free slots on checked hosts: they wait for the next round
    while the members train."""
    target = target_slots(m, now)
    open_hosts(m, target, now)
    held = {(w.host, w.index) for w in m.live()}
    order = m.membership.order(now)
    wanted = set(target)
    for host, index in target:
        if (host, index) in held or host not in m.opened:
            continue
        planned = layout([(w.wid, w.host, w.index) for w in m.live() if (w.host, w.index) in wanted]
                         + [(-1, host, index)], order)
        spawn(m, host, index, planned[-1], now)
        held.add((host, index))


def spawn(m: MachineState, host: str, index: int, slot: Any, now: float) -> WorkerRec:
    wid = len(m.workers)
    w = WorkerRec(wid, host, index)
    m.workers[wid] = w
    order = m.membership.order(now)
    m.emit(Spawn(wid, host, index, slot, tuple(sorted(m.opened)), order[0] if order else host))
    return w


def finishing(m: MachineState, now: float) -> None:
    for w in m.workers.values():
        if w.state is S.JOINED:
            w.move(S.ENDING, now)
            m.emit(Answer(w.wid, {"error": "the job is ending: a worker finished"}))
    if all(not w.alive for w in m.workers.values()):
        m.end(0)


__all__ = ["breaking", "finishing", "form", "forming", "grow", "notify", "release", "running", "spawn"]
