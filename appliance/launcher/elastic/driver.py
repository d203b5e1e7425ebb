"""The elastic driver's I/O shell: processes, sockets, threads and the clock around the state machine.

What it owns: ``ElasticDriver``, one job with ``--min-np``, ``--max-np`` or
``--host-discovery-script`` (``launch.run_elastic`` sets it up). Every decision is
``machine.Machine``'s (pure, its transitions tabled in that module's docstring); the shell turns
what happens into its events (``events``) and carries out the actions it returns. The shell holds
what the machine must not: the mechanism's worker handles, the rendezvous server
(``rendezvous.RendezvousServer``) with its held joins (``Ticket``) and notification streams, the
discovery poller, the host checks and the signal trap.

Threads and the one inbox: the main thread runs the machine and every action; every other thread
only posts events to one queue, the inbox, that the main thread drains: the rendezvous
connections (joins, streams, leaves), the discovery poller (whose first run is off the main
thread too, so SIGTERM or Ctrl-C during a hung first run ends the launcher at once), the host
checks and the worker waiter (``wait_exits``: every rank's exit as the mechanism reports it). A
``Tick`` follows every drain (at least every ``POLL_S``), with the signal trap and the deadline
checked before it. When the job ends, for whatever reason, the waiter stops, the discovery is
closed (a run in flight is killed with its process group), every held join answered, and the
rendezvous closed.

Env vars: APPLIANCE_ELASTIC_LEAVE_ON_TERM (``env``, then the launcher's environment); the rest
come read (``LaunchConfig``/``ElasticConfig``). Workers get HOROVOD_ELASTIC=1,
APPLIANCE_ELASTIC_ADDR, APPLIANCE_ELASTIC_WORKER and HOROVOD_RANK... of the round they start for,
and APPLIANCE_ELASTIC_LEAVE_ON_TERM=1 on Kubernetes or when the launch sets it (a worker sent
SIGTERM then asks to leave, ``Leaving``, and goes at its next commit).
Failure modes: a discovery script that fails on its first run ends the launch before any rank
starts (``LaunchError``); everything after ends in an ``Outcome``.
"""
from __future__ import annotations

import queue
import signal
import threading
import time
from typing import Any, Callable

from appliance.common.knobs import read
from appliance.launcher.config import LaunchConfig
from .. import env as envmod
from .. import mechanism as mech_mod
from ..executors import LaunchError
from ..failures import EXIT_TIMEOUT, Outcome, signal_name
from ..hosts import hosts_from
from ..output import OutputSink
from ..reaper import Reaper
from ..signals import SignalTrap
from ..workers import SpawnError
from .discovery import DiscoveryError, FixedDiscovery, ScriptDiscovery
from .events import (Answer, CloseHosts, Discovered, DiscoveryFailed, End, Exited, HostOpened, Joined, Kill, Leaving,
                     Notify, OpenHosts, Release, Remove, Say, Spawn, SpawnFailed, Tick, Watching)
from .failures import SILENT_S
from .machine import Machine
from .records import Phase
from .rendezvous import RendezvousServer, Stream, Ticket

POLL_S = 0.02


class ElasticDriver:
    """One elastic job (see the module docstring); ``run()`` returns its ``Outcome``."""

    def __init__(self, config: LaunchConfig, mech: Any, sink: OutputSink, reaper: Reaper | None,
                 trap: SignalTrap, deadline: float | None, fault_dir: str, clock: Callable[[], float] = time.monotonic,
                 job: tuple[str, str] | None = None, observer: Any = None):
        assert config.elastic is not None
        self.config, self.e = config, config.elastic
        self.mech, self.sink, self.reaper, self.trap = mech, sink, reaper, trap
        self.deadline, self.fault_dir, self.clock = deadline, fault_dir, clock
        self.job_id, self.secret = job or (envmod.new_job_id(), envmod.new_secret())
        self.observer = observer  # observe.Observer: told every line said and every round formed
        self.machine = Machine(config)  # the launch configuration whole, its ElasticConfig within
        self.discovery = (ScriptDiscovery(self.e.discovery_script, self.e.slots_per_host, self.e.discovery_timeout_s,
                                          config.environ, config.cwd)
                          if self.e.discovery_script is not None else
                          FixedDiscovery({h.name: h.slots for h in hosts_from(config.hosts, config.hostfile,
                                                                               None if mech.name == "local"
                                                                               else config.slurm, config.np,
                                                                               config.default_slots)}))
        self.inbox: queue.Queue = queue.Queue()  # every thread's events, (event, its ticket or stream or handle)
        self.leave_on_term = self.e.kubernetes or bool(read("APPLIANCE_ELASTIC_LEAVE_ON_TERM",
                                                            {**config.environ, **config.env}))
        self.handles: dict[int, Any] = {}
        self.tickets: dict[Any, Ticket] = {}  # held joins by worker number, held leaves by ("leave", number)
        self.streams: dict[int, Stream] = {}
        self.stamps: dict[int, int] = {}    # notice number -> its timestamp
        self.timestamp = 0
        self.outcome: Outcome | None = None
        self.server: RendezvousServer | None = None
        self._stop = threading.Event()
        self._waiter: threading.Thread | None = None  # the worker waiter, from the first start on

    def say(self, text: str) -> None:
        self.sink.message(f"appliance launch: elastic: {text}")
        if self.observer is not None:
            self.observer.event(f"elastic: {text}")

    # -- the rendezvous handler (server threads) ------------------------------------------------
    def join(self, worker: int, message: dict) -> Ticket:
        ticket = Ticket()
        self.inbox.put((Joined(worker, dict(message)), ticket))
        return ticket

    def watch(self, worker: int, stream: Stream) -> None:
        self.inbox.put((Watching(worker), stream))

    def leave(self, worker: int) -> Ticket:
        self.inbox.put((Leaving(worker), ticket := Ticket()))
        return ticket

    # -- the job ------------------------------------------------------------------------------
    def run(self) -> Outcome:
        self.server = RendezvousServer(self, bytes.fromhex(self.secret), self.job_id)
        try:
            threading.Thread(target=poll_discovery, args=(self.discovery, self.inbox, self._stop, self.e.discovery_interval_s),
                             name="elastic-discovery", daemon=True).start()
            while self.outcome is None:
                self._step()
            return self.outcome
        finally:
            self._stop.set()
            if self._waiter is not None:  # back to this thread: _end_all waits for the exits itself
                self._waiter.join(timeout=1.0)
            self.discovery.close()
            self._end_all()
            self.server.close()

    def _step(self) -> None:
        now = self.clock()
        if self.trap.received:
            sig = self.trap.received[0]
            self.outcome = Outcome(128 + sig, reason=f"interrupted by {signal_name(sig)}", interrupted=sig)
            return
        if self.deadline is not None and now >= self.deadline:
            self.outcome = Outcome(EXIT_TIMEOUT, reason=f"timed out after {self.config.timeout_s:g} s", timed_out=True)
            return
        try:
            self._event(*self.inbox.get(timeout=POLL_S))
        except queue.Empty:
            pass
        while self.outcome is None:
            try:
                event, extra = self.inbox.get_nowait()
            except queue.Empty:
                break
            self._event(event, extra)
        if self.outcome is None:
            silent = frozenset()
            if self.machine.phase is Phase.BREAKING:
                silent = frozenset(wid for wid, h in self.handles.items()
                                   if getattr(h, "silent_s", None) is not None and h.silent_s() > SILENT_S)
            self._feed(Tick(silent))

    def _event(self, event: Any, extra: Any) -> None:
        if isinstance(event, Joined):
            old = self.tickets.get(event.wid)
            if old is not None:
                old.set({"error": "superseded by a newer request"})
            self.tickets[event.wid] = extra
        elif isinstance(event, Leaving):
            self.tickets[("leave", event.wid)] = extra
        elif isinstance(event, Exited):  # from the waiter: its held join and its stream end with it
            ticket = self.tickets.pop(event.wid, None)
            if ticket is not None:
                ticket.set({"error": "exited"})
            stream = self.streams.pop(event.wid, None)
            if stream is not None:
                stream.close()
        elif isinstance(event, Watching):
            w = self.machine.workers.get(event.wid)
            if w is None or not w.alive:
                extra.close()
                return
            old = self.streams.get(event.wid)
            if old is not None:
                old.close()
            self.streams[event.wid] = extra
        elif isinstance(event, DiscoveryFailed) and event.first:
            raise LaunchError(event.message)
        self._feed(event)

    def _feed(self, event: Any) -> None:
        pending = [event]
        while pending and self.outcome is None:
            for action in self.machine.handle(pending.pop(0), self.clock()):
                follow = self._act(action)
                if follow is not None:
                    pending.append(follow)

    # -- actions ------------------------------------------------------------------------------
    def _act(self, a: Any) -> Any:
        """Carry out one action; returns the event it caused at once (a failed start), if any."""
        if isinstance(a, Spawn):
            return self._spawn(a)
        if isinstance(a, Remove):
            if a.ask:
                ticket = self.tickets.pop(a.wid, None)
                if ticket is not None:
                    ticket.set({"removed": a.why})
            elif a.wid in self.handles:
                self.mech.signal([self.handles[a.wid]], signal.SIGTERM)
        elif isinstance(a, Kill):
            h = self.handles.get(a.wid)
            if h is not None and a.term:
                self.mech.signal([h], signal.SIGTERM)
            elif h is not None:
                self.mech.signal([h], signal.SIGKILL)
        elif isinstance(a, Answer):
            ticket = self.tickets.pop(("leave", a.wid) if a.leave else a.wid, None)
            if ticket is not None:
                ticket.set(dict(a.answer))
        elif isinstance(a, Release):
            self._release(a)
        elif isinstance(a, Notify):
            if a.seq not in self.stamps:
                self.timestamp = max(self.timestamp + 1, int(time.time()))
                self.stamps[a.seq] = self.timestamp
            note = {"hosts_updated": {"timestamp": self.stamps[a.seq], "result": a.result, "round": a.round_id}}
            for wid in a.wids:
                stream = self.streams.get(wid)
                if stream is not None:
                    stream.push(note)
        elif isinstance(a, OpenHosts):
            threading.Thread(target=self._check, args=(list(a.hosts),), name="elastic-open", daemon=True).start()
        elif isinstance(a, CloseHosts):
            self.mech.hosts.close(list(a.hosts))
        elif isinstance(a, Say):
            self.say(a.text)
        elif isinstance(a, End):
            self.outcome = Outcome(a.code, a.rank, a.host, a.reason)
        return None

    def _check(self, hosts: list[str]) -> None:
        try:
            result = self.mech.hosts.open(hosts)
        except Exception as e:  # noqa: BLE001 - reported as that host's failure
            result = {h: f"{h}: {type(e).__name__}: {e}" for h in hosts}
        for host in hosts:
            self.inbox.put((HostOpened(host, result.get(host, f"{host}: no answer from the check")), None))

    def _spawn(self, a: Spawn) -> Any:
        spec = mech_mod.RankSpec(a.slot, a.wid, {
            "HOROVOD_ELASTIC": "1", "APPLIANCE_ELASTIC_ADDR": f"{self.mech.hosts.launcher_address(a.host)}:{self.server.port}",
            "APPLIANCE_ELASTIC_WORKER": str(a.wid), "HOROVOD_ELASTIC_TIMEOUT": repr(float(self.e.timeout_s)),
            **({"APPLIANCE_ELASTIC_LEAVE_ON_TERM": "1"} if self.leave_on_term else {}),
            **(self.observer.env_for(self.mech.hosts.launcher_address(a.host)) if self.observer is not None else {})})
        addrs = self.mech.hosts.addresses(list(a.hosts))
        plan = envmod.JobPlan(job_id=self.job_id, secret=self.secret, store_addr="",
                              master_addr=addrs.get(a.first_host, ""), master_port=0, data_addrs=addrs,
                              start_timeout_s=self.config.start_timeout_s, verbose=self.config.verbose,
                              fault_dir=self.fault_dir)
        try:
            if self._waiter is None:
                self._waiter = threading.Thread(target=wait_exits, args=(self.mech, self.inbox, self._stop),
                                                name="elastic-waiter", daemon=True)
                self._waiter.start()
            self.mech.start([spec], plan, self.sink, self.reaper)
        except SpawnError as e:
            return SpawnFailed(a.wid, e.returncode, str(e))
        self.handles[a.wid] = self.mech.workers[-1]
        return None

    def _release(self, a: Release) -> None:
        if self.observer is not None:
            self.observer.new_round(a.round_id, len(a.members))
        addrs = self.mech.hosts.addresses(list(dict.fromkeys(m.host for m in a.members)))
        store, answers = round_answers(a, addrs, self.job_id)
        for wid, answer in answers:
            ticket = self.tickets.pop(wid, None)
            if ticket is not None:
                ticket.set({"round": answer})
        if self.config.verbose:
            self.say(f"round {a.round_id}: store {store}")

    def _end_all(self) -> None:
        """The job's outcome is known: answer every held join, give the survivors the failure
        grace to exit by themselves (as a static job does), then the caller stops the rest."""
        reason = self.outcome.reason if self.outcome else "stopped"
        for ticket in self.tickets.values():
            ticket.set({"error": f"the job is ending: {reason}"})
        self.tickets.clear()
        for stream in self.streams.values():
            stream.close()
        if self.outcome is None or self.outcome.returncode == 0 or self.outcome.interrupted or self.outcome.timed_out:
            return
        end = self.clock() + self.config.failure_grace_s
        while mech_mod.running(self.mech) and self.clock() < end and not self.trap.received:
            self.mech.wait(POLL_S)


def wait_exits(mech: Any, inbox: queue.Queue, stop: threading.Event) -> None:
    """The worker waiter: every rank's exit, as the mechanism reports it, posted to the inbox as
    ``Exited`` (its handle alongside) until ``stop``."""
    while not stop.is_set():
        got = mech.wait(POLL_S)
        if got is not None:
            handle, code = got
            inbox.put((Exited(handle.rank, code, getattr(handle, "cause", None) or ""), handle))


def poll_discovery(discovery: Any, events: queue.Queue, stop: threading.Event, interval_s: float) -> None:
    """The discovery thread: one ``Discovered`` or ``DiscoveryFailed`` event per run, every
    ``interval_s``, until ``stop``; a failed first run is the last (the job cannot start)."""
    first = True
    while not stop.is_set():
        try:
            event: Any = Discovered(discovery.find())
        except DiscoveryError as e:
            event = DiscoveryFailed(str(e), first)
        except Exception as e:  # noqa: BLE001 - the poller must never die silently
            event = DiscoveryFailed(f"{discovery.describe()}: {type(e).__name__}: {e}", first)
        if stop.is_set():
            return
        events.put((event, None))
        if first and isinstance(event, DiscoveryFailed):
            return
        first = False
        stop.wait(interval_s)


def round_answers(a: Release, addrs: dict, job_id: str) -> tuple[str, list[tuple[int, dict]]]:
    """A released round's store address and each member's answer: its layout, where its data
    and the round's store are, and whether state is synced."""
    rank0 = a.members[0]
    store = f"{addrs.get(rank0.host) or str(rank0.join.get('addr', ''))}:{int(rank0.join.get('port') or 0)}"
    answers = []
    for m in a.members:
        s = m.slot
        answers.append((m.wid, {"round": a.round_id, "job_id": f"{job_id}.{a.round_id}", "rank": s.rank,
                                "size": s.size, "local_rank": s.local_rank, "local_size": s.local_size,
                                "cross_rank": s.cross_rank, "cross_size": s.cross_size, "host": m.host,
                                "data_addr": addrs.get(m.host) or str(m.join.get("addr", "")), "store": store,
                                "sync": a.sync}))
    return store, answers


__all__ = ["ElasticDriver"]
