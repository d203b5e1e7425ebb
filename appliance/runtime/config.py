"""The runtime's config: everything ``appliance.runtime.init()`` needs, read once at init.

What it owns: ``RuntimeConfig`` and how it is read from the environment; ``ORIGINS``, the one
table of where a worker's place in the job comes from (our launcher: HOROVOD_RANK/SIZE...;
OpenMPI's mpirun: OMPI_COMM_WORLD_*; a task ``srun`` started itself: Slurm's variables; hydra:
PMI_RANK/PMI_SIZE; else a lone process), each with how it is detected and read, which every
framework's binding reaches through ``appliance.runtime``; the rendezvous store's address
(APPLIANCE_STORE_ADDR; a Slurm step's derived one; or, under mpirun or hydra, what rank 0
published through the process manager: ``appliance.runtime.procmgr``), the job's secret
(APPLIANCE_JOB_SECRET, else the file APPLIANCE_JOB_SECRET_FILE, else a Slurm job's default file,
else the process manager's) and the engine's knobs (every knob of ``appliance.common.knobs`` that names the core
option it feeds). Failure modes: missing or
invalid values raise ``ConfigError`` naming the variable as its origin set it (not a
``HOROVOD_*`` the user never saw) and how to provide it.
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
        src, rank, size, task = layout(env, slurm)
        manager = src.manager

        store_host, store_port, secret, store_note = "", 0, b"", ""
        data_addr = read("APPLIANCE_DATA_ADDR", env)
        if size > 1:
            addr = read("APPLIANCE_STORE_ADDR", env)
            if not addr and manager and procmgr is not None:
                try:
                    boot = procmgr(env, rank, size)
                except ConfigError as e:
                    raise ConfigError(f"rank {rank} of {size} under {src.label}: {e}") from None
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


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a worker's place in the job comes from: ``detect(env)`` says whether this origin
    started the process; its rank and size are read from ``rank_var``/``size_var`` (srun's from
    ``appliance.common.slurm``), its ranks per host from ``local_size_var`` (the store's address
    under mpirun and hydra; the local rank itself is the rendezvous' for every origin). ``manager``:
    the process manager whose exchange carries the store's address and secret ("" = none)."""

    name: str            # "launcher", "mpirun", "srun", "hydra", "alone"
    label: str           # for messages: "under mpirun: ..."
    rank_var: str
    size_var: str
    local_size_var: str
    manager: str
    detect: Callable[[Mapping[str, str]], bool]


ORIGINS = (  # asked in this order; the first that detects itself is the origin
    Origin("launcher", "our launcher", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE", "",
           lambda env: bool(env.get("HOROVOD_RANK") or env.get("HOROVOD_SIZE"))),
    Origin("mpirun", "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun",
           lambda env: "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env),
    Origin("srun", "srun", "SLURM_PROCID", "SLURM_NTASKS", "", "",  # all read by appliance.common.slurm
           lambda env: bool(env.get("SLURM_STEP_ID") and env.get("SLURM_PROCID"))),
    Origin("hydra", "hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "hydra",
           lambda env: bool(env.get("PMI_RANK") or env.get("PMI_SIZE"))),
    Origin("alone", "a lone process", "", "", "", "", lambda env: True),
)


def origin(env: Mapping[str, str], srun: bool = True) -> Origin:
    """The first origin of ``ORIGINS`` that detects itself in ``env`` (``srun=False``: a Slurm
    task is not asked, its variables being another launcher's)."""
    return next(o for o in ORIGINS if (srun or o.name != "srun") and o.detect(env))


def layout(env: Mapping[str, str], slurm: Callable[[Mapping[str, str]], Any] | None = None
           ) -> tuple[Origin, int, int, Any]:
    """``(origin, rank, size, slurm task or None)``, every value checked and a bad one named as
    the origin set it (``OMPI_COMM_WORLD_SIZE='abc' is not a whole number``). ``slurm``: the
    Slurm task reader; without it srun is no origin."""
    o = origin(env, srun=slurm is not None)
    if o.name == "alone":
        return o, 0, 1, None
    if o.name == "srun":
        task = slurm(env)
        if task is not None:
            return o, task.rank, task.size, task
        o = origin({k: v for k, v in env.items() if not k.startswith("SLURM_")}, srun=False)
        if o.name == "alone":
            return o, 0, 1, None
    if o.name == "launcher":
        rank, size = read(o.rank_var, env), read(o.size_var, env)
        if rank is None or size is None:
            raise ConfigError("HOROVOD_RANK and HOROVOD_SIZE must be set together")
    else:
        for have, need in ((o.rank_var, o.size_var), (o.size_var, o.rank_var)):
            if not env.get(need):
                raise ConfigError(f"{need} is {'empty' if need in env else 'not set'} though {have}="
                                  f"{env.get(have)!r} is: {o.label} sets both for each rank")
        rank, size = _int_var(env, o.rank_var), _int_var(env, o.size_var)
    if size < 1:
        raise ConfigError(f"{o.size_var}={size} is not a job size (at least 1)")
    if not 0 <= rank < size:
        raise ConfigError(f"{o.rank_var}={rank} is not below {o.size_var}={size}" if rank >= 0
                          else f"{o.rank_var}={rank} is negative")
    return o, rank, size, None


def _int_var(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name].strip())
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


