"""Host executors: how ranks are started on one host, behind one small interface.

What it owns: the ``Executor`` interface (one per host of the job: the address its ranks listen
on, free ports there, the base environment of its workers, starting a worker, closing), the
``LocalExecutor`` for this machine, ``is_local_host()``, and ``open_executors()``/
``job_addresses()``, the only places that decide local versus remote. ``run.py`` talks to
executors only, so the SSH executor (issue 3: records remote pids in a job directory and signals
remote process groups) slots in here without changing the orchestration.

Env vars: none read; a local worker's base environment is the launcher's whole environment.
Failure modes: a host that does not resolve, or that is not this machine while remote launch is
unavailable, raises ``LaunchError`` naming the host; no free port raises ``LaunchError``.
"""
from __future__ import annotations

import contextlib
import random
import socket
from typing import Iterator, Mapping, Protocol, Sequence

from ..config import ConfigError, LaunchConfig, interface_address
from .workers import LocalWorker, OutputSink, Worker

# Ports for the store and MASTER_PORT are drawn below Linux's ephemeral range (32768-60999), so
# they do not collide with the source ports of outgoing connections.
PORT_RANGE = (20000, 32767)
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "127.0.0.1", "::1"})


class LaunchError(RuntimeError):
    """The job could not be set up (host unreachable, no port...); the message names the culprit."""


class Executor(Protocol):
    """Starts and reaches the ranks of one host."""

    host: str  # the name given in -H

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


def is_local_host(name: str) -> bool:
    """Whether ``name`` (from -H) is this machine: a loopback name, its hostname, or its addresses."""
    if name in LOCAL_NAMES or name == socket.gethostname():
        return True
    try:
        infos = socket.getaddrinfo(name, None)
    except socket.gaierror as e:
        raise LaunchError(f"host {name!r} does not resolve: {e.strerror}") from None
    resolved = {info[4][0].split("%")[0] for info in infos}
    local = _local_addresses()
    return all(a in local or a.startswith("127.") for a in resolved)


def pick_free_ports(address: str, count: int, rng: random.Random | None = None) -> list[int]:
    """Distinct ports in ``PORT_RANGE`` that can be bound on ``address`` right now (all held while choosing)."""
    rng = rng or random.Random()
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    held: list[socket.socket] = []
    try:
        for _ in range(200):
            if len(held) == count:
                break
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.bind((address, rng.randint(*PORT_RANGE)))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < count:
            raise LaunchError(f"no free TCP port on {address} in {PORT_RANGE[0]}-{PORT_RANGE[1]}")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


class LocalExecutor:
    """Ranks on this machine: subprocesses in their own sessions."""

    def __init__(self, host: str):
        self.host = host

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        return dict(environ)

    def free_ports(self, address: str, count: int) -> list[int]:
        return pick_free_ports(address, count)

    def spawn(self, rank: int, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
              sink: OutputSink) -> Worker:
        return LocalWorker(rank, self.host, argv, env, cwd, sink)

    def close(self) -> None:
        pass


@contextlib.contextmanager
def open_executors(hosts: Sequence[str], config: LaunchConfig) -> Iterator[dict[str, Executor]]:
    """One executor per host that received ranks; all closed on exit."""
    executors: dict[str, Executor] = {}
    try:
        for host in hosts:
            if not is_local_host(host):
                raise LaunchError(
                    f"host {host!r} is not this machine; starting ranks on other hosts needs the SSH "
                    "launcher, which this version does not have yet")
            executors[host] = LocalExecutor(host)
        yield executors
    finally:
        for ex in executors.values():
            ex.close()


def job_addresses(executors: Mapping[str, Executor]) -> dict[str, str]:
    """The address each host's ranks listen on (and rank 0's store). All local: loopback."""
    if all(isinstance(ex, LocalExecutor) for ex in executors.values()):
        return {host: "127.0.0.1" for host in executors}
    raise LaunchError("multi-host address selection arrives with the SSH launcher")
