"""The job as the launcher sees it through the metrics wire: per-rank state and its aggregates.

What it owns: ``JobState``, fed by the collector with the wire's messages (``hello``, ``sample``,
``bye``; ``docs/observing.md``) and by the launcher with events (a line: an elastic round formed,
a host left...), and ``JobState.snapshot()``: an immutable ``Snapshot`` of the job at one moment,
which the view, the record, the Prometheus endpoint and the report read. Every counter on the
wire is cumulative, so rates are differences over a window of each rank's recent samples:
steps/s, samples/s, communication share (d busy_s / d wall_s), lateness and waiting per step,
bus bandwidth per operation kind (bytes / core seconds with nccl-tests' factors). A rank whose
counters go back (a new process took its rank: elastic) starts a new window; a rank's only sample
so far is measured from where its process began counting (``wall_s`` before it, counters at zero). The straggler rule
is ``straggler.py``'s; a stall (no rank finished a step for ``STALL_S`` while they report) and its
end are events too. Thread-safe: one lock around the state; ``snapshot`` copies out.

Env vars: none. Failure modes: none raised; a malformed message is counted and ignored.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import threading
import time
from typing import Any, Callable, Mapping, Optional

from .straggler import RankWindow, Straggler, StragglerTracker

OP_KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
KEEP_SAMPLES = 64        # per rank: enough for a window at any sane interval
MAX_EVENTS = 50
STALL_S = 60.0  # no rank finished a step for this long while they report: a stall (Horovod's warning too)
MIN_STRAGGLER_SPAN_S = 2.0  # a rank's window takes part in the straggler rule once it spans this
SETTLE_STEPS = 3  # a rank's first steps in a round (joining, warming up) take no part in the straggler rule
MAX_PIDS = 4096


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of an operation kind over ``n`` ranks."""
    if n <= 1:
        return 1.0
    if kind == "allreduce":
        return 2.0 * (n - 1) / n
    if kind in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def _num(v: Any, default: float = 0.0) -> float:
    if isinstance(v, bool):
        return default
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return default
    return f if math.isfinite(f) else default


@dataclasses.dataclass(frozen=True)
class Sample:
    """One ``sample`` message, typed (cumulative counters)."""
    t: float
    step: float
    samples: Optional[float]
    busy_s: float
    wall_s: float
    wait_s: float
    late_s: float
    ops: Mapping[str, tuple]     # kind -> (n, bytes, seconds)
    rss: Optional[float] = None
    gpu_util: Optional[float] = None
    gpu_mem: Optional[float] = None
    round: int = 0
    total_steps: Optional[int] = None

    @classmethod
    def of(cls, m: Mapping[str, Any]) -> "Sample":
        ops = {}
        given = m.get("ops")
        for kind, v in (given.items() if isinstance(given, Mapping) else ()):
            if isinstance(v, Mapping) and len(ops) < 16:
                ops[str(kind)[:32]] = (_num(v.get("n")), _num(v.get("bytes")), _num(v.get("s")))
        opt = lambda k: None if m.get(k) is None else _num(m.get(k))  # noqa: E731
        total = _num(m.get("total_steps"))
        return cls(t=_num(m.get("t"), time.time()), step=_num(m.get("step")), samples=opt("samples"),
                   busy_s=_num(m.get("busy_s")), wall_s=_num(m.get("wall_s")), wait_s=_num(m.get("wait_s")),
                   late_s=_num(m.get("late_s")), ops=ops, rss=opt("rss"), gpu_util=opt("gpu_util"),
                   gpu_mem=opt("gpu_mem"), round=int(_num(m.get("round"))),
                   total_steps=int(total) if total > 0 else None)

    def origin(self) -> Optional["Sample"]:
        """Where this sample's process began counting: ``wall_s`` before it, every counter at zero
        (None when unknown). A rank's only sample so far has rates from it."""
        if self.wall_s <= 0:
            return None
        return Sample(t=self.t - self.wall_s, step=0.0, samples=None if self.samples is None else 0.0, busy_s=0.0,
                      wall_s=0.0, wait_s=0.0, late_s=0.0, ops={}, round=self.round, total_steps=self.total_steps)

    def to_json(self) -> dict:
        return {"t": self.t, "step": self.step, "samples": self.samples, "busy_s": self.busy_s,
                "wall_s": self.wall_s, "wait_s": self.wait_s, "late_s": self.late_s,
                "ops": {k: list(v) for k, v in self.ops.items()}, "rss": self.rss, "gpu_util": self.gpu_util,
                "gpu_mem": self.gpu_mem, "round": self.round, "total_steps": self.total_steps}


@dataclasses.dataclass(frozen=True)
class Rates:
    """One rank's rates over its window (None: not known yet)."""
    steps_per_s: Optional[float] = None
    samples_per_s: Optional[float] = None
    comm_share: Optional[float] = None
    step_time_s: Optional[float] = None
    wait_per_step_s: Optional[float] = None
    late_per_step_s: Optional[float] = None
    busbw: Mapping[str, float] = dataclasses.field(default_factory=dict)   # kind -> bytes/s


def rates(first: Sample, last: Sample, size: int) -> Rates:
    """The rates between two samples of one rank (``first`` older)."""
    dt = last.t - first.t
    dstep = last.step - first.step
    if dt <= 0:
        return Rates()
    dwall = last.wall_s - first.wall_s
    busbw = {}
    for kind, (n1, b1, s1) in last.ops.items():
        n0, b0, s0 = first.ops.get(kind, (0.0, 0.0, 0.0))
        if s1 - s0 > 0 and b1 - b0 > 0:
            busbw[kind] = (b1 - b0) / (s1 - s0) * busbw_factor(kind, size)
    per_step = (lambda d: d / dstep) if dstep > 0 else (lambda d: None)
    return Rates(
        steps_per_s=dstep / dt,
        samples_per_s=None if first.samples is None or last.samples is None else (last.samples - first.samples) / dt,
        comm_share=None if dwall <= 0 else min(1.0, max(0.0, (last.busy_s - first.busy_s) / dwall)),
        step_time_s=per_step(dt), wait_per_step_s=per_step(last.wait_s - first.wait_s),
        late_per_step_s=per_step(last.late_s - first.late_s), busbw=busbw)


class RankState:
    """What the launcher knows of one rank."""

    def __init__(self, rank: int, host: str):
        self.rank, self.host = rank, host
        self.pid: Optional[int] = None
        self.local_rank: Optional[int] = None
        self.round = 0
        self.connected = False
        self.said_bye = False
        self.samples: collections.deque = collections.deque(maxlen=KEEP_SAMPLES)
        # where its process stood when its round began: its own counter then (``start``), the
        # job's step then (``base``); its step as the job counts it is base + step - start
        self.start_round: Optional[int] = None
        self.start = 0.0
        self.base = 0.0
        self.settled_t: Optional[float] = None  # when it had done SETTLE_STEPS steps in its round

    def add(self, s: Sample) -> bool:
        """Keeps ``s``; False when it was a duplicate. A sample whose counters went back starts a
        new window (a new process holds this rank)."""
        last = self.samples[-1] if self.samples else None
        if last is not None and (s.step < last.step or s.wall_s < last.wall_s or s.t <= last.t):
            if s.t <= last.t and s.step >= last.step and s.wall_s >= last.wall_s:
                return False  # a duplicate or reordered sample
            self.samples.clear()  # a new process holds this rank: counters restarted
            self.start_round = None
        self.samples.append(s)
        self.round = s.round
        return True

    def job_step(self, s: Sample) -> float:
        """``s``'s step as the job counts it."""
        return self.base + max(0.0, s.step - self.start)

    def since(self, t0: float) -> Optional[Sample]:
        """Its oldest sample at or after ``t0`` other than the newest (None if there is none)."""
        for s in list(self.samples)[:-1]:
            if s.t >= t0 - 1e-9:
                return s
        return None

    def window(self, span_s: float) -> tuple[Optional[Sample], Optional[Sample]]:
        """(oldest sample within ``span_s`` of the newest, newest); the oldest is None with < 2."""
        if len(self.samples) < 2:
            return None, self.samples[-1] if self.samples else None
        last = self.samples[-1]
        first = None
        for s in self.samples:
            if s.t >= last.t - span_s - 1e-9 and s is not last:
                first = s
                break
        return (first or self.samples[-2]), last


@dataclasses.dataclass(frozen=True)
class RankRow:
    rank: int
    host: str
    step: Optional[float]
    round: int
    alive: bool                    # reporting, or ended with a bye
    rates: Rates
    rss: Optional[float] = None
    gpu_util: Optional[float] = None
    gpu_mem: Optional[float] = None
    last: Optional[Sample] = None
    straggler: bool = False
    connected: bool = False        # its connection is open now


@dataclasses.dataclass(frozen=True)
class HostRow:
    host: str
    ranks: tuple
    step: Optional[float]
    steps_per_s: Optional[float]
    samples_per_s: Optional[float]
    comm_share: Optional[float]
    late_ms: Optional[float]       # the host's largest lateness per step
    wait_ms: Optional[float]       # its ranks' median wait per step
    busbw: Optional[float]         # bytes/s, the host's median over its ranks and kinds
    rss: Optional[float]           # sum over its ranks
    gpu_util: Optional[float]      # mean
    round: int
    alive: int
    straggler: bool = False


@dataclasses.dataclass(frozen=True)
class Event:
    t: float
    text: str
    source: str = "job"     # "launcher": said by the launcher already (elastic); "straggler"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    job_id: str
    t: float
    started: float
    size: int
    ranks: tuple                   # RankRow, by rank
    hosts: tuple                   # HostRow, by their lowest rank
    step: Optional[float]
    total_steps: Optional[int]
    steps_per_s: Optional[float]
    samples_per_s: Optional[float]
    comm_share: Optional[float]
    round: int
    events: tuple                  # Event, oldest first
    straggler: Optional[Straggler]

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.t - self.started)

    @property
    def eta_s(self) -> Optional[float]:
        if not self.total_steps or self.step is None or not self.steps_per_s:
            return None
        return max(0.0, (self.total_steps - self.step) / self.steps_per_s)

    @property
    def reporting(self) -> int:
        return sum(1 for r in self.ranks if r.alive)


def _median(values) -> Optional[float]:
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def _mean(values) -> Optional[float]:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


class JobState:
    """The job's state (see the module docstring). ``window_s``: the span rates are taken over."""

    def __init__(self, job_id: str, size: int = 0, *, hosts: Mapping[int, str] | None = None,
                 total_steps: Optional[int] = None, window_s: float = 5.0,
                 clock: Callable[[], float] = time.time, on_event: Callable[[Event], None] | None = None):
        self.job_id, self.size, self.window_s, self.clock = job_id, size, window_s, clock
        self.total_steps = total_steps
        self.started = clock()
        self.round = 0
        self.bad_messages = 0
        self.ranks: dict[int, RankState] = {}
        self.host_order: list[str] = []
        for rank, host in (hosts or {}).items():
            self._rank(rank, host)
        self.events: collections.deque = collections.deque(maxlen=MAX_EVENTS)
        self.tracker = StragglerTracker()
        self._pid_step: dict = {}          # pid -> its newest counter (a process that changes rank keeps its count)
        self._job_round: Optional[int] = None  # the newest round a sample came from
        self._round_base: dict[int, float] = {}  # round -> the job's step when it began
        self._top_step = -1.0
        self._progress_t = self.started
        self._stalled = False
        self.on_event = on_event
        self._lock = threading.Lock()

    def _rank(self, rank: int, host: str) -> RankState:
        st = self.ranks.get(rank)
        if st is None:
            st = self.ranks[rank] = RankState(rank, host)
        elif host and host != st.host:
            st.host = host
        if st.host not in self.host_order:
            self.host_order.append(st.host)
        return st

    # -- input (collector and launcher threads) ----------------------------------------------
    def message(self, m: Mapping[str, Any]) -> None:
        """One wire message (already authenticated); one that does not fit is counted and ignored."""
        try:
            self._message(m)
        except Exception:  # noqa: BLE001 - wrong types from a rank cost that message, never the collector
            self.bad_messages += 1

    def _message(self, m: Mapping[str, Any]) -> None:
        try:
            kind, rank = m.get("kind"), int(m["rank"])
        except (KeyError, TypeError, ValueError, AttributeError):
            self.bad_messages += 1
            return
        with self._lock:
            if kind == "hello":
                st = self._rank(rank, str(m.get("host") or (self.ranks[rank].host if rank in self.ranks else "?")))
                if m.get("pid") != st.pid:
                    st.samples.clear()
                    st.start_round = None
                st.pid, st.local_rank, st.connected, st.said_bye = m.get("pid"), m.get("local_rank"), True, False
                if isinstance(m.get("size"), int) and m["size"] > 0:
                    self.size = m["size"]
                st.round = int(_num(m.get("round")))
            elif kind == "sample":
                st = self.ranks.get(rank) or self._rank(rank, "?")
                s = Sample.of(m)
                self._sample(st, s)
                st.connected = True
                if s.total_steps:
                    self.total_steps = s.total_steps
            elif kind == "bye":
                st = self.ranks.get(rank)
                if st is not None:
                    st.said_bye, st.connected = True, False
            else:
                self.bad_messages += 1

    def _sample(self, st: RankState, s: Sample) -> None:
        """One sample of ``st`` (under the lock). The job's step is what the script counts, not the
        smallest per-process counter: a round's step is the job's step when the round began plus
        the steps its slowest member did in it, so a rank that joined later (its counter began at
        its own start) or a survivor that changed rank (its counter goes on) counts right."""
        if self._job_round is None or s.round > self._job_round:
            self._round_base[s.round] = self._job_step_now() if self._job_round is not None else 0.0
            self._job_round = s.round
        if not st.add(s):
            return
        if st.start_round != s.round:  # its first sample in this round (or of a new process)
            before = self._pid_step.get(st.pid, 0.0) if st.pid is not None else 0.0
            st.start = before if before <= s.step else 0.0
            st.start_round, st.base, st.settled_t = s.round, self._round_base.get(s.round, 0.0), None
        if st.settled_t is None and s.step - st.start >= SETTLE_STEPS:
            st.settled_t = s.t
        if st.pid is not None:
            self._pid_step[st.pid] = s.step
            while len(self._pid_step) > MAX_PIDS:
                del self._pid_step[next(iter(self._pid_step))]

    def _job_step_now(self) -> float:
        """The job's step from the members of its newest round (under the lock)."""
        cur = [st for st in self.ranks.values() if st.samples and st.start_round == self._job_round]
        live = [st for st in cur if st.connected or st.said_bye] or cur
        if not live:
            return self._round_base.get(self._job_round, 0.0) if self._job_round is not None else 0.0
        return min(st.job_step(st.samples[-1]) for st in live)

    def disconnected(self, rank: int) -> None:
        with self._lock:
            st = self.ranks.get(rank)
            if st is not None:
                st.connected = False

    def event(self, text: str, t: Optional[float] = None, source: str = "job") -> None:
        """A line of the job's history (elastic driver, straggler)."""
        ev = Event(self.clock() if t is None else t, text, source)
        with self._lock:
            self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def note_round(self, round_id: int) -> None:
        """The elastic round the job is in (no event: ``new_round`` says it)."""
        with self._lock:
            self.round = max(self.round, round_id)

    def new_round(self, round_id: int, ranks: int) -> None:
        self.note_round(round_id)
        self.event(f"round {round_id} formed: {ranks} rank{'s' if ranks != 1 else ''}", source="launcher")

    # -- output --------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        now = self.clock()
        with self._lock:
            size = self.size or len(self.ranks)
            rows, windows = [], []
            gate = self._settled()
            for rank in sorted(self.ranks):
                st = self.ranks[rank]
                first, last = st.window(self.window_s)
                base = first if first is not None else last.origin() if last is not None else None
                r = rates(base, last, size) if base is not None else Rates()
                rows.append(RankRow(rank=rank, host=st.host, step=st.job_step(last) if last else None,
                                    round=st.round, alive=st.connected or st.said_bye, rates=r,
                                    rss=last.rss if last else None, gpu_util=last.gpu_util if last else None,
                                    gpu_mem=last.gpu_mem if last else None, last=last, connected=st.connected))
                # the straggler rule: only windows that begin once every member of the round is
                # past its first steps (a rank that joins keeps the others waiting while it starts)
                first = st.since(max(gate, last.t - self.window_s)) if gate is not None and last else None
                if first is not None and st.connected and last.t - first.t >= MIN_STRAGGLER_SPAN_S:
                    windows.append(RankWindow(rank, st.host, last.step - first.step, last.t - first.t,
                                              last.wait_s - first.wait_s, last.late_s - first.late_s))
            job_step = self._job_step_now() if self._job_round is not None else None
            change = self.tracker.update(windows, now)
            round_ = max([self.round] + [r.round for r in rows])
            stall = self._stall(rows, now)
            total = self.total_steps
            started = self.started
        if change is not None:
            self.event(change, source="straggler")
        if stall is not None:
            self.event(stall, source="stall")
        with self._lock:
            events = tuple(self.events)
        strag = self.tracker.current
        if strag is not None:
            rows = [dataclasses.replace(r, straggler=True) if r.rank == strag.rank else r for r in rows]
        hosts = self._hosts(rows, strag)
        live = [r for r in rows if r.alive]
        spd = [r.rates.samples_per_s for r in live if r.rates.samples_per_s is not None]
        return Snapshot(job_id=self.job_id, t=now, started=started, size=size, ranks=tuple(rows), hosts=tuple(hosts),
                        step=job_step, total_steps=total,
                        steps_per_s=_median(r.rates.steps_per_s for r in live),
                        samples_per_s=sum(spd) if spd else None,
                        comm_share=_mean(r.rates.comm_share for r in live), round=round_, events=events,
                        straggler=strag)

    def _settled(self) -> Optional[float]:
        """When the last connected member of the newest round got past its first steps (None: one
        has not yet; under the lock)."""
        cur = [st for st in self.ranks.values() if st.connected and st.start_round == self._job_round]
        if not cur or any(st.settled_t is None for st in cur):
            return None
        return max(st.settled_t for st in cur)

    def _stall(self, rows: list, now: float) -> Optional[str]:
        """The line to say when the job stops or resumes finishing steps (under the lock)."""
        steps = [r.step for r in rows if r.step is not None]
        if not steps:
            return None
        if max(steps) > self._top_step:
            self._top_step, self._progress_t = max(steps), now
            if self._stalled:
                self._stalled = False
                return f"stall over: steps again (step {max(steps):.0f})"
            return None
        alive = [r for r in rows if r.alive]
        if not self._stalled and alive and now - self._progress_t >= STALL_S:
            self._stalled = True
            return (f"stall: no rank has finished a step for {now - self._progress_t:.0f} s "
                    f"(step {self._top_step:.0f}; {len(alive)} of {len(rows)} ranks still report)")
        return None

    def _hosts(self, rows: list, strag: Optional[Straggler]) -> list:
        by_host: dict[str, list] = {}
        for h in self.host_order:
            by_host[h] = []
        for r in rows:
            by_host.setdefault(r.host, []).append(r)
        out = []
        # hosts in the order of their lowest rank (as -H lists them), not of their first hello
        for host, mine in sorted(by_host.items(), key=lambda kv: min((r.rank for r in kv[1]), default=1 << 30)):
            if not mine:
                continue
            live = [r for r in mine if r.alive] or mine
            steps = [r.step for r in live if r.step is not None]
            spd = [r.rates.samples_per_s for r in live if r.rates.samples_per_s is not None]
            late = [r.rates.late_per_step_s for r in live if r.rates.late_per_step_s is not None]
            rss = [r.rss for r in live if r.rss is not None]
            bw = [v for r in live for v in r.rates.busbw.values()]
            wait = _median(r.rates.wait_per_step_s for r in live)
            out.append(HostRow(
                host=host, ranks=tuple(r.rank for r in mine), step=min(steps) if steps else None,
                steps_per_s=_median(r.rates.steps_per_s for r in live), samples_per_s=sum(spd) if spd else None,
                comm_share=_mean(r.rates.comm_share for r in live), late_ms=max(late) * 1e3 if late else None,
                wait_ms=None if wait is None else wait * 1e3, busbw=_median(bw),
                rss=sum(rss) if rss else None, gpu_util=_mean(r.gpu_util for r in live),
                round=max(r.round for r in mine), alive=sum(1 for r in mine if r.alive),
                straggler=strag is not None and strag.host == host and strag.rank in {r.rank for r in mine}))
        return out


__all__ = ["Event", "HostRow", "JobState", "RankRow", "RankState", "Rates", "Sample", "Snapshot", "busbw_factor",
           "rates", "OP_KINDS"]
