"""The elastic job as a pure state machine: events in, actions out, the clock passed in.

What it owns: ``Machine`` (one elastic job: ``state.MachineState``, its phase, workers, current
round, membership, hosts being checked, and the event dispatch), the transitions of a worker's
own events (it joined, opened its stream, asked to leave, exited, could not start; time passed)
and the one table below, which the modules of each concern implement: ``rounds`` (form, release,
run, break, grow, notify, finish), ``failures`` (a failure, the doomed round, failing, the lost,
reaping) and ``hosts`` (discovery, host checks, pending hosts, closing, the target); a worker's
own moves are ``records.WorkerState`` with its table ``records.MOVES``. ``Machine.handle(event, now)``
applies one event (``events``: ``Joined``, ``Watching``, ``Leaving``, ``Exited``, ``SpawnFailed``,
``Discovered``, ``DiscoveryFailed``, ``HostOpened``, ``Tick``), then advances the phase, and
returns the actions (``Spawn``, ``Remove``, ``Kill``, ``Answer``, ``Release``, ``Notify``,
``OpenHosts``, ``CloseHosts``, ``Say``, ``End``) for the I/O shell (``driver.ElasticDriver``) to carry out. No
threads, processes, sockets or clock readings here: the tests drive it with a fake clock.

Phases (``records.Phase``) and transitions, the one table of the elastic driver (each transition
named by its module):

| phase | event / condition | transition | next phase |
| --- | --- | --- | --- |
| WAITING | discovery listed hosts not yet checked | ``hosts.open_hosts``: ``OpenHosts`` | WAITING |
| any | a host's check failed (Kubernetes: its pod is listed before its sshd or DNS is up) | ``hosts.on_host_opened``: pending (``pending.py``), checked again after a doubling pause, one line a minute at most; never blacklisted | same |
| any | a pending host's check passes | ``hosts.on_host_opened``: its slots count from now | same |
| any | a host's check failed (elsewhere) | ``hosts.on_host_opened``: blacklisted (the cool-down, if any) | same |
| WAITING, BREAKING | enough checked slots (``-np`` first, then ``--min-np``) | ``rounds.form``: ``Spawn`` new slots, lay out ranks (reset counted after the first release) | FORMING |
| WAITING, BREAKING | too few slots for ``--elastic-timeout`` | ``rounds.form``: ``End`` "fewer than ... slots" | ENDED |
| BREAKING | no worker of the last round left / reset limit used up | ``rounds.form``: ``End`` (Horovod's reset-limit sentence) | ENDED |
| FORMING | every member has joined | ``rounds.release``: ``Release`` | RUNNING |
| FORMING | a member left, or did not join within ``--elastic-timeout`` | ``rounds.forming``: blacklist, ``Remove`` | BREAKING |
| RUNNING | discovery changed the target slots | ``rounds.notify``: ``Notify`` every member at once, before any check or start | RUNNING |
| RUNNING | checked free slots in the target | ``rounds.grow``: ``Spawn`` (the new workers join the next round) | RUNNING |
| RUNNING | fewer than ``--min-np`` slots listed | ``rounds.running``: keep every worker; ``End`` after ``--elastic-timeout`` | RUNNING / ENDED |
| RUNNING | a member joins again (runtime error, host change) or exits | ``on_joined`` / ``on_exited``: ``state.break_round`` | BREAKING |
| BREAKING | every member still running joined again | ``rounds.breaking``: ``rounds.form`` | FORMING |
| BREAKING | a member named lost (its join's ``lost``: silent past the heartbeat timeout) by a member back from the round | ``failures.lost``: blacklist, ``Remove`` and ``Kill`` it at once (a stopped process too) | BREAKING |
| BREAKING | a member was named lost and others are not back ``LOST_GRACE_S`` later (another frozen host) | ``rounds.breaking``: blacklist, ``Remove`` | BREAKING |
| BREAKING | a member silent over SSH | ``failures.lost``: blacklist, ``Remove`` | BREAKING |
| BREAKING | a member not back within ``--elastic-timeout`` | ``rounds.breaking``: blacklist, ``Remove`` | BREAKING |
| any | a worker exits non-zero (or cannot start) | ``failures.failure``: blacklist its host, ``Remove`` its other workers; a worker that never joined a round only holds new workers off its host | same / BREAKING |
| FORMING, RUNNING, BREAKING | every member failed or lost its host | ``failures.check_doomed`` | FAILING |
| FAILING | the members still stopping have exited, or the stop grace passed | ``failures.failing``: ``End`` naming every rank and its exit, with Horovod's phrase | ENDED |
| any | a worker sent SIGTERM asks to leave (``Leaving``: its pod is being deleted) | ``on_leaving``: no blacklist, new workers held off its host for the cool-down; its slot leaves the target, so a running round's members are told at once (``rounds.notify``), its round ends at the next commit and the next round forms without it (``removed`` at its join, it exits 0); not in a running round: ``Remove`` now | same |
| any | Kubernetes, or a worker that asked to leave: ended by SIGTERM (pod deleted, ``replicas`` lowered; a departing one also exiting 0) | ``failures.leave_on_sigterm``: it leaves, no blacklist; new workers held off its host for the cool-down; a member's round breaks | same / BREAKING |
| any | a worker exits 0 | ``on_exited``: ``Remove`` workers that never joined | FINISHING |
| FINISHING | every worker exited / one failed | ``rounds.finishing``: ``End`` 0 / its code | ENDED |
| any | ``Tick`` | ``failures.reap``: TERM, then KILL, workers that did not leave within the grace | same |
| any but ENDED | a checked host has no live worker and is not listed, or is blacklisted for good (Kubernetes: or blacklisted or held at all: its pod is re-created) | ``hosts.close_hosts``: ``CloseHosts`` (listed again: ``OpenHosts`` again) | same |

Env vars: none (``Machine(config)``: the launch's ``LaunchConfig`` whole, its ``ElasticConfig`` within). Failure modes: none raised; the
job's end is the ``End`` action (also kept as ``Machine.outcome``).
"""
from __future__ import annotations

from signal import SIGTERM
from typing import Any, Callable

from ..failures import describe_exit, exit_code
from .events import (Action, Answer, Discovered, DiscoveryFailed, Exited, HostOpened, Joined, Leaving, Notify,
                     SpawnFailed, Tick, Watching)
from .failures import HOROVOD_FAILED, check_doomed, failing, failure, leave_on_sigterm, reap
from .hosts import close_hosts, on_discovered, on_discovery_failed, on_host_opened
from .records import Phase, WorkerState as S
from .rounds import breaking, finishing, form, forming, running
from .state import MachineState, break_round, remove, when


class Machine(MachineState):
    """One elastic job's decisions (see the module docstring)."""

    def handle(self, event: Any, now: float) -> list[Action]:
        if self.phase is not Phase.ENDED:
            TRANSITIONS[type(event)](self, event, now)
            if not (type(event) is HostOpened and event.failure and self.opening):  # the batch's last decides
                advance(self, now)
        return self.take()


# -- a worker's own events ----------------------------------------------------------------------
def on_joined(m: MachineState, ev: Joined, now: float) -> None:
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


def on_watching(m: MachineState, ev: Watching, now: float) -> None:
    """A member that opens its stream after its round's notice gets the notice now."""
    w = m.workers.get(ev.wid)
    cur = m.round
    if w is not None and m.phase is Phase.RUNNING and cur is not None and w.wid in cur.members and cur.notified:
        _, result, seq = cur.notified
        m.emit(Notify((w.wid,), result, cur.id, seq))


def on_leaving(m: MachineState, ev: Leaving, now: float) -> None:
    """A worker sent SIGTERM asks to leave: it goes as a host removed from discovery does (its
    slot leaves the target, ``notify``), at its round's next commit; no blacklist."""
    w = m.workers.get(ev.wid)
    refused = (f"worker {ev.wid} is not part of this job" if w is None or not w.alive else
               "the launcher is stopping it" if w.leaving else
               "the job is ending" if m.phase in (Phase.FINISHING, Phase.FAILING) else "")
    m.emit(Answer(ev.wid, {"error": refused} if refused else {"leave": True}, leave=True))
    if refused or w.departing:
        return
    w.departing = "it was sent SIGTERM" + (" (its pod is being deleted)" if m.e.kubernetes else "")
    until = m.membership.hold(w.host, now)
    m.say(f"{w.name()} was sent SIGTERM: it leaves the job at its next commit (not a failure); no new worker "
          f"starts on {w.host} {when(until, now)}")
    if not (m.is_member(w) and w.state is S.TRAINING):  # not training in a round: nothing to wait for
        remove(m, w, w.departing, now)


def on_exited(m: MachineState, ev: Exited, now: float) -> None:
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
    if ((m.e.kubernetes or w.departing) and ev.code in (-SIGTERM, 128 + SIGTERM)) or (w.departing and ev.code == 0):
        leave_on_sigterm(m, w, now)
        return
    if ev.code == 0:
        m.phase = Phase.FINISHING
        if m.config.verbose:
            m.say(f"{w.name()} finished: the job ends when the others do")
        for other in m.live():
            if other.last == 0:
                remove(m, other, "the job is ending", now)
        return
    failure(m, w, ev.cause or describe_exit(ev.code), now)


def on_spawn_failed(m: MachineState, ev: SpawnFailed, now: float) -> None:
    w = m.workers.get(ev.wid)
    if w is not None and w.alive:
        w.exited(ev.code, now)
        failure(m, w, f"could not start: {ev.message}", now)


def on_tick(m: MachineState, ev: Tick, now: float) -> None:
    m.silent = ev.silent
    reap(m, now)


TRANSITIONS: dict[type, Callable[[Any, Any, float], None]] = {
    Joined: on_joined, Watching: on_watching, Leaving: on_leaving, Exited: on_exited, SpawnFailed: on_spawn_failed,
    Discovered: on_discovered, DiscoveryFailed: on_discovery_failed, HostOpened: on_host_opened, Tick: on_tick,
}


# -- the phases -----------------------------------------------------------------------------------
def advance(m: MachineState, now: float) -> None:
    phases(m, now)
    if m.phase is not Phase.ENDED:
        close_hosts(m, now)


def phases(m: MachineState, now: float) -> None:
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


__all__ = ["HOROVOD_FAILED", "Machine", "TRANSITIONS"]
