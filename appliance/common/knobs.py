"""Every knob of the appliance, declared once, read once: the table and its reader.

What it owns: ``KNOBS`` (each knob's environment name, type, default and one-line doc, and for
a knob of the collective engine the core option it feeds: ``core``),
``read()`` (a knob's typed, validated value), ``describe()`` (the table with current values,
which rank 0 prints with ``--verbose`` / ``APPLIANCE_VERBOSE``) and ``ConfigError``. Horovod's
names are kept where Horovod has the knob (``HOROVOD_FUSION_THRESHOLD``...); ours start with
``APPLIANCE_``. Command-line flags win over the environment, which wins over the default.

Nothing else in the package reads ``os.environ`` for a knob: each plane builds its own config
from this table (``appliance.runtime.config``, ``appliance.launcher.config``,
``appliance.cluster.config``). ``docs/knobs.md`` is generated from it. This module is on the
ground floor: it imports no plane. Failure mode: an invalid value raises ``ConfigError`` naming
the variable, the value and the knob's doc.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping



class ConfigError(ValueError):
    """A knob has a value that cannot be used; the message names the variable."""


@dataclasses.dataclass(frozen=True)
class Knob:
    env: str
    type: Callable[[str], Any]
    default: Any
    doc: str
    # The engine option this knob feeds (a name in APPLIANCE_ENGINE_OPTIONS of
    # runtime/csrc/common/options.h, whose default must equal this one): the runtime's config
    # copies every such knob into the core by this name. "" = not an engine option.
    core: str = ""


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {s!r}")


def parse_size(s: str) -> int:
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


def _pos_float(s: str) -> float:
    f = float(s)
    if not (math.isfinite(f) and f > 0):
        raise ValueError("must be a positive number")
    return f


def _port(s: str) -> int:
    n = int(s)
    if not 0 < n < 65536:
        raise ValueError("must be a TCP port (1-65535)")
    return n


LAUNCHERS = ("auto", "ssh", "srun", "local")


def parse_launcher(s: str) -> str:
    v = s.strip().lower() or "auto"
    if v not in LAUNCHERS:
        raise ValueError(f"expected one of {', '.join(LAUNCHERS)}, got {s!r}")
    return v


def _bind(s: str) -> str:
    v = s.strip().lower() or "none"
    if v not in ("none", "core"):
        raise ValueError(f"expected none or core, got {s!r}")
    return v


def _negotiation(s: str) -> str:
    v = s.strip().lower() or "tree"
    if v not in ("tree", "star"):
        raise ValueError(f"expected tree or star, got {s!r}")
    return v


def _hierarchy(s: str) -> str:
    v = s.strip().lower()
    if v in ("", "auto"):
        return "auto"
    if v in ("1", "true", "yes", "on"):
        return "on"
    if v in ("0", "false", "no", "off"):
        return "off"
    raise ValueError(f"expected 1 (on), 0 (off) or auto, got {s!r}")


VIEW_MODES = ("auto", "live", "lines", "off")


def _view_mode(s: str) -> str:
    v = s.strip().lower() or "auto"
    if v in ("0", "false", "no"):
        v = "off"
    if v not in VIEW_MODES:
        raise ValueError(f"expected one of {', '.join(VIEW_MODES)}, got {s!r}")
    return v


def _opt_port(s: str):
    return None if not s.strip() else _port(s)


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
    Knob("APPLIANCE_FAULT_FILE", str, "", "where the runtime writes its fault report (JSON) when the job first fails (the launcher sets it; empty = none)", core="fault_file"),
    Knob("HOROVOD_START_TIMEOUT", _nonneg_float, 60.0, "seconds to wait for every rank at init (launch: --start-timeout)", core="start_timeout_s"),
    # Engine.
    Knob("HOROVOD_FUSION_THRESHOLD", parse_size, 128 << 20, "bytes of small allreduces fused into one (0 disables fusion)", core="fusion_threshold"),
    Knob("APPLIANCE_FUSION_MEMBER_BYTES", parse_size, 256 << 10, "the largest CPU-tensor allreduce fused with others (0: any below HOROVOD_FUSION_THRESHOLD); larger ones run in place, without two copies through the fusion buffer (CUDA tensors fuse up to the threshold)", core="fusion_member_bytes"),
    Knob("HOROVOD_CYCLE_TIME", _nonneg_float, 1.0, "milliseconds to wait for more tensors to fuse while some are still coming", core="cycle_time_ms"),
    Knob("HOROVOD_CACHE_CAPACITY", _rank_int, 1024, "response cache entries (0 disables the cache)", core="cache_capacity"),
    Knob("APPLIANCE_CARRY_BYTES", parse_size, 0, "cached host allreduces (Sum, Average, Min, Max, Product; the global process set) of at most this many bytes carry their data through the tree negotiation: reduced up the tree and handed down with the plan, with no separate data exchange (0 = never, the default: on one machine the collective is as fast or faster, see docs/scale.md; at most 256 KiB counts)", core="carry_bytes"),
    Knob("HOROVOD_HIERARCHICAL_ALLREDUCE", _hierarchy, "auto", "allreduce within each host over shared memory, across hosts on disjoint slices, then back within the host (jobs of several hosts with the same number of consecutive ranks each): 1 always, 0 never, auto where its cost model beats the flat algorithm", core="hierarchical_allreduce"),
    Knob("HOROVOD_HIERARCHICAL_ALLGATHER", _hierarchy, "auto", "allgather within each host, across hosts among one leader per host, then a broadcast within the host (same layouts): 1 always, 0 never, auto where its cost model wins", core="hierarchical_allgather"),
    Knob("APPLIANCE_NEGOTIATION", _negotiation, "tree", "how ranks agree on what runs next: tree (cached ops agreed up and down a binary tree, rank 0's coordinator only for the rest; O(1) work per op at rank 0) or star (every rank tells rank 0's coordinator, which answers each; see docs/scale.md)", core="negotiation"),
    Knob("HOROVOD_STALL_CHECK_DISABLE", _bool, False, "do not warn about ranks that lag behind on a tensor", core="stall_check_disable"),
    Knob("HOROVOD_STALL_CHECK_TIME_SECONDS", _nonneg_float, 60.0, "warn when a tensor waits this long for some ranks", core="stall_check_s"),
    Knob("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", _nonneg_float, 300.0, "fail the job on every rank when a tensor waits this long for some ranks (0 = never)", core="stall_shutdown_s"),
    Knob("APPLIANCE_DEADLOCK_SECONDS", _nonneg_float, 5.0, "fail the job on every rank, naming what each waits on, when every rank of a group has been blocked this long in a wait on collectives that can never match (different operations, names or order; a rank that computes, e.g. checkpoints, never counts); 0 = never", core="deadlock_s"),
    Knob("HOROVOD_DYNAMIC_PROCESS_SETS", _bool, False, "allow hvd.add_process_set/remove_process_set after init (as hvd.init(process_sets='dynamic'))"),
    Knob("HOROVOD_TIMELINE", str, "", "rank 0 writes a Chrome-trace timeline of every tensor to this file from init (empty or DYNAMIC: only between hvd.start_timeline and stop_timeline)", core="timeline"),
    Knob("HOROVOD_TIMELINE_MARK_CYCLES", _bool, False, "mark each wake of rank 0's background thread (CYCLE_START) in the timeline started at init", core="timeline_mark_cycles"),
    Knob("APPLIANCE_CHUNK_BYTES", parse_size, 1 << 20, "pipelining grain of the ring algorithms", core="chunk_bytes"),
    Knob("APPLIANCE_SHM", _bool, True, "shared memory between ranks of one machine (0 = TCP for every pair)", core="shm"),
    Knob("APPLIANCE_SPIN_US", _rank_int, 100, "microseconds a caller waiting for a host op runs the engine itself (sparing a small op two thread hand-offs; the background thread stands aside until a cycle after), and the background thread polls after work; 0 = nothing spins, the background thread does all", core="spin_us"),
    Knob("APPLIANCE_HEARTBEAT_TIMEOUT", _nonneg_float, 10.0, "seconds of silence after which a peer is declared lost", core="heartbeat_timeout_s"),
    Knob("APPLIANCE_NCCL_LIBRARY", str, "", "path of libnccl.so.2 to use for CUDA tensors (default: the nvidia-nccl wheel next to torch, then the loader path)", core="nccl_library"),
    Knob("APPLIANCE_VERBOSE", _bool, False, "print the knob table and rendezvous details on rank 0 (launch: --verbose)", core="verbose"),
    # Metrics a rank publishes (runtime/metrics.py; the launcher collects them).
    Knob("APPLIANCE_METRICS_ADDR", str, "", "host:port each rank sends its metrics to (JSON lines: docs/runtime.md; the launcher sets it when it collects metrics; empty = nothing is sent)"),
    Knob("APPLIANCE_METRICS_INTERVAL", _pos_float, 1.0, "seconds between two metrics samples of a rank"),
    Knob("APPLIANCE_TOTAL_STEPS", _rank_int, None, "the job's total steps, for progress and an ETA (a script's appliance.torch.progress(total=...) wins)"),
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
    Knob("APPLIANCE_MIN_SHM", parse_size, 64 << 20, "free bytes /dev/shm must have on every host (appliance check)"),
    Knob("SLURM_JOB_NODELIST", str, None, "set by Slurm: the allocation's nodes, used as hosts when neither -H nor --hostfile is given"),
    Knob("SLURM_TASKS_PER_NODE", str, None, "set by Slurm: tasks per node of the allocation (e.g. 2(x3),1) -> slots"),
    Knob("SLURM_NTASKS_PER_NODE", str, None, "set by Slurm with --ntasks-per-node: slots per node when SLURM_TASKS_PER_NODE is absent"),
    Knob("SLURM_JOB_ID", str, None, "set by Slurm in an allocation: with it and neither -H nor --hostfile, launch starts the ranks with srun; `appliance secret` makes that job's secret file"),
    Knob("APPLIANCE_BIND", _bind, "none", "CPU binding of ranks: none (the kernel places them) or core (the ranks of a host split its CPUs into disjoint slices by local rank, as mpirun --bind-to core)"),
    Knob("APPLIANCE_LAUNCHER", parse_launcher, "auto", "how launch starts ranks: auto (srun inside a Slurm allocation without -H/--hostfile, else ssh), ssh, srun or local (launch: --launcher)"),
    # Seeing the job (docs/observing.md).
    Knob("APPLIANCE_VIEW", _view_mode, "auto", "the launcher's view of the job: auto (a live table when stdout and stderr are terminals, else summary lines), live, lines or off (launch: --no-view)"),
    Knob("APPLIANCE_VIEW_INTERVAL", _pos_float, 30.0, "seconds between the view's summary lines when it is not on a terminal"),
    Knob("APPLIANCE_VIEW_RANKS", _bool, False, "the live view starts with a row per rank instead of per host (key r toggles)"),
    Knob("APPLIANCE_RECORD_DIR", str, "", "directory of the job's record (metrics.jsonl, TensorBoard events, report.png); default SHARED/jobs/JOB_ID when the shared directory exists; off: none"),
    Knob("APPLIANCE_METRICS_PORT", _opt_port, None, "serve the job's metrics for Prometheus on this port of the launcher (launch: --metrics-port)"),
    # Elastic jobs (launch: --min-np, --max-np, --host-discovery-script; docs/elastic.md).
    Knob("HOROVOD_ELASTIC_TIMEOUT", _pos_float, 600.0, "seconds an elastic job waits for at least --min-np slots (and for the members of a new round) before it fails (launch: --elastic-timeout)"),
    Knob("APPLIANCE_DISCOVERY_INTERVAL", _pos_float, 1.0, "seconds between two runs of the host discovery script of an elastic job"),
    Knob("APPLIANCE_DISCOVERY_TIMEOUT", _pos_float, 10.0, "seconds one run of the host discovery script may take before it counts as failed"),
    Knob("HOROVOD_ELASTIC", _bool, False, "set by the launcher for the workers of an elastic job: init() asks the driver for its round, and DistributedOptimizer registers its gradient hooks at any size, one rank included (as Horovod's), so a job started at one rank allreduces once it grows"),
    Knob("APPLIANCE_ELASTIC_ADDR", str, "", "set by the launcher for the workers of an elastic job: host:port of its driver's rendezvous"),
    Knob("APPLIANCE_ELASTIC_WORKER", _rank_int, None, "set by the launcher for the workers of an elastic job: this worker's number (unique for the job's life)"),
    Knob("APPLIANCE_ELASTIC_LEAVE_ON_TERM", _bool, False, "a worker of an elastic job sent SIGTERM leaves the job at its next commit (exit 0, no blacklist) instead of dying; a second SIGTERM is handled as without it (set for the workers on Kubernetes; set it for the launcher to have it elsewhere)"),
    # Kubernetes (the MPI Operator's and Kubeflow Trainer's launcher pod; docs/kubernetes.md).
    Knob("APPLIANCE_MPI_CONFIG_DIR", str, "/etc/mpi", "where the MPI Operator mounts hostfile and discover_hosts.sh in the launcher pod (the operators' own variables, K_MPI_JOB_ROLE, OMPI_MCA_orte_default_hostfile..., are read as they set them)"),
    # Appliance plane (Docker: appliance secondary|primary|status).
    Knob("APPLIANCE_IMAGE", str, "appliance:latest", "image of the secondary and primary containers (--image)"),
    Knob("APPLIANCE_NETWORK", str, "host", "Docker network of the containers: host, or a user-defined network (--network)"),
    Knob("APPLIANCE_SHM_SIZE", str, "", "/dev/shm of the containers: 'host' (--ipc host) or a size like 2g (default: host on the host network, else 1g)"),
    Knob("APPLIANCE_GPUS", str, "auto", "GPUs for the containers: auto (all, when Docker has an nvidia runtime), all, none, or a count"),
    Knob("APPLIANCE_SECONDARY_WAIT", _nonneg_float, 20.0, "seconds the primary waits for each secondary's SSH port to answer"),
    Knob("APPLIANCE_SECONDARY_HEARTBEAT", _nonneg_float, 1.0, "seconds between two heartbeats of a secondary's registration on the shared mount (SHARED/secondaries/NAME.json)"),
    Knob("APPLIANCE_SECONDARY_STALE", _nonneg_float, 5.0, "seconds after its last heartbeat a secondary's registration stops counting: the elastic primary's discovery drops it"),
    Knob("APPLIANCE_CONTAINER", str, "", "set by appliance for each container it starts: <name>@<engine id>; lock owners record it (read from the container's init), so a lock whose container is gone is taken over at once"),
    # TensorFlow.
    Knob("APPLIANCE_TF_OPS_DIR", str, "", "where appliance.tensorflow keeps its op library, compiled against the installed TensorFlow at first import (default: ~/.cache/appliance/tf-ops; one subfolder per TensorFlow build and source)"),
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


