"""``--metrics-port PORT``: the job's metrics in Prometheus' text format, for clusters that scrape.

What it owns: ``PrometheusEndpoint``, a context manager serving ``http://HOST:PORT/metrics``
(all addresses) with ``prometheus_client`` from a registry of its own whose one collector reads a
fresh ``Snapshot`` at each scrape. Per rank, labelled ``job``, ``host``, ``rank``:
``appliance_rank_step``, ``appliance_rank_steps_per_second``, ``appliance_rank_samples_per_second``,
``appliance_rank_comm_share`` (0..1), ``appliance_rank_late_seconds_per_step``,
``appliance_rank_wait_seconds_per_step``, ``appliance_rank_late_seconds_total``,
``appliance_rank_busy_seconds_total``, ``appliance_rank_collective_bytes_total`` and
``appliance_rank_busbw_bytes_per_second`` (also labelled ``op``), ``appliance_rank_rss_bytes``,
``appliance_rank_gpu_utilization_percent``, ``appliance_rank_up``; per job (``job``):
``appliance_job_step``, ``appliance_job_steps_per_second``, ``appliance_job_samples_per_second``,
``appliance_job_comm_share``, ``appliance_job_ranks``, ``appliance_job_round``,
``appliance_job_straggler_rank`` (-1: none).

Env vars: none (the port comes from the flag). Failure modes: ``ConfigError`` naming the flag when
the port cannot be bound or ``prometheus_client`` is not installed.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from appliance.common.knobs import ConfigError
from .state import Snapshot


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


class PrometheusEndpoint:
    def __init__(self, port: int, snapshot: Callable[[], Snapshot], addr: str = "0.0.0.0"):
        self.port, self.addr, self.snapshot = port, addr, snapshot
        self._server: Optional[Any] = None
        self._thread: Optional[Any] = None

    def __enter__(self) -> "PrometheusEndpoint":
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ConfigError("--metrics-port needs prometheus_client (pip install 'appliance[view]')") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self.snapshot))
        try:
            self._server, self._thread = start_http_server(self.port, addr=self.addr, registry=registry)
        except OSError as e:
            raise ConfigError(f"--metrics-port {self.port}: cannot listen there: {e.strerror or e}") from None
        self.port = self._server.server_address[1]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None


__all__ = ["PrometheusEndpoint"]
