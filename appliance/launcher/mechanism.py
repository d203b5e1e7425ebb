"""How ranks start: one small interface over the ways a job's ranks are started, watched and stopped.

What it owns: ``Mechanism``, the protocol ``run.py`` and the elastic driver use (in the spirit
of torch elastic's ``PContext``): ``prepare`` the job (its directory and, for a static job, its
plan), ``start`` ranks, ``signal`` some, ``wait`` for the next exit, ``close`` (stop everything).
Its data: ``name``, ``hosts`` (its host set: which hosts are open, how they are opened and
closed, where their ranks listen), ``workers`` (every rank started) and ``returncodes``.
Helpers over it: ``running``, ``notes`` and ``describe``. Implementations:

- ``Executors`` (``--launcher ssh`` and ``local``): one executor per host (``executors.py``:
  this machine's ranks as subprocesses, other hosts' over SSH through a remote stub), the
  started ranks in a ``workers.WorkerGroup``; its hosts are a ``hostset.ExecutorHosts``, opened
  one way for static and elastic jobs.
- ``slurm.step.SrunStatic`` / ``SrunElastic`` (``--launcher srun``): the ranks as tasks of one
  ``srun`` step (static), or one step per rank (elastic), inside the Slurm allocation.

``choose(config)`` picks one from ``slurm.step.launcher_of`` (the only place that knows the
choice) and whether the job is elastic; nothing asks again.

``RankSpec`` is one rank to start: its ``Slot``, its worker number ``wid`` (the output prefix
``[wid]`` and the key of its exit; equal to the rank in a static job, unique across an elastic
job's life) and extra variables on top of the worker contract (``env.worker_env``).

Env vars: none read (``LaunchConfig`` carries them). Failure modes: ``prepare`` raises
``executors.LaunchError`` for unusable hosts; ``start`` raises ``workers.SpawnError`` when a rank
cannot be started; everything started is stopped by ``close`` (bounded, idempotent).
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import tempfile
from typing import Any, Callable, Mapping, Protocol, Sequence

from appliance.launcher.config import LaunchConfig
from . import env as envmod
from .executors import Executor, LocalExecutor, job_addresses
from .hostset import ExecutorHosts
from .hosts import Slot, used_hosts
from .output import OutputSink
from .reaper import Reaper
from .workers import WorkerGroup


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """One rank to start (see the module docstring)."""

    slot: Slot
    wid: int
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Mechanism(Protocol):
    """The ranks of one job, however they start (see the module docstring)."""

    name: str                       # "ssh", "local" or "srun"
    hosts: Any                      # the host set: merge/open/close/addresses/launcher_address
    workers: list                   # every rank started so far
    returncodes: dict               # wid -> return code, for ranks that exited

    def prepare(self, slots: Sequence[Slot] | None) -> envmod.JobPlan:
        """The job's directory (fault reports) and, given a static job's ``slots``, its hosts opened
        and its plan (id, secret, store); an elastic job (None) gets a plan with the directory only.
        Raises ``LaunchError``."""

    def start(self, specs: Sequence[RankSpec], plan: envmod.JobPlan, sink: OutputSink, reaper: Reaper | None,
              cancelled: Callable[[], bool] = lambda: False) -> None:
        """Start ranks (the first, or more of an elastic job); stops early when ``cancelled()``;
        ``SpawnError``."""

    def signal(self, workers: Sequence, sig: int) -> None:
        """``sig`` to these ranks (their process groups); their exits are still reported by ``wait``."""

    def wait(self, timeout: float):
        """The next rank to exit and its code (negative: a signal), or None after ``timeout``."""

    def close(self) -> None:
        """Stop every rank on every host (TERM, grace, KILL); idempotent, bounded."""


def running(mech: Mechanism) -> list:
    """The started ranks that have not exited."""
    return [w for w in mech.workers if w.rank not in mech.returncodes]


def notes(mech: Mechanism, config: LaunchConfig) -> list[str]:
    """Lines worth saying before the ranks start (flags given but unused)."""
    if not config.ssh_flags:
        return []
    flags = " and ".join(config.ssh_flags)
    if mech.name == "srun":
        return [f"appliance launch: {flags} unused: ranks start with srun"]
    if all(isinstance(ex, LocalExecutor) for ex in mech.hosts.executors.values()):
        return [f"appliance launch: {flags} unused: every host is this machine"]
    return []


def describe(mech: Mechanism, slots: Sequence[Slot], plan: envmod.JobPlan) -> list[str]:
    """The --verbose lines: the layout and where each host listens."""
    hosts = used_hosts(slots)
    if mech.name == "srun":
        lines = [f"appliance launch: job {plan.job_id}: {len(slots)} ranks on {len(hosts)} Slurm node(s) "
                 f"with srun; store at rank 0's node ({hosts[0]})"]
        return lines + [f"  rank {s.rank}: node {s.host} local_rank {s.local_rank}/{s.local_size} "
                        f"cross_rank {s.cross_rank}/{s.cross_size}" for s in slots]
    lines = [f"appliance launch: job {plan.job_id}: {len(slots)} ranks on {len(hosts)} host(s); "
             f"store {plan.store_addr}; MASTER_ADDR:PORT {plan.master_addr}:{plan.master_port}"]
    for h in hosts:
        ex = mech.hosts.executors[h]
        lines.append(f"  host {h}: {'local' if isinstance(ex, LocalExecutor) else 'ssh'}, listen "
                     f"{plan.data_addrs[h]} (interface {getattr(ex, 'iface', '') or '?'})")
    for s in slots:
        lines.append(f"  rank {s.rank}: host {s.host} local_rank {s.local_rank}/{s.local_size} "
                     f"cross_rank {s.cross_rank}/{s.cross_size} listen {plan.data_addrs[s.host]}")
    return lines


def env_of(spec: RankSpec, plan: envmod.JobPlan, ex: Executor, config: LaunchConfig) -> dict[str, str]:
    """The complete environment of one rank started by an executor."""
    env = envmod.worker_env(spec.slot, plan, ex.base_env(config.environ), config.env)
    env.update(spec.env)
    if plan.fault_dir:
        env["APPLIANCE_FAULT_FILE"] = envmod.fault_file(plan.fault_dir, spec.wid)
    return env


def elastic_plan(config: LaunchConfig, fault_dir: str) -> envmod.JobPlan:
    """An elastic job's plan before any round: its directory only (the driver plans each round)."""
    return envmod.JobPlan(job_id="", secret="", store_addr="", master_addr="", master_port=0, data_addrs={},
                          start_timeout_s=config.start_timeout_s, verbose=config.verbose, fault_dir=fault_dir)


class Executors:
    """Ranks started by per-host executors: local subprocesses and SSH (``executors.py``)."""

    def __init__(self, config: LaunchConfig, name: str, on_host_report=None, *, elastic: bool = False):
        self.config, self.name = config, name
        self.hosts = ExecutorHosts(config, name, per_round=elastic, on_report=on_host_report)
        self.group = WorkerGroup(config.stop_grace_s)
        self._stack = contextlib.ExitStack()
        self._sink: OutputSink | None = None

    def prepare(self, slots: Sequence[Slot] | None) -> envmod.JobPlan:
        executors = self.hosts.open_all(used_hosts(slots)) if slots is not None else None
        fault_dir = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="appliance-faults-"))
        if executors is None:
            return elastic_plan(self.config, fault_dir)
        return plan_job(slots, executors, self.config, fault_dir)

    def start(self, specs: Sequence[RankSpec], plan: envmod.JobPlan, sink: OutputSink, reaper: Reaper | None,
              cancelled: Callable[[], bool] = lambda: False) -> None:
        self._sink = sink
        if reaper is not None:
            self.group.reaper = reaper
        for spec in specs:
            if cancelled():
                break
            ex = self.hosts.get(spec.slot.host)
            self.group.add(ex.spawn(spec.wid, self.config.command, env_of(spec, plan, ex, self.config),
                                    self.config.cwd, sink))

    def signal(self, workers: Sequence, sig: int) -> None:
        for w in workers:
            w.signal(sig)
            if sig != signal.SIGKILL:
                w.signal(signal.SIGCONT)  # a stopped rank acts on it now

    @property
    def workers(self) -> list:
        return self.group.workers

    @property
    def returncodes(self) -> dict:
        return self.group.returncodes

    def wait(self, timeout: float):
        return self.group.next_exit(timeout)

    def close(self) -> None:
        self.group.stop()

    def __enter__(self) -> "Executors":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.group.stop()
        finally:
            self._stack.close()
            self.hosts.close_all()


def plan_job(slots: Sequence[Slot], executors: Mapping[str, Executor], config: LaunchConfig,
             fault_dir: str = "") -> envmod.JobPlan:
    """The per-job facts for executors: a new job id and secret, the store and torch's master on
    two free ports of rank 0's host."""
    addrs = job_addresses(executors)
    rank0_host = slots[0].host
    store_port, master_port = executors[rank0_host].free_ports(addrs[rank0_host], 2)
    return envmod.JobPlan(
        job_id=envmod.new_job_id(), secret=envmod.new_secret(),
        store_addr=f"{addrs[rank0_host]}:{store_port}", master_addr=addrs[rank0_host], master_port=master_port,
        data_addrs=addrs, start_timeout_s=config.start_timeout_s, verbose=config.verbose, fault_dir=fault_dir)


def choose(config: LaunchConfig, on_host_report=None) -> Mechanism:
    """The mechanism of this job (``slurm.step.launcher_of`` decides); raises ``ConfigError`` for a
    choice that cannot work. Nothing is started or opened yet."""
    from .slurm import step

    name = step.launcher_of(config)
    elastic = config.elastic is not None
    if name == "srun":
        return step.SrunElastic(config) if elastic else step.SrunStatic(config)
    return Executors(config, name, on_host_report, elastic=elastic)


__all__ = ["Mechanism", "RankSpec", "Executors", "choose", "plan_job", "env_of", "running", "notes", "describe",
           "elastic_plan"]
