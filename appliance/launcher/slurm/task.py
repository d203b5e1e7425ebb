"""The per-task wrapper of the srun launcher: ``python -m appliance.launcher.slurm.task DIR GRACE -- COMMAND...``.

What it is: the program ``srun`` starts as each task of the step that ``step.py`` launches. It
reads what Slurm says this task is (``appliance.common.slurm.SlurmTask.from_env``: the rank's
``Slot``, the same type the launcher lays out everywhere else), gives COMMAND
exactly the environment a rank gets from the launcher everywhere else (``env.worker_env``: rank,
size, local and cross rank, HOROVOD_HOSTNAME = the Slurm node name, RANK/WORLD_SIZE/...,
APPLIANCE_DATA_ADDR, the store at rank 0's node, MASTER_ADDR/PORT, APPLIANCE_FAULT_FILE in DIR,
HOROVOD_GLOO_IFACE/NCCL_SOCKET_IFNAME defaulting to the data address's interface;
the job's secret, id and start timeout arrive in the step's environment from the launcher), runs
it as a child in a session of its own, and records how it ended where the launcher reads it.

What it owns, in DIR (the launcher's per-step directory on a mount every node shares, mode 0700):
- ``rendezvous.json``: written by rank 0's wrapper: the store address (its node's address and a
  port free there) and torch's MASTER_ADDR/MASTER_PORT; every other wrapper waits for it (within
  HOROVOD_START_TIMEOUT) before starting its rank.
- ``elastic.json`` (an elastic job's step, HOROVOD_ELASTIC=1; the launcher's): per task, the
  worker number (APPLIANCE_ELASTIC_WORKER) and the place the driver planned for it; no
  ``rendezvous.json`` then: every round's store comes from the driver.
- ``hostfile`` (the launcher's): the node of each rank, one per line (srun's SLURM_HOSTFILE); a
  task that Slurm placed elsewhere fails at once, naming both nodes.
- ``start.N.json``: rank N started (node, child pid, ``JOB.STEP``: the launcher signals the step by it).
- ``exit.N.json``: rank N's child ended: its return code (negative: killed by that signal) and
  when (``at``, wall clock: the launcher orders exits it finds together by it), so the launcher
  names the rank and node even when the child was SIGKILLed.
Files are written whole (temporary name, then rename).

Lifecycle: signals the task gets (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2) are passed to the
child's process group (SIGTERM with a SIGCONT). When the child fails, the wrapper holds its own
exit for up to GRACE seconds (the survivors' APPLIANCE_FAILURE_GRACE, ended early once every rank
recorded its exit or a signal arrives), because its non-zero exit makes ``srun
--kill-on-bad-exit`` kill the whole step; the launcher normally decides first. It then exits with
the child's code (128+N for signal N; 127/126 when COMMAND cannot be started).

Env vars: Slurm's (through ``SlurmTask``), the launcher's per-job contract (APPLIANCE_JOB_SECRET,
APPLIANCE_JOB_ID, HOROVOD_START_TIMEOUT, APPLIANCE_VERBOSE), HOROVOD_GLOO_IFACE (the data
address is that interface's, else the node name's address). Failure modes: not a Slurm task, an
incomplete Slurm environment, or no rendezvous file within the start timeout: one line on stderr,
exit 2 (recorded as the rank's exit).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

from appliance.common.knobs import ConfigError
from appliance.common.netif import interface_address
from appliance.common.slurm import SlurmEnvError, SlurmTask
from .. import binding
from appliance.common.ranks import Slot
from ..env import JobPlan, fault_file, network_defaults, worker_env
from ..workers import read_json

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PRIVATE = ("SLURM_HOSTFILE",)  # the launcher's means of placing tasks; not for the rank's own sruns
POLL_S = 0.01


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def exit_file(d: str, rank: int) -> str:
    return os.path.join(d, f"exit.{rank}.json")


def start_file(d: str, rank: int) -> str:
    return os.path.join(d, f"start.{rank}.json")


def rendezvous_file(d: str) -> str:
    return os.path.join(d, "rendezvous.json")


def elastic_file(d: str) -> str:
    """An elastic job's step: each task's worker number and planned place (the launcher's)."""
    return os.path.join(d, "elastic.json")


def planned_node(d: str, rank: int) -> str | None:
    """The node the launcher's layout gave ``rank`` (line ``rank`` of DIR/hostfile), None if unknown."""
    try:
        with open(os.path.join(d, "hostfile"), encoding="utf-8") as f:
            names = f.read().split()
    except OSError:
        return None
    return names[rank] if rank < len(names) else None


def data_address(node: str) -> str:
    """Where this node's ranks listen: HOROVOD_GLOO_IFACE's address, else the node name's, else the host's."""
    iface = os.environ.get("HOROVOD_GLOO_IFACE", "").strip()
    if iface:
        return interface_address(iface)
    for name in (node, socket.gethostname()):
        try:
            return socket.gethostbyname(name)
        except OSError:
            continue
    raise ConfigError(f"node {node!r} does not resolve to an address; set HOROVOD_GLOO_IFACE (--network-interface)")


def interface_of(address: str) -> str:
    """The interface whose address is ``address`` ("" when none is), as the executors default
    HOROVOD_GLOO_IFACE and NCCL_SOCKET_IFNAME to the chosen interface."""
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == address:
                return name
        except ConfigError:
            continue
    return ""


def free_ports(address: str, count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
            s.bind((address, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def rendezvous(d: str, task: SlurmTask, address: str, timeout_s: float) -> dict:
    """Rank 0 publishes the store's and torch's addresses; every other rank reads them."""
    path = rendezvous_file(d)
    if task.rank == 0:
        store, master = free_ports(address, 2)
        data = {"store_addr": f"[{address}]:{store}" if ":" in address else f"{address}:{store}",
                "master_addr": address, "master_port": master}
        write_json(path, data)
        return data
    end = time.monotonic() + timeout_s
    while True:
        data = read_json(path)
        if data is not None:
            return data
        if time.monotonic() > end:
            raise ConfigError(f"rank 0 did not publish the rendezvous ({path}) within {timeout_s:g} s")
        time.sleep(POLL_S)


def rank_env(task: SlurmTask, d: str, environ: dict[str, str]) -> dict[str, str]:
    """COMMAND's environment: the launcher's contract for this task's rank (``env.worker_env``)."""
    timeout_s = float(environ.get("HOROVOD_START_TIMEOUT") or 60.0)
    address = data_address(task.node)
    elastic = read_json(elastic_file(d)) if environ.get("HOROVOD_ELASTIC") == "1" else None
    if elastic is not None:  # an elastic job's step: the place the driver planned; the store comes from it
        spec = elastic[str(task.rank)]
        slot = Slot(**spec["slot"])
        plan = JobPlan(job_id=environ.get("APPLIANCE_JOB_ID", ""), secret=environ.get("APPLIANCE_JOB_SECRET", ""),
                       store_addr="", master_addr=address, master_port=0, data_addrs={slot.host: address},
                       start_timeout_s=timeout_s, verbose=environ.get("APPLIANCE_VERBOSE") == "1", fault_dir=d)
        base = {k: v for k, v in environ.items() if k not in PRIVATE}
        network_defaults(base, interface_of(address))
        env = worker_env(slot, plan, base, {})
        env.update(APPLIANCE_ELASTIC_WORKER=str(spec["wid"]), APPLIANCE_FAULT_FILE=fault_file(d, task.rank))
        return env
    meet = rendezvous(d, task, address, timeout_s)
    plan = JobPlan(job_id=environ.get("APPLIANCE_JOB_ID", ""), secret=environ.get("APPLIANCE_JOB_SECRET", ""),
                   store_addr=meet["store_addr"], master_addr=meet["master_addr"],
                   master_port=int(meet["master_port"]), data_addrs={task.node: address},
                   start_timeout_s=timeout_s, verbose=environ.get("APPLIANCE_VERBOSE") == "1", fault_dir=d)
    base = {k: v for k, v in environ.items() if k not in PRIVATE}
    network_defaults(base, interface_of(address))
    return worker_env(task, plan, base, {})  # a SlurmTask is the rank's Slot


def _hold(d: str, size: int, grace_s: float, signalled: list[int]) -> None:
    """After a failure: wait until every rank recorded its exit, a signal arrives, or the grace ends."""
    end = time.monotonic() + grace_s
    while time.monotonic() < end and not signalled:
        if all(os.path.exists(exit_file(d, r)) for r in range(size)):
            return
        time.sleep(0.05)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m appliance.launcher.slurm.task DIR GRACE -- COMMAND...", file=sys.stderr)
        return 2
    d, grace_s, command = argv[0], float(argv[1]), list(argv[3:])
    try:
        task = SlurmTask.from_env()
        if task is None:
            raise SlurmEnvError("not a Slurm task (SLURM_STEP_ID is not set): srun starts this, not you")
    except SlurmEnvError as e:
        print(f"appliance srun task: {e}", file=sys.stderr, flush=True)
        return 2
    record = {"rank": task.rank, "host": task.node}
    planned = planned_node(d, task.rank)
    if planned is not None and planned != task.node:
        error = (f"Slurm placed rank {task.rank} on {task.node}, the launcher's layout on {planned} "
                 "(SLURM_HOSTFILE with --distribution=arbitrary was not honoured)")
        print(f"appliance srun task: {error}", file=sys.stderr, flush=True)
        write_json(exit_file(d, task.rank), {**record, "returncode": 2, "error": error, "at": time.time()})
        return 2
    signalled: list[int] = []
    child: subprocess.Popen | None = None

    def forward(sig: int, _frame: object) -> None:
        signalled.append(sig)
        if child is not None:
            for s in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
                try:
                    os.killpg(child.pid, s)
                except (ProcessLookupError, PermissionError):
                    pass

    for s in FORWARDED:
        signal.signal(s, forward)
    try:
        env = rank_env(task, d, dict(os.environ))
    except (ConfigError, OSError, ValueError) as e:
        print(f"appliance srun task: rank {task.rank} (node {task.node}): {e}", file=sys.stderr, flush=True)
        write_json(exit_file(d, task.rank), {**record, "returncode": 2, "error": str(e), "at": time.time()})
        return 2
    try:
        with binding.bound(env):
            child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        code = 127 if isinstance(e, FileNotFoundError) else 126
        what = "command not found" if code == 127 else "command not executable" if isinstance(
            e, PermissionError) else f"cannot start ({e.strerror})"
        error = f"{what}: {command[0]!r}"
        print(f"appliance srun task: rank {task.rank} (node {task.node}): {error}", file=sys.stderr, flush=True)
        write_json(exit_file(d, task.rank), {**record, "returncode": code, "error": error, "at": time.time()})
        return code
    step = f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_STEP_ID', '')}"
    write_json(start_file(d, task.rank), {**record, "pid": child.pid, "step": step})
    if signalled:  # a signal that came before the child existed
        forward(signalled[-1], None)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    write_json(exit_file(d, task.rank), {**record, "returncode": code, "at": time.time()})
    if code != 0:
        _hold(d, task.size, grace_s, signalled)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
