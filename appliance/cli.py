"""The ``appliance`` command: parse arguments, build a config dataclass, call one function.

What it owns: the argument syntax of every subcommand and the mapping of errors to exit codes,
nothing else (no logic lives here). Subcommands: ``launch`` (horovodrun's flags: ``-np``/
``--num-proc``, ``-H``/``--hosts``, ``--hostfile``, ``--start-timeout``, ``--output-filename``,
``--verbose``, mpirun's ``-x NAME[=VALUE]``). ``check`` and ``keys`` (SSH launch) and
``secondary``, ``primary``, ``status`` (Docker) register here as they arrive: one
``_add_<name>(subparsers)`` each, setting ``func`` to a function of the parsed namespace.

Env vars: flags fall back to knobs read in ``appliance/config.py`` (``--start-timeout`` ->
HOROVOD_START_TIMEOUT, ``--verbose`` -> APPLIANCE_VERBOSE). Exit codes: the job's code for
``launch``; 2 for unusable arguments (bad -H, hostfile line, -np above the slots, -x); 1 when the
job cannot be set up (unknown host...). Errors are one line on stderr starting ``appliance <cmd>:``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .config import ConfigError, LaunchConfig


def _launch(args: argparse.Namespace) -> int:
    from .launcher import LaunchError, run

    try:
        config = LaunchConfig.create(
            args.command, args.np, hosts=args.hosts, hostfile=args.hostfile, start_timeout=args.start_timeout,
            output_dir=args.output_filename, verbose=True if args.verbose else None, forward=args.x or ())
        return run(config, echo=True, capture=False).returncode
    except (ConfigError, ValueError) as e:  # HostsError is a ValueError
        print(f"appliance launch: error: {e}", file=sys.stderr)
        return 2
    except LaunchError as e:
        print(f"appliance launch: error: {e}", file=sys.stderr)
        return 1


def _add_launch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch", allow_abbrev=False, help="run COMMAND as N ranks (horovodrun-compatible)",
        usage="appliance launch -np N [-H host:slots,... | --hostfile FILE] [options] [--] COMMAND...",
        description="Start N ranks of COMMAND, each with its rank environment; the first failing rank stops all.")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, metavar="N", help="number of ranks")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...",
                       help="hosts and their slots, filled in order (default: localhost:N)")
    hosts.add_argument("-hostfile", "--hostfile", dest="hostfile", metavar="FILE",
                       help="file of 'host slots=N' lines ('#' comments)")
    p.add_argument("--start-timeout", type=float, metavar="S",
                   help="seconds for all ranks to start and meet (env HOROVOD_START_TIMEOUT, default 60)")
    p.add_argument("--output-filename", metavar="DIR", help="also write DIR/rank.N/stdout and stderr")
    p.add_argument("--verbose", action="store_true", help="print the rank layout and addresses (env APPLIANCE_VERBOSE)")
    p.add_argument("-x", action="append", metavar="NAME[=VALUE]",
                   help="set NAME for every worker (to VALUE, or to the launcher's value); repeatable")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the program and its arguments")
    p.set_defaults(func=_launch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", allow_abbrev=False,
                                     description="Multi-host PyTorch training with a Horovod-compatible runtime.")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    _add_launch(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def horovodrun(argv: Sequence[str] | None = None) -> int:
    """``horovodrun ARGS`` == ``appliance launch ARGS`` (the image installs it as an alias)."""
    return main(["launch", *(sys.argv[1:] if argv is None else argv)])
