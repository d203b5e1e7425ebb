"""``Observer``: everything the launcher does to show a job, owned for the job's life.

What it owns: the order in which the pieces start and stop, and what they are given. Entered once
the job's id and secret are known (before any rank starts): a ``JobState``, the ``Collector`` on a
free port (``env_for(address)`` is what each rank gets: ``APPLIANCE_METRICS_ADDR``), the record
(``RecordWriter``) in the job directory, the Prometheus endpoint when a port is given, the display
(``LiveDisplay`` when the view is on and both the launcher's stdout and stderr are terminals, the
output sink's lines then diverted above it; else ``LinesDisplay``), and one ticker thread that
takes a snapshot every second (stragglers are named there) and writes what changed. Events come
in through ``event(text)`` and ``new_round(id, ranks)`` (the elastic driver). On exit, in this
order: the display stops (the sink writes to its streams again), the closing summary line (only
when some rank reported), the record's end, ``report.png``, the endpoint, the collector.

Env vars (``appliance/common/knobs.py``): APPLIANCE_VIEW (auto, live, lines, off; ``--no-view``
is off), APPLIANCE_VIEW_INTERVAL (seconds between summary lines off a terminal),
APPLIANCE_VIEW_RANKS (start with a row per rank), APPLIANCE_RECORD_DIR (where the record goes;
default ``SHARED/jobs/<job id>`` when the shared directory exists; ``off``: no record).
Failure modes: ``ConfigError`` from ``__enter__`` for an unusable ``--metrics-port``; anything
else (a record that cannot be written, a report that cannot be drawn) is one warning line.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import IO, Any, Callable, Mapping, Optional

from appliance.common.knobs import read
from .collector import Collector
from .state import Event, JobState
from .view import LinesDisplay, LiveDisplay, closing_line

TICK_S = 1.0
WARM_JOIN_S = 60.0  # the longest the end of a job waits for the warm-up's imports to finish


def silent_bound_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """How long the collector keeps a connection that sends nothing (a rank on a cut or frozen
    host): a rank sends a sample every APPLIANCE_METRICS_INTERVAL; ten of them missed, it is gone."""
    return max(10.0, 10 * read("APPLIANCE_METRICS_INTERVAL", environ))


def record_dir_of(job_id: str, environ: Mapping[str, str], shared: Optional[str]) -> Optional[str]:
    """Where the job's record goes (see the module docstring), or None."""
    given = read("APPLIANCE_RECORD_DIR", environ)
    if given.strip().lower() == "off":
        return None
    if given:
        return given
    if shared and os.path.isdir(shared):
        from ...mount import Layout

        return Layout(shared).job_dir(job_id)
    return None


class Observer:
    """See the module docstring. ``say``: a line of the launcher's own (the sink's ``message``)."""

    def __init__(self, job_id: str, secret: Optional[str], size: int, *, say: Callable[[str], None],
                 sink: Any = None, out: IO[str] | None = None, err: IO[str] | None = None,
                 environ: Mapping[str, str] | None = None, hosts: Mapping[int, str] | None = None,
                 view: Optional[bool] = None, metrics_port: Optional[int] = None, shared: Optional[str] = None,
                 prefix: str = "appliance launch"):
        env = dict(os.environ if environ is None else environ)
        self.job_id, self.secret, self.size, self.prefix = job_id, secret, size, prefix
        self._say, self.sink, self.out, self.err = say, sink, out, err
        mode = read("APPLIANCE_VIEW", env)
        self.mode = "off" if view is False else mode
        self.interval_s = read("APPLIANCE_VIEW_INTERVAL", env)
        self.idle_s = silent_bound_s(env)
        self.ranks_view = read("APPLIANCE_VIEW_RANKS", env)
        self.record_dir = record_dir_of(job_id, env, shared)
        self.metrics_port = metrics_port
        self.state = JobState(job_id, size, hosts=hosts, on_event=self._on_event)
        self.collector: Optional[Collector] = None
        self.record: Any = None
        self.display: Any = None
        self.returncode: Optional[int] = None
        self._stack = contextlib.ExitStack()
        self._stop = threading.Event()
        self._ticker: Optional[threading.Thread] = None
        self._warmer: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    # -- the launcher's calls ------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.collector.port if self.collector else 0

    def env_for(self, address: str) -> dict[str, str]:
        """What a rank whose host reaches this machine at ``address`` gets in its environment."""
        return {"APPLIANCE_METRICS_ADDR": f"{address}:{self.port}"} if self.collector else {}

    def event(self, text: str) -> None:
        self.state.event(text, source="launcher")

    def new_round(self, round_id: int, ranks: int) -> None:
        self.state.new_round(round_id, ranks)
        if self.record is not None:
            self.record.round(self.state.clock(), round_id, ranks)

    def ended(self, returncode: int) -> None:
        self.returncode = returncode

    # -- life --------------------------------------------------------------------------------
    def __enter__(self) -> "Observer":
        try:
            self.collector = self._stack.enter_context(Collector(self.state, self.secret, idle_s=self.idle_s,
                                                                 say=self._say, prefix=f"{self.prefix}: metrics: "))
            if self.metrics_port is not None:
                from .prometheus import PrometheusEndpoint

                self._stack.enter_context(PrometheusEndpoint(
                    self.metrics_port, self.state.snapshot, say=self._say, prefix=f"{self.prefix}: --metrics-port: "))
            if self.record_dir is not None:
                from .record import RecordWriter

                self.record = self._stack.enter_context(RecordWriter(
                    self.record_dir, self.job_id, self.size, warn=lambda s: self._say(f"{self.prefix}: warning: {s}")))
            self._start_display()
            if self.record is not None:
                self._warmer = threading.Thread(target=self._warm, name="observe-warm", daemon=True)
                self._warmer.start()
            self._ticker = threading.Thread(target=self._tick, name="observe-ticker", daemon=True)
            self._ticker.start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _start_display(self) -> None:
        if self.mode == "off":
            return
        live = self.mode == "live" or (self.mode == "auto" and _is_tty(self.out) and _is_tty(self.err))
        if live and self.sink is not None:
            self.display = LiveDisplay(self.out, self.state.snapshot, ranks=self.ranks_view).start()
            self.sink.divert(self.display.write)
        else:
            self.display = LinesDisplay(lambda s: self._say(f"{self.prefix}: {s}"), self.state.snapshot,
                                        self.interval_s).start()

    def _on_event(self, ev: Event) -> None:
        if self.record is not None:
            self.record.event(ev.t, ev.text, ev.source)
        if ev.source != "launcher":  # the launcher's own events were said where they happened
            self._say(f"{self.prefix}: {ev.text}")

    def _warm(self) -> None:
        """The record's libraries, imported while the ranks start and off the ticker (which keeps
        writing the record meanwhile): the job then holds the same threads and files to its end."""
        if self.record is not None:
            self.record.open_tensorboard()
            from .report import warm

            warm()

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            snap = self.state.snapshot()
            if self.record is not None:
                self.record.tick(snap)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(5)
        # A short job can end while the warm-up still imports its C extensions (protobuf, matplotlib):
        # the interpreter's shutdown under an import in a daemon thread is a segfault, and the
        # report needs those libraries anyway.
        if self._warmer is not None:
            self._warmer.join(WARM_JOIN_S)
        try:
            if self.display is not None:
                if isinstance(self.display, LiveDisplay) and self.sink is not None:
                    self.display.stop()
                    self.sink.divert(None)
                else:
                    self.display.stop()
            snap = self.state.snapshot()
            reported = any(r.last is not None for r in snap.ranks)
            summary = ""
            # A failed job's last line stays the one naming the failure: its summary and where its
            # record lies are in the record only (``appliance report`` prints them).
            said = self.returncode == 0
            if reported:
                summary = closing_line(snap)
                if said:
                    self._say(f"{self.prefix}: {summary}")
            if self.record is not None:
                self.record.end(snap, self.returncode, summary)
                self.record.close()
                if reported:
                    self._report(said)
        finally:
            self._stack.close()

    def _report(self, say_where: bool) -> None:
        from .report import draw

        files = []
        try:
            draw(self.record_dir)
            files.append("report.png")
        except ValueError:
            pass  # too short a job for a picture: its record and summary line say it all
        except Exception as e:  # noqa: BLE001 - the report is a picture, the job is over either way
            self._say(f"{self.prefix}: warning: no report.png: {type(e).__name__}: {e}")
        files.append("metrics.jsonl")
        if _has_events(self.record_dir):
            files.append("TensorBoard events")
        if say_where:
            self._say(f"{self.prefix}: record of job {self.job_id}: {self.record_dir} ({', '.join(files)})")


def _has_events(d: str) -> bool:
    try:
        return any(n.startswith("events.out.tfevents") for n in os.listdir(d))
    except OSError:
        return False


def _is_tty(f: Any) -> bool:
    try:
        return bool(f is not None and f.isatty())
    except (AttributeError, ValueError, OSError):
        return False


__all__ = ["Observer", "record_dir_of", "silent_bound_s"]
