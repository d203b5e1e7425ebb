"""Host executors: how ranks are started on one host, behind one small interface.

What it owns: the ``Executor`` interface (one per host of the job: the address its ranks listen
on and its interface, free ports there, the base environment of its workers, starting a worker,
closing), the ``LocalExecutor`` for this machine, the ``SSHExecutor`` for any other host,
``is_local_host()``/``is_local()``, ``merge_same_machines()`` (one machine named twice, e.g.
``localhost`` and ``127.0.0.1``, is one host: merged, with a line saying so), and
and ``job_addresses()``; ``hostset.py`` decides local versus remote and runs the preflight.

Base environment of a worker: on this machine the launcher's whole environment; on another host
the launcher's environment as horovodrun forwards it (it exports every variable but BASH_FUNC_*,
OLDPWD and its secret key), minus the variables that describe the launcher's own machine, login
or terminal (``host_specific()``: HOSTNAME, HOST, PWD, OLDPWD, SHLVL, _, HOME, USER, LOGNAME,
SHELL, MAIL, TMPDIR, DISPLAY, XAUTHORITY, DBUS_SESSION_BUS_ADDRESS, HOROVOD_SECRET_KEY,
APPLIANCE_CONTAINER, and every SSH_*, XDG_*, BASH_FUNC_* name), on top of what the SSH session
itself has (HOME, USER...). On both, HOROVOD_GLOO_IFACE and NCCL_SOCKET_IFNAME
default to the host's chosen interface unless already set. A remote command whose program is
``python``/``python3``/``pythonX.Y`` or the launcher's own interpreter runs with the remote
interpreter (an absolute path: ``--remote-python``, else the launcher's ``sys.executable``).

Env vars: none read (``LaunchConfig``/``RemoteConfig`` carry them). Failure modes: preflight
failures and unusable hosts raise ``LaunchError`` naming every culprit; no free port raises
``LaunchError``; a remote rank that cannot start raises ``SpawnError``.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
from typing import Mapping, Protocol, Sequence

from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig
from appliance.common.netif import interface_address
from .env import network_defaults
from .hosts import Host, merge_hosts
from .ports import NoFreePorts, pick_free_ports
from .output import OutputSink
from .workers import LocalWorker, Worker

LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "127.0.0.1", "::1"})
# Not forwarded to other hosts: what names the launcher's machine, login session or terminal there.
HOST_SPECIFIC_NAMES = frozenset({
    "HOSTNAME", "HOST", "PWD", "OLDPWD", "SHLVL", "_", "HOME", "USER", "LOGNAME", "SHELL", "MAIL", "TMPDIR",
    "DISPLAY", "XAUTHORITY", "DBUS_SESSION_BUS_ADDRESS", "HOROVOD_SECRET_KEY", "APPLIANCE_CONTAINER"})
HOST_SPECIFIC_PREFIXES = ("SSH_", "XDG_", "BASH_FUNC_")
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")


class LaunchError(RuntimeError):
    """The job could not be set up (host unreachable, no port...); the message names the culprit."""


class Executor(Protocol):
    """Starts and reaches the ranks of one host."""

    host: str     # the name given in -H
    address: str  # where its ranks listen (APPLIANCE_DATA_ADDR)
    iface: str    # the interface of that address

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment a worker starts from, before the explicit variables and the contract."""

    def free_ports(self, address: str, count: int) -> list[int]:
        """``count`` distinct ports that are free on ``address`` of this host."""

    def spawn(self, rank: int, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
              sink: OutputSink) -> Worker:
        """Start one rank; raises ``SpawnError`` when the command cannot be started."""

    def close(self) -> None:
        """Release connections; the workers themselves are stopped by ``WorkerGroup``."""


def _local_addresses() -> set[str]:
    addrs = set(LOCAL_NAMES)
    for _, name in socket.if_nameindex():
        try:
            addrs.add(interface_address(name))
        except ConfigError:
            pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                raw = line.split()[0]
                addrs.add(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw)))
    except (OSError, ValueError, IndexError):
        pass
    return addrs


def _resolve(name: str) -> set[str]:
    try:
        infos = socket.getaddrinfo(name, None)
    except (socket.gaierror, UnicodeError) as e:
        raise LaunchError(f"host {name!r} does not resolve: {getattr(e, 'strerror', None) or e}") from None
    return {info[4][0].split("%")[0] for info in infos}


def _is_this_machine(name: str, resolved: set[str], local: set[str]) -> bool:
    return name in LOCAL_NAMES or name == socket.gethostname() or all(
        a in local or a.startswith("127.") for a in resolved)


def is_local_host(name: str) -> bool:
    """Whether ``name`` (from -H) is this machine: a loopback name, its hostname, or its addresses."""
    if name in LOCAL_NAMES or name == socket.gethostname():
        return True
    return _is_this_machine(name, _resolve(name), _local_addresses())


def is_local(host: str) -> bool:
    """``is_local_host``, with a name that does not resolve counted as another host (the preflight
    then reports it with the other findings)."""
    try:
        return is_local_host(host)
    except LaunchError:
        return False


THIS_MACHINE = "this machine"


def merge_same_machines(hosts: Sequence[Host]) -> tuple[list[Host], list[str]]:
    """One machine named twice is one host: every name of this machine (``localhost``, its hostname,
    its addresses) merges into the first of them, and other names that resolve to the same
    address (the IPv4 ones when a name has any) merge likewise; slots are summed, the first name
    and its place are kept. Returns the hosts and one line per merge saying so. A name that does
    not resolve is left alone (the preflight reports it)."""
    local: list[set[str]] = []  # this machine's addresses, looked up once if a name needs them

    def machine(name: str) -> object | None:
        if name in LOCAL_NAMES or name == socket.gethostname():
            return THIS_MACHINE
        try:
            resolved = _resolve(name)
        except LaunchError:
            return None
        if not local:
            local.append(_local_addresses())
        if _is_this_machine(name, resolved, local[0]):
            return THIS_MACHINE
        v4 = sorted(a for a in resolved if ":" not in a)
        return tuple(v4 or sorted(resolved))

    keys = {h.name: machine(h.name) for h in hosts}
    merged, groups = merge_hosts(hosts, keys.__getitem__)
    slots = {h.name: h.slots for h in merged}
    notes = []
    for names in groups:
        key = keys[names[0]]
        what = ("name this machine" if key == THIS_MACHINE else
                f"resolve to the same address ({', '.join(key)})")  # type: ignore[arg-type]
        notes.append(f"{', '.join(names[:-1])} and {names[-1]} {what}: one host, {names[0]}, "
                     f"with {slots[names[0]]} slots")
    return merged, notes


def host_specific(name: str) -> bool:
    """Whether the launcher's variable ``name`` describes its own machine or session, and so is not
    forwarded to ranks on other hosts (everything else is, as horovodrun does)."""
    return name in HOST_SPECIFIC_NAMES or name.startswith(HOST_SPECIFIC_PREFIXES)


class LocalExecutor:
    """Ranks on this machine: subprocesses in their own sessions."""

    def __init__(self, host: str, address: str = "127.0.0.1", iface: str = "lo"):
        self.host, self.address, self.iface = host, address, iface

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        return network_defaults(dict(environ), self.iface)

    def free_ports(self, address: str, count: int) -> list[int]:
        try:
            return pick_free_ports(address, count)
        except NoFreePorts as e:
            raise LaunchError(str(e)) from None

    def spawn(self, rank: int, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
              sink: OutputSink) -> Worker:
        return LocalWorker(rank, self.host, argv, env, cwd, sink)

    def close(self) -> None:
        pass


def remote_argv(argv: Sequence[str], python: str) -> list[str]:
    """The command for another host: a Python program name becomes the remote interpreter's path."""
    argv = [str(a) for a in argv]
    if argv and (_PYTHON.match(argv[0]) or argv[0] == sys.executable):
        argv[0] = python
    return argv


class SSHExecutor:
    """Ranks on another host, each through its own SSH channel and remote stub."""

    def __init__(self, host: str, conn, config: LaunchConfig, address: str, iface: str):
        self.host, self.address, self.iface = host, address, iface
        self._conn, self._config = conn, config
        self.python = config.remote.remote_python or sys.executable

    @property
    def launcher_address(self) -> str:
        """This machine's address as that host reaches it (the SSH connection's own end)."""
        return self._conn.local_address

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in environ.items() if not host_specific(k)}
        return network_defaults(env, self.iface)

    def free_ports(self, address: str, count: int) -> list[int]:
        from .ssh.connection import SSHFailure

        try:
            status, out, err = self._conn.exec(
                [self.python, "-m", "appliance.launcher.ssh.remote_stub", "ports", address, str(count)],
                timeout=max(5.0, self._config.start_timeout_s / 2))
            if status == 0:
                return [int(p) for p in json.loads(out)]
        except (SSHFailure, ValueError, TypeError) as e:
            err = str(e).encode()
        raise LaunchError(f"host {self.host}: cannot find free ports on {address}: "
                          f"{err.decode(errors='replace').strip()[-300:]}")

    def spawn(self, rank: int, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
              sink: OutputSink) -> Worker:
        from .ssh.worker import SSHWorker

        job_id = env.get("APPLIANCE_JOB_ID", "")
        root = self._config.remote.job_dir
        spec = {"rank": rank, "argv": remote_argv(argv, self.python), "env": dict(env),
                "cwd": cwd or os.getcwd(), "job_id": job_id,
                "job_dir": os.path.join(root, job_id) if root else None, "grace": self._config.stop_grace_s,
                "ssh_timeout": self._config.remote.ssh_timeout_s}
        stub = [self.python, "-m", "appliance.launcher.ssh.remote_stub"]
        return SSHWorker(rank, self.host, self._conn, stub, spec, sink)

    def close(self) -> None:
        self._conn.close()


def job_addresses(executors: Mapping[str, Executor]) -> dict[str, str]:
    """The address each host's ranks listen on (and rank 0's store): loopback when all are local."""
    return {host: ex.address for host, ex in executors.items()}
