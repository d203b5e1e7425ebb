"""The ``appliance`` command: parse arguments, build a config dataclass, call one function.

What it owns: the subcommands, their dispatch and the mapping of errors to exit codes, nothing
else (no logic lives here). The launch flags (horovodrun's ``-np``, ``-H``, ``--hostfile``,
``--start-timeout``, ``--output-filename``, ``--verbose``, mpirun's ``-x``, and ``-p``, ``-i``,
``--remote-python``, ``--network-interface``, ``--shared`` for other hosts) belong to the
launcher: ``launcher/flags.py`` adds them to ``launch`` and ``check`` and turns them into the
configs. The ``horovodrun`` command is not here: it is ``appliance/hvdcompat/horovodrun.py``
(the launch flags plus horovodrun's own, and ``--check-build``). Subcommands: ``launch``,
``check`` (the preflight as a table), ``keys`` (the cluster's SSH keys), ``secret`` (a Slurm
job's secret file, ``appliance/common/jobsecret.py``), and the Docker plane: ``secondary`` (this
host's sshd container), ``primary`` (a job from a primary container; its flags are ``launch``'s
plus its own, which argparse cannot hold in one subparser, so ``main()`` dispatches it before
argparse and the launcher's parser reads the launch flags) and ``status``; ``report`` (a job's
report.png drawn again from its record, ``launcher/observe/report.py``); ``leave`` (SIGTERM
this host's ranks and wait for them to leave: a Kubernetes worker's preStop hook,
``appliance/launcher/ssh/leave.py``). One
``_add_<name>(subparsers)`` each, setting ``func``.

Env vars: flags fall back to knobs of ``appliance/common/knobs.py`` (``--start-timeout`` ->
HOROVOD_START_TIMEOUT, ``--verbose`` -> APPLIANCE_VERBOSE). Exit codes: the job's code for
``launch``; 2 for unusable arguments (bad -H, hostfile line, -np above the slots, -x); 1 when the
job cannot be set up (preflight failures...); ``check``: 0 all hosts ready, 1 some failed, 2 bad
arguments; ``keys``: 0, or 1 when the files cannot be made; ``secret``: 0 (path on stdout), 1 when
the file cannot be made or an existing one is unusable, 2 when no job is known; ``report``: 0, 1 when
the job has no record; ``secondary``/``status``: 0, 1 when
Docker, the image or the share is missing (one line saying what to run), 2 bad arguments;
``primary``: the job's code, or those; ``leave``: 0 when no rank is left, 1 when some still run at
its timeout. Errors are one line on stderr starting ``appliance <cmd>:``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from appliance.common.knobs import ConfigError


def _launch(args: argparse.Namespace) -> int:
    from .launcher import LaunchError, run
    from .launcher.flags import launch_config

    try:
        return run(launch_config(args), echo=True, capture=False).returncode
    except (ConfigError, ValueError) as e:  # HostsError is a ValueError
        print(f"appliance launch: error: {e}", file=sys.stderr)
        return 2
    except LaunchError as e:
        print(f"appliance launch: error: {e}", file=sys.stderr)
        return 1


def _add_launch(sub: argparse._SubParsersAction) -> None:
    from .launcher.flags import LAUNCH_USAGE, add_launch_flags

    p = sub.add_parser(
        "launch", allow_abbrev=False, help="run COMMAND as N ranks (horovodrun-compatible)",
        usage=f"appliance launch {LAUNCH_USAGE}",
        description="Start N ranks of COMMAND, each with its rank environment; the first failing rank stops all.")
    add_launch_flags(p)
    p.set_defaults(func=_launch)


def _check(args: argparse.Namespace) -> int:
    from .launcher.check import check
    from .launcher.flags import check_config

    try:
        return check(check_config(args))
    except (ConfigError, ValueError) as e:
        print(f"appliance check: error: {e}", file=sys.stderr)
        return 2


def _add_check(sub: argparse._SubParsersAction) -> None:
    from .launcher.flags import add_launch_flags

    p = sub.add_parser(
        "check", allow_abbrev=False, help="verify every host before a launch (SSH, Python, share, network)",
        usage="appliance check [-H host:slots,... | --hostfile FILE] [-np N] [-p PORT] [-i KEY] [--shared DIR]",
        description="Per host, in parallel: TCP reach, SSH auth, remote Python and appliance, shared directory, "
                    "/dev/shm, unique hostnames, network address. One line per failure; exit 1 if any.")
    add_launch_flags(p, check=True)
    p.set_defaults(func=_check)


def _keys(args: argparse.Namespace) -> int:
    from appliance.common.knobs import read
    from .launcher.ssh.keys import KeysError, ensure_keys

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


def _secret(args: argparse.Namespace) -> int:
    from appliance.common.knobs import read
    from appliance.common.jobsecret import SecretFileError, ensure
    from appliance.common.slurm import default_secret_file

    path = args.file or read("APPLIANCE_JOB_SECRET_FILE")
    if not path:
        job = args.job or read("SLURM_JOB_ID")
        if not job or not job.isdigit():
            print("appliance secret: error: which job? run it inside a Slurm job (sbatch script, salloc shell), "
                  "or give --job JOBID or --file PATH", file=sys.stderr)
            return 2
        path = default_secret_file(int(job))
    try:
        ensure(path)
    except SecretFileError as e:
        print(f"appliance secret: error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _add_secret(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "secret", allow_abbrev=False, help="create the job's secret file for `srun python ...` (idempotent)",
        usage="appliance secret [--job JOBID | --file PATH]",
        description="Create the secret file every task of a Slurm job reads at hvd.init() (mode 0600 in a 0700 "
                    "directory; an existing usable one is kept) and print its path. Default: "
                    "~/.appliance/slurm/job-$SLURM_JOB_ID.secret (env APPLIANCE_JOB_SECRET_FILE to put it elsewhere).")
    p.add_argument("--job", metavar="JOBID", help="the Slurm job (default: SLURM_JOB_ID, set inside a job)")
    p.add_argument("--file", metavar="PATH", help="this file instead of the job's default one")
    p.set_defaults(func=_secret)


# --- the appliance plane (Docker): secondary, primary, status ----------------------------------
def _cluster_config(args: argparse.Namespace):
    from appliance.cluster.config import ClusterConfig

    return ClusterConfig.create(shared=args.shared, image=getattr(args, "image", None),
                                network=getattr(args, "network", None), name=getattr(args, "name", None),
                                ssh_port=getattr(args, "ssh_port", None), shm_size=getattr(args, "shm_size", None),
                                gpus=getattr(args, "gpus", None), slots=getattr(args, "slots", None))


def _add_container_flags(p: argparse.ArgumentParser, *, name_help: str) -> None:
    p.add_argument("--shared", metavar="DIR",
                   help="shared directory, mounted at the same path in the container (env APPLIANCE_SHARED, default /mnt/share)")
    p.add_argument("--image", metavar="NAME", help="image (env APPLIANCE_IMAGE, default appliance:latest, made by build.sh)")
    p.add_argument("--network", metavar="NAME",
                   help="host (default, env APPLIANCE_NETWORK) or a user-defined network; one named appliance-* is "
                        "created when missing, so one machine can simulate hosts")
    p.add_argument("--name", metavar="NAME", help=name_help)
    p.add_argument("--shm-size", metavar="SIZE", dest="shm_size",
                   help="'host' (--ipc host) or a size for a private /dev/shm (env APPLIANCE_SHM_SIZE; default host on "
                        "the host network, else 1g)")
    p.add_argument("--gpus", metavar="auto|all|none|N",
                   help="GPUs for the container (env APPLIANCE_GPUS; auto = all when Docker has an nvidia runtime)")


def _cluster_call(cmd: str, fn) -> int:
    from .cluster.docker import ClusterError

    try:
        return fn()
    except ConfigError as e:
        print(f"appliance {cmd}: error: {e}", file=sys.stderr)
        return 2
    except ClusterError as e:
        print(f"appliance {cmd}: error: {e}", file=sys.stderr)
        return 1


def _secondary(args: argparse.Namespace) -> int:
    def go() -> int:
        from .cluster.secondary import Secondary

        sec = Secondary(_cluster_config(args))
        report = sec.stop() if args.stop else sec.start()
        for path in report.keys_created:
            print(f"appliance secondary: created {path}")
        print(f"appliance secondary: {report.line()}")
        return 0
    return _cluster_call("secondary", go)


def _add_secondary(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "secondary", allow_abbrev=False, help="start this host's sshd container (idempotent)",
        usage="appliance secondary [--ssh-port PORT] [--shared DIR] [--image NAME] [--network NAME] [--name NAME] "
              "[--slots N] [--stop]",
        description="Start (or report) the secondary container: key-only sshd on --ssh-port with the cluster key from "
                    "SHARED/ssh (created on first use), the shared directory at the same path, host network, GPUs, "
                    "large /dev/shm, memlock unlimited. --stop removes it.")
    p.add_argument("-p", "--ssh-port", type=int, metavar="PORT", dest="ssh_port",
                   help="port of its sshd (env APPLIANCE_SSH_PORT, default 12345)")
    _add_container_flags(p, name_help="container appliance-NAME with host name NAME (to simulate hosts on one "
                                      "machine; default appliance-secondary)")
    p.add_argument("--slots", type=int, metavar="N",
                   help="ranks this host takes in an elastic job that discovers it (default 1): it registers "
                        "itself on the shared mount as HOST:N")
    p.add_argument("--stop", action="store_true",
                   help="unregister it (an elastic job moves its ranks away at its next commit), then stop and "
                        "remove the secondary container")
    p.set_defaults(func=_secondary)


def _split_primary(argv: list[str]) -> tuple[list[str], list[str]]:
    """(everything before the command, the command) at the first ``--``; without one the command
    is left in the first part, where the launcher's parser finds it (its first positional)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _primary_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="appliance primary", allow_abbrev=False, add_help=False)
    p.add_argument("-p", "--ssh-port", type=int, metavar="PORT", dest="ssh_port")
    _add_container_flags(p, name_help="")
    p.add_argument("--workdir", metavar="DIR")
    p.add_argument("--no-view", action="store_true", dest="no_view")
    return p


def _primary(args: argparse.Namespace) -> int:
    from .launcher.flags import parse_launch_flags

    before, command = _split_primary(list(args.rest))
    own, launch_args = _primary_parser().parse_known_args(before)
    try:  # the launcher's own parser; without "--" it also says where the command starts
        flags, command = parse_launch_flags([*launch_args, *(["--", *command] if command else [])],
                                            prog="appliance primary")
    except SystemExit as e:  # it printed why
        return e.code if isinstance(e.code, int) else 2

    if own.no_view:  # also the launcher's view of the job, inside the container
        flags = flags.replace(no_view=True)

    def go() -> int:
        from .cluster.primary import run_primary

        try:
            return run_primary(_cluster_config(own), flags, command, workdir=own.workdir,
                               live=False if own.no_view else None)
        except ValueError as e:  # HostsError: bad -H, hostfile, -np above the slots
            print(f"appliance primary: error: {e}", file=sys.stderr)
            return 2
    return _cluster_call("primary", go)


def _add_primary(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "primary", allow_abbrev=False, add_help=True, help="run a job from a primary container (horovodrun's flags)",
        usage="appliance primary -np N -H localhost:1,HOST2:1 [-p PORT] [--shared DIR] [--image NAME] "
              "[--network NAME] [--name NAME] [--workdir DIR] [launch flags] -- COMMAND...",
        description="Start the primary container and run `appliance launch` inside it (every flag of `appliance "
                    "launch`/horovodrun passes through), with a per-host view while the cluster starts, the job's "
                    "output streamed here, and its exit code. Ctrl-C stops every rank on every host. The ranks run "
                    "in the shared directory (--workdir to change), so `python -m train` runs SHARED/train.py when "
                    "there is one, else the image's default training job.",
        epilog="appliance options: -p/--ssh-port PORT (secondaries' sshd, env APPLIANCE_SSH_PORT, default 12345), "
               "--shared, --image, --network, --name, --shm-size, --gpus (as for `appliance secondary`), "
               "--workdir DIR (default: the shared directory), --no-view (plain status lines instead of the table).")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_primary)


def _status(args: argparse.Namespace) -> int:
    def go() -> int:
        from appliance.common.knobs import read
        from .cluster.docker import ClusterError
        from .cluster.status import list_containers, list_jobs, list_secondaries, render, shares_of

        if args.shared is not None and not os.path.isdir(args.shared):
            raise ConfigError(f"--shared {args.shared}: no such directory")
        stale = read("APPLIANCE_SECONDARY_STALE")
        try:
            rows, error = list_containers(), None
        except ClusterError as e:  # the share's secondaries are still worth showing
            rows, error = None, e
        shares = [args.shared] if args.shared is not None else shares_of(rows or [], read("APPLIANCE_SHARED"))
        unlisted: dict = {}
        skip = lambda path, why: print(f"appliance status: skipped {path}: {why}", file=sys.stderr)  # noqa: E731
        secondaries = list_secondaries(shares, stale, on_skip=skip)
        jobs = list_jobs(shares, on_skip=skip, on_unlisted=unlisted.__setitem__)
        sys.stderr.flush()
        render(rows, sys.stdout, secondaries, shares, jobs, unlisted)
        if error is not None:
            raise error
        return 0
    return _cluster_call("status", go)


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", allow_abbrev=False,
                       help="list the appliance containers here and the secondaries registered on the share",
                       description="Every container appliance started on this Docker engine (secondaries, primaries), "
                                   "with state, health, network, SSH port, shared directory and job; then the "
                                   "secondaries registered on the shared directory (name, slots, SSH port, container, "
                                   "heartbeat age, live or stale after APPLIANCE_SECONDARY_STALE seconds, as an "
                                   "elastic primary's discovery counts them); then the jobs running on the share "
                                   "(id, hosts, ranks, step, steps/s, age).")
    p.add_argument("--shared", metavar="DIR",
                   help="the shared directory whose secondaries and jobs to list (default: APPLIANCE_SHARED and the "
                        "containers' shared directories)")
    p.set_defaults(func=_status)


def _add_leave(sub: argparse._SubParsersAction) -> None:
    from .launcher.ssh import leave

    p = sub.add_parser("leave", allow_abbrev=False, help="SIGTERM this host's ranks and wait for them to leave",
                       description="Send SIGTERM to every rank the appliance's remote stubs run on this host (found "
                                   "from their records) and wait until they have exited: an elastic job's rank "
                                   "leaves at its next commit. A Kubernetes worker pod's preStop hook.")
    leave.add_arguments(p)
    p.set_defaults(func=leave.run)


def _report(args: argparse.Namespace) -> int:
    from appliance.common.knobs import read
    from .launcher.observe.record import RECORD
    from .launcher.observe.report import draw, job_dir_of, load, summary_text

    try:
        job_dir = job_dir_of(args.job, args.shared or read("APPLIANCE_SHARED"))
        record, skipped = load(job_dir)
    except (OSError, ValueError) as e:  # no record, or one that cannot be read
        print(f"appliance report: {e}", file=sys.stderr)
        return 1
    if skipped:
        print(f"appliance report: skipped {skipped} row(s) of {os.path.join(job_dir, RECORD)} whose fields are not "
              "of the record's types", file=sys.stderr)
    print(summary_text(job_dir, record), flush=True)
    try:
        path = draw(job_dir, args.output, record)
    except (OSError, ValueError, ImportError) as e:  # cannot write there, nothing to draw, no matplotlib
        print(f"appliance report: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", allow_abbrev=False, help="draw a job's report.png again from its record",
                       description="Redraw report.png (steps/s and communication share per host over time, a rank x "
                                   "time heatmap of lateness, elastic rounds marked) from the record the launcher "
                                   "wrote in the job's directory, SHARED/jobs/JOB_ID/metrics.jsonl; prints the job's "
                                   "summary line and the picture's path.")
    p.add_argument("job", metavar="JOB_ID", help="the job's id (its directory under SHARED/jobs), or a job directory")
    p.add_argument("--shared", metavar="DIR", help="the shared directory (env APPLIANCE_SHARED, default /mnt/share)")
    p.add_argument("-o", "--output", metavar="PNG", help="write the picture here (default JOB_DIR/report.png; a "
                                                         "directory: report.png in it)")
    p.set_defaults(func=_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", allow_abbrev=False,
                                     description="Multi-host PyTorch training with a Horovod-compatible runtime.")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    _add_launch(sub)
    _add_check(sub)
    _add_keys(sub)
    _add_secret(sub)
    _add_secondary(sub)
    _add_primary(sub)
    _add_status(sub)
    _add_leave(sub)
    _add_report(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["primary"]:
        # Its flags are the launcher's plus its own, passed through unparsed (argparse cannot
        # hold "everything else" in a subparser), so it is dispatched here.
        before, _ = _split_primary(argv[1:])
        if not ({"-h", "--help"} & set(before)):
            return _primary(argparse.Namespace(rest=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.func(args)
