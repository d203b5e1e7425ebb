"""Orchestration of one job: hosts -> ranks -> plan -> workers -> first failure -> result.

What it owns: ``run(config)``. It picks how ranks start once (``mechanism.choose``: the
executors, local and SSH, or the srun step inside a Slurm allocation) and from then on talks to
that ``mechanism.Mechanism`` only: it arranges the hosts (one machine named twice is one host
for the executors), lays out the ranks, opens the hosts (preflight and a private directory for
the ranks' fault reports, or the step's directory) which decides the job plan (job id, secret,
store), starts the reaper (``reaper.py``: local ranks die with a killed launcher) and every rank
with its environment, then waits (``failures.wait_for_end``). The first rank to exit non-zero
(or be killed by a signal) ends the job: the others get ``APPLIANCE_FAILURE_GRACE`` seconds to
exit by themselves, then are stopped; SIGINT/SIGTERM/SIGHUP to the launcher and the optional
overall timeout stop them at once. An elastic job (``elastic/``) runs the same mechanism under
its driver instead. The result is a ``LaunchResult``: exit code (the failed rank's code,
128+signal for a signal, 130/143/129 when the launcher was interrupted, 124 on timeout, 127/126
when a command cannot be started), the blamed rank and host (the origin named in the failed
rank's fault report, if any), a one-line reason, and the captured lines.

Env vars: none read directly (``LaunchConfig`` carries them). Failure modes: bad hosts or
arguments raise ``HostsError``/``ConfigError`` before anything starts; an unusable host raises
``LaunchError``; once workers exist, every path ends with all of them stopped (``Mechanism.close``).
"""
from __future__ import annotations

import dataclasses
import time

from appliance.launcher.config import LaunchConfig
from . import env as envmod
from . import mechanism
from .executors import is_local
from .failures import Outcome, wait_for_end
from .hosts import Host, HostsError, assign_ranks, hosts_from
from .setup import JobSetup
from .workers import SpawnError


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    returncode: int
    failed_rank: int | None = None
    failed_host: str | None = None
    reason: str = ""
    lines: tuple[tuple[int, str, str], ...] = ()  # (rank, "stdout"|"stderr", text without newline)
    timed_out: bool = False
    interrupted: int | None = None  # signal number that stopped the launcher
    job_id: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def output(self, rank: int | None = None, stream: str = "stdout") -> str:
        """Captured text of ``stream`` (of one rank, or all), one line per line."""
        return "".join(t + "\n" for r, s, t in self.lines if s == stream and (rank is None or r == rank))


def hosts_of(config: LaunchConfig, launcher: str = "ssh") -> list[Host]:
    """-H, then --hostfile, then a Slurm allocation (not for ``--launcher local``), else ``localhost``
    with -np slots (horovodrun's default)."""
    hosts = hosts_from(config.hosts, config.hostfile, None if launcher == "local" else config.slurm, config.np,
                       config.default_slots)
    if launcher == "local":
        other = [h.name for h in hosts if not is_local(h.name)]
        if other:
            raise HostsError(f"--launcher local runs every rank on this machine, but {', '.join(other)} "
                             f"{'is' if len(other) == 1 else 'are'} another host")
    return hosts


def run(config: LaunchConfig, *, echo: bool = True, capture: bool = False,
        handle_signals: bool = True, stdout=None, stderr=None, on_host_report=None) -> LaunchResult:
    """Run one job to the end; see the module docstring for exit codes. Never leaves workers behind.
    ``on_host_report(report)``: called once per host with its ``preflight.HostReport`` when the
    host checks are decided, before any rank starts (``hostset.ExecutorHosts.open``)."""
    start = time.monotonic()
    deadline = None if config.timeout_s is None else start + config.timeout_s
    if config.elastic is not None:
        from .elastic.launch import run_elastic
        outcome, summary, lines, job_id = run_elastic(
            config, echo=echo, capture=capture, handle_signals=handle_signals, stdout=stdout, stderr=stderr,
            on_host_report=on_host_report, deadline=deadline)
        return LaunchResult(returncode=outcome.returncode, failed_rank=outcome.rank, failed_host=outcome.host,
                            reason=summary, lines=lines, timed_out=outcome.timed_out,
                            interrupted=outcome.interrupted, job_id=job_id, elapsed_s=time.monotonic() - start)
    envmod.check_explicit(config.env)
    ranks = mechanism.choose(config, on_host_report=on_host_report)
    hosts, merges = ranks.hosts.merge(hosts_of(config, ranks.name))
    slots = assign_ranks(hosts, config.np)
    with JobSetup(config, ranks, echo=echo, capture=capture, handle_signals=handle_signals, stdout=stdout,
                  stderr=stderr) as job:
        plan = ranks.prepare(slots)
        sink = job.begin(plan.fault_dir, config.np)
        for line in [f"appliance launch: {m}" for m in merges] + mechanism.notes(ranks, config):
            sink.message(line)
        if config.verbose:
            for line in mechanism.describe(ranks, slots, plan):
                sink.message(line)
        outcome = None
        try:
            ranks.start([mechanism.RankSpec(s, s.rank) for s in slots], plan, sink, job.reaper,
                        cancelled=lambda: bool(job.trap.received))
        except SpawnError as e:
            outcome = Outcome(e.returncode, e.rank, e.host, f"rank {e.rank} (host {e.host}) could not start: {e}")
        if outcome is None:
            outcome = wait_for_end(ranks, job.trap, deadline, config.timeout_s, config.failure_grace_s)
        summary = job.finish(outcome)
        lines = sink.captured()
    return LaunchResult(returncode=outcome.returncode, failed_rank=outcome.rank, failed_host=outcome.host,
                        reason=summary, lines=lines, timed_out=outcome.timed_out,
                        interrupted=outcome.interrupted, job_id=plan.job_id, elapsed_s=time.monotonic() - start)
