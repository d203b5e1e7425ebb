"""The hosts of the executors, opened one way for static and elastic jobs alike.

What it owns: ``ExecutorHosts``, the host set of the ``--launcher ssh``/``local`` mechanism: which
hosts are open (one ``executors.Executor`` each), ``open(hosts)`` (the one path from host names to
ready executors: the preflight of ``ssh/preflight.py`` for the hosts that need it, bounded by
``--start-timeout``, in parallel), ``close(hosts)``, where each host's ranks listen in a round
(``addresses``) and this machine's address as a host reaches it (``launcher_address``: the
address of the interface that routes to the host, never a DNS name, so workers reach the
launcher's rendezvous whether or not its name resolves for them).

A static job opens its hosts once, together (``per_round=False``): a job on this machine alone
uses loopback without checks; as soon as one host is another machine, every host is checked
(this machine's too, for its address). An elastic job (``per_round=True``) opens hosts as they
appear: this machine's without checks (its address is decided per round), the others checked.
``open_executors`` is ``open_all`` as a context manager. ``open`` returns host -> None (ready) or the reason it is not; ``failures`` and ``error`` keep the
last preflight's lines and exception for a static job's ``LaunchError``.

Env vars: none read (``LaunchConfig``). Failure modes: never raises for a host that fails (its
reason is returned); ``launcher_address``/``addresses`` raise ``LaunchError`` when no route
leads to a host.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator, Sequence

from appliance.launcher.config import LaunchConfig
from .executors import Executor, LaunchError, LocalExecutor, SSHExecutor, is_local, merge_same_machines
from .hosts import Host


def say(text: str) -> None:
    print(f"appliance launch: {text}", file=sys.stderr, flush=True)


class ExecutorHosts:
    """The open hosts of one job (see the module docstring)."""

    def __init__(self, config: LaunchConfig, name: str, *, per_round: bool, on_report: Callable | None = None):
        self.config, self.name, self.per_round, self._on_report = config, name, per_round, on_report
        self.executors: dict[str, Executor] = {}
        self.failures: list[str] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()      # the elastic driver opens hosts from another thread
        self._toward: dict[str, str] = {}  # remote address -> this machine's address towards it

    def merge(self, hosts: Sequence[Host]) -> tuple[list[Host], list[str]]:
        """One machine named twice is one host: merged, with a line saying so."""
        return merge_same_machines(hosts)

    def _report_local(self, hosts: Sequence[str]) -> None:
        if self._on_report is None:
            return
        from .ssh.preflight import HostReport

        for host in hosts:
            try:
                self._on_report(HostReport(host, True, steps={"tcp": "local", "ssh": "local"}, done=True))
            except Exception as e:  # noqa: BLE001 - as in the preflight: a warning, not a failure
                say(f"{host}: the report hook failed: {type(e).__name__}: {e}")

    def _put(self, host: str, ex: Executor) -> None:
        with self._lock:
            old = self.executors.pop(host, None)
            self.executors[host] = ex
        if old is not None:
            old.close()  # a host seen again: a fresh connection

    def open(self, hosts: Sequence[str]) -> dict[str, str | None]:
        """Make ``hosts`` ready to start ranks: host -> None, or why not (see the module docstring)."""
        result: dict[str, str | None] = {}
        local = [h for h in hosts if is_local(h)]
        remote = [h for h in hosts if h not in local]
        if self.name == "local" and remote:
            for h in remote:
                result[h] = f"{h}: --launcher local runs every rank on this machine, and {h} is another host"
            remote = []
        checked_local = [] if self.per_round or not (remote or self.config.remote.network_interface) else local
        for h in (h for h in local if h not in checked_local):
            self._put(h, LocalExecutor(h, "127.0.0.1", "") if self.per_round else LocalExecutor(h))
            result[h] = None
        if not self.per_round and not remote and not checked_local:
            self._report_local(local)
        checked = [h for h in hosts if h in remote or h in checked_local]
        self.failures, self.error = [], None
        if checked:
            from .ssh.preflight import run_preflight

            start = time.monotonic()
            with run_preflight(checked, set(checked_local), self.config.remote, self.config.start_timeout_s,
                               cwd=self.config.cwd, on_report=self._on_report) as pf:
                for line in pf.warnings + (pf.notes if self.config.verbose else []):
                    say(line)
                self.failures, self.error = pf.failures, pf.error()
                for h in checked:
                    r = pf.reports[h]
                    if r.failures:
                        result[h] = "; ".join(r.failures)
                    elif not self.failures or self.per_round:
                        self._put(h, LocalExecutor(h, r.address, r.iface) if r.local else
                                  SSHExecutor(h, pf.take(h), self.config, r.address, r.iface))
                        result[h] = None
                    else:
                        result[h] = "another host failed its checks"
            if self.config.verbose:
                say(f"preflight: {', '.join(checked)} checked in {time.monotonic() - start:.2f} s")
        return result

    def open_all(self, hosts: Sequence[str]) -> dict[str, Executor]:
        """A static job's hosts, all of them or ``LaunchError`` listing every failure."""
        result = self.open(hosts)
        if any(why is not None for why in result.values()):
            lines = self.failures or [why for why in result.values() if why]
            n = sum(1 for why in result.values() if why and why != "another host failed its checks")
            raise LaunchError(f"preflight failed ({n} host{'s' if n != 1 else ''}; `appliance check` shows every "
                              "check):\n  " + "\n  ".join(lines)) from self.error
        return {h: self.executors[h] for h in hosts}

    def get(self, host: str) -> Executor:
        with self._lock:
            return self.executors[host]

    def close(self, hosts: Sequence[str]) -> None:
        """Release the connections of ``hosts`` (none of their ranks runs); never blocks the caller."""
        with self._lock:
            gone = [ex for ex in (self.executors.pop(h, None) for h in hosts) if ex is not None]
        if gone:  # taken out now (a host opened again gets a new executor); closed off the caller's thread
            threading.Thread(target=lambda: [ex.close() for ex in gone], name="close-hosts", daemon=True).start()

    def close_all(self) -> None:
        with self._lock:
            executors, self.executors = list(self.executors.values()), {}
        for ex in executors:
            ex.close()

    def addresses(self, hosts: Sequence[str]) -> dict[str, str]:
        """Where each host's ranks listen in a round over ``hosts``."""
        from appliance.common.netif import interface_address

        with self._lock:
            executors = {h: self.executors[h] for h in hosts if h in self.executors}
        remote = [h for h in hosts if isinstance(executors.get(h), SSHExecutor)]
        iface = self.config.remote.network_interface
        if iface:
            here = interface_address(iface)
        elif remote:
            here = self._address_toward(executors[remote[0]].address, remote[0])
        else:
            here = "127.0.0.1"
        return {h: (ex.address if isinstance(ex, SSHExecutor) else here) for h, ex in executors.items()}

    def _address_toward(self, address: str, host: str) -> str:
        """This machine's source address of its route to ``address`` (cached)."""
        from .ssh import network, probe

        if address not in self._toward:
            try:
                self._toward[address] = network.choose("this machine", host, probe.route_get(address))[0]
            except network.NetworkError as e:
                raise LaunchError(str(e)) from None
        return self._toward[address]

    def launcher_address(self, host: str) -> str:
        """This machine's address as ``host`` reaches it (where the elastic driver listens)."""
        with self._lock:
            ex = self.executors.get(host)
        return ex.launcher_address if isinstance(ex, SSHExecutor) else "127.0.0.1"


@contextlib.contextmanager
def open_executors(hosts: Sequence[str], config: LaunchConfig, *,
                   on_report: Callable | None = None) -> Iterator[dict[str, Executor]]:
    """One executor per host of a static job (``hostset.ExecutorHosts.open_all``: the one way
    hosts are opened); all closed on exit. ``on_report``: called once per host with its
    ``preflight.HostReport``."""
    opened = ExecutorHosts(config, "ssh", per_round=False, on_report=on_report)
    try:
        yield opened.open_all(hosts)
    finally:
        opened.close_all()


__all__ = ["ExecutorHosts", "open_executors"]
