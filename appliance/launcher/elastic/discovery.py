"""Host discovery for elastic jobs: which hosts, with how many slots, are available now.

What it owns: ``parse_hosts_output`` (the discovery script's output format, Horovod's: one host
per line, ``host:slots`` or ``host`` (then ``--slots-per-host``, default 1); IPv6 addresses in
brackets, ``[::1]:2``; blank lines and ``#`` comments skipped; the same line twice counts once),
``ScriptDiscovery`` (runs the script as an argv, never through a shell, in a session of its own,
bounded by ``APPLIANCE_DISCOVERY_TIMEOUT``; its whole process group is killed on timeout) and
``FixedDiscovery`` (the -H/--hostfile/Slurm hosts, for fault tolerance over a fixed list). Both
answer ``find() -> {host: slots}`` in the order the hosts were printed.

Every name is checked before it can reach an SSH command line: a name that could pass for an
option (``-oProxyCommand=...``) or holds anything but letters, digits and ``_ . : % -`` (shell
characters, spaces, ``user@host``) is refused with the script, the line number and the line.
The MPI Operator's ``/etc/mpi/discover_hosts.sh`` (plain host names, one per line) works as it is.

Env vars: none read (``ElasticConfig`` carries the interval and timeout); the script runs with
the launcher's environment. Failure modes: ``DiscoveryError`` naming the script and the reason:
missing, not executable, exit status, timeout, or the malformed line.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import Mapping

from ..hosts import HostsError, check_host_name, parse_slots

MAX_OUTPUT = 1 << 20  # bytes of script output read at most


class DiscoveryError(RuntimeError):
    """The discovery script could not be used this time; the message names it and why."""


def parse_hosts_output(text: str, source: str, default_slots: int | None = None) -> dict[str, int]:
    """Discovery output -> ``{host: slots}`` in the order printed (see the module docstring)."""
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}, line {number} ({line!r})"
        name, slots = line, None
        if line.startswith("["):
            close = line.find("]")
            if close < 0:
                raise DiscoveryError(f"{where}: missing ']'")
            name, rest = line[:close + 1], line[close + 1:]
            if rest:
                if not rest.startswith(":"):
                    raise DiscoveryError(f"{where}: expected 'host:slots' or 'host'")
                slots = rest[1:]
        elif line.count(":") == 1:
            name, slots = line.split(":")
        if name.lstrip("[").startswith("-"):
            raise DiscoveryError(f"{where}: a host name cannot start with '-' (it would read as an SSH option)")
        try:
            host = check_host_name(name, where)
            count = parse_slots(slots, where) if slots is not None else (default_slots or 1)
        except HostsError as e:
            raise DiscoveryError(str(e)) from None
        if host in hosts and hosts[host] != count:
            raise DiscoveryError(f"{where}: {host} is listed again with {count} slots (it had {hosts[host]})")
        hosts[host] = count
    return hosts


def resolve_script(script: str, environ: Mapping[str, str]) -> str:
    """The script's path: as given when it names a file (relative to the working directory), else
    looked up on PATH. Raises ``DiscoveryError`` when it is missing or not executable."""
    path = script if os.sep in script or os.path.exists(script) else (
        shutil.which(script, path=environ.get("PATH")) or script)
    if not os.path.exists(path):
        raise DiscoveryError(f"host discovery script {script}: no such file")
    if os.path.isdir(path):
        raise DiscoveryError(f"host discovery script {script}: is a directory")
    if not os.access(path, os.X_OK):
        raise DiscoveryError(f"host discovery script {script}: not executable (chmod +x {script})")
    return os.path.abspath(path)


class ScriptDiscovery:
    """Runs the discovery script (see the module docstring)."""

    def __init__(self, script: str, default_slots: int | None, timeout_s: float, environ: Mapping[str, str],
                 cwd: str | None = None):
        self.script, self.default_slots, self.timeout_s = script, default_slots, timeout_s
        self.environ, self.cwd = dict(environ), cwd

    def describe(self) -> str:
        return f"host discovery script {self.script}"

    def find(self) -> dict[str, int]:
        path = resolve_script(self.script, self.environ)
        try:
            proc = subprocess.Popen([path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self.environ, cwd=self.cwd, start_new_session=True, close_fds=True)
        except OSError as e:
            raise DiscoveryError(f"host discovery script {self.script}: cannot run it: {e.strerror}") from None
        try:
            out, err = proc.communicate(timeout=self.timeout_s or None)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise DiscoveryError(f"host discovery script {self.script}: did not finish within {self.timeout_s:g} s "
                                 "(APPLIANCE_DISCOVERY_TIMEOUT)") from None
        finally:
            _kill_group(proc)  # anything it left behind in its session
        if proc.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
            how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else
                   f"exited with code {proc.returncode}")
            raise DiscoveryError(f"host discovery script {self.script} {how}" + (f": {last}" if last else ""))
        return parse_hosts_output(out[:MAX_OUTPUT].decode(errors="replace"), f"host discovery script {self.script}",
                                  self.default_slots)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass


class FixedDiscovery:
    """The hosts given with -H, --hostfile or by a Slurm allocation, always the same."""

    def __init__(self, hosts: Mapping[str, int]):
        self.hosts = dict(hosts)

    def describe(self) -> str:
        return "the fixed host list"

    def find(self) -> dict[str, int]:
        return dict(self.hosts)


__all__ = ["DiscoveryError", "FixedDiscovery", "ScriptDiscovery", "parse_hosts_output", "resolve_script"]
