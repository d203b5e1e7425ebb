"""The record of a job, written into its job directory as it runs (a job killed midway keeps it).

What it owns: the files ``RecordWriter`` writes under the job directory and ``read_record`` reads:

    metrics.jsonl    one JSON object a line: ``{"kind":"job",...}`` first (id, size, hosts, start),
                     then ``{"kind":"rank","rank":R,"host":H,...}`` rows (each rank's newest cumulative
                     counters, as on the wire, written when they changed, at most every
                     ``every_s`` seconds, and ``job_step``: its step as the job counts it,
                     across elastic rounds), ``{"kind":"event","t":T,"text":...,"source":S}`` lines
                     (elastic rounds, hosts, stragglers, stalls), ``{"kind":"round",...}`` and a last
                     ``{"kind":"end","t":T,"returncode":C,"summary":...}``
    events.out.tfevents.*   TensorBoard scalars (``tensorboardX``): the job's steps/s, samples/s,
                     communication share, and per host steps/s, communication share and lateness,
                     so ``tensorboard --logdir SHARED/jobs`` shows every job as a run
    live.json        the job at a glance for ``appliance status`` (id, hosts, ranks, step,
                     steps/s, started, updated, ended), replaced atomically

Env vars: none. Failure modes: a job directory that cannot be created or opened means no record
(one warning through ``warn``), never a failed job; a write that fails later (no fd to be had,
a full disk) costs that tick: one warning when the failures begin, one when writes succeed again,
and the next tick writes what changed; without ``tensorboardX`` there are no event files.
``read_record`` skips lines it cannot parse (a line cut by a killed launcher).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable, Optional

from ...mount.atomic import write_json
from .state import Snapshot

RECORD = "metrics.jsonl"
LIVE = "live.json"


def _summary_writer():
    """tensorboardX's ``SummaryWriter``, imported without torch when the launcher has not imported it:
    tensorboardX imports torch only to name a type (4.3 s against 0.5 s, most of it holding the GIL,
    which stalls the launcher's SSH heartbeats as the ranks start)."""
    blocked = "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None  # type: ignore[assignment]  # "import torch" raises ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        if blocked and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


class RecordWriter:
    def __init__(self, job_dir: str, job_id: str, size: int, *, every_s: float = 2.0,
                 warn: Callable[[str], None] = lambda s: None, tensorboard: bool = True):
        self.job_dir, self.job_id, self.size, self.every_s, self.warn = job_dir, job_id, size, every_s, warn
        self._f: Any = None
        self._tb: Any = None
        self._tb_wanted = tensorboard
        self._written: dict[int, float] = {}   # rank -> t of its last row
        self._last = 0.0
        self._started = time.time()
        self._broken = False      # no record at all: the directory or the file could not be opened
        self._failing = False     # the last write failed (said once); the next tick tries again
        self._flushed = False
        self._tb_lock = threading.Lock()

    def __enter__(self) -> "RecordWriter":
        try:
            os.makedirs(self.job_dir, exist_ok=True)
            self._f = open(os.path.join(self.job_dir, RECORD), "a", encoding="utf-8")
        except OSError as e:
            self._broken = True
            self.warn(f"no record of the job in {self.job_dir}: {e}")
            return self
        self._write({"kind": "job", "job": self.job_id, "size": self.size, "t": self._started})
        return self

    def open_tensorboard(self, wait: bool = True) -> None:
        """The event writer, made by the observer's warm-up thread as the job starts (importing it
        takes a while: neither the ranks nor the ticker wait for that), or else at the first
        numbers. ``wait=False``: do nothing while another thread is making it."""
        if not self._tb_lock.acquire(blocking=wait):
            return
        try:
            self._open_tensorboard()
        finally:
            self._tb_lock.release()

    def _open_tensorboard(self) -> None:
        if not self._tb_wanted or self._broken:
            return
        self._tb_wanted = False
        try:
            SummaryWriter = _summary_writer()
            self._tb = SummaryWriter(logdir=self.job_dir, flush_secs=10)
        except ImportError:
            self._tb = None
        except Exception as e:  # noqa: BLE001 - the record is optional, the job is not
            self.warn(f"no TensorBoard events: {type(e).__name__}: {e}")

    def _fail(self, e: BaseException) -> None:
        """A write failed: said once while failures last; the record goes on at the next tick."""
        if not self._failing:
            self._failing = True
            self.warn(f"the job's record in {self.job_dir} misses a write: {e} (trying again each tick)")

    def _ok(self) -> None:
        if self._failing:
            self._failing = False
            self.warn(f"the job's record in {self.job_dir} is written again")

    def _write(self, obj: dict) -> None:
        if self._f is None or self._broken:
            return
        try:
            self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        except (OSError, ValueError) as e:
            self._fail(e)

    def event(self, t: float, text: str, source: str = "job") -> None:
        self._write({"kind": "event", "t": t, "text": text, "source": source})
        self._flush()

    def round(self, t: float, round_id: int, ranks: int) -> None:
        self._write({"kind": "round", "t": t, "round": round_id, "ranks": ranks})
        self._flush()

    def tick(self, snap: Snapshot, force: bool = False) -> None:
        """Write what changed since the last tick (at most every ``every_s`` unless ``force``)."""
        if not force and snap.t - self._last < self.every_s:
            return
        self._last = snap.t
        for r in snap.ranks:
            if r.last is None or self._written.get(r.rank) == r.last.t:
                continue
            self._written[r.rank] = r.last.t
            self._write({"kind": "rank", "rank": r.rank, "host": r.host, **r.last.to_json(), "job_step": r.step})
        self._flush()
        self._tensorboard(snap)
        if self._live(snap, ended=None) and self._flushed:
            self._ok()

    def _tensorboard(self, snap: Snapshot) -> None:
        if snap.step is None:
            return
        self.open_tensorboard(wait=False)
        if self._tb is None:
            return
        step = int(snap.step)
        try:
            for name, v in (("job/steps_per_s", snap.steps_per_s), ("job/samples_per_s", snap.samples_per_s),
                            ("job/comm_share", snap.comm_share)):
                if v is not None:
                    self._tb.add_scalar(name, v, step, walltime=snap.t)
            for h in snap.hosts:
                for name, v in (("steps_per_s", h.steps_per_s), ("comm_share", h.comm_share),
                                ("late_ms_per_step", h.late_ms)):
                    if v is not None:
                        self._tb.add_scalar(f"host/{h.host}/{name}", v, step, walltime=snap.t)
        except Exception as e:  # noqa: BLE001
            self._tb = None
            self.warn(f"TensorBoard events stop: {type(e).__name__}: {e}")

    def _live(self, snap: Snapshot, ended: Optional[float], returncode: Optional[int] = None) -> bool:
        if self._broken or self._f is None:
            return False
        try:
            write_json(os.path.join(self.job_dir, LIVE), {
                "job": self.job_id, "hosts": [h.host for h in snap.hosts], "ranks": snap.size,
                "reporting": snap.reporting, "step": snap.step, "total_steps": snap.total_steps,
                "steps_per_s": snap.steps_per_s, "started": snap.started, "updated": snap.t, "ended": ended,
                "returncode": returncode, "pid": os.getpid()})
        except OSError as e:
            self._fail(e)
            return False
        return True

    def _flush(self) -> None:
        self._flushed = False
        if self._f is not None and not self._broken:
            try:
                self._f.flush()
                self._flushed = True
            except OSError as e:
                self._fail(e)

    def end(self, snap: Snapshot, returncode: Optional[int], summary: str) -> None:
        self.tick(snap, force=True)
        self._write({"kind": "end", "t": snap.t, "returncode": returncode, "summary": summary})
        self._flush()
        self._live(snap, ended=snap.t, returncode=returncode)

    def close(self) -> None:
        if self._tb is not None:
            try:
                self._tb.close()
            except Exception:  # noqa: BLE001
                pass
            self._tb = None
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_record(job_dir: str) -> dict:
    """``{"job": {...} | None, "ranks": [row...], "events": [...], "rounds": [...], "end": {...} | None}``."""
    out: dict = {"job": None, "ranks": [], "events": [], "rounds": [], "end": None}
    path = os.path.join(job_dir, RECORD)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            kind = obj.get("kind") if isinstance(obj, dict) else None
            if kind == "job":
                out["job"] = out["job"] or obj
            elif kind == "rank":
                out["ranks"].append(obj)
            elif kind == "event":
                out["events"].append(obj)
            elif kind == "round":
                out["rounds"].append(obj)
            elif kind == "end":
                out["end"] = obj
    return out


__all__ = ["LIVE", "RECORD", "RecordWriter", "read_record"]
