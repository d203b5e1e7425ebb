"""The launcher's configs: one ``appliance launch`` (``LaunchConfig``), one ``appliance check``
(``CheckConfig``), how both reach other hosts (``RemoteConfig``) and an elastic job's membership
rules (``ElasticConfig``).

What it owns: validating flags and the environment into frozen dataclasses that ``run()``,
``check`` and the SSH layer consume, and ``-x NAME[=VALUE]`` forwarding (``parse_forwards``).
Knobs come from ``appliance.common.knobs``; Slurm's description of an allocation from
``appliance.common.slurm.SlurmAllocation``. Precedence: flag, then ``-x``/``env``, then the
launcher's environment, then the knob's default. Failure mode: ``ConfigError`` naming the
flag or variable.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Mapping, Sequence

from appliance.common.knobs import ConfigError, parse_launcher, read
from appliance.common.slurm import SlurmAllocation
from appliance.launcher.flagtable import fallback
from appliance.launcher.kubernetes import COOLDOWN_S, Kubernetes, detect, uniform_slots


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
    wait_dns: bool = False              # ... and for its name to resolve (a pod whose DNS record is not there yet)
    record_hosts: bool = True           # write new host keys to ~/.ssh/known_hosts (not on a read-only mount)
    per_pod_share: bool = False         # Kubernetes: each pod may have its own shared_dir (an emptyDir) unless --shared

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
        python = fallback("remote_python", remote_python or None, env) or None
        if python is not None and not os.path.isabs(python):
            raise ConfigError(f"--remote-python {python!r}: must be an absolute path (SSH sessions do not see "
                              "the PATH of a login shell or of Docker's ENV)")
        iface = fallback("network_interface", network_interface or None, env) or None
        if iface is not None and not re.fullmatch(r"[A-Za-z0-9_.:@\-]{1,15}", iface):
            raise ConfigError(f"--network-interface {iface!r} is not an interface name")
        return cls(
            port=int(port) if port is not None else fallback("ssh_port", None, env),
            key=os.fspath(key) if key else (fallback("ssh_identity_file", None, env) or None),
            user=user or read("APPLIANCE_SSH_USER", env) or None,
            shared_dir=os.fspath(shared) if shared else fallback("shared", None, env),
            shared_explicit=bool(shared),
            remote_python=python,
            network_interface=iface,
            job_dir=read("APPLIANCE_JOB_DIR", env) or None,
            min_shm=read("APPLIANCE_MIN_SHM", env),
            ssh_timeout_s=read("APPLIANCE_SSH_TIMEOUT", env),
            host_wait_s=float(host_wait_s),
        )


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
    default_slots: int = 1  # slots of a hostfile line that gives none

    @classmethod
    def create(cls, *, hosts: str | None = None, hostfile: str | os.PathLike | None = None, np: int | None = None,
               start_timeout: float | None = None, verbose: bool | None = None,
               environ: Mapping[str, str] | None = None, **remote: Any) -> "CheckConfig":
        env = dict(os.environ if environ is None else environ)
        if hosts is not None and hostfile is not None:
            raise ConfigError("give hosts either with -H/--hosts or with --hostfile, not both")
        if start_timeout is not None and not start_timeout > 0:
            raise ConfigError(f"--start-timeout must be positive, got {start_timeout!r}")
        remote_config = RemoteConfig.create(environ=env, **remote)
        k8s, default_slots = detect(env), 1
        if k8s is not None:  # a Kubernetes launcher pod: its hostfile and key, as for launch
            default_slots = k8s.slots or 1
            hostfile = k8s.hostfile if hosts is None and hostfile is None else hostfile
            remote_config = dataclasses.replace(remote_config, key=remote_config.key or k8s.key, record_hosts=False,
                                                per_pod_share=True)
        return cls(hosts=hosts, hostfile=None if hostfile is None else os.fspath(hostfile), np=np,
                   start_timeout_s=float(fallback("start_timeout", start_timeout, env)),
                   verbose=bool(fallback("verbose", verbose, env)),
                   remote=remote_config, slurm=SlurmAllocation.from_env(env), default_slots=default_slots)


COOLDOWN_LIMITS_S = (1.0, 3600.0)  # Horovod's bounds of --blacklist-cooldown-range


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """An elastic job's rules, with Horovod's meanings (``docs/elastic.md``).

    The job starts once ``-np`` slots are available, then runs on every available slot up to
    ``max_np`` (None, when --max-np is not given: every available slot, as Horovod) and waits (up to ``timeout_s``) whenever fewer than ``min_np`` remain. Hosts come
    from ``discovery_script`` (``host:slots`` or ``host`` lines; ``slots_per_host`` for the latter)
    or, without one, from the fixed host list (-H, --hostfile, a Slurm allocation): then it is
    fault tolerance over those hosts. ``reset_limit``: how many membership changes the job may
    go through (None: any number). ``cooldown_range``: (min, max) seconds a failed host stays
    blacklisted, doubling with each failure (None: for good).
    """

    min_np: int
    max_np: int | None
    discovery_script: str | None = None
    slots_per_host: int | None = None
    timeout_s: float = 600.0
    reset_limit: int | None = None
    cooldown_range: tuple[float, float] | None = None
    kubernetes: bool = False            # hosts not answering yet are pending; a SIGTERM-ed rank leaves gracefully
    discovery_interval_s: float = 1.0
    discovery_timeout_s: float = 10.0

    @classmethod
    def create(cls, np: int, *, min_np: int | None = None, max_np: int | None = None,
               discovery_script: str | None = None, slots_per_host: int | None = None,
               elastic_timeout: float | None = None, reset_limit: int | None = None,
               cooldown_range: Sequence[float] | None = None, fixed_hosts: bool = False,
               kubernetes: bool = False, environ: Mapping[str, str] | None = None) -> "ElasticConfig":
        """``fixed_hosts``: -H or --hostfile was given (they exclude a discovery script)."""
        env = os.environ if environ is None else environ
        if discovery_script is not None and fixed_hosts:
            raise ConfigError("give hosts either with --host-discovery-script or with -H/--hostfile, not both")
        if discovery_script is not None and not str(discovery_script).strip():
            raise ConfigError("--host-discovery-script: empty path")
        if slots_per_host is not None and discovery_script is None:
            raise ConfigError("--slots-per-host applies to the lines of --host-discovery-script that give no "
                              ":slots; with -H/--hostfile give each host's slots there")
        if slots_per_host is not None and slots_per_host < 1:
            raise ConfigError(f"--slots-per-host must be at least 1, got {slots_per_host}")
        lo = np if min_np is None else int(min_np)
        hi = None if max_np is None else int(max_np)  # Horovod's: not given means unbounded
        if lo < 1:
            raise ConfigError(f"--min-np must be at least 1, got {lo}")
        if not lo <= np or (hi is not None and not np <= hi):
            raise ConfigError(f"expected --min-np <= -np <= --max-np, got {lo} <= {np} <= "
                              f"{'(unbounded)' if hi is None else hi}")
        if elastic_timeout is None:
            timeout = fallback("elastic_timeout", None, env)  # its knob: refused there, naming the variable
        else:
            timeout = float(elastic_timeout)
            if not (math.isfinite(timeout) and timeout > 0):
                raise ConfigError(f"--elastic-timeout must be positive, got {elastic_timeout!r}")
        if reset_limit is not None and int(reset_limit) < 0:
            raise ConfigError(f"--reset-limit must not be negative, got {reset_limit}")
        cooldown = None
        if cooldown_range is not None:
            values = [float(v) for v in cooldown_range]
            if len(values) != 2:
                raise ConfigError(f"--blacklist-cooldown-range takes MIN MAX, got {cooldown_range!r}")
            low, high = values
            if not COOLDOWN_LIMITS_S[0] <= low <= high <= COOLDOWN_LIMITS_S[1]:
                raise ConfigError(f"--blacklist-cooldown-range {low:g} {high:g}: expected "
                                  f"{COOLDOWN_LIMITS_S[0]:g} <= MIN <= MAX <= {COOLDOWN_LIMITS_S[1]:g} seconds")
            cooldown = (low, high)
        return cls(min_np=lo, max_np=hi, discovery_script=None if discovery_script is None else str(discovery_script),
                   slots_per_host=slots_per_host, timeout_s=timeout,
                   reset_limit=None if reset_limit is None else int(reset_limit), cooldown_range=cooldown,
                   kubernetes=kubernetes,
                   discovery_interval_s=read("APPLIANCE_DISCOVERY_INTERVAL", env),
                   discovery_timeout_s=read("APPLIANCE_DISCOVERY_TIMEOUT", env))


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
    launcher: str = "auto"  # auto, ssh, srun, local (slurm/step.py decides what auto means)
    elastic: ElasticConfig | None = None  # an elastic job (--min-np, --max-np or a discovery script)
    default_slots: int = 1  # slots of a hostfile line that gives none
    kubernetes: Kubernetes | None = None  # the launcher pod of the MPI Operator / Kubeflow Trainer
    notice: str = ""  # the line said at start about where the hosts and key came from
    view: bool = True                     # --no-view: False (observe/session.py reads APPLIANCE_VIEW too)
    metrics_port: int | None = None       # --metrics-port: serve Prometheus' text format there

    @classmethod
    def create(cls, command: Sequence[str], np: int, *, hosts: str | None = None, hostfile: str | None = None,
               start_timeout: float | None = None, output_dir: str | os.PathLike | None = None,
               verbose: bool | None = None, timeout: float | None = None, forward: Sequence[str] = (),
               env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
               environ: Mapping[str, str] | None = None, launcher: str | None = None,
               min_np: int | None = None, max_np: int | None = None, host_discovery_script: str | None = None,
               slots_per_host: int | None = None, elastic_timeout: float | None = None,
               reset_limit: int | None = None, blacklist_cooldown_range: Sequence[float] | None = None,
               no_view: bool = False, metrics_port: int | None = None, **remote: Any) -> "LaunchConfig":
        """``remote``: the keyword arguments of ``RemoteConfig.create`` (port, key, user, shared,
        remote_python, network_interface, host_wait_s). ``launcher``: --launcher (else
        APPLIANCE_LAUNCHER). The elastic arguments (Horovod's flags) make an elastic job as soon
        as ``min_np``, ``max_np`` or ``host_discovery_script`` is given (``ElasticConfig``); the
        others without those are a ``ConfigError``."""
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
        elastic = None
        wants_elastic = min_np is not None or max_np is not None or host_discovery_script is not None
        k8s = detect(environ)
        default_slots = 1
        if k8s is not None:
            default_slots = k8s.slots or 1
            if hosts is None and hostfile is None and host_discovery_script is None:
                if wants_elastic and k8s.discovery:
                    host_discovery_script = k8s.discovery
                else:
                    hostfile = k8s.hostfile
            if host_discovery_script is not None and slots_per_host is None:
                slots_per_host = k8s.slots or uniform_slots(k8s.hostfile, default_slots)
            if wants_elastic and blacklist_cooldown_range is None:
                blacklist_cooldown_range = COOLDOWN_S
        if wants_elastic:
            elastic = ElasticConfig.create(np, min_np=min_np, max_np=max_np, discovery_script=host_discovery_script,
                                           slots_per_host=slots_per_host, elastic_timeout=elastic_timeout,
                                           reset_limit=reset_limit, cooldown_range=blacklist_cooldown_range,
                                           fixed_hosts=hosts is not None or hostfile is not None,
                                           kubernetes=k8s is not None, environ=merged)
        else:
            given = [flag for flag, value in (("--slots-per-host", slots_per_host),
                                              ("--elastic-timeout", elastic_timeout), ("--reset-limit", reset_limit),
                                              ("--blacklist-cooldown-range", blacklist_cooldown_range))
                     if value is not None]
            if given:
                raise ConfigError(f"{given[0]} applies to elastic jobs: add --min-np, --max-np or "
                                  "--host-discovery-script")
        return cls(
            command=command,
            np=np,
            hosts=hosts,
            hostfile=None if hostfile is None else os.fspath(hostfile),
            start_timeout_s=float(fallback("start_timeout", start_timeout, merged)),
            output_dir=None if output_dir is None else os.fspath(output_dir),
            verbose=bool(fallback("verbose", verbose, merged)),
            timeout_s=None if timeout is None else float(timeout),
            stop_grace_s=read("APPLIANCE_STOP_GRACE", merged),
            failure_grace_s=read("APPLIANCE_FAILURE_GRACE", merged),
            cwd=None if cwd is None else os.fspath(cwd),
            env=explicit,
            environ=environ,
            remote=RemoteConfig.create(environ=merged, **remote),
            slurm=SlurmAllocation.from_env(environ),
            ssh_flags=tuple(f for f, k in (("-p", "port"), ("-i", "key")) if remote.get(k) is not None),
            launcher=fallback("launcher", None, merged) if launcher is None else _launcher_flag(launcher),
            elastic=elastic,
            default_slots=default_slots,
            kubernetes=k8s,
            view=not no_view,
            metrics_port=_metrics_port(fallback("metrics_port", metrics_port, merged)),
        )._on_kubernetes()

    def _on_kubernetes(self) -> "LaunchConfig":
        """In a launcher pod: the mounted key (unless -i/APPLIANCE_SSH_KEY), no known_hosts written,
        a static job's hosts and their names waited for (up to --start-timeout; an elastic job's are
        pending instead); and the line that says so."""
        k8s = self.kubernetes
        if k8s is None:
            return self
        wait = self.remote.host_wait_s if self.elastic else max(self.remote.host_wait_s, self.start_timeout_s)
        remote = dataclasses.replace(self.remote, key=self.remote.key or k8s.key, record_hosts=False, wait_dns=True,
                                     host_wait_s=wait, per_pod_share=True)  # elastic: a host not answering is pending
        e = self.elastic
        notice = k8s.line(hosts_from=self.hostfile, discovery=e.discovery_script if e else None, key=remote.key,
                          cooldown=e.cooldown_range if e else None)
        return dataclasses.replace(self, remote=remote, notice=notice)


def _metrics_port(port: Any) -> int | None:
    if port is not None and not 0 <= int(port) < 65536:
        raise ConfigError(f"--metrics-port {port}: expected a TCP port (1-65535, or 0 for any free one)")
    return None if port is None else int(port)


def _launcher_flag(value: str) -> str:
    try:
        return parse_launcher(value)
    except ValueError as e:
        raise ConfigError(f"--launcher: {e}") from None


