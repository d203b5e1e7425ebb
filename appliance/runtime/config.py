"""The runtime's config: everything ``appliance.runtime.init()`` needs, read once at init.

What it owns: ``RuntimeConfig`` and how it is read from the environment (the job layout set by
a launcher: HOROVOD_RANK/SIZE...; OpenMPI's OMPI_COMM_WORLD_*; for a task ``srun`` started
itself, Slurm's variables; hydra's PMI_RANK/PMI_SIZE), the rendezvous store's address
(APPLIANCE_STORE_ADDR; a Slurm step's derived one; or, under mpirun or hydra, what rank 0
published through the process manager: ``appliance.runtime.procmgr``), the job's secret
(APPLIANCE_JOB_SECRET, else the file APPLIANCE_JOB_SECRET_FILE, else a Slurm job's default file,
else the process manager's) and the engine's knobs (every knob of ``appliance.common.knobs`` that names the core
option it feeds). Failure modes: missing or
invalid values raise ``ConfigError`` naming the variable and how to provide it.
"""
from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any, Callable, Mapping

from appliance.common import jobsecret
from appliance.common.knobs import KNOBS, ConfigError, read
from appliance.common.netif import interface_address


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Everything ``appliance.runtime.init()`` needs, read from the environment at init: the job's
    layout and bootstrap, and ``options``, the engine's knobs by the core option each feeds
    (every knob with a ``core`` name; ``appliance.runtime.engine`` copies them as they are)."""

    rank: int = 0
    size: int = 1
    host: str = ""
    store_host: str = ""
    store_port: int = 0
    store_note: str = ""  # how the store's address was derived and how to override it ("" = given)
    manager: str = ""     # "mpirun" or "hydra" when that process manager gave the store's address
    secret: bytes = b""
    job_id: str = ""
    data_addr: str = ""
    options: Mapping[str, Any] = dataclasses.field(default_factory=lambda: engine_options({}))
    elastic_round: int = 0  # an elastic job's round (runtime/elastic.py): the job id is per round, not per start

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 slurm: Callable[[Mapping[str, str]], Any] | None = None,
                 procmgr: Callable[[Mapping[str, str], int, int], Any] | None = None) -> "RuntimeConfig":
        """``slurm``: ``appliance.common.slurm.SlurmTask.from_env``, asked only when no launcher described
        the job (HOROVOD_RANK/SIZE and OMPI_COMM_WORLD_RANK unset); a Slurm task it returns gives
        the layout, the store (the step's first node) and the secret file (README, "Slurm").
        ``procmgr``: ``appliance.runtime.procmgr.bootstrap``, asked for the store and the secret
        when mpirun or hydra started the ranks and APPLIANCE_STORE_ADDR is unset."""
        env = os.environ if env is None else env
        rank, size = read("HOROVOD_RANK", env), read("HOROVOD_SIZE", env)
        manager = ""
        if rank is None and "OMPI_COMM_WORLD_RANK" in env:  # started by OpenMPI's mpirun
            rank, size, manager = int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"]), "mpirun"
        task = slurm(env) if rank is None and size is None and slurm is not None else None
        if task is not None:  # a task srun started itself
            rank, size = task.rank, task.size
        if rank is None and size is None and env.get("PMI_RANK") and env.get("PMI_SIZE"):  # hydra
            rank, size, manager = _int_var(env, "PMI_RANK"), _int_var(env, "PMI_SIZE"), "hydra"
        if rank is None and size is None:
            rank, size = 0, 1  # no launcher: a single rank, so the same script runs on a laptop
        if rank is None or size is None:
            raise ConfigError("HOROVOD_RANK and HOROVOD_SIZE must be set together")
        if size < 1 or rank >= size:
            raise ConfigError(f"HOROVOD_RANK={rank} is not below HOROVOD_SIZE={size}")

        store_host, store_port, secret, store_note = "", 0, b"", ""
        data_addr = read("APPLIANCE_DATA_ADDR", env)
        if size > 1:
            addr = read("APPLIANCE_STORE_ADDR", env)
            if not addr and manager and procmgr is not None:
                try:
                    boot = procmgr(env, rank, size)
                except ConfigError as e:
                    raise ConfigError(f"rank {rank} of {size} under {manager}: {e}") from None
                addr, store_note, data_addr = boot.store_addr, boot.note, data_addr or boot.data_addr
                env = {**env, "APPLIANCE_JOB_SECRET": boot.secret_hex}  # read below, never exported
            if not addr and task is not None:
                addr = f"{task.first_node}:{task.store_port}"
                store_note = (f"the port Slurm job {task.job_id} step {task.step_id} derives from its ids; "
                              f"choose another with APPLIANCE_STORE_ADDR={task.first_node}:PORT")
            if not addr:
                raise ConfigError(
                    f"rank {rank} of {size}: APPLIANCE_STORE_ADDR is not set. Start workers with "
                    "`appliance launch`, or under mpirun pass -x APPLIANCE_STORE_ADDR=<rank 0 host>:<port> "
                    "-x APPLIANCE_JOB_SECRET")
            store_host, _, port = addr.rpartition(":")
            try:
                store_port = int(port)
            except ValueError:
                raise ConfigError(f"APPLIANCE_STORE_ADDR={addr!r}: expected host:port") from None
            if not store_host or not 0 < store_port < 65536:
                raise ConfigError(f"APPLIANCE_STORE_ADDR={addr!r}: expected host:port")
            secret = _job_secret(env, rank, size, task)

        iface = read("HOROVOD_GLOO_IFACE", env)
        if not data_addr and iface:
            data_addr = interface_address(iface)
        return cls(
            rank=rank,
            size=size,
            host=read("HOROVOD_HOSTNAME", env) or (task.node if task is not None else socket.gethostname()),
            store_host=store_host,
            store_port=store_port,
            store_note=store_note,
            manager=manager if store_note and manager else "",
            secret=secret,
            job_id=read("APPLIANCE_JOB_ID", env) or (f"slurm-{task.job_id}.{task.step_id}" if task is not None else ""),
            data_addr=data_addr,
            options=engine_options(env),
        )


def _int_var(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ConfigError(f"{name}={env[name]!r} is not a whole number") from None


def engine_options(env: Mapping[str, str]) -> dict:
    """Every knob that feeds the core (``Knob.core``), read from ``env``: option name -> value."""
    return {k.core: read(k.env, env) for k in KNOBS.values() if k.core}


def _job_secret(env: Mapping[str, str], rank: int, size: int, task: Any) -> bytes:
    """APPLIANCE_JOB_SECRET, else the file APPLIANCE_JOB_SECRET_FILE, else (a Slurm task) the job's
    default file: never a fixed value. Missing: one line saying how to provide one."""
    hex_secret = read("APPLIANCE_JOB_SECRET", env)
    if hex_secret:
        try:
            return bytes.fromhex(hex_secret)
        except ValueError:
            raise ConfigError("APPLIANCE_JOB_SECRET must be hexadecimal") from None
    path = read("APPLIANCE_JOB_SECRET_FILE", env) or (task.secret_file if task is not None else "")
    if path:
        try:
            return jobsecret.read(path)
        except FileNotFoundError:
            pass
        except jobsecret.SecretFileError as e:
            raise ConfigError(f"rank {rank} of {size}: {e}") from None
    if task is not None:
        raise ConfigError(
            f"rank {rank} of {size} (Slurm job {task.job_id}): no job secret: run `appliance secret` in the job "
            f"before srun (it creates {path}), or export APPLIANCE_JOB_SECRET=<hex>")
    if path:
        raise ConfigError(f"rank {rank} of {size}: APPLIANCE_JOB_SECRET_FILE={path}: no such file "
                          f"(create it with `appliance secret --file {path}`)")
    raise ConfigError(
        f"rank {rank} of {size}: APPLIANCE_JOB_SECRET is not set; every rank needs the "
        "job's secret (the launcher passes it in the environment; under mpirun: "
        "export APPLIANCE_JOB_SECRET=$(python -c 'import secrets; print(secrets.token_hex(16))') "
        "and add -x APPLIANCE_JOB_SECRET)")


