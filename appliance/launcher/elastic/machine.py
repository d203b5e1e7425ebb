"""The elastic job as a pure state machine: events in, actions out, the clock passed in.

What it owns: ``Machine`` (the state of one elastic job: its phase, workers, current round,
membership, hosts being checked) and one function per transition. ``Machine.handle(event, now)``
applies one event (``events``: ``Joined``, ``Watching``, ``Leaving``, ``Exited``, ``SpawnFailed``,
``Discovered``, ``DiscoveryFailed``, ``HostOpened``, ``Tick``), then advances the phase, and
returns the actions (``Spawn``, ``Remove``, ``Kill``, ``Answer``, ``Release``, ``Notify``,
``OpenHosts``, ``CloseHosts``, ``Say``, ``End``) for the I/O shell (``driver.ElasticDriver``) to carry out. No
threads, processes, sockets or clock readings here: the tests drive it with a fake clock.

Phases (``records.Phase``) and transitions, the one table of the elastic driver:

| phase | event / condition | transition | next phase |
| --- | --- | --- | --- |
| WAITING | discovery listed hosts not yet checked | ``open_hosts``: ``OpenHosts`` | WAITING |
| any | a host's check failed (Kubernetes: its pod is listed before its sshd or DNS is up) | ``on_host_opened``: pending (``pending.py``), checked again after a doubling pause, one line a minute at most; never blacklisted | same |
| any | a pending host's check passes | ``on_host_opened``: its slots count from now | same |
| any | a host's check failed (elsewhere) | ``on_host_opened``: blacklisted (the cool-down, if any) | same |
| WAITING, BREAKING | enough checked slots (``-np`` first, then ``--min-np``) | ``form``: ``Spawn`` new slots, lay out ranks (reset counted after the first release) | FORMING |
| WAITING, BREAKING | too few slots for ``--elastic-timeout`` | ``form``: ``End`` "fewer than ... slots" | ENDED |
| BREAKING | no worker of the last round left / reset limit used up | ``form``: ``End`` (Horovod's reset-limit sentence) | ENDED |
| FORMING | every member has joined | ``release``: ``Release`` | RUNNING |
| FORMING | a member left, or did not join within ``--elastic-timeout`` | ``forming``: blacklist, ``Remove`` | BREAKING |
| RUNNING | discovery changed the target slots | ``notify``: ``Notify`` every member at once, before any check or start | RUNNING |
| RUNNING | checked free slots in the target | ``grow``: ``Spawn`` (the new workers join the next round) | RUNNING |
| RUNNING | fewer than ``--min-np`` slots listed | ``running``: keep every worker; ``End`` after ``--elastic-timeout`` | RUNNING / ENDED |
| RUNNING | a member joins again (runtime error, host change) or exits | ``on_joined`` / ``on_exited``: ``break_round`` | BREAKING |
| BREAKING | every member still running joined again | ``breaking``: ``form`` | FORMING |
| BREAKING | a member named lost (``lost``: silent past the heartbeat timeout) by a member back from the round | ``breaking``: blacklist, ``Remove`` and ``Kill`` it at once (a stopped process too) | BREAKING |
| BREAKING | a member was named lost and others are not back ``LOST_GRACE_S`` later (another frozen host) | ``breaking``: blacklist, ``Remove`` | BREAKING |
| BREAKING | a member silent over SSH, or not back within ``--elastic-timeout`` | ``breaking``: blacklist, ``Remove`` | BREAKING |
| any | a worker exits non-zero (or cannot start) | ``failure``: blacklist its host, ``Remove`` its other workers; a worker that never joined a round only holds new workers off its host | same / BREAKING |
| FORMING, RUNNING, BREAKING | every member failed or lost its host | ``check_doomed`` | FAILING |
| FAILING | the members still stopping have exited, or the stop grace passed | ``failing``: ``End`` naming every rank and its exit, with Horovod's phrase | ENDED |
| any | a worker sent SIGTERM asks to leave (``Leaving``: its pod is being deleted) | ``on_leaving``: no blacklist, new workers held off its host for the cool-down; its slot leaves the target, so a running round's members are told at once (``notify``), its round ends at the next commit and the next round forms without it (``removed`` at its join, it exits 0); not in a running round: ``Remove`` now | same |
| any | Kubernetes, or a worker that asked to leave: ended by SIGTERM (pod deleted, ``replicas`` lowered; a departing one also exiting 0) | ``leave_on_sigterm``: it leaves, no blacklist; new workers held off its host for the cool-down; a member's round breaks | same / BREAKING |
| any | a worker exits 0 | ``on_exited``: ``Remove`` workers that never joined | FINISHING |
| FINISHING | every worker exited / one failed | ``finishing``: ``End`` 0 / its code | ENDED |
| any | ``Tick`` | ``reap``: TERM, then KILL, workers that did not leave within the grace | same |
| any but ENDED | a checked host has no live worker and is not listed, or is blacklisted for good (Kubernetes: or blacklisted or held at all: its pod is re-created) | ``close_hosts``: ``CloseHosts`` (listed again: ``OpenHosts`` again) | same |

Env vars: none (``records.Settings`` carries what the launcher read). Failure modes: none raised; the
job's end is the ``End`` action (also kept as ``Machine.outcome``).
"""
from __future__ import annotations

import math
from signal import SIGTERM
from typing import Any, Callable

from ..failures import describe_exit, exit_code
from .events import (Action, Answer, CloseHosts, Discovered, DiscoveryFailed, End, Exited, HostOpened, Joined, Kill,
                     Leaving, Member, Notify, OpenHosts, Release, Remove, Say, Spawn, SpawnFailed, Tick, Watching)
from .membership import HostUpdate, Membership, ResetLimitExceeded, layout
from .pending import PendingHosts
from .records import Phase, Round, Settings, WorkerRec, WorkerState as S
from .waiting import say_late, short_of_slots

LOST_GRACE_S = 10.0  # after a member was named lost, the others not back within this are taken as lost too
HOROVOD_FAILED = "Horovod detected that one or more processes exited with non-zero status"


class Machine:
    """One elastic job's decisions (see the module docstring)."""

    def __init__(self, settings: Settings, rand: Callable[[], float] | None = None):
        self.s = settings
        kw = {} if rand is None else {"rand": rand}
        self.membership = Membership(settings.min_np, settings.max_np, settings.cooldown_range,
                                     settings.reset_limit, **kw)
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

    def handle(self, event: Any, now: float) -> list[Action]:
        if self.phase is not Phase.ENDED:
            TRANSITIONS[type(event)](self, event, now)
            advance(self, now)
        out, self._out = self._out, []
        return out

    # -- helpers the transitions share ----------------------------------------------------------
    def emit(self, action: Action) -> None:
        self._out.append(action)

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

    def target(self, now: float) -> list[tuple[str, int]]:
        """The slots that should run workers: discovery's target, less the free slots of hosts
        where new workers are held off or that are pending (listed, not answering yet)."""
        held = {(w.host, w.index) for w in self.live() if not w.departing}
        return [t for t in self.membership.target(now)
                if t in held or not (self.membership.is_held(t[0], now) or t[0] in self.pending.hosts)]

    def hosts_line(self, now: float) -> str:
        out = ", ".join(f"{h}:{s}" for h, s in self.membership.available(now)) or "none"
        black = [h for h in self.membership.hosts if self.membership.is_blacklisted(h, now)]
        leaving = sorted({w.host for w in self.live() if w.departing})
        return (out + (f"; blacklisted: {', '.join(black)}" if black else "")
                + (f"; leaving: {', '.join(leaving)}" if leaving else ""))


def _when(until: float, now: float) -> str:
    return "for good" if until == math.inf else f"for {until - now:.0f} s"


# -- events -------------------------------------------------------------------------------------
def on_joined(m: Machine, ev: Joined, now: float) -> None:
    w = m.workers.get(ev.wid)
    if w is None or not w.alive:
        m.emit(Answer(ev.wid, {"error": f"worker {ev.wid} is not part of this job"}))
        return
    if m.phase in (Phase.FINISHING, Phase.FAILING):
        m.emit(Answer(ev.wid, {"error": "the job is ending"}))
        return
    if w.leaving:
        m.emit(Answer(ev.wid, {"removed": w.why}))
        return
    back = w.state is S.TRAINING
    w.move(S.JOINED, now)
    w.join = dict(ev.message)
    if back and m.phase in (Phase.RUNNING, Phase.BREAKING) and m.is_member(w):
        break_round(m, f"{w.name()} asked for a new round ({ev.message.get('reason', '?')})", now)
        if ev.message.get("reason") != "hosts":
            m.round.failed = True


def on_watching(m: Machine, ev: Watching, now: float) -> None:
    """A member that opens its stream after its round's notice gets the notice now."""
    w = m.workers.get(ev.wid)
    cur = m.round
    if w is not None and m.phase is Phase.RUNNING and cur is not None and w.wid in cur.members and cur.notified:
        _, result, seq = cur.notified
        m.emit(Notify((w.wid,), result, cur.id, seq))


def on_leaving(m: Machine, ev: Leaving, now: float) -> None:
    """A worker sent SIGTERM asks to leave: it goes as a host removed from discovery does (its
    slot leaves the target, ``notify``), at its round's next commit; no blacklist."""
    w = m.workers.get(ev.wid)
    refused = (f"worker {ev.wid} is not part of this job" if w is None or not w.alive else
               "the launcher is stopping it" if w.leaving else
               "the job is ending" if m.phase in (Phase.FINISHING, Phase.FAILING) else "")
    m.emit(Answer(ev.wid, {"error": refused} if refused else {"leave": True}, leave=True))
    if refused or w.departing:
        return
    w.departing = "it was sent SIGTERM" + (" (its pod is being deleted)" if m.s.kubernetes else "")
    until = m.membership.hold(w.host, now)
    m.say(f"{w.name()} was sent SIGTERM: it leaves the job at its next commit (not a failure); no new worker "
          f"starts on {w.host} {_when(until, now)}")
    if not (m.is_member(w) and w.state is S.TRAINING):  # not training in a round: nothing to wait for
        remove(m, w, w.departing, now)


def on_exited(m: Machine, ev: Exited, now: float) -> None:
    w = m.workers.get(ev.wid)
    if w is None or not w.alive:
        return
    w.exited(ev.code, now)
    if m.phase is Phase.FAILING:
        return
    if m.phase is Phase.FINISHING:
        if ev.code != 0 and not w.leaving:
            m.end(exit_code(ev.code), f"{w.name()} {describe_exit(ev.code)}", w.rank, w.host)
        return
    if w.leaving:
        if m.is_member(w) and m.phase in (Phase.FORMING, Phase.RUNNING):
            break_round(m, f"{w.name()} left", now)
        check_doomed(m, now)
        return
    if ((m.s.kubernetes or w.departing) and ev.code in (-SIGTERM, 128 + SIGTERM)) or (w.departing and ev.code == 0):
        leave_on_sigterm(m, w, now)
        return
    if ev.code == 0:
        m.phase = Phase.FINISHING
        if m.s.verbose:
            m.say(f"{w.name()} finished: the job ends when the others do")
        for other in m.live():
            if other.last == 0:
                remove(m, other, "the job is ending", now)
        return
    failure(m, w, ev.cause or describe_exit(ev.code), now)


def on_spawn_failed(m: Machine, ev: SpawnFailed, now: float) -> None:
    w = m.workers.get(ev.wid)
    if w is not None and w.alive:
        w.exited(ev.code, now)
        failure(m, w, f"could not start: {ev.message}", now)


def on_discovered(m: Machine, ev: Discovered, now: float) -> None:
    if m.discovery_error:
        m.say("host discovery works again")
        m.discovery_error = ""
    m.membership.update(ev.hosts, now)
    m.pending.keep_only(ev.hosts)
    m.discovered = True
    for host in set(m.membership.clamped) - m.clamped:
        m.clamped.add(host)
        m.say(f"host {host} lists {ev.hosts[host]} slots; an elastic job uses at most "
              f"{m.membership.hosts[host].slots} on one host")


def on_discovery_failed(m: Machine, ev: DiscoveryFailed, now: float) -> None:
    if ev.first:
        m.end(1, ev.message)
        return
    if ev.message != m.discovery_error:
        m.say(f"{ev.message} (retrying every {m.s.discovery_interval_s:g} s)")
    m.discovery_error = ev.message


def on_host_opened(m: Machine, ev: HostOpened, now: float) -> None:
    m.opening.discard(ev.host)
    if ev.failure is None:
        m.opened.add(ev.host)
        waited = m.pending.opened(ev.host, now)
        if waited is not None:
            m.say(f"host {ev.host} answers now, after {waited:.0f} s pending")
        return
    if m.s.kubernetes:  # listed (its pod is Running) but its sshd or DNS record is not up yet
        if m.pending.failed(ev.host, now):
            m.say(f"host {ev.host} is listed but does not answer yet; pending, checked again (this line at most "
                  f"once a minute): {ev.failure}")
        return
    until = m.membership.blacklist(ev.host, now)
    m.say(f"host {ev.host} cannot run ranks, blacklisted {_when(until, now)}: {ev.failure}")


def on_tick(m: Machine, ev: Tick, now: float) -> None:
    m.silent = ev.silent
    reap(m, now)


TRANSITIONS: dict[type, Callable[[Machine, Any, float], None]] = {
    Joined: on_joined, Watching: on_watching, Leaving: on_leaving, Exited: on_exited, SpawnFailed: on_spawn_failed,
    Discovered: on_discovered, DiscoveryFailed: on_discovery_failed, HostOpened: on_host_opened, Tick: on_tick,
}


# -- failures -----------------------------------------------------------------------------------
def leave_on_sigterm(m: Machine, w: WorkerRec, now: float) -> None:
    """Kubernetes: a rank ended by SIGTERM (its pod deleted, ``replicas`` lowered) leaves as a
    removed host does: no blacklist, the round re-forms without it from the last commit; new
    workers are held off its host for the cool-down (its pod is going away)."""
    w.why = w.departing or "it was sent SIGTERM (its pod is being deleted)"
    w.move(S.LEFT, now)
    until = m.membership.hold(w.host, now)
    how = "exited before its round's commit" if w.exit_code == 0 else "ended by SIGTERM"
    m.say(f"{w.name()} on {w.host} {how}: it leaves the job (not a failure); no new worker starts "
          f"there {_when(until, now)}")
    if m.is_member(w) and m.phase in (Phase.FORMING, Phase.RUNNING):
        break_round(m, f"{w.name()} left", now)
    check_doomed(m, now)


def failure(m: Machine, w: WorkerRec, why: str, now: float) -> None:
    """``w`` failed. A worker that never joined a round holds new workers off its host (the
    running ones stay); any other blacklists its host and stops the host's other workers."""
    w.failed = True
    if w.last == 0 and m.released_any:
        until = m.membership.hold(w.host, now)
        m.say(f"{w.name()} {why} before it joined a round; no new worker starts on host {w.host} "
              f"{_when(until, now)}")
        if m.is_member(w) and m.phase is Phase.FORMING:
            break_round(m, f"{w.name()} failed", now)
        check_doomed(m, now)
        return
    until = m.membership.blacklist(w.host, now)
    m.say(f"{w.name()} {why}; host {w.host} is blacklisted {_when(until, now)}")
    for other in m.live():
        if other is not w and other.host == w.host:
            remove(m, other, f"host {w.host} is blacklisted", now)
    if m.is_member(w):
        if m.phase in (Phase.FORMING, Phase.RUNNING):
            break_round(m, f"{w.name()} failed", now)
        m.round.failed = True
    check_doomed(m, now)


def check_doomed(m: Machine, now: float) -> None:
    """Every member of the round failed or lost its host: nobody holds the training state and
    nobody can take it on; the job fails (``failing``) once the members still stopping exit."""
    if m.round is None or m.phase not in (Phase.FORMING, Phase.RUNNING, Phase.BREAKING):
        return
    members = m.members()
    lost = [w for w in members if w.failed or (w.exit_code not in (None, 0) and not w.leaving)
            or (w.leaving and m.membership.is_blacklisted(w.host, now))]
    if len(lost) == len(members) and any(w.failed for w in members):
        m.phase, m.failing_since = Phase.FAILING, now


def failing(m: Machine, now: float) -> None:
    """End the failed job naming every rank (Horovod's failure message), once every member has
    exited (so its own exit code is named) or the stop grace has passed."""
    members = m.members()
    if any(w.alive for w in members) and now - m.failing_since <= m.s.stop_grace_s:
        return
    first = next((w for w in members if w.failed and w.exit_code is not None), None)
    every = "every rank failed" if all(w.exit_code not in (None, 0) for w in members) else "every host failed"

    def one(w: WorkerRec) -> str:
        what = describe_exit(w.exit_code) if w.exit_code is not None else "was stopped (its host was blacklisted)"
        return f"{w.name()} {what}"
    m.end(exit_code(first.exit_code) if first is not None else 1,
          f"{HOROVOD_FAILED}: {every}: " + "; ".join(one(w) for w in members),
          first.rank if first else None, first.host if first else None)


def remove(m: Machine, w: WorkerRec, why: str, now: float) -> None:
    if w.leaving or not w.alive:
        return
    ask = w.state is S.JOINED  # at a join: told to leave, it exits 0 by itself (TERM only after the grace)
    w.why = why
    w.move(S.ASKED if ask else S.STOPPING, now)
    m.emit(Remove(w.wid, why, ask=ask))


def reap(m: Machine, now: float) -> None:
    for w in m.workers.values():
        if w.state in (S.ASKED, S.STOPPING) and now - w.since > m.s.stop_grace_s:
            if w.state is S.ASKED:  # it did not exit by itself: TERM now, KILL after another grace
                w.move(S.STOPPING, now)
                m.emit(Kill(w.wid, term=True))
            else:
                w.move(S.KILLED, now)
                m.emit(Kill(w.wid))


# -- the phases -----------------------------------------------------------------------------------
def advance(m: Machine, now: float) -> None:
    phases(m, now)
    if m.phase is not Phase.ENDED:
        close_hosts(m, now)


def close_hosts(m: Machine, now: float) -> None:
    """Close the connection of every checked host that no worker runs on any more and that is no
    longer wanted (not listed, or blacklisted for good; on Kubernetes also one in its cool-down or
    hold: the pod of that name is re-created, so its old connection is dead): a host listed again
    is checked again."""
    busy = {w.host for w in m.workers.values() if w.alive}
    gone = tuple(h for h in sorted(m.opened) if h not in busy and (not m.membership.wanted(h) or (
        m.s.kubernetes and (m.membership.is_blacklisted(h, now) or m.membership.is_held(h, now)))))
    if gone:
        m.opened -= set(gone)
        m.emit(CloseHosts(gone))


def phases(m: Machine, now: float) -> None:
    if m.phase is Phase.FINISHING:
        finishing(m, now)
    elif m.phase is Phase.FAILING:
        failing(m, now)
    elif m.phase is Phase.WAITING:
        if m.discovered:
            form(m, now)
    elif m.phase is Phase.FORMING:
        forming(m, now)
    elif m.phase is Phase.RUNNING:
        running(m, now)
    elif m.phase is Phase.BREAKING:
        breaking(m, now)


def break_round(m: Machine, why: str, now: float) -> None:
    if m.phase in (Phase.FORMING, Phase.RUNNING):
        m.phase = Phase.BREAKING
        m.round.broken_at = now
        if m.s.verbose:
            m.say(f"round {m.round.id} ends: {why}")


def finishing(m: Machine, now: float) -> None:
    for w in m.workers.values():
        if w.state is S.JOINED:
            w.move(S.ENDING, now)
            m.emit(Answer(w.wid, {"error": "the job is ending: a worker finished"}))
    if all(not w.alive for w in m.workers.values()):
        m.end(0)


def forming(m: Machine, now: float) -> None:
    cur, members = m.round, m.members()
    if any(not w.alive or w.leaving for w in members):
        break_round(m, "a member left before the round started", now)
        breaking(m, now)
    elif all(w.state is S.JOINED for w in members):
        release(m, now)
    elif now - cur.formed_at > m.s.timeout_s:
        for w in members:
            if w.state is not S.JOINED:
                failure(m, w, f"did not join round {cur.id} within {m.s.timeout_s:g} s", now)
                remove(m, w, "did not join in time", now)
    else:
        say_late(m, [w for w in members if w.state is not S.JOINED], "to join", cur.formed_at, now)


def running(m: Machine, now: float) -> None:
    if short_of_slots(m, m.s.min_np, "--min-np", now, keep=True):
        return
    notify(m, now)
    grow(m, now)


def lost_by(m: Machine, w: WorkerRec) -> list[WorkerRec]:
    """The members back from the current round whose runtime found ``w`` silent past the
    heartbeat timeout (their join's ``lost``)."""
    return [o for o in m.members() if o.state is S.JOINED and o.join.get("last") == m.round.id
            and isinstance(o.join.get("lost"), list) and w.rank in o.join["lost"][:64]]


def breaking(m: Machine, now: float) -> None:
    cur = m.round
    back = [w for w in m.members() if w.state is S.TRAINING]
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
            failure(m, w, f"stopped answering: nothing from {w.host} over SSH for {m.s.silent_s:g} s", now)
            remove(m, w, "its host stopped answering", now)
    back = [w for w in back if not w.leaving and w.alive]
    if m.phase is not Phase.BREAKING:
        return
    if not back:
        form(m, now)
    elif cur.lost_at is not None and now - cur.lost_at > LOST_GRACE_S:  # another frozen host, not named
        for w in back:
            failure(m, w, f"did not come back within {LOST_GRACE_S:g} s after a member of round {cur.id} was "
                          "found silent", now)
            remove(m, w, "did not come back in time", now)
    elif now - cur.broken_at > m.s.timeout_s:
        for w in back:
            failure(m, w, f"did not come back within {m.s.timeout_s:g} s after round {cur.id} ended", now)
            remove(m, w, "did not come back in time", now)
    else:
        say_late(m, back, "to come back for a new round", cur.broken_at, now)


def open_hosts(m: Machine, target: list[tuple[str, int]], now: float) -> bool:
    """Check the target's hosts not checked yet (a pending one once its pause is over); True
    while any target host is being checked."""
    order = list(dict.fromkeys([h for h, _ in target] + [h for h in m.pending.hosts if m.membership.wanted(h)]))
    new = tuple(h for h in order if h not in m.opened and h not in m.opening and not m.pending.waiting(h, now))
    if new:
        m.opening |= set(new)
        m.emit(OpenHosts(new))
    return any(h in m.opening and h not in m.pending.hosts for h in order)  # a pending host is not waited for


def notify(m: Machine, now: float) -> None:
    """Discovery changed the slots the job should run on: tell every member at once (before any
    host is checked or worker started), once per target."""
    cur = m.round
    target = m.target(now)
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


def grow(m: Machine, now: float) -> None:
    """Start workers for the target's free slots on checked hosts: they wait for the next round
    while the members train."""
    target = m.target(now)
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


def spawn(m: Machine, host: str, index: int, slot: Any, now: float) -> WorkerRec:
    wid = len(m.workers)
    w = WorkerRec(wid, host, index)
    m.workers[wid] = w
    order = m.membership.order(now)
    m.emit(Spawn(wid, host, index, slot, tuple(sorted(m.opened)), order[0] if order else host))
    return w


def form(m: Machine, now: float) -> None:
    first = not m.released_any
    needed = m.s.np if first else m.s.min_np
    target = m.target(now)
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
            m.say(f"waiting for {needed} slots ({len(have) + len(free)} available; at most {m.s.timeout_s:g} s)")
        elif now - m.short_since > m.s.timeout_s:
            m.end(1, f"fewer than {'-np' if first else '--min-np'} {needed} slots were available for "
                     f"{m.s.timeout_s:g} s (--elastic-timeout); hosts: {m.hosts_line(now)}")
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
        limit = "" if m.s.reset_limit is None else f" of {m.s.reset_limit}"
        m.say(f"round {m.rounds}: {what} on {', '.join(dict.fromkeys(slots[w.wid].host for w in ranked))} "
              f"(reset {m.membership.resets}{limit})")
    if all(w.state is S.JOINED for w in members):
        release(m, now)


def release(m: Machine, now: float) -> None:
    cur = m.round
    members = m.members()
    m.emit(Release(cur.id, tuple(Member(w.wid, w.host, cur.slots[w.wid], dict(w.join)) for w in members), cur.sync))
    for w in members:
        w.move(S.TRAINING, now)
        w.last, w.rank = cur.id, cur.slots[w.wid].rank
    m.phase = Phase.RUNNING
    m.released_any = True
    if m.s.verbose:
        m.say(f"round {cur.id} started: {len(members)} ranks, sync {cur.sync}")


__all__ = ["HOROVOD_FAILED", "Machine", "Settings", "TRANSITIONS"]
