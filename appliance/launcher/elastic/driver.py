"""The elastic driver: an elastic job's membership, rounds and rendezvous, outliving any rank.

What it owns: ``ElasticDriver``, one job with ``--min-np``, ``--max-np`` or
``--host-discovery-script`` (``launch.run_elastic`` sets it up; its records are ``records``'s
``WorkerRec`` and ``Round``). The driver runs in the launcher, hosts the rendezvous
(``rendezvous.RendezvousServer``; rank 0 may be the rank that dies) and decides everything on one thread (the launcher's main thread); the rendezvous
connections, the discovery poller and host checks only post events to it.

Rounds. A round is one layout of the job: its members (workers, each with a number the driver
gave it at spawn), their ranks (``membership.layout``: hosts oldest first, so rank 0 is on the
longest-running host), the address of its store (hosted by the round's rank 0, at a port that
worker picked and sent with its join) and whether state must be synced (``sync``: any member
new to the job, or the round follows a failure). A worker's ``init()`` joins (``join``) and is
answered only when every member of the round has joined: the barrier. A member that does not
come within ``--elastic-timeout`` is dropped (its host counts as failed) and a new round formed.

What breaks a round: a member exits, or a member joins again (its runtime failed:
``HorovodInternalError``, or every rank raised ``HostsUpdatedInterrupt`` at a commit). The next
round is formed once every member still running has joined again (or timed out), from the
workers still alive on available hosts, plus new workers for slots that are free: only new slots
start new processes; survivors are never restarted. Forming a round after the first counts
against ``--reset-limit``.

Hosts (``membership.Membership``, fed by ``discovery``): polled every ``APPLIANCE_DISCOVERY_INTERVAL``
seconds; a host that appears is checked (``Mechanism.open_hosts``: the SSH preflight), its free
slots get workers at once (so they start while training goes on), and then the members of the
current round are told (``hosts_updated`` on their watch stream, within about a second of the
discovery), so that their next ``commit()`` raises ``HostsUpdatedInterrupt`` everywhere at the same
step. A host that disappears is announced the same way; its workers leave at that commit
(answered ``removed``, they exit 0).

Failures, as Horovod: a worker that exits non-zero blacklists its host (``--blacklist-cooldown-range``:
it may come back later), whose other workers are stopped; any worker exiting 0 ends the job (the
others finish; pending workers are stopped); every rank of the round failing fails the job naming
them; fewer than ``--min-np`` slots for ``--elastic-timeout`` seconds, the reset limit, or no
worker of the last round surviving (nobody holds the training state) fail it with one line saying
so. A silent host (a network cut): once the round has ended (the survivors' runtimes noticed the
missing heartbeats), a member whose host has sent nothing over SSH for ``SILENT_S`` seconds is
taken as failed, without waiting for the SSH timeout.

Env vars: none read here (``LaunchConfig``/``ElasticConfig``). Workers get HOROVOD_ELASTIC=1,
APPLIANCE_ELASTIC_ADDR, APPLIANCE_ELASTIC_WORKER and HOROVOD_RANK... of the round they start
for. Failure modes: a discovery script that fails on its first run, or unusable flags, end the
launch before any rank starts (``LaunchError``); later discovery failures are retried and said
once until they recover.
"""
from __future__ import annotations

import math
import queue
import signal
import threading
import time
from typing import Any, Callable

from appliance.launcher.config import LaunchConfig
from .. import env as envmod
from .. import mechanism as mech_mod
from ..executors import LaunchError
from ..failures import EXIT_TIMEOUT, Outcome, describe_exit, exit_code, signal_name
from ..hosts import hosts_from
from ..output import OutputSink
from ..reaper import Reaper
from ..signals import SignalTrap
from ..workers import SpawnError
from .discovery import DiscoveryError, FixedDiscovery, ScriptDiscovery
from .membership import HostUpdate, Membership, ResetLimitExceeded, layout
from .records import Round, WorkerRec
from .rendezvous import RendezvousServer, Stream, Ticket

POLL_S = 0.02
SILENT_S = 2.5  # in a round that ended, a member whose host has said nothing over SSH for this long is gone


class ElasticDriver:
    """One elastic job (see the module docstring); ``run()`` returns its ``Outcome``."""

    def __init__(self, config: LaunchConfig, mech: Any, sink: OutputSink, reaper: Reaper | None,
                 trap: SignalTrap, deadline: float | None, fault_dir: str, clock: Callable[[], float] = time.monotonic):
        assert config.elastic is not None
        self.config, self.e = config, config.elastic
        self.mech, self.sink, self.reaper, self.trap = mech, sink, reaper, trap
        self.deadline, self.fault_dir, self.clock = deadline, fault_dir, clock
        self.job_id, self.secret = envmod.new_job_id(), envmod.new_secret()
        self.membership = Membership(self.e.min_np, self.e.max_np, self.e.cooldown_range, self.e.reset_limit)
        self.discovery = (ScriptDiscovery(self.e.discovery_script, self.e.slots_per_host, self.e.discovery_timeout_s,
                                          config.environ, config.cwd)
                          if self.e.discovery_script is not None else
                          FixedDiscovery({h.name: h.slots for h in hosts_from(config.hosts, config.hostfile,
                                                                               None if mech.name == "local"
                                                                               else config.slurm, config.np)}))
        self.workers: dict[int, WorkerRec] = {}
        self.round: Round | None = None
        self.rounds = 0
        self.events: queue.Queue = queue.Queue()
        self.opened: set[str] = set()       # hosts ready to start ranks
        self.opening: set[str] = set()      # hosts being checked
        self.outcome: Outcome | None = None
        self.finishing = False              # a worker exited 0: the job is ending
        self.short_since: float | None = None
        self.notified: tuple | None = None  # (round id, target) the current members were told about
        self.timestamp = 0
        self.discovery_error = ""
        self.failed: list[WorkerRec] = []   # workers that failed in the current round
        self.server: RendezvousServer | None = None
        self._stop = threading.Event()
        self._started = False

    # -- output -------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.sink.message(f"appliance launch: elastic: {text}")

    # -- the rendezvous handler (server threads) ------------------------------------------------
    def join(self, worker: int, message: dict) -> Ticket:
        ticket = Ticket()
        self.events.put(("join", worker, message, ticket))
        return ticket

    def watch(self, worker: int, stream: Stream) -> None:
        self.events.put(("watch", worker, stream, None))

    # -- the job ------------------------------------------------------------------------------
    def run(self) -> Outcome:
        self.server = RendezvousServer(self, bytes.fromhex(self.secret), self.job_id)
        try:
            self._first_discovery()
            poller = threading.Thread(target=self._poll_discovery, name="elastic-discovery", daemon=True)
            poller.start()
            while self.outcome is None:
                self._step()
            return self.outcome
        finally:
            self._stop.set()
            self._end_all()
            self.server.close()

    def _first_discovery(self) -> None:
        """The first discovery must succeed (a broken script fails the launch); then wait (at most
        --elastic-timeout) for -np slots, as Horovod does before it starts anything."""
        try:
            found = self.discovery.find()
        except DiscoveryError as e:
            raise LaunchError(str(e)) from None
        now = self.clock()
        self.membership.update(found, now)
        self._open_new_hosts(blocking=True)

    def _poll_discovery(self) -> None:
        while not self._stop.wait(self.e.discovery_interval_s):
            try:
                self.events.put(("discovered", self.discovery.find(), None, None))
            except DiscoveryError as e:
                self.events.put(("discovery_error", str(e), None, None))
            except Exception as e:  # noqa: BLE001 - the poller must never die silently
                self.events.put(("discovery_error", f"{self.discovery.describe()}: {type(e).__name__}: {e}", None, None))

    def _step(self) -> None:
        now = self.clock()
        if self.trap.received:
            sig = self.trap.received[0]
            self.outcome = Outcome(128 + sig, reason=f"interrupted by {signal_name(sig)}", interrupted=sig)
            return
        if self.deadline is not None and now >= self.deadline:
            self.outcome = Outcome(EXIT_TIMEOUT, reason=f"timed out after {self.config.timeout_s:g} s", timed_out=True)
            return
        event = self.mech.next_exit(POLL_S) if self._started else (time.sleep(POLL_S) or None)
        while event is not None:
            self._on_exit(event[0], event[1])
            event = self.mech.next_exit(0)
        while True:
            try:
                kind, a, b, c = self.events.get_nowait()
            except queue.Empty:
                break
            if kind == "join":
                self._on_join(a, b, c)
            elif kind == "watch":
                self._on_watch(a, b)
            elif kind == "discovered":
                self._on_discovered(a)
            elif kind == "discovery_error":
                if a != self.discovery_error:
                    self.say(f"{a} (retrying every {self.e.discovery_interval_s:g} s)")
                self.discovery_error = a
            elif kind == "opened":
                self._on_opened(a, b)
        self._reap_leaving()
        self._advance()

    # -- events -------------------------------------------------------------------------------
    def _on_join(self, wid: int, message: dict, ticket: Ticket) -> None:
        w = self.workers.get(wid)
        if w is None or not w.alive:
            ticket.set({"error": f"worker {wid} is not part of this job"})
            return
        if self.outcome is not None or self.finishing:
            ticket.set({"error": "the job is ending"})
            return
        if w.leaving:
            ticket.set({"removed": w.leaving})
            return
        if w.ticket is not None:
            w.ticket.set({"error": "superseded by a newer request"})
        w.ticket, w.join = ticket, dict(message)
        cur = self.round
        if cur is not None and w.wid in cur.members and cur.released:
            w.in_round = False
            self._break(cur, f"{w.name()} asked for a new round ({message.get('reason', '?')})")
            if message.get("reason") != "hosts":
                cur.failed = True

    def _on_watch(self, wid: int, stream: Stream) -> None:
        w = self.workers.get(wid)
        if w is None or not w.alive:
            stream.close()
            return
        if w.stream is not None:
            w.stream.close()
        w.stream = stream

    def _on_exit(self, handle: Any, code: int) -> None:
        w = self.workers.get(handle.rank)
        if w is None:
            return
        w.exit_code = code
        if w.ticket is not None:
            w.ticket.set({"error": "exited"})
            w.ticket = None
        if w.stream is not None:
            w.stream.close()
        if w.leaving or self.outcome is not None:
            return
        if code == 0:
            if not self.finishing:
                self.finishing = True
                if self.config.verbose:
                    self.say(f"{w.name()} finished: the job ends when the others do")
                for other in self.workers.values():
                    if other.alive and other.last == 0:
                        self._remove(other, "the job is ending")
            return
        if self.finishing:
            self.outcome = self._blame(w, code)
            return
        reason = getattr(handle, "cause", None) or describe_exit(code)
        self._failure(w, reason, code)

    def _failure(self, w: WorkerRec, why: str, code: int | None = None) -> None:
        """``w`` failed: blacklist its host, stop its other workers, break the round."""
        now = self.clock()
        until = self.membership.blacklist(w.host, now)
        when = "for good" if until == math.inf else f"for {until - now:.0f} s"
        self.say(f"{w.name()} {why}; host {w.host} is blacklisted {when}")
        w.exit_code = w.exit_code if w.exit_code is not None else code
        self.failed.append(w)
        for other in self.workers.values():
            if other is not w and other.alive and other.host == w.host and not other.leaving:
                self._remove(other, f"host {w.host} is blacklisted")
        cur = self.round
        if cur is not None and w.wid in cur.members:
            self._break(cur, f"{w.name()} failed")
            cur.failed = True
            members = [self.workers[m] for m in cur.members]
            if all(m in self.failed for m in members):
                first = self.failed[0] if self.failed[0] in members else w
                names = "; ".join(f"{m.name()} {describe_exit(m.exit_code) if m.exit_code is not None else 'was lost'}"
                                  for m in members)
                self.outcome = Outcome(exit_code(first.exit_code if first.exit_code is not None else 1),
                                       first.rank, first.host, f"every rank failed: {names}")

    def _on_discovered(self, found: dict) -> None:
        if self.discovery_error:
            self.say(f"{self.discovery.describe()} works again")
            self.discovery_error = ""
        change = self.membership.update(found, self.clock())
        if change != HostUpdate.no_update:
            self._open_new_hosts(blocking=False)

    def _open_new_hosts(self, blocking: bool) -> None:
        now = self.clock()
        wanted = {h for h, _ in self.membership.target(now)} - self.opened - self.opening
        if not wanted:
            return
        hosts = sorted(wanted, key=self.membership.order(now).index)
        self.opening |= set(hosts)
        if blocking:
            for host, failure in self.mech.open_hosts(hosts).items():
                self._on_opened(host, failure)
            return

        def check() -> None:
            try:
                result = self.mech.open_hosts(hosts)
            except Exception as e:  # noqa: BLE001 - reported as that host's failure
                result = {h: f"{h}: {type(e).__name__}: {e}" for h in hosts}
            for host, failure in result.items():
                self.events.put(("opened", host, failure, None))
        threading.Thread(target=check, name="elastic-open", daemon=True).start()

    def _on_opened(self, host: str, failure: str | None) -> None:
        self.opening.discard(host)
        if failure is None:
            self.opened.add(host)
            return
        now = self.clock()
        until = self.membership.blacklist(host, now)
        when = "for good" if until == math.inf else f"for {until - now:.0f} s"
        self.say(f"host {host} cannot run ranks, blacklisted {when}: {failure}")

    # -- decisions ----------------------------------------------------------------------------
    def _break(self, cur: Round, why: str) -> None:
        if not cur.broken:
            cur.broken, cur.broken_at = True, self.clock()
            if self.config.verbose:
                self.say(f"round {cur.id} ends: {why}")

    def _advance(self) -> None:
        if self.outcome is not None:
            return
        now = self.clock()
        if self.finishing:
            for w in self.workers.values():
                if w.ticket is not None:
                    w.ticket.set({"error": "the job is ending: a worker finished"})
                    w.ticket = None
            if not self.mech.running():
                self.outcome = Outcome(0)
            return
        cur = self.round
        if cur is not None and not cur.released and not cur.broken:
            members = [self.workers[m] for m in cur.members]
            if any(not m.alive or m.leaving for m in members):
                self._break(cur, "a member left before the round started")
            elif all(m.ticket is not None for m in members):
                self._release(cur)
                return
            elif now - cur.formed_at > self.e.timeout_s:
                for m in members:
                    if m.ticket is None:
                        self._failure(m, f"did not join round {cur.id} within {self.e.timeout_s:g} s")
                        self._remove(m, "did not join in time")
            else:
                return
        if cur is not None and cur.released and not cur.broken:
            self._grow_and_notify(cur)
            return
        if cur is not None and cur.broken:
            back = [self.workers[m] for m in cur.members
                    if self.workers[m].in_round and self.workers[m].alive and not self.workers[m].leaving]
            for m in back:  # a silent host: its SSH heartbeats stopped (sooner than the SSH timeout)
                silent = getattr(m.handle, "silent_s", None)
                if silent is not None and silent() > SILENT_S:
                    self._failure(m, f"stopped answering: nothing from {m.host} over SSH for {SILENT_S:g} s")
                    self._remove(m, "its host stopped answering")
            back = [m for m in back if not m.leaving and m.alive]
            if back:
                if now - cur.broken_at > self.e.timeout_s:
                    for m in back:
                        self._failure(m, f"did not come back within {self.e.timeout_s:g} s after round {cur.id} ended")
                        self._remove(m, "did not come back in time")
                return
        if self.outcome is None:
            self._form(now)

    def _eligible(self, now: float) -> tuple[list[tuple[str, int]], dict[tuple[str, int], WorkerRec]]:
        """The target slots and the live workers that hold one; removes the workers that hold none."""
        target = self.membership.target(now)
        wanted = set(target)
        have: dict[tuple[str, int], WorkerRec] = {}
        for w in self.workers.values():
            if not w.alive or w.leaving:
                continue
            if (w.host, w.index) in wanted and (w.host, w.index) not in have:
                have[(w.host, w.index)] = w
            else:
                self._remove(w, f"host {w.host} is no longer part of the job" if w.host not in dict(target)
                             else "its slot is no longer part of the job")
        return target, have

    def _form(self, now: float) -> None:
        first = self.round is None
        target, have = self._eligible(now)
        free = [t for t in target if t not in have and t[0] in self.opened]
        needed = self.config.np if first else self.e.min_np
        if len(have) + len(free) < needed:
            self._open_new_hosts(blocking=False)
            if self.short_since is None:
                self.short_since = now
                self.say(f"waiting for {needed} slots ({len(have) + len(free)} available; "
                         f"at most {self.e.timeout_s:g} s)")
            elif now - self.short_since > self.e.timeout_s:
                self.outcome = Outcome(1, reason=f"fewer than {'-np' if first else '--min-np'} {needed} slots "
                                                 f"were available for {self.e.timeout_s:g} s (--elastic-timeout); "
                                                 f"hosts: {self._hosts_line(now)}")
            return
        if self.short_since is not None:
            self.short_since = None
        if not first:
            if not any(w.last > 0 for w in have.values()):
                self.outcome = Outcome(1, reason="no worker of the last round is left to hold the training state "
                                                 f"(hosts now: {self._hosts_line(now)})")
                return
            try:
                self.membership.count_reset()
            except ResetLimitExceeded as e:
                self.outcome = Outcome(1, reason=str(e))
                return
        previous = self.round
        self.rounds += 1
        rid = self.rounds
        planned = layout([(w.wid, w.host, w.index) for w in have.values()] +
                         [(-1 - i, h, s) for i, (h, s) in enumerate(free)], self.membership.order(now))
        for i, (host, index) in enumerate(free):
            w = self._spawn(host, index, planned[-1 - i])
            if w is None:
                return  # could not start: its host is blacklisted; the next step forms again
            have[(host, index)] = w
        members = list(have.values())
        slots = layout([(w.wid, w.host, w.index) for w in members], self.membership.order(now))
        order = sorted(members, key=lambda w: slots[w.wid].rank)
        sync = (previous is None or previous.failed or any(w.last == 0 for w in members)
                or any(w.join.get("reason") == "error" for w in members))
        self.round = Round(rid, [w.wid for w in order], slots, sync, now)
        self.failed = []
        self.notified = None
        if not first:
            grown = len(members) - len(previous.members) if previous else 0
            what = f"{len(members)} rank{'s' if len(members) != 1 else ''}" + (f" ({grown:+d})" if grown else "")
            self.say(f"round {rid}: {what} on {', '.join(dict.fromkeys(slots[w.wid].host for w in order))} "
                     f"(reset {self.membership.resets}"
                     f"{'' if self.e.reset_limit is None else ' of ' + str(self.e.reset_limit)})")
        if all(w.ticket is not None for w in members):
            self._release(self.round)

    def _spawn(self, host: str, index: int, slot: Any) -> WorkerRec | None:
        wid = len(self.workers)
        w = WorkerRec(wid, host, index)
        self.workers[wid] = w
        spec = mech_mod.RankSpec(slot, wid, {
            "HOROVOD_ELASTIC": "1", "APPLIANCE_ELASTIC_ADDR": f"{self.mech.launcher_address(host)}:{self.server.port}",
            "APPLIANCE_ELASTIC_WORKER": str(wid), "HOROVOD_ELASTIC_TIMEOUT": repr(float(self.e.timeout_s))})
        plan = self._plan()
        try:
            if not self._started:
                self._started = True
                self.mech.start([spec], plan, self.sink, self.reaper)
            else:
                self.mech.add(host, [spec], plan)
        except SpawnError as e:
            w.exit_code = e.returncode
            self._failure(w, f"could not start: {e}", e.returncode)
            return None
        w.handle = self.mech.workers[-1]
        return w

    def _plan(self) -> envmod.JobPlan:
        hosts = sorted(self.opened)
        addrs = self.mech.round_addresses(hosts)
        first = self.membership.order(self.clock())
        master = addrs.get(first[0], "") if first else ""
        return envmod.JobPlan(job_id=self.job_id, secret=self.secret, store_addr="", master_addr=master,
                              master_port=0, data_addrs=addrs, start_timeout_s=self.config.start_timeout_s,
                              verbose=self.config.verbose, fault_dir=self.fault_dir)

    def _release(self, cur: Round) -> None:
        members = [self.workers[m] for m in cur.members]
        addrs = self.mech.round_addresses(list(dict.fromkeys(w.host for w in members)))
        rank0 = members[0]
        store_host = addrs.get(rank0.host) or str(rank0.join.get("addr", ""))
        store = f"{store_host}:{int(rank0.join.get('port') or 0)}"
        for w in members:
            s = cur.slots[w.wid]
            answer = {"round": cur.id, "job_id": f"{self.job_id}.{cur.id}", "rank": s.rank, "size": s.size,
                      "local_rank": s.local_rank, "local_size": s.local_size, "cross_rank": s.cross_rank,
                      "cross_size": s.cross_size, "host": w.host,
                      "data_addr": addrs.get(w.host) or str(w.join.get("addr", "")), "store": store, "sync": cur.sync}
            assert w.ticket is not None
            w.ticket.set({"round": answer})
            w.ticket, w.last, w.in_round, w.rank = None, cur.id, True, s.rank
        cur.released = True
        if self.config.verbose:
            self.say(f"round {cur.id} started: {len(members)} ranks, store {store}, sync {cur.sync}")

    def _grow_and_notify(self, cur: Round) -> None:
        """A healthy round: start workers for the free slots of the target (they wait for the next
        round), and once every target slot has a worker that has joined (its start overlaps the
        training), tell the members (once per target)."""
        now = self.clock()
        target = self.membership.target(now)
        members = {(self.workers[m].host, self.workers[m].index) for m in cur.members}
        if set(target) == members:
            return
        self._open_new_hosts(blocking=False)
        held = {(w.host, w.index) for w in self.workers.values() if w.alive and not w.leaving}
        order = self.membership.order(now)
        for host, index in target:
            if (host, index) in held or host not in self.opened:
                continue
            planned = layout([(w.wid, w.host, w.index) for w in self.workers.values()
                              if w.alive and not w.leaving and (w.host, w.index) in set(target)]
                             + [(-1, host, index)], order)
            if self._spawn(host, index, planned[-1]) is None:
                return
            held.add((host, index))
        key = (cur.id, tuple(target))
        joined = {(w.host, w.index) for w in self.workers.values()
                  if w.alive and not w.leaving and (w.ticket is not None or w.wid in cur.members)}
        if self.notified == key or any(t not in joined for t in target):
            return  # told already, or new workers still starting (training goes on meanwhile)
        self.notified = key
        result = ((HostUpdate.added if any(t not in members for t in target) else HostUpdate.no_update)
                  | (HostUpdate.removed if any(m not in set(target) for m in members) else HostUpdate.no_update))
        self.timestamp = max(self.timestamp + 1, int(time.time()))
        note = {"hosts_updated": {"timestamp": self.timestamp, "result": int(result), "round": cur.id}}
        for m in cur.members:
            w = self.workers[m]
            if w.stream is not None:
                w.stream.push(note)
        self.say(f"hosts changed ({HostUpdate(result).name}): available now {self._hosts_line(now)}; round {cur.id} "
                 "moves to the new layout at its next commit")

    def _remove(self, w: WorkerRec, why: str) -> None:
        if w.leaving or not w.alive:
            return
        w.leaving, w.leaving_since = why, self.clock()
        if w.ticket is not None:  # at a join: told to leave, it exits 0 by itself (TERM only after the grace)
            w.ticket.set({"removed": why})
            w.ticket = None
            w.asked_to_leave = True
        elif w.handle is not None:
            self.mech.remove([w.handle])

    def _reap_leaving(self) -> None:
        now = self.clock()
        for w in self.workers.values():
            if w.leaving and w.alive and w.handle is not None and now - w.leaving_since > self.config.stop_grace_s:
                if w.asked_to_leave:  # it did not exit by itself: TERM now, KILL after another grace
                    w.asked_to_leave, w.leaving_since = False, now
                    self.mech.remove([w.handle])
                    continue
                w.handle.signal(signal.SIGKILL)
                w.leaving_since = math.inf

    def _hosts_line(self, now: float) -> str:
        avail = self.membership.available(now)
        out = ", ".join(f"{h}:{s}" for h, s in avail) or "none"
        black = [h for h in self.membership.hosts if self.membership.is_blacklisted(h, now)]
        return out + (f"; blacklisted: {', '.join(black)}" if black else "")

    def _blame(self, w: WorkerRec, code: int) -> Outcome:
        return Outcome(exit_code(code), w.rank, w.host, f"{w.name()} {describe_exit(code)}")

    def _end_all(self) -> None:
        """The job's outcome is known: answer every held join, give the survivors the failure
        grace to exit by themselves (as a static job does), then the caller stops the rest."""
        for w in self.workers.values():
            if w.ticket is not None:
                w.ticket.set({"error": f"the job is ending: {self.outcome.reason if self.outcome else 'stopped'}"})
                w.ticket = None
            if w.stream is not None:
                w.stream.close()
        if self.outcome is None or self.outcome.returncode == 0 or self.outcome.interrupted or self.outcome.timed_out:
            return
        end = self.clock() + self.config.failure_grace_s
        while self.mech.running() and self.clock() < end and not self.trap.received:
            self.mech.next_exit(POLL_S)


__all__ = ["ElasticDriver"]
