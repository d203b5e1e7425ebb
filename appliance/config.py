"""Every knob of the appliance, declared once, read once.

Each knob has an environment name, a type, a default and a one-line doc in ``KNOBS``. Horovod's
names are kept where Horovod has the knob (``HOROVOD_FUSION_THRESHOLD``...); ours start with
``APPLIANCE_``. Command-line flags win over the environment, which wins over the default.
``describe()`` renders the table (rank 0 prints it with ``--verbose`` / ``APPLIANCE_VERBOSE``).

Nothing else in the package reads ``os.environ`` for a knob; modules ask for a dataclass
built here (``RuntimeConfig.from_env()``...). ``RuntimeConfig.from_env`` also reads the job's
secret file (``appliance.jobsecret``) and, for a task ``srun`` started without a launcher, takes
the layout from ``appliance.slurm`` (handed in by the runtime: that module imports this one). Invalid values raise ``ConfigError`` naming the
variable and what was wrong with it.
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket
from typing import Any, Callable, Mapping, Sequence

from . import jobsecret


class ConfigError(ValueError):
    """A knob has a value that cannot be used; the message names the variable."""


@dataclasses.dataclass(frozen=True)
class Knob:
    env: str
    type: Callable[[str], Any]
    default: Any
    doc: str


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {s!r}")


def _size(s: str) -> int:
    """Bytes, optionally with a K/M/G suffix (powers of 1024)."""
    v = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if v.endswith(suffix):
            v, mult = v[:-1], m
            break
    n = int(float(v) * mult)
    if n < 0:
        raise ValueError("must not be negative")
    return n


def _nonneg_float(s: str) -> float:
    f = float(s)
    if f < 0:
        raise ValueError("must not be negative")
    return f


def _port(s: str) -> int:
    n = int(s)
    if not 0 < n < 65536:
        raise ValueError("must be a TCP port (1-65535)")
    return n


LAUNCHERS = ("auto", "ssh", "srun", "local")


def _launcher(s: str) -> str:
    v = s.strip().lower() or "auto"
    if v not in LAUNCHERS:
        raise ValueError(f"expected one of {', '.join(LAUNCHERS)}, got {s!r}")
    return v


def _bind(s: str) -> str:
    v = s.strip().lower() or "none"
    if v not in ("none", "core"):
        raise ValueError(f"expected none or core, got {s!r}")
    return v


def _rank_int(s: str) -> int:
    n = int(s)
    if n < 0:
        raise ValueError("must not be negative")
    return n


# --- the table ----------------------------------------------------------------------------
KNOBS: dict[str, Knob] = {k.env: k for k in [
    # Process layout (the launcher sets these; OpenMPI's OMPI_COMM_WORLD_* are the fallback).
    Knob("HOROVOD_RANK", _rank_int, None, "this process's rank"),
    Knob("HOROVOD_SIZE", _rank_int, None, "number of ranks in the job"),
    Knob("HOROVOD_LOCAL_RANK", _rank_int, None, "rank among the processes of this host"),
    Knob("HOROVOD_LOCAL_SIZE", _rank_int, None, "number of ranks on this host"),
    Knob("HOROVOD_CROSS_RANK", _rank_int, None, "rank among the ranks with this local rank (the host's index when hosts are even)"),
    Knob("HOROVOD_CROSS_SIZE", _rank_int, None, "number of ranks with this local rank (the number of hosts when hosts are even)"),
    Knob("HOROVOD_HOSTNAME", str, None, "host name as the launcher knows it (default: gethostname())"),
    # Bootstrap.
    Knob("APPLIANCE_STORE_ADDR", str, None, "host:port of the rendezvous store hosted by rank 0"),
    Knob("APPLIANCE_JOB_SECRET", str, None, "per-job secret (hex); every connection must prove it"),
    Knob("APPLIANCE_JOB_SECRET_FILE", str, "", "file holding the job secret (hex, mode 0600) when APPLIANCE_JOB_SECRET is unset (default for a Slurm task: ~/.appliance/slurm/job-JOBID.secret; `appliance secret` makes it)"),
    Knob("APPLIANCE_JOB_ID", str, "", "job identifier, part of every handshake"),
    Knob("APPLIANCE_DATA_ADDR", str, "", "address this rank listens on for peers (the launcher picks it)"),
    Knob("HOROVOD_GLOO_IFACE", str, "", "network interface whose address this rank listens on"),
    Knob("APPLIANCE_FAULT_FILE", str, "", "where the runtime writes its fault report (JSON) when the job first fails (the launcher sets it; empty = none)"),
    Knob("HOROVOD_START_TIMEOUT", _nonneg_float, 60.0, "seconds to wait for every rank at init (launch: --start-timeout)"),
    # Engine.
    Knob("HOROVOD_FUSION_THRESHOLD", _size, 128 << 20, "bytes of small allreduces fused into one (0 disables fusion)"),
    Knob("HOROVOD_CYCLE_TIME", _nonneg_float, 1.0, "milliseconds to wait for more tensors to fuse while some are still coming"),
    Knob("HOROVOD_CACHE_CAPACITY", _rank_int, 1024, "response cache entries (0 disables the cache)"),
    Knob("HOROVOD_STALL_CHECK_DISABLE", _bool, False, "do not warn about ranks that lag behind on a tensor"),
    Knob("HOROVOD_STALL_CHECK_TIME_SECONDS", _nonneg_float, 60.0, "warn when a tensor waits this long for some ranks"),
    Knob("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", _nonneg_float, 300.0, "fail the job on every rank when a tensor waits this long for some ranks (0 = never)"),
    Knob("HOROVOD_DYNAMIC_PROCESS_SETS", _bool, False, "allow hvd.add_process_set/remove_process_set after init (as hvd.init(process_sets='dynamic'))"),
    Knob("HOROVOD_TIMELINE", str, "", "rank 0 writes a Chrome-trace timeline of every tensor to this file from init (empty or DYNAMIC: only between hvd.start_timeline and stop_timeline)"),
    Knob("HOROVOD_TIMELINE_MARK_CYCLES", _bool, False, "mark each wake of rank 0's background thread (CYCLE_START) in the timeline started at init"),
    Knob("APPLIANCE_CHUNK_BYTES", _size, 1 << 20, "pipelining grain of the ring algorithms"),
    Knob("APPLIANCE_SHM", _bool, True, "shared memory between ranks of one machine (0 = TCP for every pair)"),
    Knob("APPLIANCE_SPIN_US", _rank_int, 100, "microseconds the engine polls after work, and a waiting caller before it blocks, so back-to-back small ops skip thread wake-ups (0 = never)"),
    Knob("APPLIANCE_CALLER_DRIVES", _bool, True, "a caller waiting for a host op runs the engine itself for up to APPLIANCE_SPIN_US, sparing a small op two thread hand-offs; the background thread stands aside until a cycle after (0 = the background thread does all)"),
    Knob("APPLIANCE_HEARTBEAT_TIMEOUT", _nonneg_float, 10.0, "seconds of silence after which a peer is declared lost"),
    Knob("APPLIANCE_NCCL_LIBRARY", str, "", "path of libnccl.so.2 to use for CUDA tensors (default: the nvidia-nccl wheel next to torch, then the loader path)"),
    Knob("APPLIANCE_VERBOSE", _bool, False, "print the knob table and rendezvous details on rank 0 (launch: --verbose)"),
    # Launcher.
    Knob("APPLIANCE_STOP_GRACE", _nonneg_float, 3.0, "seconds between SIGTERM and SIGKILL when the launcher stops workers"),
    Knob("APPLIANCE_FAILURE_GRACE", _nonneg_float, 5.0, "seconds the surviving ranks get to finish their error handlers after the first rank fails, before SIGTERM"),
    Knob("APPLIANCE_SSH_PORT", _port, None, "SSH port of the other hosts (launch/check: -p; default: ~/.ssh/config, else 22)"),
    Knob("APPLIANCE_SSH_KEY", str, "", "private key for SSH (launch/check: -i; default: SHARED/ssh/id_ed25519 if present, else ~/.ssh/config and ~/.ssh/id_*)"),
    Knob("APPLIANCE_SSH_USER", str, "", "user on the other hosts (default: ~/.ssh/config, else the launcher's user)"),
    Knob("APPLIANCE_SHARED", str, "/mnt/share", "directory mounted at the same path on every host; keys live in its ssh/ (check/keys: --shared)"),
    Knob("APPLIANCE_REMOTE_PYTHON", str, "", "absolute path of Python on the other hosts (launch: --remote-python; default: the launcher's own)"),
    Knob("APPLIANCE_SSH_TIMEOUT", _nonneg_float, 5.0, "seconds of silence on a remote rank's SSH channel after which its host is declared unreachable (and the stub there stops the rank; 0 disables)"),
    Knob("APPLIANCE_JOB_DIR", str, "", "where remote ranks record their pid/pgid, per host (default: $TMPDIR/appliance-UID/jobs)"),
    Knob("APPLIANCE_MIN_SHM", _size, 64 << 20, "free bytes /dev/shm must have on every host (appliance check)"),
    Knob("SLURM_JOB_NODELIST", str, None, "set by Slurm: the allocation's nodes, used as hosts when neither -H nor --hostfile is given"),
    Knob("SLURM_TASKS_PER_NODE", str, None, "set by Slurm: tasks per node of the allocation (e.g. 2(x3),1) -> slots"),
    Knob("SLURM_NTASKS_PER_NODE", str, None, "set by Slurm with --ntasks-per-node: slots per node when SLURM_TASKS_PER_NODE is absent"),
    Knob("SLURM_JOB_ID", str, None, "set by Slurm in an allocation: with it and neither -H nor --hostfile, launch starts the ranks with srun; `appliance secret` makes that job's secret file"),
    Knob("APPLIANCE_BIND", _bind, "none", "CPU binding of ranks: none (the kernel places them) or core (the ranks of a host split its CPUs into disjoint slices by local rank, as mpirun --bind-to core)"),
    Knob("APPLIANCE_LAUNCHER", _launcher, "auto", "how launch starts ranks: auto (srun inside a Slurm allocation without -H/--hostfile, else ssh), ssh, srun or local (launch: --launcher)"),
    # Appliance plane (Docker: appliance secondary|primary|status).
    Knob("APPLIANCE_IMAGE", str, "appliance:latest", "image of the secondary and primary containers (--image)"),
    Knob("APPLIANCE_NETWORK", str, "host", "Docker network of the containers: host, or a user-defined network (--network)"),
    Knob("APPLIANCE_SHM_SIZE", str, "", "/dev/shm of the containers: 'host' (--ipc host) or a size like 2g (default: host on the host network, else 1g)"),
    Knob("APPLIANCE_GPUS", str, "auto", "GPUs for the containers: auto (all, when Docker has an nvidia runtime), all, none, or a count"),
    Knob("APPLIANCE_SECONDARY_WAIT", _nonneg_float, 20.0, "seconds the primary waits for each secondary's SSH port to answer"),
    Knob("APPLIANCE_CONTAINER", str, "", "set by appliance for each container it starts: <name>@<engine id>; lock owners record it (read from the container's init), so a lock whose container is gone is taken over at once"),
]}


def read(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The value of knob ``name`` from ``env`` (default ``os.environ``), typed and validated."""
    knob = KNOBS[name]
    env = os.environ if env is None else env
    raw = env.get(name)
    if raw is None or (raw == "" and knob.default is not None and knob.type is not str):
        return knob.default
    try:
        return knob.type(raw)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{name}={raw!r}: {e} ({knob.doc})") from None


def describe(env: Mapping[str, str] | None = None) -> str:
    """The knob table with current values, one line per knob."""
    rows = []
    for k in KNOBS.values():
        try:
            value = read(k.env, env)
        except ConfigError as e:
            value = f"<invalid: {e}>"
        if k.env == "APPLIANCE_JOB_SECRET" and value:
            value = "<set>"
        rows.append(f"  {k.env:<36} {value!s:<14} {k.doc}")
    return "\n".join(rows)


# --- the runtime's view ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Everything ``appliance.runtime.init()`` needs, read from the environment at init."""

    rank: int = 0
    size: int = 1
    host: str = ""
    store_host: str = ""
    store_port: int = 0
    store_note: str = ""  # how the store's address was derived and how to override it ("" = given)
    secret: bytes = b""
    job_id: str = ""
    data_addr: str = ""
    start_timeout_s: float = 60.0
    fusion_threshold: int = 128 << 20
    cycle_time_ms: float = 1.0
    cache_capacity: int = 1024
    stall_check_s: float = 60.0
    stall_shutdown_s: float = 300.0
    chunk_bytes: int = 1 << 20
    heartbeat_timeout_s: float = 10.0
    shm: bool = True
    spin_us: int = 100
    caller_drives: bool = True
    verbose: bool = False
    nccl_library: str = ""
    fault_file: str = ""
    timeline: str = ""
    timeline_mark_cycles: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 slurm: Callable[[Mapping[str, str]], Any] | None = None) -> "RuntimeConfig":
        """``slurm``: ``appliance.slurm.SlurmTask.from_env``, asked only when no launcher described
        the job (HOROVOD_RANK/SIZE and OMPI_COMM_WORLD_RANK unset); a Slurm task it returns gives
        the layout, the store (the step's first node) and the secret file (README, "Slurm")."""
        env = os.environ if env is None else env
        rank, size = read("HOROVOD_RANK", env), read("HOROVOD_SIZE", env)
        if rank is None and "OMPI_COMM_WORLD_RANK" in env:  # started by OpenMPI's mpirun
            rank, size = int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"])
        task = slurm(env) if rank is None and size is None and slurm is not None else None
        if task is not None:  # a task srun started itself
            rank, size = task.rank, task.size
        if rank is None and size is None:
            rank, size = 0, 1  # no launcher: a single rank, so the same script runs on a laptop
        if rank is None or size is None:
            raise ConfigError("HOROVOD_RANK and HOROVOD_SIZE must be set together")
        if size < 1 or rank >= size:
            raise ConfigError(f"HOROVOD_RANK={rank} is not below HOROVOD_SIZE={size}")

        store_host, store_port, secret, store_note = "", 0, b"", ""
        if size > 1:
            addr = read("APPLIANCE_STORE_ADDR", env)
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

        data_addr = read("APPLIANCE_DATA_ADDR", env)
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
            secret=secret,
            job_id=read("APPLIANCE_JOB_ID", env) or (f"slurm-{task.job_id}.{task.step_id}" if task is not None else ""),
            data_addr=data_addr,
            start_timeout_s=read("HOROVOD_START_TIMEOUT", env),
            fusion_threshold=read("HOROVOD_FUSION_THRESHOLD", env),
            cycle_time_ms=read("HOROVOD_CYCLE_TIME", env),
            cache_capacity=read("HOROVOD_CACHE_CAPACITY", env),
            stall_check_s=0.0 if read("HOROVOD_STALL_CHECK_DISABLE", env) else read("HOROVOD_STALL_CHECK_TIME_SECONDS", env),
            stall_shutdown_s=read("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", env),
            chunk_bytes=max(1, read("APPLIANCE_CHUNK_BYTES", env)),
            heartbeat_timeout_s=read("APPLIANCE_HEARTBEAT_TIMEOUT", env),
            shm=read("APPLIANCE_SHM", env),
            spin_us=read("APPLIANCE_SPIN_US", env),
            caller_drives=read("APPLIANCE_CALLER_DRIVES", env),
            verbose=read("APPLIANCE_VERBOSE", env),
            nccl_library=read("APPLIANCE_NCCL_LIBRARY", env),
            fault_file=read("APPLIANCE_FAULT_FILE", env),
            timeline=read("HOROVOD_TIMELINE", env),
            timeline_mark_cycles=read("HOROVOD_TIMELINE_MARK_CYCLES", env),
        )


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


# --- the launcher's view --------------------------------------------------------------------
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_forwards(items: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """``-x NAME`` (the launcher's value of NAME) and ``-x NAME=VALUE``, as mpirun, -> a dict."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not _ENV_NAME.match(name):
            raise ConfigError(f"-x {item!r}: expected NAME or NAME=VALUE with NAME a variable name")
        if not eq:
            if name not in env:
                raise ConfigError(f"-x {name}: {name} is not set in the launcher's environment (use -x {name}=VALUE)")
            value = env[name]
        out[name] = value
    return out


@dataclasses.dataclass(frozen=True)
class RemoteConfig:
    """How the launcher and ``appliance check`` reach other hosts (SSH) and what they verify there.

    ``None`` means "not given": the SSH layer then consults ``~/.ssh/config`` (port, user, key)
    and its own defaults (port 22, the launcher's user, the launcher's ``sys.executable``).
    Precedence: flag, then the explicit env (``-x``), then the launcher's environment, then
    ``~/.ssh/config``, then the default.
    """

    port: int | None = None
    key: str | None = None
    user: str | None = None
    shared_dir: str = "/mnt/share"
    shared_explicit: bool = False       # --shared was given: a missing directory is an error
    remote_python: str | None = None
    network_interface: str | None = None
    job_dir: str | None = None
    min_shm: int = 64 << 20
    ssh_timeout_s: float = 5.0          # silence on a remote rank's channel -> its host is unreachable
    host_wait_s: float = 0.0            # how long the preflight waits for a host's SSH port to accept TCP

    @classmethod
    def create(cls, *, port: int | None = None, key: str | os.PathLike | None = None, user: str | None = None,
               shared: str | os.PathLike | None = None, remote_python: str | None = None,
               network_interface: str | None = None, host_wait_s: float = 0.0,
               environ: Mapping[str, str] | None = None) -> "RemoteConfig":
        """``host_wait_s``: how long the preflight waits for a host's SSH port to accept a TCP
        connection (a secondary container still starting) before failing that host; a name that
        does not resolve is never waited for. The cluster plane sets it from ``secondary_wait_s``."""
        env = os.environ if environ is None else environ
        if port is not None and not 0 < int(port) < 65536:
            raise ConfigError(f"-p {port}: expected a TCP port (1-65535)")
        if not host_wait_s >= 0:
            raise ConfigError(f"host_wait_s must not be negative, got {host_wait_s!r}")
        python = remote_python or read("APPLIANCE_REMOTE_PYTHON", env) or None
        if python is not None and not os.path.isabs(python):
            raise ConfigError(f"--remote-python {python!r}: must be an absolute path (SSH sessions do not see "
                              "the PATH of a login shell or of Docker's ENV)")
        iface = network_interface or read("HOROVOD_GLOO_IFACE", env) or None
        if iface is not None and not re.fullmatch(r"[A-Za-z0-9_.:@\-]{1,15}", iface):
            raise ConfigError(f"--network-interface {iface!r} is not an interface name")
        return cls(
            port=int(port) if port is not None else read("APPLIANCE_SSH_PORT", env),
            key=os.fspath(key) if key else (read("APPLIANCE_SSH_KEY", env) or None),
            user=user or read("APPLIANCE_SSH_USER", env) or None,
            shared_dir=os.fspath(shared) if shared else read("APPLIANCE_SHARED", env),
            shared_explicit=bool(shared),
            remote_python=python,
            network_interface=iface,
            job_dir=read("APPLIANCE_JOB_DIR", env) or None,
            min_shm=read("APPLIANCE_MIN_SHM", env),
            ssh_timeout_s=read("APPLIANCE_SSH_TIMEOUT", env),
            host_wait_s=float(host_wait_s),
        )


@dataclasses.dataclass(frozen=True)
class SlurmAllocation:
    """Slurm's description of the allocation (all ``None`` outside Slurm)."""

    nodelist: str | None = None
    tasks_per_node: str | None = None
    ntasks_per_node: str | None = None
    job_id: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "SlurmAllocation":
        return cls(read("SLURM_JOB_NODELIST", env) or None, read("SLURM_TASKS_PER_NODE", env) or None,
                   read("SLURM_NTASKS_PER_NODE", env) or None, read("SLURM_JOB_ID", env) or None)


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """One ``appliance check``: which hosts, how to reach them, how long it may take."""

    hosts: str | None = None
    hostfile: str | None = None
    np: int | None = None
    start_timeout_s: float = 60.0
    verbose: bool = False
    remote: RemoteConfig = dataclasses.field(default_factory=RemoteConfig)
    slurm: SlurmAllocation = dataclasses.field(default_factory=SlurmAllocation)

    @classmethod
    def create(cls, *, hosts: str | None = None, hostfile: str | os.PathLike | None = None, np: int | None = None,
               start_timeout: float | None = None, verbose: bool | None = None,
               environ: Mapping[str, str] | None = None, **remote: Any) -> "CheckConfig":
        env = dict(os.environ if environ is None else environ)
        if hosts is not None and hostfile is not None:
            raise ConfigError("give hosts either with -H/--hosts or with --hostfile, not both")
        if start_timeout is not None and not start_timeout > 0:
            raise ConfigError(f"--start-timeout must be positive, got {start_timeout!r}")
        return cls(hosts=hosts, hostfile=None if hostfile is None else os.fspath(hostfile), np=np,
                   start_timeout_s=read("HOROVOD_START_TIMEOUT", env) if start_timeout is None else float(start_timeout),
                   verbose=read("APPLIANCE_VERBOSE", env) if verbose is None else bool(verbose),
                   remote=RemoteConfig.create(environ=env, **remote), slurm=SlurmAllocation.from_env(env))


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """One ``appliance launch``: what to run, where, and how to treat it.

    ``env`` holds the variables given explicitly for every worker (``-x`` and the Python API's
    ``env``); ``environ`` is the launcher's own environment, the base of every local worker's.
    Precedence: flag, then ``env``, then ``environ``, then the knob's default.
    """

    command: tuple[str, ...]
    np: int
    hosts: str | None = None
    hostfile: str | None = None
    start_timeout_s: float = 60.0
    output_dir: str | None = None
    verbose: bool = False
    timeout_s: float | None = None
    stop_grace_s: float = 3.0
    failure_grace_s: float = 5.0
    cwd: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    remote: RemoteConfig = dataclasses.field(default_factory=RemoteConfig)
    slurm: SlurmAllocation = dataclasses.field(default_factory=SlurmAllocation)
    ssh_flags: tuple[str, ...] = ()  # "-p"/"-i" when given as flags (not through the environment)
    launcher: str = "auto"  # auto, ssh, srun, local (launcher/srun.py decides what auto means)

    @classmethod
    def create(cls, command: Sequence[str], np: int, *, hosts: str | None = None, hostfile: str | None = None,
               start_timeout: float | None = None, output_dir: str | os.PathLike | None = None,
               verbose: bool | None = None, timeout: float | None = None, forward: Sequence[str] = (),
               env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
               environ: Mapping[str, str] | None = None, launcher: str | None = None,
               **remote: Any) -> "LaunchConfig":
        """``remote``: the keyword arguments of ``RemoteConfig.create`` (port, key, user, shared,
        remote_python, network_interface, host_wait_s). ``launcher``: --launcher (else
        APPLIANCE_LAUNCHER)."""
        environ = dict(os.environ if environ is None else environ)
        command = tuple(str(c) for c in command)
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            raise ConfigError("no command to launch (usage: appliance launch -np N [-H host:slots,...] -- COMMAND...)")
        if not isinstance(np, int) or np < 1:
            raise ConfigError(f"-np must be a positive number of processes, got {np!r}")
        if hosts is not None and hostfile is not None:
            raise ConfigError("give hosts either with -H/--hosts or with --hostfile, not both")
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"timeout must be positive, got {timeout!r}")
        if start_timeout is not None and not start_timeout > 0:
            raise ConfigError(f"--start-timeout must be positive, got {start_timeout!r}")
        explicit = {str(k): str(v) for k, v in (env or {}).items()}
        bad = [k for k in explicit if not _ENV_NAME.match(k)]
        if bad:
            raise ConfigError(f"env: {bad[0]!r} is not a variable name")
        explicit.update(parse_forwards(forward, environ))
        merged = {**environ, **explicit}
        return cls(
            command=command,
            np=np,
            hosts=hosts,
            hostfile=None if hostfile is None else os.fspath(hostfile),
            start_timeout_s=read("HOROVOD_START_TIMEOUT", merged) if start_timeout is None else float(start_timeout),
            output_dir=None if output_dir is None else os.fspath(output_dir),
            verbose=read("APPLIANCE_VERBOSE", merged) if verbose is None else bool(verbose),
            timeout_s=None if timeout is None else float(timeout),
            stop_grace_s=read("APPLIANCE_STOP_GRACE", merged),
            failure_grace_s=read("APPLIANCE_FAILURE_GRACE", merged),
            cwd=None if cwd is None else os.fspath(cwd),
            env=explicit,
            environ=environ,
            remote=RemoteConfig.create(environ=merged, **remote),
            slurm=SlurmAllocation.from_env(environ),
            ssh_flags=tuple(f for f, k in (("-p", "port"), ("-i", "key")) if remote.get(k) is not None),
            launcher=read("APPLIANCE_LAUNCHER", merged) if launcher is None else _launcher_flag(launcher),
        )


def _launcher_flag(value: str) -> str:
    try:
        return _launcher(value)
    except ValueError as e:
        raise ConfigError(f"--launcher: {e}") from None


# --- the appliance plane's view ----------------------------------------------------------------
DEFAULT_SSH_PORT = 12345
_DOCKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """One ``appliance secondary|primary|status``: which image, which share, which network.

    Precedence: flag, then the environment (``APPLIANCE_*``), then the default. ``shm`` is
    ``"host"`` (share the host's IPC namespace and /dev/shm) or a size for a private /dev/shm;
    by default ``host`` on the host network (real hosts) and ``1g`` on a user-defined network,
    where containers stand for separate hosts and must not share /dev/shm.
    """

    shared: str = "/mnt/share"
    image: str = "appliance:latest"
    network: str = "host"
    name: str | None = None
    ssh_port: int = DEFAULT_SSH_PORT
    shm: str = "host"
    gpus: str = "auto"
    secondary_wait_s: float = 20.0

    @classmethod
    def create(cls, *, shared: str | os.PathLike | None = None, image: str | None = None, network: str | None = None,
               name: str | None = None, ssh_port: int | None = None, shm_size: str | None = None,
               gpus: str | None = None, environ: Mapping[str, str] | None = None) -> "ClusterConfig":
        env = os.environ if environ is None else environ
        shared = os.path.abspath(os.fspath(shared) if shared else read("APPLIANCE_SHARED", env))
        network = network or read("APPLIANCE_NETWORK", env)
        if not _DOCKER_NAME.match(network):
            raise ConfigError(f"--network {network!r} is not a Docker network name")
        if name is not None and not _DOCKER_NAME.match(name):
            raise ConfigError(f"--name {name!r}: use letters, digits, '_', '.', '-' (a host name for simulated hosts)")
        if ssh_port is None:
            ssh_port = read("APPLIANCE_SSH_PORT", env) or DEFAULT_SSH_PORT
        elif not 0 < int(ssh_port) < 65536:
            raise ConfigError(f"--ssh-port {ssh_port}: expected a TCP port (1-65535)")
        shm = (shm_size or read("APPLIANCE_SHM_SIZE", env) or ("host" if network == "host" else "1g")).strip().lower()
        if shm != "host":
            try:
                if _size(shm) < (64 << 20):
                    raise ValueError("at least 64m")
            except ValueError as e:
                raise ConfigError(f"--shm-size {shm!r}: expected 'host' or a size such as 2g ({e})") from None
        gpus = (gpus or read("APPLIANCE_GPUS", env)).strip().lower()
        if gpus not in ("auto", "all", "none") and not (gpus.isdigit() and int(gpus) > 0):
            raise ConfigError(f"--gpus {gpus!r}: expected auto, all, none or a positive count")
        return cls(shared=shared, image=image or read("APPLIANCE_IMAGE", env), network=network, name=name,
                   ssh_port=int(ssh_port), shm=shm, gpus=gpus,
                   secondary_wait_s=read("APPLIANCE_SECONDARY_WAIT", env))


def interface_address(name: str) -> str:
    """IPv4 address of network interface ``name`` (Linux)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError as e:
            raise ConfigError(f"network interface {name!r} has no IPv4 address here: {e.strerror}") from None
    return socket.inet_ntoa(packed[20:24])
