"""The launch flags, declared once: one ``Flag`` row per flag, read by every entry point.

What it owns: ``FLAGS``, the table of the launch flags (horovodrun's and mpirun's): each row is
the flag's field name (``dest``: the ``LaunchFlags`` field), its spellings, its argparse type,
metavar and help, the knob it falls back to (``knob``: the environment variable, declared in
``appliance/common/knobs.py``), the keyword of ``LaunchConfig.create`` it feeds (``config``), the
keyword of the Python API ``launcher.launch()`` (``api``) and of Horovod's ``horovod.run()``
(``horovod``) that give it. Everything else derives from this table: the parsers of
``appliance launch``/``check``/``horovodrun`` and the cluster plane (``flags.add_launch_flags``),
``LaunchFlags`` and its JSON, the mapping to ``LaunchConfig.create`` (``flags.config_kwargs``),
``launch()``'s keywords and ``horovod.run()``'s (``api_kwargs``). Adding a flag is adding a row
(and the ``LaunchConfig.create`` keyword it feeds, when that is new).

Env vars: none read here (``knob`` names the variable; the configs read it through
``fallback``). Failure modes: ``api_kwargs`` raises ``TypeError`` for a keyword no row declares,
as a Python function would.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from appliance.common.knobs import read


@dataclasses.dataclass(frozen=True)
class Flag:
    """One launch flag (see the module docstring)."""

    dest: str                                   # LaunchFlags field
    names: tuple[str, ...]                      # command-line spellings
    help: str
    type: Callable[[str], Any] | None = str     # argparse type; None: a store_true switch
    metavar: str | tuple[str, ...] | None = None
    knob: str | None = None                     # environment fallback (appliance/common/knobs.py)
    config: str | None = ""                     # LaunchConfig.create keyword ("": dest; None: none)
    api: str | None = ""                        # launcher.launch() keyword ("": dest; None: none)
    horovod: tuple[str, ...] = ()               # horovod.run() keywords that give it (first wins)
    check: bool = True                          # `appliance check` takes it too
    group: str = "launch"                       # "launch", "hosts" (exclusive pair) or "elastic"
    nargs: int | None = None
    choices: tuple[str, ...] | None = None
    check_help: str = ""                        # the help under `appliance check`, when it differs
    default: Any = None                         # LaunchFlags' value when not given

    @property
    def config_kw(self) -> str | None:
        return self.dest if self.config == "" else self.config

    @property
    def api_kw(self) -> str | None:
        return self.dest if self.api == "" else self.api

    def help_text(self, check: bool) -> str:
        text = (self.check_help or self.help) if check else self.help
        if self.knob and "env " not in text:
            text += f" (env {self.knob})"
        return text


FLAGS: tuple[Flag, ...] = (
    Flag("np", ("-np", "--num-proc"), "number of ranks", int, "N", api=None, horovod=("num_proc", "np"),
         check_help="also check that N ranks fit the slots"),
    Flag("hosts", ("-H", "--hosts"), "hosts and their slots, filled in order (default: localhost:N, or the "
         "hostfile the MPI Operator or Kubeflow Trainer mounts)", str, "HOST:SLOTS,...", group="hosts",
         horovod=("hosts",), check_help="hosts (as for launch)"),
    Flag("hostfile", ("-hostfile", "--hostfile"), "file of 'host slots=N' or 'host:N' lines ('#' comments)", str,
         "FILE", group="hosts", horovod=("hostfile",), check_help="hostfile (as for launch)"),
    Flag("start_timeout", ("--start-timeout",), "seconds for all ranks to start and meet (default 60)", float, "S",
         knob="HOROVOD_START_TIMEOUT", horovod=("start_timeout",), check_help="seconds for all checks"),
    Flag("output_filename", ("--output-filename",), "also write DIR/rank.N/stdout and stderr", str, "DIR",
         config="output_dir", api="output", horovod=("output_filename",), check=False),
    Flag("verbose", ("--verbose",), "print the rank layout and addresses", None, knob="APPLIANCE_VERBOSE",
         horovod=("verbose",), check_help="more detail"),
    Flag("x", ("-x",), "set NAME for every worker (to VALUE, or to the launcher's value); repeatable", str,
         "NAME[=VALUE]", config="forward", api="forward", check=False, default=()),
    Flag("launcher", ("--launcher",), "how ranks start: srun (one step in the Slurm allocation), ssh (others over "
         "SSH), local (all on this machine); default auto: srun inside an allocation without -H/--hostfile, else "
         "ssh", str, knob="APPLIANCE_LAUNCHER", check=False, choices=("auto", "ssh", "srun", "local")),
    Flag("ssh_port", ("-p", "--ssh-port"), "SSH port of the other hosts (default ~/.ssh/config, else 22)", int,
         "PORT", knob="APPLIANCE_SSH_PORT", config="port", horovod=("ssh_port",)),
    Flag("ssh_identity_file", ("-i", "--ssh-identity-file"), "SSH private key (default SHARED/ssh/id_ed25519 if "
         "present; under the MPI Operator or Kubeflow Trainer the mounted id_rsa)", str, "KEY",
         knob="APPLIANCE_SSH_KEY", config="key", api="ssh_key", horovod=("ssh_identity_file",)),
    Flag("remote_python", ("--remote-python",), "absolute path of Python on the other hosts (default: this one)",
         str, "PATH", knob="APPLIANCE_REMOTE_PYTHON", horovod=("executable",)),
    Flag("network_interface", ("--network-interface",), "use each host's address on IF instead of the routed one",
         str, "IF", knob="HOROVOD_GLOO_IFACE", horovod=("network_interface",)),
    Flag("shared", ("--shared",), "the shared directory to verify", str, "DIR", knob="APPLIANCE_SHARED",
         horovod=(), check_help="the shared directory (default /mnt/share)"),
    Flag("min_np", ("--min-np", "--min-num-proc"), "fewest ranks to train with; below it the job waits for hosts "
         "(default: -np)", int, "N", group="elastic", check=False, horovod=("min_num_proc", "min_np")),
    Flag("max_np", ("--max-np", "--max-num-proc"), "most ranks to run, however many slots appear (default: "
         "unbounded, every available slot)", int, "N", group="elastic", check=False,
         horovod=("max_num_proc", "max_np")),
    Flag("slots_per_host", ("--slots-per-host", "--slots"), "slots of a host the discovery script prints without "
         ":slots (default 1, or the hostfile's)", int, "N", group="elastic", check=False, horovod=("slots",)),
    Flag("host_discovery_script", ("--host-discovery-script",), "executable printing the available hosts, one "
         "'host:slots' or 'host' per line; run every second (env APPLIANCE_DISCOVERY_INTERVAL)", str, "SCRIPT",
         group="elastic", check=False, horovod=("host_discovery_script",)),
    Flag("elastic_timeout", ("--elastic-timeout",), "seconds to wait for --min-np slots before failing (default "
         "600)", float, "S", knob="HOROVOD_ELASTIC_TIMEOUT", group="elastic", check=False,
         horovod=("elastic_timeout",)),
    Flag("reset_limit", ("--reset-limit",), "fail the job at its N+1-th membership change (default: no limit)",
         int, "N", group="elastic", check=False, horovod=("reset_limit",)),
    Flag("blacklist_cooldown_range", ("--blacklist-cooldown-range",), "a failed host may return after MIN*2^n s "
         "plus jitter, at most MAX (default: never; on Kubernetes 10 300)", float, ("MIN", "MAX"),
         group="elastic", check=False, nargs=2, horovod=("cooldown_range",)),
)

BY_DEST: dict[str, Flag] = {f.dest: f for f in FLAGS}


def rows() -> tuple[Flag, ...]:
    """The table as it is now (a test may add a row)."""
    return FLAGS


def fallback(dest: str, given: Any, env: Mapping[str, str]) -> Any:
    """``given`` when the flag was given, else its knob's value in ``env`` (else None)."""
    if given is not None:
        return given
    flag = next((f for f in rows() if f.dest == dest), None)
    return read(flag.knob, env) if flag is not None and flag.knob else None


def api_kwargs(given: Mapping[str, Any], *, horovod: bool = False) -> dict[str, Any]:
    """Keywords of ``launch()`` (or, with ``horovod``, of ``horovod.run()``) -> ``LaunchConfig.create``
    keywords. None values are not given. ``TypeError`` for a keyword no row declares."""
    out: dict[str, Any] = {}
    known: dict[str, Flag] = {}
    for f in rows():
        for name in (f.horovod if horovod else ((f.api_kw,) if f.api_kw else ())):
            known.setdefault(name, f)
    for name, value in given.items():
        f = known.get(name)
        if f is None:
            raise TypeError(f"{'horovod.run' if horovod else 'launch'}() got an unexpected keyword argument {name!r}")
        if value is None or f.config_kw is None or f.config_kw in out:
            continue
        out[f.config_kw] = tuple(value) if f.nargs or f.default == () else value
    return out


__all__ = ["Flag", "FLAGS", "BY_DEST", "rows", "fallback", "api_kwargs"]
