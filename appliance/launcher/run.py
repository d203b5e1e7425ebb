"""Orchestration of one job: hosts -> ranks -> plan -> workers -> first failure -> result.

What it owns: ``run(config)``, which picks the launcher (``slurm.step.launcher_of``: one
``srun`` step inside a Slurm allocation, else the executors), merges the names of one machine
into one host, lays out the ranks, opens one executor per host (or, under srun, one
``slurm.step.SrunStep``), decides the job plan (job id, secret, free ports on rank
0's host, a private directory for the ranks' fault reports), starts the reaper (``reaper.py``:
local ranks die with a killed launcher) and every rank with its environment, then waits
(``failures.wait_for_end``). The first rank to exit non-zero (or be killed by a signal) ends the
job: the others get ``APPLIANCE_FAILURE_GRACE`` seconds to exit by themselves, then are stopped;
SIGINT/SIGTERM/SIGHUP to the launcher and the optional overall timeout stop them at once.
The result is a ``LaunchResult``: exit code (the failed rank's code, 128+signal for a signal,
130/143/129 when the launcher was interrupted, 124 on timeout, 127/126 when a command cannot be
started), the blamed rank and host (the origin named in the failed rank's fault report, if any),
a one-line reason, and the captured lines.

Env vars: none read directly (``LaunchConfig`` carries them). Failure modes: bad hosts or
arguments raise ``HostsError``/``ConfigError`` before anything starts; an unusable host raises
``LaunchError``; once workers exist, every path ends with all of them stopped (``WorkerGroup``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from typing import Sequence

from appliance.launcher.config import LaunchConfig
from . import env as envmod
from .slurm import step as srun_step
from .executors import LocalExecutor, is_local, job_addresses, merge_same_machines, open_executors
from .failures import Outcome, wait_for_end
from .hosts import Host, HostsError, Slot, assign_ranks, hosts_from, used_hosts
from .reaper import Reaper
from .signals import SignalTrap
from .output import OutputSink
from .workers import SpawnError, WorkerGroup


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
    hosts = hosts_from(config.hosts, config.hostfile, None if launcher == "local" else config.slurm, config.np)
    if launcher == "local":
        other = [h.name for h in hosts if not is_local(h.name)]
        if other:
            raise HostsError(f"--launcher local runs every rank on this machine, but {', '.join(other)} "
                             f"{'is' if len(other) == 1 else 'are'} another host")
    return hosts


def plan_job(slots: Sequence[Slot], executors: dict, config: LaunchConfig, fault_dir: str = "") -> envmod.JobPlan:
    addrs = job_addresses(executors)
    rank0_host = slots[0].host
    store_port, master_port = executors[rank0_host].free_ports(addrs[rank0_host], 2)
    return envmod.JobPlan(
        job_id=envmod.new_job_id(), secret=envmod.new_secret(),
        store_addr=f"{addrs[rank0_host]}:{store_port}", master_addr=addrs[rank0_host], master_port=master_port,
        data_addrs=addrs, start_timeout_s=config.start_timeout_s, verbose=config.verbose, fault_dir=fault_dir)


def _verbose_plan(sink: OutputSink, slots: Sequence[Slot], plan: envmod.JobPlan, executors: dict) -> None:
    hosts = used_hosts(slots)
    if not executors:  # srun: the addresses are decided on the nodes
        sink.message(f"appliance launch: job {plan.job_id}: {len(slots)} ranks on {len(hosts)} Slurm node(s) "
                     f"with srun; store at rank 0's node ({hosts[0]})")
        for s in slots:
            sink.message(f"  rank {s.rank}: node {s.host} local_rank {s.local_rank}/{s.local_size} "
                         f"cross_rank {s.cross_rank}/{s.cross_size}")
        return
    sink.message(f"appliance launch: job {plan.job_id}: {len(slots)} ranks on {len(hosts)} host(s); "
                 f"store {plan.store_addr}; MASTER_ADDR:PORT {plan.master_addr}:{plan.master_port}")
    for h in hosts:
        ex = executors[h]
        sink.message(f"  host {h}: {'local' if isinstance(ex, LocalExecutor) else 'ssh'}, listen "
                     f"{plan.data_addrs[h]} (interface {getattr(ex, 'iface', '') or '?'})")
    for s in slots:
        sink.message(f"  rank {s.rank}: host {s.host} local_rank {s.local_rank}/{s.local_size} "
                     f"cross_rank {s.cross_rank}/{s.cross_size} listen {plan.data_addrs[s.host]}")


def run(config: LaunchConfig, *, echo: bool = True, capture: bool = False,
        handle_signals: bool = True, stdout=None, stderr=None, on_host_report=None) -> LaunchResult:
    """Run one job to the end; see the module docstring for exit codes. Never leaves workers behind.
    ``on_host_report(report)``: called once per host with its ``preflight.HostReport`` when the
    host checks are decided, before any rank starts (``executors.open_executors``)."""
    start = time.monotonic()
    deadline = None if config.timeout_s is None else start + config.timeout_s
    envmod.check_explicit(config.env)
    launcher = srun_step.launcher_of(config)
    hosts, merges = (hosts_of(config, launcher), []) if launcher == "srun" else merge_same_machines(
        hosts_of(config, launcher))
    slots = assign_ranks(hosts, config.np)
    with contextlib.ExitStack() as stack:
        trap = stack.enter_context(SignalTrap(handle_signals))
        executors: dict = {}
        if launcher == "srun":  # Slurm node names are distinct nodes: no merging, no preflight
            job_id = envmod.new_job_id()
            fault_dir = stack.enter_context(srun_step.step_dir(config, job_id))
            plan = srun_step.plan_step(config, fault_dir, job_id)
        else:
            executors = stack.enter_context(open_executors(used_hosts(slots), config, on_report=on_host_report))
            fault_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="appliance-faults-"))
            plan = plan_job(slots, executors, config, fault_dir)
        sink = stack.enter_context(OutputSink(config.np, echo=echo, capture=capture, output_dir=config.output_dir,
                                              stdout=stdout, stderr=stderr))
        for line in merges:
            sink.message(f"appliance launch: {line}")
        if config.ssh_flags and all(isinstance(ex, LocalExecutor) for ex in executors.values()):
            sink.message(f"appliance launch: {' and '.join(config.ssh_flags)} unused: "
                         f"{'ranks start with srun' if launcher == 'srun' else 'every host is this machine'}")
        if config.verbose:
            _verbose_plan(sink, slots, plan, executors)
        reaper = stack.enter_context(Reaper(config.stop_grace_s, cleanup=[fault_dir]))
        if reaper.error:
            sink.message(f"appliance launch: warning: {reaper.error}")
        outcome = None
        if launcher == "srun":
            group = stack.enter_context(srun_step.SrunStep(config, slots, plan, sink, reaper))
            if not trap.received:
                group.start()
        else:
            group = stack.enter_context(WorkerGroup(config.stop_grace_s, reaper=reaper))
            for slot in slots:
                if trap.received:
                    break
                ex = executors[slot.host]
                env = envmod.worker_env(slot, plan, ex.base_env(config.environ), config.env)
                try:
                    group.add(ex.spawn(slot.rank, config.command, env, config.cwd, sink))
                except SpawnError as e:
                    outcome = Outcome(e.returncode, e.rank, e.host, f"rank {e.rank} (host {e.host}) could not start: {e}")
                    break
        if outcome is None:
            outcome = wait_for_end(group, trap, deadline, config.timeout_s, config.failure_grace_s)
        others = len(group.running())
        group.stop()
        summary = outcome.reason
        if outcome.returncode != 0 and others:
            summary += f"; stopped {others}{' other' if outcome.rank is not None else ''} rank{'s' if others != 1 else ''}"
        if outcome.returncode != 0 and echo:
            sink.message(f"appliance launch: {summary}")
        lines = sink.captured()
    return LaunchResult(returncode=outcome.returncode, failed_rank=outcome.rank, failed_host=outcome.host,
                        reason=summary, lines=lines, timed_out=outcome.timed_out,
                        interrupted=outcome.interrupted, job_id=plan.job_id, elapsed_s=time.monotonic() - start)
