"""The elastic machine's failures: a worker that failed, the round nobody can carry on, the lost.

What it owns (the failure rows of ``machine``'s table): ``failure`` (a worker failed: its host is
blacklisted and its other workers removed, or, for a worker that never joined a round, new
workers are held off its host), ``leave_on_sigterm`` (a rank ended by SIGTERM on Kubernetes, or
after it asked to leave: a leave, not a failure), ``check_doomed`` and ``failing`` (every member
failed or lost its host: the job fails naming every rank, with Horovod's phrase),
``lost_by``/``lost`` (members of a round that ended that another member's runtime found silent
past the heartbeat timeout, or whose host went silent over SSH: blacklisted, removed, killed)
and ``reap`` (TERM, then KILL, the removed workers that did not exit within the stop grace).

Env vars: none. Failure modes: none raised; a failed job ends with the ``End`` action.
"""
from __future__ import annotations

from ..failures import describe_exit, exit_code
from .events import Kill
from .records import Phase, WorkerRec, WorkerState as S
from .state import MachineState, break_round, remove, when

SILENT_S = 2.5  # in a round that ended, a member whose host has said nothing over SSH for this long is gone
LOST_GRACE_S = 10.0  # after a member was named lost, the others not back within this are taken as lost too
HOROVOD_FAILED = "Horovod detected that one or more processes exited with non-zero status"


def leave_on_sigterm(m: MachineState, w: WorkerRec, now: float) -> None:
    """Kubernetes: a rank ended by SIGTERM (its pod deleted, ``replicas`` lowered) leaves as a
    removed host does: no blacklist, the round re-forms without it from the last commit; new
    workers are held off its host for the cool-down (its pod is going away)."""
    w.why = w.departing or "it was sent SIGTERM (its pod is being deleted)"
    w.move(S.LEFT, now)
    until = m.membership.hold(w.host, now)
    how = "exited before its round's commit" if w.exit_code == 0 else "ended by SIGTERM"
    m.say(f"{w.name()} on {w.host} {how}: it leaves the job (not a failure); no new worker starts "
          f"there {when(until, now)}")
    if m.is_member(w) and m.phase in (Phase.FORMING, Phase.RUNNING):
        break_round(m, f"{w.name()} left", now)
    check_doomed(m, now)


def failure(m: MachineState, w: WorkerRec, why: str, now: float) -> None:
    """``w`` failed. A worker that never joined a round holds new workers off its host (the
    running ones stay); any other blacklists its host and stops the host's other workers."""
    w.failed = True
    if w.last == 0 and m.released_any:
        until = m.membership.hold(w.host, now)
        m.say(f"{w.name()} {why} before it joined a round; no new worker starts on host {w.host} "
              f"{when(until, now)}")
        if m.is_member(w) and m.phase is Phase.FORMING:
            break_round(m, f"{w.name()} failed", now)
        check_doomed(m, now)
        return
    until = m.membership.blacklist(w.host, now)
    m.say(f"{w.name()} {why}; host {w.host} is blacklisted {when(until, now)}")
    for other in m.live():
        if other is not w and other.host == w.host:
            remove(m, other, f"host {w.host} is blacklisted", now)
    if m.is_member(w):
        if m.phase in (Phase.FORMING, Phase.RUNNING):
            break_round(m, f"{w.name()} failed", now)
        m.round.failed = True
    check_doomed(m, now)


def check_doomed(m: MachineState, now: float) -> None:
    """Every member of the round failed or lost its host: nobody holds the training state and
    nobody can take it on; the job fails (``failing``) once the members still stopping exit."""
    if m.round is None or m.phase not in (Phase.FORMING, Phase.RUNNING, Phase.BREAKING):
        return
    members = m.members()
    lost = [w for w in members if w.failed or (w.exit_code not in (None, 0) and not w.leaving)
            or (w.leaving and m.membership.is_blacklisted(w.host, now))]
    if len(lost) == len(members) and any(w.failed for w in members):
        m.phase, m.failing_since = Phase.FAILING, now


def failing(m: MachineState, now: float) -> None:
    """End the failed job naming every rank (Horovod's failure message), once every member has
    exited (so its own exit code is named) or the stop grace has passed."""
    members = m.members()
    if any(w.alive for w in members) and now - m.failing_since <= m.config.stop_grace_s:
        return
    first = next((w for w in members if w.failed and w.exit_code is not None), None)
    every = "every rank failed" if all(w.exit_code not in (None, 0) for w in members) else "every host failed"

    def one(w: WorkerRec) -> str:
        what = describe_exit(w.exit_code) if w.exit_code is not None else "was stopped (its host was blacklisted)"
        return f"{w.name()} {what}"
    m.end(exit_code(first.exit_code) if first is not None else 1,
          f"{HOROVOD_FAILED}: {every}: " + "; ".join(one(w) for w in members),
          first.rank if first else None, first.host if first else None)


def lost_by(m: MachineState, w: WorkerRec) -> list[WorkerRec]:
    """The members back from the current round whose runtime found ``w`` silent past the
    heartbeat timeout (their join's ``lost``)."""
    return [o for o in m.members() if o.state is S.JOINED and o.join.get("last") == m.round.id
            and isinstance(o.join.get("lost"), list) and w.rank in o.join["lost"][:64]]


def lost(m: MachineState, back: list[WorkerRec], now: float) -> list[WorkerRec]:
    """Of ``back`` (members of the round that ended, still training in it), the ones found lost
    are blacklisted and removed: named lost by a member back from the round (a stopped process,
    a frozen host: killed at once) or silent over SSH. Returns the others."""
    cur = m.round
    for w in back:  # named lost by a member back from the round (a stopped process, a frozen host): killed now
        by = lost_by(m, w)
        if by and not w.leaving:
            failure(m, w, f"showed no sign of life to {by[0].name()} for the heartbeat timeout "
                          "(APPLIANCE_HEARTBEAT_TIMEOUT: a stopped process or a frozen host)", now)
            remove(m, w, "it showed no sign of life", now)
            cur.lost_at = now if cur.lost_at is None else cur.lost_at
            if w.state in (S.ASKED, S.STOPPING):
                w.move(S.KILLED, now)
                m.emit(Kill(w.wid))
    for w in back:  # a silent host: its SSH heartbeats stopped (sooner than the SSH timeout)
        if w.wid in m.silent and not w.leaving:
            failure(m, w, f"stopped answering: nothing from {w.host} over SSH for {SILENT_S:g} s", now)
            remove(m, w, "its host stopped answering", now)
    return [w for w in back if not w.leaving and w.alive]


def reap(m: MachineState, now: float) -> None:
    for w in m.workers.values():
        if w.state in (S.ASKED, S.STOPPING) and now - w.since > m.config.stop_grace_s:
            if w.state is S.ASKED:  # it did not exit by itself: TERM now, KILL after another grace
                w.move(S.STOPPING, now)
                m.emit(Kill(w.wid, term=True))
            else:
                w.move(S.KILLED, now)
                m.emit(Kill(w.wid))


__all__ = ["HOROVOD_FAILED", "LOST_GRACE_S", "SILENT_S", "check_doomed", "failing", "failure", "leave_on_sigterm", "lost", "lost_by",
           "reap"]
