"""The launch flags (horovodrun's and mpirun's): one parser, used by every entry point.

What it owns: the syntax and meaning of ``-np``/``--num-proc``, ``-H``/``--hosts``,
``--hostfile``, ``--start-timeout``, ``--output-filename``, ``--verbose``, ``-x NAME[=VALUE]``,
``--launcher {auto,ssh,srun,local}`` (how ranks start: ``slurm/step.py``), for other hosts
``-p``/``--ssh-port``, ``-i``/``--ssh-identity-file``, ``--remote-python``,
``--network-interface`` and ``--shared``, and Horovod's elastic flags (``--min-np``/``--min-num-proc``,
``--max-np``/``--max-num-proc``, ``--slots-per-host``/``--slots``, ``--host-discovery-script``,
``--elastic-timeout``, ``--reset-limit``, ``--blacklist-cooldown-range MIN MAX``: ``docs/elastic.md``). ``appliance launch`` and ``appliance check``
(``cli.py``) add them to their subcommand with ``add_launch_flags``; the cluster plane (``appliance
primary`` and its driver) parses the user's flags with ``parse_launch_flags``. Either way the
parsed flags become a ``LaunchFlags`` (plain values, JSON-able: the cluster keeps them in its
job.json) and then a ``LaunchConfig``/``CheckConfig`` through ``LaunchFlags.launch_config`` /
``check_config``, the one place flags meet their knobs, so the same flags mean the same job
whoever parsed them.

Env vars: none read here; the configs fall back to the knobs of ``appliance/common/knobs.py``
(``--start-timeout`` -> HOROVOD_START_TIMEOUT, ``-p`` -> APPLIANCE_SSH_PORT, ``--launcher`` ->
APPLIANCE_LAUNCHER...). Failure modes:
argparse's (``SystemExit(2)`` with a usage line) for unusable syntax; ``ConfigError`` from the
configs for unusable values; ``from_json`` raises ``ConfigError`` for a field it does not know.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping, Sequence

from appliance.launcher.config import CheckConfig, LaunchConfig
from appliance.common.knobs import ConfigError

LAUNCH_USAGE = "-np N [-H host:slots,... | --hostfile FILE] [options] [--] COMMAND..."


@dataclasses.dataclass(frozen=True)
class LaunchFlags:
    """The launch flags as given (``None``: not given, so the knob or default applies)."""

    np: int | None = None
    hosts: str | None = None
    hostfile: str | None = None
    start_timeout: float | None = None
    output_filename: str | None = None
    verbose: bool = False
    x: tuple[str, ...] = ()
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    remote_python: str | None = None
    network_interface: str | None = None
    shared: str | None = None
    launcher: str | None = None
    min_np: int | None = None
    max_np: int | None = None
    slots_per_host: int | None = None
    host_discovery_script: str | None = None
    elastic_timeout: float | None = None
    reset_limit: int | None = None
    blacklist_cooldown_range: tuple[float, float] | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LaunchFlags":
        """From a namespace made by a parser with ``add_launch_flags`` (absent flags: not given)."""
        values = {f.name: getattr(args, f.name, f.default) for f in dataclasses.fields(cls)}
        values["x"] = tuple(values["x"] or ())
        values["verbose"] = bool(values["verbose"])
        if values["blacklist_cooldown_range"] is not None:
            values["blacklist_cooldown_range"] = tuple(values["blacklist_cooldown_range"])
        return cls(**values)

    @property
    def elastic(self) -> bool:
        """Whether these flags ask for an elastic job (as Horovod: --min-np, --max-np or a discovery script)."""
        return self.min_np is not None or self.max_np is not None or self.host_discovery_script is not None

    def to_json(self) -> dict[str, Any]:
        cooldown = self.blacklist_cooldown_range
        return {**dataclasses.asdict(self), "x": list(self.x),
                "blacklist_cooldown_range": None if cooldown is None else list(cooldown)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LaunchFlags":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"launch flags: unknown field(s) {', '.join(unknown)}")
        values = dict(data)
        values["x"] = tuple(values.get("x") or ())
        if values.get("blacklist_cooldown_range") is not None:
            values["blacklist_cooldown_range"] = tuple(values["blacklist_cooldown_range"])
        return cls(**values)

    def remote(self) -> dict[str, Any]:
        """The keyword arguments of ``RemoteConfig.create`` these flags give."""
        return dict(port=self.ssh_port, key=self.ssh_identity_file, shared=self.shared,
                    remote_python=self.remote_python, network_interface=self.network_interface)

    def launch_config(self, command: Sequence[str], **extra: Any) -> LaunchConfig:
        """The job these flags describe, running ``command``. ``extra``: further keyword arguments
        of ``LaunchConfig.create`` that have no flag (``environ``, ``timeout``, ``cwd``, ``env``,
        ``host_wait_s``...)."""
        if self.np is None:
            raise ConfigError("-np is required: the number of ranks to start")
        return LaunchConfig.create(
            command, self.np, hosts=self.hosts, hostfile=self.hostfile, start_timeout=self.start_timeout,
            output_dir=self.output_filename, verbose=True if self.verbose else None, forward=self.x,
            launcher=self.launcher, min_np=self.min_np, max_np=self.max_np,
            host_discovery_script=self.host_discovery_script, slots_per_host=self.slots_per_host,
            elastic_timeout=self.elastic_timeout, reset_limit=self.reset_limit,
            blacklist_cooldown_range=self.blacklist_cooldown_range, **self.remote(), **extra)

    def check_config(self, **extra: Any) -> CheckConfig:
        """The checks ``appliance check`` runs for these flags (``-np`` optional)."""
        return CheckConfig.create(hosts=self.hosts, hostfile=self.hostfile, np=self.np,
                                  start_timeout=self.start_timeout, verbose=True if self.verbose else None,
                                  **self.remote(), **extra)


def add_launch_flags(p: argparse.ArgumentParser, *, check: bool = False, np_required: bool = True) -> None:
    """Add the launch flags to ``p`` (``check``: those ``appliance check`` takes: -np optional, no
    -x, --output-filename or COMMAND; ``np_required=False``: -np may be absent, as for ``horovodrun
    --check-build``, and ``LaunchFlags.launch_config`` then says it is required). Parse with
    ``allow_abbrev=False`` parsers: horovodrun's single-dash long options (-np, -hostfile) must not
    be read as abbreviations."""
    if check or not np_required:
        p.add_argument("-np", "--num-proc", dest="np", type=int, metavar="N",
                       help="also check that N ranks fit the slots" if check else "number of ranks")
    else:
        p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, metavar="N", help="number of ranks")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...",
                       help="hosts (as for launch)" if check else
                       "hosts and their slots, filled in order (default: localhost:N)")
    hosts.add_argument("-hostfile", "--hostfile", dest="hostfile", metavar="FILE",
                       help="hostfile (as for launch)" if check else "file of 'host slots=N' lines ('#' comments)")
    p.add_argument("--start-timeout", dest="start_timeout", type=float, metavar="S",
                   help="seconds for all checks (env HOROVOD_START_TIMEOUT)" if check else
                   "seconds for all ranks to start and meet (env HOROVOD_START_TIMEOUT, default 60)")
    if not check:
        p.add_argument("--output-filename", dest="output_filename", metavar="DIR",
                       help="also write DIR/rank.N/stdout and stderr")
    p.add_argument("--verbose", action="store_true",
                   help="more detail" if check else "print the rank layout and addresses (env APPLIANCE_VERBOSE)")
    if not check:
        p.add_argument("-x", dest="x", action="append", metavar="NAME[=VALUE]",
                       help="set NAME for every worker (to VALUE, or to the launcher's value); repeatable")
        p.add_argument("--launcher", dest="launcher", choices=("auto", "ssh", "srun", "local"),
                       help="how ranks start: srun (one step in the Slurm allocation), ssh (others over SSH), "
                            "local (all on this machine); default auto: srun inside an allocation without "
                            "-H/--hostfile, else ssh (env APPLIANCE_LAUNCHER)")
    p.add_argument("-p", "--ssh-port", dest="ssh_port", type=int, metavar="PORT",
                   help="SSH port of the other hosts (env APPLIANCE_SSH_PORT; default ~/.ssh/config, else 22)")
    p.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file", metavar="KEY",
                   help="SSH private key (env APPLIANCE_SSH_KEY; default SHARED/ssh/id_ed25519 if present)")
    p.add_argument("--remote-python", dest="remote_python", metavar="PATH",
                   help="absolute path of Python on the other hosts (env APPLIANCE_REMOTE_PYTHON; default: this one)")
    p.add_argument("--network-interface", dest="network_interface", metavar="IF",
                   help="use each host's address on IF instead of the routed one (env HOROVOD_GLOO_IFACE)")
    p.add_argument("--shared", metavar="DIR",
                   help="the shared directory (env APPLIANCE_SHARED, default /mnt/share)" if check else
                   "the shared directory to verify (env APPLIANCE_SHARED)")
    if not check:
        add_elastic_flags(p)
        p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the program and its arguments")


def add_elastic_flags(p: argparse.ArgumentParser) -> None:
    """Horovod's elastic flags (``docs/elastic.md``); any of the first three makes the job elastic."""
    g = p.add_argument_group("elastic (Horovod's flags: any of --min-np, --max-np, --host-discovery-script "
                             "makes the job elastic)")
    g.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                   help="fewest ranks to train with; below it the job waits for hosts (default: -np)")
    g.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                   help="most ranks to run, however many slots appear (default: unbounded, every available slot)")
    g.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int, metavar="N",
                   help="slots of a host the discovery script prints without :slots (default 1)")
    g.add_argument("--host-discovery-script", dest="host_discovery_script", metavar="SCRIPT",
                   help="executable printing the available hosts, one 'host:slots' or 'host' per line; run "
                        "every second (env APPLIANCE_DISCOVERY_INTERVAL)")
    g.add_argument("--elastic-timeout", dest="elastic_timeout", type=float, metavar="S",
                   help="seconds to wait for --min-np slots before failing (env HOROVOD_ELASTIC_TIMEOUT, "
                        "default 600)")
    g.add_argument("--reset-limit", dest="reset_limit", type=int, metavar="N",
                   help="fail the job at its N+1-th membership change (default: no limit)")
    g.add_argument("--blacklist-cooldown-range", dest="blacklist_cooldown_range", type=float, nargs=2,
                   metavar=("MIN", "MAX"),
                   help="a failed host may return after MIN*2^n s plus jitter, at most MAX (default: never)")


def launch_parser(prog: str = "appliance launch") -> argparse.ArgumentParser:
    """A parser of the launch flags and COMMAND alone (the cluster plane's; ``prog`` names the
    command in its error messages)."""
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False, usage=f"{prog} {LAUNCH_USAGE}")
    add_launch_flags(p)
    return p


def command_of(args: argparse.Namespace) -> list[str]:
    """The COMMAND of a parsed launch (without the ``--`` that may separate it)."""
    command = list(getattr(args, "command", None) or [])
    return command[1:] if command[:1] == ["--"] else command


def parse_launch_flags(argv: Sequence[str], prog: str = "appliance launch") -> tuple[LaunchFlags, list[str]]:
    """``[flags] [--] COMMAND...`` -> (flags, command). Raises ``SystemExit(2)`` (argparse, after
    printing the usage and why) for unusable syntax."""
    args = launch_parser(prog).parse_args(list(argv))
    return LaunchFlags.from_args(args), command_of(args)


def launch_config(args: argparse.Namespace, **extra: Any) -> LaunchConfig:
    """The CLI's ``launch``: its parsed namespace -> ``LaunchConfig`` (through ``LaunchFlags``)."""
    return LaunchFlags.from_args(args).launch_config(command_of(args), **extra)


def check_config(args: argparse.Namespace, **extra: Any) -> CheckConfig:
    """The CLI's ``check``: its parsed namespace -> ``CheckConfig`` (through ``LaunchFlags``)."""
    return LaunchFlags.from_args(args).check_config(**extra)


def with_defaults(flags: LaunchFlags, **defaults: Any) -> LaunchFlags:
    """``flags`` with each of ``defaults`` filled in where the flag was not given."""
    return dataclasses.replace(flags, **{k: v for k, v in defaults.items() if getattr(flags, k) in (None, ())})


__all__ = ["LaunchFlags", "add_launch_flags", "add_elastic_flags", "launch_parser", "parse_launch_flags", "launch_config",
           "check_config", "command_of", "with_defaults"]
