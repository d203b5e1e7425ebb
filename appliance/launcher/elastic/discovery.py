"""Host discovery for elastic jobs: which hosts, with how many slots, are available now.

What it owns: ``parse_hosts_output`` (the discovery script's output format, Horovod's: one host
per line, ``host:slots`` or ``host`` (then ``--slots-per-host``, default 1); IPv6 addresses in
brackets, ``[::1]:2``; blank lines and ``#`` comments skipped; the same line twice counts once),
``ScriptDiscovery`` (runs the script as an argv, never through a shell, in a session of its own,
bounded by ``APPLIANCE_DISCOVERY_TIMEOUT``; its whole process group is killed on timeout; its
output is read as it comes and a run that prints more than ``MAX_OUTPUT`` bytes fails) and
``FixedDiscovery`` (the -H/--hostfile/Slurm hosts, for fault tolerance over a fixed list). Both
answer ``find() -> {host: slots}`` in the order the hosts were printed, and ``close()``
(thread-safe, also as a context manager): a run in flight is killed with its process group and
reaped, a ``find()`` blocked in it raises at once, and every later ``find()`` raises.

Every name is checked before it can reach an SSH command line: a name that could pass for an
option (``-oProxyCommand=...``) or holds anything but letters, digits and ``_ . : % -`` (shell
characters, spaces, ``user@host``) is refused with the script, the line number and the line.
The MPI Operator's ``/etc/mpi/discover_hosts.sh`` (plain host names, one per line) works as it is.

Env vars: none read (``ElasticConfig`` carries the interval and timeout); the script runs with
the launcher's environment. Failure modes: ``DiscoveryError`` naming the script and the reason:
missing, not executable, exit status, timeout, too much output, the malformed line, or closed.
"""
from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from typing import Mapping

from ..hosts import HostsError, check_host_name, parse_slots, shown

MAX_OUTPUT = 1 << 20  # bytes of script output a run may print; more fails the run
_STDERR_KEPT = 1 << 16  # bytes of the script's stderr kept (its last line is shown)


class DiscoveryError(RuntimeError):
    """The discovery script could not be used this time; the message names it and why."""


def parse_hosts_output(text: str, source: str, default_slots: int | None = None) -> dict[str, int]:
    """Discovery output -> ``{host: slots}`` in the order printed (see the module docstring)."""
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}, line {number} ({shown(line)})"
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
    """Runs the discovery script (see the module docstring). ``close()`` (thread-safe) kills a run
    in flight, its whole session, and makes every later ``find()`` raise ``DiscoveryError`` at once."""

    def __init__(self, script: str, default_slots: int | None, timeout_s: float, environ: Mapping[str, str],
                 cwd: str | None = None):
        if not timeout_s > 0:
            raise ValueError(f"the discovery timeout must be positive, got {timeout_s!r}")  # a run is always bounded
        self.script, self.default_slots, self.timeout_s = script, default_slots, timeout_s
        self.environ, self.cwd = dict(environ), cwd
        self._lock = threading.Lock()
        self._closed = False
        self._run: _Run | None = None

    def describe(self) -> str:
        return f"host discovery script {self.script}"

    def __enter__(self) -> "ScriptDiscovery":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kill the run in flight (its process group) and wait for it; later ``find()`` calls fail."""
        with self._lock:
            self._closed = True
            run = self._run
        if run is not None:
            run.cancel()

    def _closed_error(self) -> DiscoveryError:
        return DiscoveryError(f"{self.describe()}: discovery is closed")

    def find(self) -> dict[str, int]:
        if self._closed:
            raise self._closed_error()
        path = resolve_script(self.script, self.environ)
        with self._lock:  # start under the lock: close() either sees this run or stops it from starting
            if self._closed:
                raise self._closed_error()
            try:
                run = _Run([path], self.environ, self.cwd)
            except OSError as e:
                raise DiscoveryError(f"host discovery script {self.script}: cannot run it: {e.strerror}") from None
            self._run = run
        try:
            out, err, status = run.collect(self.timeout_s, MAX_OUTPUT)
        finally:
            run.cancel()  # anything it left behind in its session
            with self._lock:
                self._run = None
            run.close()
        if status == "cancelled":
            raise self._closed_error()
        if status == "too much":
            raise DiscoveryError(f"host discovery script {self.script}: its output exceeded {MAX_OUTPUT} bytes "
                                 "(nothing of it is used)")
        if status == "timeout":
            raise DiscoveryError(f"host discovery script {self.script}: did not finish within {self.timeout_s:g} s "
                                 "(APPLIANCE_DISCOVERY_TIMEOUT)")
        code = run.proc.returncode
        if code != 0:
            last = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise DiscoveryError(f"host discovery script {self.script} {how}" + (f": {last}" if last else ""))
        return parse_hosts_output(out.decode(errors="replace"), f"host discovery script {self.script}",
                                  self.default_slots)


class _Run:
    """One run of the script in a session of its own: its output read as it comes, and a wake-up
    pipe so that ``cancel()`` from another thread ends ``collect()`` at once."""

    def __init__(self, argv: list[str], environ: Mapping[str, str], cwd: str | None):
        self._wake_r, self._wake_w = os.pipe()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=dict(environ), cwd=cwd,
                                         start_new_session=True, close_fds=True)
        except BaseException:
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise
        self._cancel_lock = threading.Lock()
        self._cancelled = False
        self._reaped = False
        self._fds_closed = False

    def collect(self, timeout_s: float, max_output: int) -> tuple[bytes, bytes, str]:
        """(stdout, stderr, "done" | "timeout" | "cancelled" | "too much"): read as it comes, at
        most ``max_output`` bytes of stdout kept (one more ends the run as "too much")."""
        deadline = time.monotonic() + timeout_s
        out, err = bytearray(), bytearray()
        streams = {self.proc.stdout.fileno(): out, self.proc.stderr.fileno(): err}
        status = "done"
        with selectors.DefaultSelector() as sel:
            for fd in streams:
                sel.register(fd, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while len(sel.get_map()) > 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    status = "timeout"
                    break
                ready = sel.select(left)
                if self._cancelled:
                    status = "cancelled"
                    break
                for key, _ in ready:
                    if key.fd == self._wake_r:
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    buf = streams[key.fd]
                    buf += chunk
                    if key.fd == self.proc.stderr.fileno() and len(buf) > _STDERR_KEPT:
                        del buf[:len(buf) - _STDERR_KEPT]  # only its last line is ever shown
                    elif buf is out and len(out) > max_output:
                        status = "too much"
                if status != "done":
                    break
        if status == "done":
            left = max(0.0, deadline - time.monotonic())
            try:
                self.proc.wait(timeout=left)  # output closed: it has ended, or it will within the limit
            except subprocess.TimeoutExpired:
                status = "timeout"
        if self._cancelled:
            status = "cancelled"
        return bytes(out), bytes(err), status

    def cancel(self) -> None:
        """Kill the script's whole process group, reap it and close the pipes (idempotent)."""
        with self._cancel_lock:
            if self._fds_closed:
                return
            first = not self._cancelled
            self._cancelled = True
            if first:
                try:
                    os.write(self._wake_w, b"x")
                except OSError:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if not self._reaped:
                try:
                    self.proc.wait(timeout=2)
                    self._reaped = True
                except subprocess.TimeoutExpired:
                    pass

    def close(self) -> None:
        """Close the pipes; only the thread that ran ``collect()`` calls it, after ``cancel()``."""
        with self._cancel_lock:
            self._fds_closed = True
            for f in (self.proc.stdout, self.proc.stderr):
                f.close()
            os.close(self._wake_r)
            os.close(self._wake_w)


class FixedDiscovery:
    """The hosts given with -H, --hostfile or by a Slurm allocation, always the same."""

    def __init__(self, hosts: Mapping[str, int]):
        self.hosts = dict(hosts)
        self._closed = False

    def describe(self) -> str:
        return "the fixed host list"

    def __enter__(self) -> "FixedDiscovery":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True

    def find(self) -> dict[str, int]:
        if self._closed:
            raise DiscoveryError(f"{self.describe()}: discovery is closed")
        return dict(self.hosts)


__all__ = ["DiscoveryError", "FixedDiscovery", "ScriptDiscovery", "parse_hosts_output", "resolve_script"]
