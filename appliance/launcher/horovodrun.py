"""``horovodrun``: the launch flags plus horovodrun's own, and ``--check-build``.

What it owns: the thin layer between Horovod's ``horovodrun`` command line and ``appliance
launch``. Its parser is the launcher's (``flags.add_launch_flags``: -np, -H, --hostfile, -p, -i,
--start-timeout, --output-filename, --verbose, --network-interface, -x...) plus horovodrun's flags
that the launcher has no use for. Each of those is, by name, one of:

- honoured as a knob: it becomes ``-x KNOB=VALUE`` (given after the user's own -x, so the flag
  wins), e.g. ``--disable-cache`` -> HOROVOD_CACHE_CAPACITY=0 (``KNOB_FLAGS``);
- accepted as what we already do (``--gloo``, ``--tcp``: our runtime is Gloo-like, over TCP);
- ignored with one warning line on stderr (tuning and diagnostics this runtime does not have:
  ``--log-level``, ``--timeline-filename``, ``--autotune*``, hierarchical collectives...);
- rejected (exit 2) with one line saying what to use (``--mpi``, elastic and MPI-only flags).

An unknown flag before COMMAND is rejected by argparse, by name. ``--check-build``/``-cb`` prints
what this build has in Horovod's layout: frameworks (PyTorch when torch imports), controllers
(Gloo = our runtime's; MPI when ``mpirun`` is on PATH, whose ranks the runtime accepts) and tensor
operations (NCCL as ``appliance.runtime`` capabilities report; Gloo = our CPU/TCP collectives).

Env vars: none read here (the knobs are read by the ranks). Failure modes: ``SystemExit(2)`` from
argparse for unusable syntax; a rejected flag returns 2 with ``horovodrun: error: --FLAG: ...``.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import shutil
import sys
from typing import Callable, Sequence

from .flags import LaunchFlags, add_launch_flags, command_of

HOROVOD_VERSION = "0.28.1"  # the Horovod release whose horovodrun and API this one follows
USAGE = "horovodrun -np N [-H host:slots,... | --hostfile FILE] [options] [--] COMMAND... | --check-build"

_MB = 1 << 20
# flag dest -> (knob, value of the parsed flag as the knob's string)
KNOB_FLAGS: dict[str, tuple[str, Callable[[object], str]]] = {
    "disable_cache": ("HOROVOD_CACHE_CAPACITY", lambda v: "0"),
    "cache_capacity": ("HOROVOD_CACHE_CAPACITY", lambda v: str(v)),
    "fusion_threshold_mb": ("HOROVOD_FUSION_THRESHOLD", lambda v: str(int(float(v) * _MB))),
    "cycle_time_ms": ("HOROVOD_CYCLE_TIME", lambda v: str(v)),
    "no_stall_check": ("HOROVOD_STALL_CHECK_DISABLE", lambda v: "1"),
    "stall_check_warning_time_seconds": ("HOROVOD_STALL_CHECK_TIME_SECONDS", lambda v: str(v)),
    "stall_check_shutdown_time_seconds": ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", lambda v: str(v)),
}
# flag -> why it is ignored (the job runs the same without it)
IGNORED = {
    "--log-level": "this runtime has no log levels (--verbose prints rank 0's knobs and rendezvous)",
    "--log-without-timestamp": "the runtime's log lines carry no timestamp",
    "--log-hide-timestamp": "the runtime's log lines carry no timestamp",
    "--prefix-output-with-timestamp": "output lines are prefixed [rank]<stream>: only",
    "--timeline-filename": "the Horovod timeline is not implemented",
    "--timeline-mark-cycles": "the Horovod timeline is not implemented",
    "--autotune": "there is no autotuner; set --fusion-threshold-mb / --cycle-time-ms instead",
    "--autotune-log-file": "there is no autotuner",
    "--autotune-warmup-samples": "there is no autotuner",
    "--autotune-steps-per-sample": "there is no autotuner",
    "--autotune-bayes-opt-max-samples": "there is no autotuner",
    "--autotune-gaussian-process-noise": "there is no autotuner",
    "--hierarchical-allreduce": "collectives are flat rings",
    "--no-hierarchical-allreduce": "collectives are flat rings",
    "--hierarchical-allgather": "collectives are flat rings",
    "--no-hierarchical-allgather": "collectives are flat rings",
    "--num-nccl-streams": "one NCCL stream per job",
    "--thread-affinity": "the background thread is not pinned",
    "--gloo-timeout-seconds": "the rendezvous waits --start-timeout",
    "--disable-output": "not supported; output is always relayed",
}
# flag -> what to use instead (the job would not be what was asked)
REJECTED = {
    "--mpi": "this launcher does not start jobs through mpirun; leave --mpi out (or use --gloo) to run on "
             "this runtime, or run `mpirun -np N ... python SCRIPT` yourself (the runtime reads OpenMPI's ranks)",
    "--mpi-args": "this launcher does not use mpirun (run mpirun yourself to pass it arguments)",
    "--binding-args": "this launcher does not use mpirun (run mpirun yourself to bind processes)",
    "--mpi-threads-disable": "this launcher does not use mpirun",
    "--min-np": "elastic jobs are not supported by this launcher yet; use -np",
    "--max-np": "elastic jobs are not supported by this launcher yet; use -np",
    "--slots-per-host": "elastic jobs are not supported by this launcher yet; use -H host:slots",
    "--host-discovery-script": "elastic jobs are not supported by this launcher yet; use -H or --hostfile",
    "--reset-limit": "elastic jobs are not supported by this launcher yet",
    "--blacklist-cooldown-range": "elastic jobs are not supported by this launcher yet",
    "--config-file": "not supported; give the flags on the command line",
}
_VALUED = {"--log-level", "--timeline-filename", "--autotune-log-file", "--autotune-warmup-samples",
           "--autotune-steps-per-sample", "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise",
           "--num-nccl-streams", "--thread-affinity", "--gloo-timeout-seconds", "--mpi-args", "--binding-args",
           "--min-np", "--max-np", "--slots-per-host", "--host-discovery-script", "--reset-limit",
           "--blacklist-cooldown-range", "--config-file"}


def add_horovodrun_flags(p: argparse.ArgumentParser) -> None:
    """horovodrun's own flags, on top of ``flags.add_launch_flags``."""
    p.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                   help="print the frameworks, controllers and tensor operations of this build, and exit")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--gloo", dest="controller", action="store_const", const="gloo",
                     help="run on this runtime (the default; its controller is Gloo-like)")
    ctl.add_argument("--mpi", dest="controller", action="store_const", const="mpi", help="rejected: " + REJECTED["--mpi"])
    p.add_argument("--tcp", action="store_true", help="accepted: the runtime always uses TCP")
    p.add_argument("--disable-cache", dest="disable_cache", action="store_true", help="HOROVOD_CACHE_CAPACITY=0")
    p.add_argument("--cache-capacity", dest="cache_capacity", type=int, metavar="N", help="HOROVOD_CACHE_CAPACITY")
    p.add_argument("--fusion-threshold-mb", dest="fusion_threshold_mb", type=float, metavar="MB",
                   help="HOROVOD_FUSION_THRESHOLD (in MiB)")
    p.add_argument("--cycle-time-ms", dest="cycle_time_ms", type=float, metavar="MS", help="HOROVOD_CYCLE_TIME")
    p.add_argument("--no-stall-check", dest="no_stall_check", action="store_true", help="HOROVOD_STALL_CHECK_DISABLE=1")
    p.add_argument("--stall-check-warning-time-seconds", dest="stall_check_warning_time_seconds", type=float,
                   metavar="S", help="HOROVOD_STALL_CHECK_TIME_SECONDS")
    p.add_argument("--stall-check-shutdown-time-seconds", dest="stall_check_shutdown_time_seconds", type=float,
                   metavar="S", help="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    for flag in sorted({*IGNORED, *REJECTED} - {"--mpi"}):
        kind = "ignored" if flag in IGNORED else "rejected"
        why = IGNORED.get(flag) or REJECTED[flag]
        dest = "hr_" + flag.lstrip("-").replace("-", "_")
        if flag in _VALUED:
            p.add_argument(flag, dest=dest, metavar="V", help=f"{kind}: {why}")
        else:
            p.add_argument(flag, dest=dest, action="store_true", help=f"{kind}: {why}")


def horovodrun_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horovodrun", allow_abbrev=False, usage=USAGE,
                                description="Horovod's launcher, on this runtime: `appliance launch` plus "
                                            "horovodrun's own flags (each honoured, ignored with a warning, or "
                                            "rejected, by name).")
    add_horovodrun_flags(p)
    add_launch_flags(p, np_required=False)
    return p


@dataclasses.dataclass
class Parsed:
    """A parsed horovodrun command line: the launch flags (knob flags folded into ``-x``), the
    command, what to warn about and what was rejected (one line each)."""

    flags: LaunchFlags
    command: list[str]
    check_build: bool
    warnings: list[str]
    errors: list[str]


def _given(args: argparse.Namespace, flag: str) -> object:
    value = getattr(args, "hr_" + flag.lstrip("-").replace("-", "_"), None)
    return value if value not in (None, False) else None


def parse(argv: Sequence[str]) -> Parsed:
    """horovodrun's command line -> ``Parsed``. Raises ``SystemExit(2)`` for unusable syntax."""
    args = horovodrun_parser().parse_args(list(argv))
    errors = [f"{flag}: {why}" for flag, why in REJECTED.items()
              if (args.controller == "mpi" if flag == "--mpi" else _given(args, flag) is not None)]
    warnings = [f"{flag}{'' if _given(args, flag) is True else ' ' + str(_given(args, flag))}: ignored: {why}"
                for flag, why in IGNORED.items() if _given(args, flag) is not None]
    knobs = [f"{knob}={fmt(getattr(args, dest))}" for dest, (knob, fmt) in KNOB_FLAGS.items()
             if getattr(args, dest) not in (None, False)]
    flags = LaunchFlags.from_args(args)
    flags = dataclasses.replace(flags, x=(*flags.x, *knobs))
    return Parsed(flags, command_of(args), bool(args.check_build), warnings, errors)


def build_report() -> list[str]:
    """``--check-build``'s lines, in Horovod's layout, for what this build really has."""
    from ..runtime import devices

    caps = devices.capabilities()

    def row(mark: bool, name: str) -> str:
        return f"    [{'X' if mark else ' '}] {name}"

    torch = importlib.util.find_spec("torch") is not None
    return [f"Horovod v{HOROVOD_VERSION}:", "",
            "Available Frameworks:", row(False, "TensorFlow"), row(torch, "PyTorch"), row(False, "MXNet"), "",
            "Available Controllers:", row(shutil.which("mpirun") is not None, "MPI"), row(True, "Gloo"), "",
            "Available Tensor Operations:", row(bool(caps.get("nccl")), "NCCL"), row(False, "DDL"),
            row(False, "CCL"), row(False, "MPI"), row(True, "Gloo"), "",
            "(appliance runtime: Gloo = its own TCP controller and CPU collectives; MPI controller = jobs started "
            "by mpirun are accepted; NCCL: " + (f"version {caps.get('nccl_version')}" if caps.get("nccl") else
                                                 str(caps.get("why") or "no CUDA device")) + ")"]


def main(argv: Sequence[str] | None = None) -> int:
    """``horovodrun ARGS``: exit code of the job, 2 for unusable or rejected flags, 1 when the
    job cannot be set up."""
    from ..config import ConfigError
    from . import LaunchError, run

    parsed = parse(sys.argv[1:] if argv is None else argv)
    if parsed.check_build:
        print("\n".join(build_report()))
        return 0
    for line in parsed.errors:
        print(f"horovodrun: error: {line}", file=sys.stderr)
    if parsed.errors:
        return 2
    for line in parsed.warnings:
        print(f"horovodrun: warning: {line}", file=sys.stderr, flush=True)
    try:
        return run(parsed.flags.launch_config(parsed.command), echo=True, capture=False).returncode
    except (ConfigError, ValueError) as e:
        print(f"horovodrun: error: {e}", file=sys.stderr)
        return 2
    except LaunchError as e:
        print(f"horovodrun: error: {e}", file=sys.stderr)
        return 1


__all__ = ["HOROVOD_VERSION", "KNOB_FLAGS", "IGNORED", "REJECTED", "Parsed", "add_horovodrun_flags",
           "horovodrun_parser", "parse", "build_report", "main"]
