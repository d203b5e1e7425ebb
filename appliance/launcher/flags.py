"""The launch flags (horovodrun's and mpirun's): one parser, used by every entry point.

What it owns: the parser and ``LaunchFlags`` built from the one table of the flags
(``flagtable.FLAGS``: each flag's names, type, help, knob and the config keyword it feeds), for
``-np``/``--num-proc``, ``-H``/``--hosts``,
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
from . import flagtable
from .flagtable import Flag

LAUNCH_USAGE = "-np N [-H host:slots,... | --hostfile FILE] [options] [--] COMMAND..."


class _FlagsMethods:
    """What ``LaunchFlags`` (a frozen dataclass with one field per row of ``flagtable.FLAGS``,
    made below) does with its values."""

    def __post_init__(self) -> None:
        for f in flagtable.rows():
            v = getattr(self, f.dest)
            if v is not None and (f.nargs or f.default == ()):
                object.__setattr__(self, f.dest, tuple(v))
            elif f.type is None:
                object.__setattr__(self, f.dest, bool(v))

    def replace(self, **changes: Any) -> "LaunchFlags":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LaunchFlags":
        """From a namespace made by a parser with ``add_launch_flags`` (absent flags: not given)."""
        values = {f.dest: getattr(args, f.dest, None) for f in flagtable.rows()}
        return cls(**{k: v for k, v in values.items() if v is not None})

    @property
    def elastic(self) -> bool:
        """Whether these flags ask for an elastic job (as Horovod: --min-np, --max-np or a discovery script)."""
        return self.min_np is not None or self.max_np is not None or self.host_discovery_script is not None

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LaunchFlags":
        """The flags ``to_json`` wrote; ``ConfigError`` for a field no row declares."""
        known = {f.dest for f in flagtable.rows()}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"launch flags: unknown field(s) {', '.join(unknown)}")
        return cls(**data)

    def config_kwargs(self, *, check: bool = False) -> dict[str, Any]:
        """The keywords of ``LaunchConfig.create`` (``check``: ``CheckConfig.create``) these flags give."""
        out: dict[str, Any] = {}
        for f in flagtable.rows():
            v = getattr(self, f.dest)
            if f.config_kw is None or (check and not f.check) or v is None or v == () or v is False:
                continue
            out[f.config_kw] = v
        return out

    def launch_config(self, command: Sequence[str], **extra: Any) -> LaunchConfig:
        """The job these flags describe, running ``command``. ``extra``: further keyword arguments
        of ``LaunchConfig.create`` that have no flag (``environ``, ``timeout``, ``cwd``, ``env``,
        ``host_wait_s``...)."""
        if self.np is None:
            raise ConfigError("-np is required: the number of ranks to start")
        return LaunchConfig.create(command, **{**self.config_kwargs(), **extra})

    def check_config(self, **extra: Any) -> CheckConfig:
        """The checks ``appliance check`` runs for these flags (``-np`` optional)."""
        return CheckConfig.create(**{**self.config_kwargs(check=True), **extra})


LaunchFlags = dataclasses.make_dataclass(
    "LaunchFlags", [(f.dest, Any, dataclasses.field(default=f.default)) for f in flagtable.rows()],
    bases=(_FlagsMethods,), frozen=True, namespace={"__module__": __name__, "__doc__": (
        "The launch flags as given (``None``: not given, so the knob or default applies): one field per "
        "row of ``flagtable.FLAGS``.")})


def _add(p, f: Flag, check: bool, np_required: bool) -> None:
    kw: dict[str, Any] = dict(dest=f.dest, help=f.help_text(check))
    if f.type is None:
        kw["action"] = "store_true"
    else:
        kw.update(type=f.type, metavar=f.metavar)
        if f.choices:
            kw["choices"] = f.choices
            kw.pop("metavar")
        if f.nargs:
            kw["nargs"] = f.nargs
        if f.default == ():
            kw["action"] = "append"
            kw.pop("type")
    if f.dest == "np" and np_required and not check:
        kw["required"] = True
    p.add_argument(*f.names, **kw)


def add_launch_flags(p: argparse.ArgumentParser, *, check: bool = False, np_required: bool = True) -> None:
    """Add the launch flags of ``flagtable.FLAGS`` to ``p`` (``check``: those ``appliance check``
    takes: -np optional, no -x, --output-filename or COMMAND; ``np_required=False``: -np may be
    absent, as for ``horovodrun --check-build``, and ``LaunchFlags.launch_config`` then says it is
    required). Parse with ``allow_abbrev=False`` parsers: horovodrun's single-dash long options
    (-np, -hostfile) must not be read as abbreviations."""
    hosts = p.add_mutually_exclusive_group()
    elastic = None
    for f in flagtable.rows():
        if check and not f.check:
            continue
        if f.group == "elastic" and elastic is None:
            elastic = p.add_argument_group("elastic (Horovod's flags: any of --min-np, --max-np, "
                                           "--host-discovery-script makes the job elastic)")
        _add(hosts if f.group == "hosts" else elastic if f.group == "elastic" else p, f, check, np_required)
    if not check:
        p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the program and its arguments")


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
    return flags.replace(**{k: v for k, v in defaults.items() if getattr(flags, k) in (None, ())})


__all__ = ["LaunchFlags", "add_launch_flags", "launch_parser", "parse_launch_flags", "launch_config",
           "check_config", "command_of", "with_defaults"]
