"""``--metrics-port PORT``: the job's metrics in Prometheus' text format, for clusters that scrape.

What it owns: ``PrometheusEndpoint``, a context manager serving ``http://HOST:PORT/metrics``
(all addresses): ``prometheus_client``'s WSGI app over a registry of its own whose one collector
reads a fresh ``Snapshot`` at each scrape, served by the standard library's threaded WSGI server
with bounds: each connection has ``REQUEST_S`` in all (a client that trickles its request is cut
there), at most ``MAX_CONNECTIONS`` are served at once (beyond it the oldest is cut: a scrape takes
milliseconds, so the oldest is the one holding on), an accept that fails (``EMFILE``...) backs off
instead of spinning, and a scrape that fails is a 500 and one line, never a traceback. Those lines
go through the elastic driver's ``RefusalLog`` (rate-limited). Per rank, labelled ``job``,
``host``, ``rank``: ``appliance_rank_step``, ``appliance_rank_steps_per_second``,
``appliance_rank_samples_per_second``, ``appliance_rank_comm_share`` (0..1),
``appliance_rank_late_seconds_per_step``, ``appliance_rank_wait_seconds_per_step``,
``appliance_rank_late_seconds_total``, ``appliance_rank_busy_seconds_total``,
``appliance_rank_collective_bytes_total`` and ``appliance_rank_busbw_bytes_per_second`` (also
labelled ``op``), ``appliance_rank_rss_bytes``, ``appliance_rank_gpu_utilization_percent``,
``appliance_rank_up``; per job (``job``): ``appliance_job_step``,
``appliance_job_steps_per_second``, ``appliance_job_samples_per_second``,
``appliance_job_comm_share``, ``appliance_job_ranks``, ``appliance_job_round``,
``appliance_job_straggler_rank`` (-1: none).

Env vars: none (the port comes from the flag). Failure modes: ``ConfigError`` naming the flag when
the port cannot be bound or ``prometheus_client`` is not installed; after that nothing a client
does stops the endpoint.
"""
from __future__ import annotations

import errno
import socket
import sys
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, Callable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from appliance.common.knobs import ConfigError
from ..elastic.rendezvous import RefusalLog, pending_cap
from .state import Snapshot

REQUEST_S = 10.0          # a connection's whole life (Prometheus' own scrape timeout is 10 s)
MAX_CONNECTIONS = 64      # served at once (and at most a quarter of the fd limit)
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 1.0
PREFIX = "appliance launch: --metrics-port: "
_PRESSURE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class _Collector:
    def __init__(self, snapshot: Callable[[], Snapshot]):
        self.snapshot = snapshot

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.snapshot()
        job = snap.job_id
        labels = ["job", "host", "rank"]

        def gauge(name: str, doc: str, extra: tuple = ()) -> Any:
            return GaugeMetricFamily(name, doc, labels=[*labels, *extra])

        step = gauge("appliance_rank_step", "steps the rank has finished")
        sps = gauge("appliance_rank_steps_per_second", "steps per second over the last window")
        smp = gauge("appliance_rank_samples_per_second", "samples per second over the last window")
        comm = gauge("appliance_rank_comm_share", "share of wall time blocked in collectives (0..1)")
        late = gauge("appliance_rank_late_seconds_per_step", "seconds the others waited per step for this rank")
        wait = gauge("appliance_rank_wait_seconds_per_step", "seconds this rank waited per step for the others")
        bw = gauge("appliance_rank_busbw_bytes_per_second", "bus bandwidth per operation kind", ("op",))
        rss = gauge("appliance_rank_rss_bytes", "resident memory of the rank's process")
        gpu = gauge("appliance_rank_gpu_utilization_percent", "GPU utilisation")
        up = gauge("appliance_rank_up", "1 while the rank's connection is open")
        late_t = CounterMetricFamily("appliance_rank_late_seconds", "seconds the others waited for this rank",
                                     labels=labels)
        busy_t = CounterMetricFamily("appliance_rank_busy_seconds", "seconds blocked in collectives", labels=labels)
        bytes_t = CounterMetricFamily("appliance_rank_collective_bytes", "bytes through collectives",
                                      labels=[*labels, "op"])
        for r in snap.ranks:
            lv = [job, r.host, str(r.rank)]
            up.add_metric(lv, 1.0 if r.connected else 0.0)
            for fam, v in ((step, r.step), (sps, r.rates.steps_per_s), (smp, r.rates.samples_per_s),
                           (comm, r.rates.comm_share), (late, r.rates.late_per_step_s),
                           (wait, r.rates.wait_per_step_s), (rss, r.rss), (gpu, r.gpu_util)):
                if v is not None:
                    fam.add_metric(lv, float(v))
            for op, v in r.rates.busbw.items():
                bw.add_metric([*lv, op], v)
            if r.last is not None:
                late_t.add_metric(lv, r.last.late_s)
                busy_t.add_metric(lv, r.last.busy_s)
                for op, (_, nbytes, _) in r.last.ops.items():
                    bytes_t.add_metric([*lv, op], nbytes)
        yield from (step, sps, smp, comm, late, wait, bw, rss, gpu, up, late_t, busy_t, bytes_t)
        for name, doc, v in (
                ("appliance_job_step", "steps every rank has finished", snap.step),
                ("appliance_job_steps_per_second", "the job's steps per second", snap.steps_per_s),
                ("appliance_job_samples_per_second", "the job's samples per second", snap.samples_per_s),
                ("appliance_job_comm_share", "mean share of wall time in collectives", snap.comm_share),
                ("appliance_job_ranks", "ranks reporting", snap.reporting),
                ("appliance_job_round", "elastic round", snap.round),
                ("appliance_job_straggler_rank", "the rank named straggler (-1: none)",
                 -1 if snap.straggler is None else snap.straggler.rank)):
            fam = GaugeMetricFamily(name, doc, labels=["job"])
            if v is not None:
                fam.add_metric([job], float(v))
            yield fam


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_S  # each read; the server's sweep bounds the whole connection

    def setup(self) -> None:
        self.timeout = self.server.request_s
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a scrape is not news; a failure is said once by the app wrapper


class _Server(ThreadingMixIn, WSGIServer):
    """The standard library's threaded WSGI server with a connection cap, a deadline per
    connection and an accept loop that backs off (see the module docstring)."""
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, addr: tuple, log: RefusalLog, request_s: float = REQUEST_S):
        self.log, self.request_s = log, request_s
        self.max_connections = pending_cap(MAX_CONNECTIONS)
        self.cut = 0                  # connections cut at the cap or the deadline
        self._active: dict[Any, float] = {}
        self._active_lock = threading.Lock()
        self._backoff = BACKOFF_MIN_S
        super().__init__(addr, _Handler)

    def get_request(self) -> Any:
        try:
            got = super().get_request()
        except OSError as e:
            if e.errno in _PRESSURE:
                self._oldest_cut(f"cut while the endpoint could not accept ({e.strerror or e})")
                self.log.admit("(accept)", f"{self.log.prefix}cannot accept a connection: {e.strerror or e} "
                                           f"(retrying in {self._backoff:g} s)")
                time.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
            raise
        self._backoff = BACKOFF_MIN_S
        return got

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._active_lock:
            full = len(self._active) >= self.max_connections
        if full:
            self._oldest_cut(f"cut: more than {self.max_connections} connections at once")
        with self._active_lock:
            self._active[request] = time.monotonic()
        return True

    def shutdown_request(self, request: Any) -> None:
        with self._active_lock:
            self._active.pop(request, None)
            super().shutdown_request(request)  # closed under the lock: the sweep never cuts a reused fd

    def service_actions(self) -> None:
        """Every poll of ``serve_forever``: cut connections past their deadline."""
        now = time.monotonic()
        with self._active_lock:
            late = [(r, t) for r, t in self._active.items() if now - t > self.request_s]
        for r, _ in late:
            self._cut(r, f"no complete request within {self.request_s:g} s")
        self.log.flush()

    def _oldest_cut(self, why: str) -> None:
        with self._active_lock:
            oldest = min(self._active.items(), key=lambda kv: kv[1], default=None)
        if oldest is not None:
            self._cut(oldest[0], why)

    def _cut(self, request: Any, why: str) -> None:
        with self._active_lock:
            if self._active.pop(request, None) is None:
                return
            try:
                peer = request.getpeername()[0]
            except OSError:
                peer = "?"
            try:
                request.shutdown(socket.SHUT_RDWR)  # its thread sees the end and closes it
            except OSError:
                pass
        self.cut += 1
        self.log.admit(peer, f"{self.log.prefix}{why}: {peer}")

    def handle_error(self, request: Any, client_address: Any) -> None:
        e = sys.exc_info()[1]
        self.log.admit(str(client_address[0]), f"{self.log.prefix}{client_address[0]}: {type(e).__name__}: {e!s:.200}")


def _guarded(app: Callable, log: RefusalLog) -> Callable:
    """The WSGI app, with a failed scrape (no fd to open, a snapshot that raised) a 500 and one line."""
    def serve(environ: dict, start_response: Callable) -> Any:
        try:
            return app(environ, start_response)
        except Exception as e:  # noqa: BLE001 - one line, never a traceback
            log.admit("(scrape)", f"{log.prefix}a scrape failed: {type(e).__name__}: {e!s:.200}")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
            return [f"{type(e).__name__}\n".encode()]
    return serve


def _stderr_line(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class PrometheusEndpoint:
    def __init__(self, port: int, snapshot: Callable[[], Snapshot], addr: str = "0.0.0.0",
                 say: Optional[Callable[[str], None]] = None, prefix: str = PREFIX, request_s: float = REQUEST_S):
        self.port, self.addr, self.snapshot, self.request_s = port, addr, snapshot, request_s
        self.log = RefusalLog(say or _stderr_line, prefix=prefix)
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "PrometheusEndpoint":
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
        except ImportError:
            raise ConfigError("--metrics-port needs prometheus_client (pip install 'appliance[view]')") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self.snapshot))
        try:
            self._server = _Server((self.addr, self.port), self.log, self.request_s)
        except OSError as e:
            raise ConfigError(f"--metrics-port {self.port}: cannot listen there: {e.strerror or e}") from None
        self._server.set_app(_guarded(make_wsgi_app(registry), self.log))
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="observe-prometheus", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None
            self.log.drain()


__all__ = ["PrometheusEndpoint"]
