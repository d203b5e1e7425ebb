"""``horovodrun``: the launch flags plus horovodrun's own, and ``--check-build``.

What it owns: the ``horovodrun`` command (``main``, the console script of the ``appliance``
package, so it exists wherever the appliance is installed: in the image, in a virtual
environment on a bare cluster, inside a Slurm allocation, where it starts one ``srun`` step),
and the thin layer between Horovod's ``horovodrun`` command line and ``appliance launch``.

It never shadows a real Horovod: when the ``horovod`` package this interpreter imports is not
the appliance's compatibility package (``real_horovod()``: its ``__init__.py`` lacks
``SHIM_MARKER``; nothing is imported to decide), ``main`` runs that Horovod's own horovodrun
(``horovod.runner.launch.run_commandline``, what Horovod's script calls), or, when that cannot be
imported, refuses (exit 2) naming the Horovod it found; the appliance's launcher is never used
in its place.

Its parser is the launcher's (``flags.add_launch_flags``: -np, -H, --hostfile, -p, -i,
--start-timeout, --output-filename, --verbose, --network-interface, -x...) plus horovodrun's flags
that the launcher has no use for. Each of those is, by name, one of:

- honoured as a knob: it becomes ``-x KNOB=VALUE`` (given after the user's own -x, so the flag
  wins), e.g. ``--cache-capacity N`` -> HOROVOD_CACHE_CAPACITY=N (``KNOB_FLAGS``);
- accepted as what we already do (``--gloo``, ``--tcp``: our runtime is Gloo-like, over TCP;
  ``--disable-cache``: horovodrun's cache of its host checks, which this launcher never keeps);
- ignored with one warning line on stderr (tuning and diagnostics this runtime does not have:
  ``--log-level``, ``--autotune*``, ``--num-nccl-streams``...), until the knob Horovod maps it
  to (``KNOB_WHEN_DECLARED``: ``--log-level`` -> HOROVOD_LOG_LEVEL, ``--autotune`` ->
  HOROVOD_AUTOTUNE...) is declared in ``appliance/common/knobs.py``'s table: from then on it is
  honoured like the above, without a warning (``--timeline-filename`` -> HOROVOD_TIMELINE and
  ``--hierarchical-allreduce`` -> HOROVOD_HIERARCHICAL_ALLREDUCE are);
- rejected (exit 2) with one line saying what to use (``--mpi`` and MPI-only flags).

Horovod's elastic flags (``--min-np``, ``--max-np``, ``--slots-per-host``,
``--host-discovery-script``, ``--elastic-timeout``, ``--reset-limit``,
``--blacklist-cooldown-range``) are the launcher's own (``flags.add_elastic_flags``).

An unknown flag before COMMAND is rejected by argparse, by name. ``--check-build``/``-cb`` prints
what this build has in Horovod's layout: frameworks (PyTorch when torch imports), controllers
(Gloo = our runtime's; MPI when ``mpirun`` is on PATH, whose ranks the runtime accepts) and tensor
operations (NCCL as ``appliance.runtime`` capabilities report; Gloo = our CPU/TCP collectives).

Env vars: none read here (the knobs are read by the ranks). Failure modes: ``SystemExit(2)`` from
argparse for unusable syntax; a rejected flag returns 2 with ``horovodrun: error: --FLAG: ...``;
a real Horovod whose launcher does not import returns 2 naming its directory.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shutil
import sys
from typing import Callable, Sequence

from appliance.common.knobs import KNOBS
from appliance.hvdcompat import HOROVOD_VERSION, SHIM_MARKER
from appliance.launcher.flags import LaunchFlags, add_launch_flags, command_of

USAGE = "horovodrun -np N [-H host:slots,... | --hostfile FILE] [options] [--] COMMAND... | --check-build"

_MB = 1 << 20
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
# flag dest -> (knob, value of the parsed flag as the knob's string)
KNOB_FLAGS: dict[str, tuple[str, Callable[[object], str]]] = {
    "cache_capacity": ("HOROVOD_CACHE_CAPACITY", lambda v: str(v)),
    "fusion_threshold_mb": ("HOROVOD_FUSION_THRESHOLD", lambda v: str(int(float(v) * _MB))),
    "cycle_time_ms": ("HOROVOD_CYCLE_TIME", lambda v: str(v)),
    "stall_check": ("HOROVOD_STALL_CHECK_DISABLE", lambda v: "0" if v else "1"),
    "stall_check_warning_time_seconds": ("HOROVOD_STALL_CHECK_TIME_SECONDS", lambda v: str(v)),
    "stall_check_shutdown_time_seconds": ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", lambda v: str(v)),
}
_AUTOTUNE = "there is no autotuner; set --fusion-threshold-mb / --cycle-time-ms instead"
_NO_MPIRUN = "this launcher does not use mpirun (run mpirun yourself to pass it arguments)"
# (flag and aliases, number of values) -> why it is ignored (the job runs the same without it)
IGNORED: dict[tuple[tuple[str, ...], int], str] = {
    (("--log-level",), 1): "this runtime has no log levels (--verbose prints rank 0's knobs and rendezvous)",
    (("--log-with-timestamp",), 0): "the runtime's log lines carry no timestamp",
    (("--log-without-timestamp",), 0): "the runtime's log lines carry no timestamp",
    (("--log-hide-timestamp",), 0): "the runtime's log lines carry no timestamp",
    (("--no-log-hide-timestamp",), 0): "the runtime's log lines carry no timestamp",
    (("--prefix-output-with-timestamp", "-prefix-timestamp"), 0): "output lines are prefixed [rank]<stream>: only",
    (("--timeline-filename",), 1): "the Horovod timeline is not implemented",
    (("--timeline-mark-cycles",), 0): "the Horovod timeline is not implemented",
    (("--no-timeline-mark-cycles",), 0): "the Horovod timeline is not implemented",
    (("--autotune",), 0): _AUTOTUNE,
    (("--no-autotune",), 0): _AUTOTUNE,
    (("--autotune-log-file",), 1): _AUTOTUNE,
    (("--autotune-warmup-samples",), 1): _AUTOTUNE,
    (("--autotune-steps-per-sample",), 1): _AUTOTUNE,
    (("--autotune-bayes-opt-max-samples",), 1): _AUTOTUNE,
    (("--autotune-gaussian-process-noise",), 1): _AUTOTUNE,
    (("--hierarchical-allreduce",), 0): "the cost model picks flat or hierarchical collectives",
    (("--no-hierarchical-allreduce",), 0): "the cost model picks flat or hierarchical collectives",
    (("--hierarchical-allgather",), 0): "the cost model picks flat or hierarchical collectives",
    (("--no-hierarchical-allgather",), 0): "the cost model picks flat or hierarchical collectives",
    (("--num-nccl-streams",), 1): "one NCCL stream per job",
    (("--thread-affinity",), 1): "the background thread is not pinned",
    (("--gloo-timeout-seconds",), 1): "a lost peer is detected by APPLIANCE_HEARTBEAT_TIMEOUT",
}
# Ignored flags that Horovod maps to a knob: honoured instead (as -x KNOB=VALUE) as soon as the knob
# table of appliance/common/knobs.py declares that knob. VALUE: the flag's value, or the one given here.
KNOB_WHEN_DECLARED: dict[str, tuple[str, str | None]] = {
    "--log-level": ("HOROVOD_LOG_LEVEL", None),
    "--log-with-timestamp": ("HOROVOD_LOG_HIDE_TIME", "0"),
    "--log-without-timestamp": ("HOROVOD_LOG_HIDE_TIME", "1"),
    "--log-hide-timestamp": ("HOROVOD_LOG_HIDE_TIME", "1"),
    "--no-log-hide-timestamp": ("HOROVOD_LOG_HIDE_TIME", "0"),
    "--timeline-filename": ("HOROVOD_TIMELINE", None),
    "--timeline-mark-cycles": ("HOROVOD_TIMELINE_MARK_CYCLES", "1"),
    "--no-timeline-mark-cycles": ("HOROVOD_TIMELINE_MARK_CYCLES", "0"),
    "--autotune": ("HOROVOD_AUTOTUNE", "1"),
    "--no-autotune": ("HOROVOD_AUTOTUNE", "0"),
    "--autotune-log-file": ("HOROVOD_AUTOTUNE_LOG", None),
    "--autotune-warmup-samples": ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", None),
    "--autotune-steps-per-sample": ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", None),
    "--autotune-bayes-opt-max-samples": ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", None),
    "--autotune-gaussian-process-noise": ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", None),
    "--hierarchical-allreduce": ("HOROVOD_HIERARCHICAL_ALLREDUCE", "1"),
    "--no-hierarchical-allreduce": ("HOROVOD_HIERARCHICAL_ALLREDUCE", "0"),
    "--hierarchical-allgather": ("HOROVOD_HIERARCHICAL_ALLGATHER", "1"),
    "--no-hierarchical-allgather": ("HOROVOD_HIERARCHICAL_ALLGATHER", "0"),
    "--num-nccl-streams": ("HOROVOD_NUM_NCCL_STREAMS", None),
    "--thread-affinity": ("HOROVOD_THREAD_AFFINITY", None),
    "--gloo-timeout-seconds": ("HOROVOD_GLOO_TIMEOUT_SECONDS", None),
}
# (flag and aliases, number of values) -> what to use instead (the job would not be what was asked)
REJECTED: dict[tuple[tuple[str, ...], int], str] = {
    (("--mpi",), 0): "this launcher does not start jobs through mpirun; leave --mpi out (or use --gloo) to run on "
                     "this runtime, or run `mpirun -np N ... python SCRIPT` yourself (the runtime reads OpenMPI's ranks)",
    (("--jsrun",), 0): "this launcher does not start jobs through jsrun; leave --jsrun out to run on this runtime",
    (("--mpi-args",), 1): _NO_MPIRUN,
    (("--binding-args",), 1): _NO_MPIRUN,
    (("--mpi-threads-disable",), 0): _NO_MPIRUN,
    (("--no-mpi-threads-disable",), 0): _NO_MPIRUN,
    (("--config-file",), 1): "not supported; give the flags on the command line",
}


def _dest(names: tuple[str, ...]) -> str:
    return "hr_" + names[0].lstrip("-").replace("-", "_")


def add_horovodrun_flags(p: argparse.ArgumentParser) -> None:
    """horovodrun's own flags, on top of ``flags.add_launch_flags``."""
    p.add_argument("-v", "--version", action="version", version=HOROVOD_VERSION,
                   help="the Horovod release this horovodrun follows")
    p.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                   help="print the frameworks, controllers and tensor operations of this build, and exit")
    p.add_argument("--gloo", action="store_true",
                   help="accepted: run on this runtime (the default; its controller is Gloo-like)")
    p.add_argument("--tcp", action="store_true", help="accepted: the runtime always uses TCP")
    p.add_argument("--disable-cache", dest="disable_cache", action="store_true",
                   help="accepted: the launcher keeps no cache of its checks (the preflight runs every launch)")
    p.add_argument("--network-interfaces", dest="network_interfaces", metavar="IF",
                   help="as --network-interface (one interface)")
    p.add_argument("--cache-capacity", dest="cache_capacity", type=int, metavar="N", help="HOROVOD_CACHE_CAPACITY")
    p.add_argument("--fusion-threshold-mb", dest="fusion_threshold_mb", type=float, metavar="MB",
                   help="HOROVOD_FUSION_THRESHOLD (in MiB)")
    p.add_argument("--cycle-time-ms", dest="cycle_time_ms", type=float, metavar="MS", help="HOROVOD_CYCLE_TIME")
    stall = p.add_mutually_exclusive_group()
    stall.add_argument("--no-stall-check", dest="stall_check", action="store_false", default=None,
                       help="HOROVOD_STALL_CHECK_DISABLE=1")
    stall.add_argument("--stall-check", dest="stall_check", action="store_true", default=None,
                       help="HOROVOD_STALL_CHECK_DISABLE=0")
    p.add_argument("--stall-check-warning-time-seconds", dest="stall_check_warning_time_seconds", type=float,
                   metavar="S", help="HOROVOD_STALL_CHECK_TIME_SECONDS")
    p.add_argument("--stall-check-shutdown-time-seconds", dest="stall_check_shutdown_time_seconds", type=float,
                   metavar="S", help="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    for table, kind in ((IGNORED, "ignored"), (REJECTED, "rejected")):
        for (names, nargs), why in table.items():
            knob = KNOB_WHEN_DECLARED.get(names[0], ("", None))[0] if table is IGNORED else ""
            text = knob if knob in KNOBS else f"{kind}: {why}"  # a declared knob: honoured (parse())
            if nargs == 0:
                p.add_argument(*names, dest=_dest(names), action="store_true", help=text)
            else:
                p.add_argument(*names, dest=_dest(names), nargs=None if nargs == 1 else nargs, metavar="V",
                               choices=LOG_LEVELS if names == ("--log-level",) else None, help=text)


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


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> str | None:
    """How the flag was given ("--flag" or "--flag VALUE"), or None when it was not."""
    value = getattr(args, _dest(names), None)
    if value in (None, False):
        return None
    return names[0] if value is True else " ".join([names[0], *map(str, value if isinstance(value, list) else [value])])


def parse(argv: Sequence[str]) -> Parsed:
    """horovodrun's command line -> ``Parsed``. Raises ``SystemExit(2)`` for unusable syntax."""
    args = horovodrun_parser().parse_args(list(argv))
    errors = [f"{names[0]}: {why}" for (names, _), why in REJECTED.items() if _given(args, names)]
    warnings, declared = [], []
    for (names, _), why in IGNORED.items():
        given = _given(args, names)
        knob, fixed = KNOB_WHEN_DECLARED.get(names[0], ("", None))
        if given and knob in KNOBS:
            declared.append(f"{knob}={fixed if fixed is not None else getattr(args, _dest(names))}")
        elif given:
            warnings.append(f"{given}: ignored: {why}")
    if args.network_interfaces is not None:
        nics = [n for n in args.network_interfaces.split(",") if n]
        if len(nics) != 1 or (args.network_interface not in (None, nics[0])):
            errors.append(f"--network-interfaces {args.network_interfaces}: this launcher uses one interface per "
                          "job; give one")
        else:
            args.network_interface = nics[0]
    knobs = [f"{knob}={fmt(getattr(args, dest))}" for dest, (knob, fmt) in KNOB_FLAGS.items()
             if getattr(args, dest) is not None]
    flags = LaunchFlags.from_args(args)
    flags = dataclasses.replace(flags, x=(*flags.x, *knobs, *declared))
    return Parsed(flags, command_of(args), bool(args.check_build), warnings, errors)


def build_report() -> list[str]:
    """``--check-build``'s lines, in Horovod's layout, for what this build really has."""
    from appliance.runtime import devices

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


def real_horovod() -> str | None:
    """The directory of the ``horovod`` package this interpreter would import, when that is a real
    Horovod and not the appliance's compatibility package; else None. Reads files, imports nothing."""
    try:
        spec = importlib.util.find_spec("horovod")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    try:
        with open(spec.origin, encoding="utf-8", errors="replace") as f:
            ours = SHIM_MARKER in f.read()
    except OSError:
        return None
    return None if ours else os.path.dirname(os.path.abspath(spec.origin))


def run_real_horovod(where: str, argv: Sequence[str]) -> int:
    """Horovod's own horovodrun with ``argv``, as its script runs it; 2 when it does not import."""
    try:
        from horovod.runner.launch import run_commandline
    except Exception as e:  # noqa: BLE001 - any import failure: say which Horovod, never run ours instead
        print(f"horovodrun: error: the Horovod installed at {where} is not the appliance's, and its horovodrun "
              f"does not import ({type(e).__name__}: {e}); fix or uninstall that Horovod", file=sys.stderr)
        return 2
    sys.argv = ["horovodrun", *argv]
    run_commandline()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``horovodrun ARGS``: exit code of the job, 2 for unusable or rejected flags, 1 when the
    job cannot be set up; a real Horovod's horovodrun when one is installed (``real_horovod``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    real = real_horovod()
    if real is not None:
        return run_real_horovod(real, argv)
    from appliance.common.knobs import ConfigError
    from appliance.launcher import LaunchError, run

    parsed = parse(argv)
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


__all__ = ["HOROVOD_VERSION", "LOG_LEVELS", "KNOB_FLAGS", "KNOB_WHEN_DECLARED", "IGNORED", "REJECTED", "Parsed",
           "add_horovodrun_flags", "horovodrun_parser", "parse", "build_report", "real_horovod", "run_real_horovod",
           "main"]
