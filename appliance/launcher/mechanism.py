"""How ranks start: one interface over the ways a job's ranks are started, watched and stopped.

What it owns: ``Mechanism``, the protocol ``run.py`` and the elastic driver use and nothing else
(in the spirit of torch elastic's ``PContext``): arrange the hosts, open them (checks, plan),
``start`` the first ranks, ``add`` ranks on a host, ``remove`` some, report the ``next_exit``,
list what is ``running``, ``stop`` everything; an elastic job also opens hosts as they appear and
closes those that left (``open_hosts``/``close_hosts``). Two implementations:

- ``Executors`` (``--launcher ssh`` and ``local``): one executor per host (``executors.py``:
  this machine's ranks as subprocesses, other hosts' over SSH through a remote stub), the
  started ranks in a ``workers.WorkerGroup``.
- ``slurm.step.Srun`` (``--launcher srun``): the ranks as tasks of ``srun`` steps inside the
  Slurm allocation.

``choose(config)`` picks one from ``slurm.step.launcher_of`` (the only place that knows the
choice); ``run()`` never asks again which it has. A static job is ``start`` once and then
``next_exit`` until the end; an elastic job (``elastic/driver.py``) also adds and removes.

``RankSpec`` is one rank to start: its ``Slot``, its worker number ``wid`` (the output prefix
``[wid]`` and the key of its exit; equal to the rank in a static job, unique across an elastic
job's life) and extra variables on top of the worker contract (``env.worker_env``).

Env vars: none read (``LaunchConfig`` carries them). Failure modes: ``open`` raises
``executors.LaunchError`` for unusable hosts; ``start``/``add`` raise ``workers.SpawnError``
when a rank cannot be started; everything started is stopped by ``stop`` (bounded).
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
import threading
import time
from typing import Callable, Mapping, Protocol, Sequence

from appliance.launcher.config import LaunchConfig
from . import env as envmod
from .executors import (Executor, LaunchError, LocalExecutor, SSHExecutor, is_local, job_addresses,
                        merge_same_machines, open_executors)
from .hosts import Host, Slot, used_hosts
from .output import OutputSink
from .reaper import Reaper
from .workers import Worker, WorkerGroup


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """One rank to start (see the module docstring)."""

    slot: Slot
    wid: int
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Mechanism(Protocol):
    """The ranks of one job, however they start (see the module docstring)."""

    name: str                       # "ssh", "local" or "srun"
    workers: list                   # every rank started so far
    returncodes: dict               # wid -> return code, for ranks that exited

    def arrange(self, hosts: Sequence[Host]) -> tuple[list[Host], list[str]]:
        """The hosts as this mechanism sees them (one machine named twice merged or not) and one
        line per change made."""

    def open(self, slots: Sequence[Slot]) -> envmod.JobPlan:
        """Make the hosts of ``slots`` ready (checks, connections, directories) and decide the
        job's plan (id, secret, store). Raises ``LaunchError``."""

    def notes(self) -> list[str]:
        """Lines worth saying before the ranks start (flags given but unused)."""

    def describe(self, slots: Sequence[Slot], plan: envmod.JobPlan) -> list[str]:
        """The --verbose lines: the layout and where each host listens."""

    def start(self, specs: Sequence[RankSpec], plan: envmod.JobPlan, sink: OutputSink, reaper: Reaper | None,
              cancelled: Callable[[], bool] = lambda: False) -> None:
        """Start the first ranks (every host); stops early when ``cancelled()``; ``SpawnError``."""

    def add(self, host: str, specs: Sequence[RankSpec], plan: envmod.JobPlan) -> None:
        """Start more ranks on ``host`` (after ``start``); ``SpawnError``."""

    def remove(self, workers: Sequence) -> None:
        """SIGTERM to these ranks (their process groups; the caller sends SIGKILL after the grace,
        through the worker's ``signal``, or ``stop`` does); their exits are still reported by
        ``next_exit``."""

    def next_exit(self, timeout: float):
        """The next rank to exit and its code (negative: a signal), or None after ``timeout``."""

    def running(self) -> list:
        """The started ranks that have not exited."""

    def stop(self) -> None:
        """Stop every rank on every host (TERM, grace, KILL); idempotent, bounded."""

    # -- what an elastic job needs besides (``elastic/driver.py``) --------------------------------
    def open_elastic(self) -> str:
        """Prepare for an elastic job whose hosts come and go; returns the ranks' fault directory."""

    def open_hosts(self, hosts: Sequence[str]) -> dict[str, str | None]:
        """Make ``hosts`` ready to start ranks (checks, connections): host -> None, or why not.
        Blocking; the driver calls it from a thread of its own for hosts that appear later."""

    def close_hosts(self, hosts: Sequence[str]) -> None:
        """Release what ``open_hosts`` holds for ``hosts`` (their connections); none of their
        ranks is running. Never blocks the caller; ``open_hosts`` makes them ready again."""

    def round_addresses(self, hosts: Sequence[str]) -> dict[str, str]:
        """Where each host's ranks listen in a round over ``hosts`` ("": the rank's own choice)."""

    def launcher_address(self, host: str) -> str:
        """This machine's address as ``host`` reaches it (where the driver's rendezvous listens)."""


def env_of(spec: RankSpec, plan: envmod.JobPlan, ex: Executor, config: LaunchConfig) -> dict[str, str]:
    """The complete environment of one rank started by an executor."""
    env = envmod.worker_env(spec.slot, plan, ex.base_env(config.environ), config.env)
    env.update(spec.env)
    if plan.fault_dir:
        env["APPLIANCE_FAULT_FILE"] = envmod.fault_file(plan.fault_dir, spec.wid)
    return env


class Executors:
    """Ranks started by per-host executors: local subprocesses and SSH (``executors.py``)."""

    def __init__(self, config: LaunchConfig, name: str, on_host_report=None):
        self.config, self.name, self._on_report = config, name, on_host_report
        self.executors: dict[str, Executor] = {}
        self.group = WorkerGroup(config.stop_grace_s)
        self._stack = contextlib.ExitStack()
        self._sink: OutputSink | None = None
        self._lock = threading.Lock()      # executors: the driver opens hosts from another thread
        self._toward: dict[str, str] = {}  # remote address -> this machine's address towards it

    # -- before the ranks ---------------------------------------------------------------------
    def arrange(self, hosts: Sequence[Host]) -> tuple[list[Host], list[str]]:
        return merge_same_machines(hosts)

    def open(self, slots: Sequence[Slot]) -> envmod.JobPlan:
        self.executors = self._stack.enter_context(
            open_executors(used_hosts(slots), self.config, on_report=self._on_report))
        fault_dir = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="appliance-faults-"))
        return plan_job(slots, self.executors, self.config, fault_dir)

    def notes(self) -> list[str]:
        if self.config.ssh_flags and all(isinstance(ex, LocalExecutor) for ex in self.executors.values()):
            return [f"appliance launch: {' and '.join(self.config.ssh_flags)} unused: every host is this machine"]
        return []

    def describe(self, slots: Sequence[Slot], plan: envmod.JobPlan) -> list[str]:
        hosts = used_hosts(slots)
        lines = [f"appliance launch: job {plan.job_id}: {len(slots)} ranks on {len(hosts)} host(s); "
                 f"store {plan.store_addr}; MASTER_ADDR:PORT {plan.master_addr}:{plan.master_port}"]
        for h in hosts:
            ex = self.executors[h]
            lines.append(f"  host {h}: {'local' if isinstance(ex, LocalExecutor) else 'ssh'}, listen "
                         f"{plan.data_addrs[h]} (interface {getattr(ex, 'iface', '') or '?'})")
        for s in slots:
            lines.append(f"  rank {s.rank}: host {s.host} local_rank {s.local_rank}/{s.local_size} "
                         f"cross_rank {s.cross_rank}/{s.cross_size} listen {plan.data_addrs[s.host]}")
        return lines

    # -- the ranks ----------------------------------------------------------------------------
    def start(self, specs: Sequence[RankSpec], plan: envmod.JobPlan, sink: OutputSink, reaper: Reaper | None,
              cancelled: Callable[[], bool] = lambda: False) -> None:
        self._sink = sink
        self.group.reaper = reaper
        for spec in specs:
            if cancelled():
                break
            self._spawn(spec, plan)

    def add(self, host: str, specs: Sequence[RankSpec], plan: envmod.JobPlan) -> None:
        for spec in specs:
            self._spawn(spec, plan)

    def _spawn(self, spec: RankSpec, plan: envmod.JobPlan) -> None:
        assert self._sink is not None, "start() first"
        with self._lock:
            ex = self.executors[spec.slot.host]
        self.group.add(ex.spawn(spec.wid, self.config.command, env_of(spec, plan, ex, self.config),
                                self.config.cwd, self._sink))

    def remove(self, workers: Sequence[Worker]) -> None:
        self.group.terminate(workers)

    @property
    def workers(self) -> list:
        return self.group.workers

    @property
    def returncodes(self) -> dict:
        return self.group.returncodes

    def next_exit(self, timeout: float):
        return self.group.next_exit(timeout)

    def running(self) -> list:
        return self.group.running()

    def stop(self) -> None:
        self.group.stop()

    # -- elastic ------------------------------------------------------------------------------
    def open_elastic(self) -> str:
        return self._stack.enter_context(tempfile.TemporaryDirectory(prefix="appliance-faults-"))

    def open_hosts(self, hosts: Sequence[str]) -> dict[str, str | None]:
        from .ssh.preflight import run_preflight

        result: dict[str, str | None] = {}
        local = [h for h in hosts if is_local(h)]
        remote = [h for h in hosts if h not in local]
        if self.name == "local" and remote:
            for h in remote:
                result[h] = f"{h}: --launcher local runs every rank on this machine, and {h} is another host"
            remote = []
        for h in local:  # its address is decided per round (round_addresses); no interface defaults
            with self._lock:
                self.executors.setdefault(h, LocalExecutor(h, "127.0.0.1", ""))
            result[h] = None
        if remote:
            start = time.monotonic()
            with run_preflight(remote, set(), self.config.remote, self.config.start_timeout_s, cwd=self.config.cwd,
                               on_report=self._on_report) as pf:
                for line in pf.warnings + (pf.notes if self.config.verbose else []):
                    print(f"appliance launch: {line}", file=sys.stderr, flush=True)
                for h in remote:
                    r = pf.reports[h]
                    if r.failures:
                        result[h] = "; ".join(r.failures)
                        continue
                    with self._lock:
                        old = self.executors.pop(h, None)
                        self.executors[h] = SSHExecutor(h, pf.take(h), self.config, r.address, r.iface)
                    if old is not None:
                        old.close()  # a host seen again: a fresh connection
                    result[h] = None
            if self.config.verbose:
                print(f"appliance launch: preflight: {', '.join(remote)} checked in {time.monotonic() - start:.2f} s",
                      file=sys.stderr, flush=True)
        return result

    def close_hosts(self, hosts: Sequence[str]) -> None:
        with self._lock:
            gone = [ex for ex in (self.executors.pop(h, None) for h in hosts) if ex is not None]
        if gone:  # taken out now (a host opened again gets a new executor); closed off the caller's thread
            threading.Thread(target=lambda: [ex.close() for ex in gone], name="close-hosts", daemon=True).start()

    def round_addresses(self, hosts: Sequence[str]) -> dict[str, str]:
        from appliance.common.netif import interface_address

        with self._lock:
            executors = {h: self.executors[h] for h in hosts if h in self.executors}
        remote = [h for h in hosts if isinstance(executors.get(h), SSHExecutor)]
        iface = self.config.remote.network_interface
        if iface:
            here = interface_address(iface)
        elif remote:
            here = self._address_toward(executors[remote[0]].address, remote[0])
        else:
            here = "127.0.0.1"
        return {h: (ex.address if isinstance(ex, SSHExecutor) else here) for h, ex in executors.items()}

    def _address_toward(self, address: str, host: str) -> str:
        """This machine's source address of its route to ``address`` (cached)."""
        from .ssh import network, probe

        if address not in self._toward:
            try:
                self._toward[address] = network.choose("this machine", host, probe.route_get(address))[0]
            except network.NetworkError as e:
                raise LaunchError(str(e)) from None
        return self._toward[address]

    def launcher_address(self, host: str) -> str:
        with self._lock:
            ex = self.executors.get(host)
        return ex.launcher_address if isinstance(ex, SSHExecutor) else "127.0.0.1"

    def __enter__(self) -> "Executors":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.group.stop()
        finally:
            self._stack.close()
            with self._lock:
                executors, self.executors = list(self.executors.values()), {}
            for ex in executors:  # those an elastic job opened (a static job's are closed already)
                ex.close()


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
    if name == "srun":
        return step.Srun(config)
    return Executors(config, name, on_host_report)


__all__ = ["Mechanism", "RankSpec", "Executors", "choose", "plan_job", "env_of"]
