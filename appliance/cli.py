"""The ``appliance`` command: parse arguments, build a config dataclass, call one function.

What it owns: the argument syntax of every subcommand and the mapping of errors to exit codes,
nothing else (no logic lives here). Subcommands: ``launch`` (horovodrun's flags: ``-np``/
``--num-proc``, ``-H``/``--hosts``, ``--hostfile``, ``--start-timeout``, ``--output-filename``,
``--verbose``, mpirun's ``-x NAME[=VALUE]``, and for other hosts ``-p``/``--ssh-port``,
``-i``/``--ssh-identity-file``, ``--network-interface``, ``--remote-python``), ``check``
(the preflight as a table) and ``keys`` (the cluster's SSH keys). ``secondary``, ``primary``,
``status`` (Docker) register here as they arrive: one ``_add_<name>(subparsers)`` each, setting
``func`` to a function of the parsed namespace.

Env vars: flags fall back to knobs read in ``appliance/config.py`` (``--start-timeout`` ->
HOROVOD_START_TIMEOUT, ``--verbose`` -> APPLIANCE_VERBOSE). Exit codes: the job's code for
``launch``; 2 for unusable arguments (bad -H, hostfile line, -np above the slots, -x); 1 when the
job cannot be set up (preflight failures...); ``check``: 0 all hosts ready, 1 some failed, 2 bad
arguments; ``keys``: 0, or 1 when the files cannot be made. Errors are one line on stderr starting ``appliance <cmd>:``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .config import ConfigError, LaunchConfig


def _remote_args(args: argparse.Namespace) -> dict:
    return dict(port=args.ssh_port, key=args.ssh_identity_file, shared=getattr(args, "shared", None),
                remote_python=args.remote_python, network_interface=args.network_interface)


def _add_remote_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--ssh-port", type=int, metavar="PORT",
                   help="SSH port of the other hosts (env APPLIANCE_SSH_PORT; default ~/.ssh/config, else 22)")
    p.add_argument("-i", "--ssh-identity-file", metavar="KEY",
                   help="SSH private key (env APPLIANCE_SSH_KEY; default SHARED/ssh/id_ed25519 if present)")
    p.add_argument("--remote-python", metavar="PATH",
                   help="absolute path of Python on the other hosts (env APPLIANCE_REMOTE_PYTHON; default: this one)")
    p.add_argument("--network-interface", metavar="IF",
                   help="use each host's address on IF instead of the routed one (env HOROVOD_GLOO_IFACE)")


def _launch(args: argparse.Namespace) -> int:
    from .launcher import LaunchError, run

    try:
        config = LaunchConfig.create(
            args.command, args.np, hosts=args.hosts, hostfile=args.hostfile, start_timeout=args.start_timeout,
            output_dir=args.output_filename, verbose=True if args.verbose else None, forward=args.x or (),
            **_remote_args(args))
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
    _add_remote_flags(p)
    p.add_argument("--shared", metavar="DIR", help="the shared directory to verify (env APPLIANCE_SHARED)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the program and its arguments")
    p.set_defaults(func=_launch)


def _check(args: argparse.Namespace) -> int:
    from .config import CheckConfig
    from .launcher.check import check

    try:
        config = CheckConfig.create(hosts=args.hosts, hostfile=args.hostfile, np=args.np,
                                    start_timeout=args.start_timeout, verbose=True if args.verbose else None,
                                    **_remote_args(args))
        return check(config)
    except (ConfigError, ValueError) as e:
        print(f"appliance check: error: {e}", file=sys.stderr)
        return 2


def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check", allow_abbrev=False, help="verify every host before a launch (SSH, Python, share, network)",
        usage="appliance check [-H host:slots,... | --hostfile FILE] [-np N] [-p PORT] [-i KEY] [--shared DIR]",
        description="Per host, in parallel: TCP reach, SSH auth, remote Python and appliance, shared directory, "
                    "/dev/shm, unique hostnames, network address. One line per failure; exit 1 if any.")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...", help="hosts (as for launch)")
    hosts.add_argument("-hostfile", "--hostfile", dest="hostfile", metavar="FILE", help="hostfile (as for launch)")
    p.add_argument("-np", "--num-proc", dest="np", type=int, metavar="N", help="also check that N ranks fit the slots")
    p.add_argument("--start-timeout", type=float, metavar="S", help="seconds for all checks (env HOROVOD_START_TIMEOUT)")
    p.add_argument("--shared", metavar="DIR", help="the shared directory (env APPLIANCE_SHARED, default /mnt/share)")
    p.add_argument("--verbose", action="store_true", help="more detail")
    _add_remote_flags(p)
    p.set_defaults(func=_check)


def _keys(args: argparse.Namespace) -> int:
    from .config import read
    from .launcher.keys import KeysError, ensure_keys

    shared = args.shared or read("APPLIANCE_SHARED")
    try:
        report = ensure_keys(shared)
    except KeysError as e:
        print(f"appliance keys: error: {e}", file=sys.stderr)
        return 1
    for kind, paths in (("created", report.created), ("fixed", report.fixed), ("kept", report.kept)):
        for path in paths:
            print(f"appliance keys: {kind} {path}")
    for note in report.notes:
        print(f"appliance keys: note: {note}", file=sys.stderr)
    print(f"appliance keys: ready in {report.directory} (client key {report.client_public.split()[0]}, "
          f"host key {report.host_public.split()[0]}); start the secondaries with this shared directory")
    return 0


def _add_keys(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "keys", allow_abbrev=False, help="create the cluster's SSH keys under DIR/ssh (idempotent)",
        description="Create or repair DIR/ssh: id_ed25519 (client), ssh_host_ed25519_key (every secondary's host "
                    "key), authorized_keys and known_hosts, with the modes sshd's StrictModes demands.")
    p.add_argument("--shared", metavar="DIR", help="the shared directory (env APPLIANCE_SHARED, default /mnt/share)")
    p.set_defaults(func=_keys)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", allow_abbrev=False,
                                     description="Multi-host PyTorch training with a Horovod-compatible runtime.")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    _add_launch(sub)
    _add_check(sub)
    _add_keys(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def horovodrun(argv: Sequence[str] | None = None) -> int:
    """``horovodrun ARGS`` == ``appliance launch ARGS`` (the image installs it as an alias)."""
    return main(["launch", *(sys.argv[1:] if argv is None else argv)])
