"""Preflight: everything that must hold on every host before ranks start, checked in parallel.

What it owns: ``run_preflight()``, used by ``appliance check`` and, for jobs with remote hosts,
by every launch (inside ``--start-timeout``). Per host, concurrently: the name resolves; TCP
reaches host:port (refused and timed out are different failures); the SSH handshake, host key
and key authentication succeed; the remote Python runs and imports ``appliance`` of the
primary's version; the working directory exists; the shared directory is really shared (a nonce
file written on the primary is read on the host; in a Kubernetes launcher pod, ``RemoteConfig.per_pod_share``,
a directory that is each pod's own, an emptyDir, is a note unless --shared asked for one share,
and the failure names the fix there: a ReadWriteMany persistentVolumeClaim); /dev/shm has room; then, across hosts, the
hostnames are unique and every host gets its address (``network.py``). The result is a
``Preflight`` that owns the open connections (the launch reuses them for its ranks) and lists
one actionable line per failure, prefixed with the host.

Per-host results use fabric's shapes: ``Preflight.results`` is a ``fabric.GroupResult`` (host
name -> its ``HostReport``, or a ``HostFailed`` carrying the report) with ``.succeeded`` and
``.failed``; ``Preflight.error()`` is a ``PreflightFailed`` (a ``fabric.exceptions.GroupException``)
carrying those partial results. The fan-out itself is one thread per host rather than
``fabric.ThreadingGroup``: a group runs one identical command on every host, while each host here
gets its own probe parameters and connect deadline, and its connection is kept for the launch.

Hooks: ``RemoteConfig.host_wait_s`` (default 0): how long a host's SSH port may refuse or not
answer TCP before that host fails (a secondary container still starting), retried with a pause
that doubles from 0.25 s to 2 s; a name that does not resolve fails at once, unless
``RemoteConfig.wait_dns`` (a Kubernetes launcher pod: a new pod's DNS record lags) retries it too. ``on_report(report)``: called once per host, in the calling thread, with
its ``HostReport`` once its checks are decided (the cross-host ones included, so after the last
host); the cluster plane writes its startup view's host files from it. An exception raised by
the hook becomes a warning line.

Env vars: none read (``RemoteConfig``). Failure modes: none raised for host problems (they are
report lines); a host that does not finish in time is reported with the step it was stuck at.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sys
import threading
import time
from typing import Sequence

from fabric import GroupResult
from fabric.exceptions import GroupException

from appliance.launcher.config import RemoteConfig
from . import network, probe
from .hostkeys import HostKeyPolicy
from .connection import Connection, SSHFailure, Target, connect, resolve

HOST_WAIT_RETRY_S = 0.25  # first pause between attempts while a host may still be starting (host_wait_s)
HOST_WAIT_MAX_S = 2.0     # the pause doubles up to this


@dataclasses.dataclass
class HostReport:
    host: str
    local: bool
    target: Target | None = None
    steps: dict = dataclasses.field(default_factory=dict)   # step -> short status for the table
    facts: dict = dataclasses.field(default_factory=dict)   # the probe's report
    address: str = ""                                       # where its ranks listen
    iface: str = ""
    failures: list = dataclasses.field(default_factory=list)
    conn: Connection | None = None
    done: bool = False
    step: str = "resolve"

    def fail(self, message: str) -> None:
        named = self.host in message.split(" ", 1)[0]  # "host:port refused...", "user@host:port did not..."
        self.failures.append(message if named else f"{self.host}: {message}")


class HostFailed(RuntimeError):
    """One host's checks failed; ``report`` holds everything that was found, ``str()`` its failure lines."""

    def __init__(self, report: HostReport):
        super().__init__("\n".join(report.failures))
        self.report = report


class PreflightFailed(GroupException):
    """Some hosts failed; ``result`` is the whole ``GroupResult`` (``.succeeded`` too), ``str()`` the lines."""

    def __init__(self, result: GroupResult):
        super().__init__(result)
        self.lines = [line for e in result.failed.values() for line in str(e).splitlines()]

    def __str__(self) -> str:
        return "\n".join(self.lines)


class Preflight:
    """Per-host reports and the connections they opened; ``with`` closes what the launch did not take."""

    def __init__(self, reports: dict[str, HostReport], warnings: list[str], notes: list[str]):
        self.reports, self.warnings, self.notes = reports, warnings, notes

    @property
    def failures(self) -> list[str]:
        return [f for r in self.reports.values() for f in r.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def results(self) -> GroupResult:
        """Host name -> ``HostReport`` (passed) or ``HostFailed`` (failed), in job order."""
        return GroupResult((h, HostFailed(r) if r.failures else r) for h, r in self.reports.items())

    def error(self) -> PreflightFailed | None:
        """The failure carrying every host's result, or None when all passed."""
        return None if self.ok else PreflightFailed(self.results)

    def take(self, host: str) -> Connection:
        """Hand the host's connection to a caller that will close it."""
        conn, self.reports[host].conn = self.reports[host].conn, None
        assert conn is not None, host
        return conn

    def close(self) -> None:
        for r in self.reports.values():
            if r.conn is not None:
                r.conn.close()
                r.conn = None

    def __enter__(self) -> "Preflight":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _probe_remote(report: HostReport, remote: RemoteConfig, python: str, params: dict, deadline: float) -> None:
    assert report.conn is not None
    with open(probe.__file__, "rb") as f:
        source = f.read()
    status, out, err = report.conn.exec([python, "-", json.dumps(params)], stdin=source,
                                        timeout=max(deadline - time.monotonic(), 0.5))
    last = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
    if status == 127 or "not found" in last.lower() and status != 0:
        report.steps["python"] = "missing"
        report.fail(f"Python {python} not found there ({last or 'exit 127'}): install the appliance on "
                    f"{report.host} at the same path, or pass --remote-python PATH (APPLIANCE_REMOTE_PYTHON)")
        return
    try:
        report.facts = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.steps["python"] = "failed"
        report.fail(f"{python} failed there (exit {status}): {last or 'no output'}")
        return


def _evaluate(report: HostReport, remote: RemoteConfig, nonce: str | None, python: str) -> str | None:
    """Turn the probe's facts into the host's steps and failures; returns a note line, if any."""
    facts = report.facts
    if not facts:
        return None
    report.steps["python"] = facts.get("python_version", "?")
    if "appliance_error" in facts:
        report.steps["appliance"] = "missing"
        report.fail(f"`import appliance` fails with {facts.get('python', python)}: {facts['appliance_error']} "
                    "(install the same appliance there, or point --remote-python at the Python that has it)")
    else:
        from appliance import __version__
        report.steps["appliance"] = facts.get("appliance", "?")
        if facts.get("appliance") != __version__:
            report.fail(f"appliance {facts.get('appliance')} there but {__version__} on the primary: install the "
                        "same version on every host")
    if not facts.get("cwd_ok", True):
        report.fail(f"the working directory {os.getcwd()} does not exist there: start the launcher from a "
                    "directory that exists on every host (e.g. under the shared mount)")
    shared, note = facts.get("shared"), None
    if nonce is not None and shared is not None:
        if not shared.get("exists"):
            report.steps["shared"] = "missing"
            report.fail(f"the shared directory {remote.shared_dir} does not exist there: mount the share at the "
                        "same path on every host (or pass --shared DIR)")
        elif shared.get("nonce") != nonce and remote.per_pod_share and not remote.shared_explicit:
            report.steps["shared"] = "its own"
            note = (f"{report.host}: {remote.shared_dir} there is its pod's own, not the launcher pod's (an emptyDir "
                    "is per pod): each pod's ranks write into their own; for one share, mount a ReadWriteMany "
                    f"persistentVolumeClaim at {remote.shared_dir} in every pod template")
        elif shared.get("nonce") != nonce:
            report.steps["shared"] = "not shared"
            fix = (f"on Kubernetes, mount one ReadWriteMany persistentVolumeClaim at {remote.shared_dir} in every pod "
                   "template (volumes: persistentVolumeClaim.claimName; an emptyDir is per pod)"
                   if remote.per_pod_share else f"mount the same share at {remote.shared_dir}")
            report.fail(f"{remote.shared_dir} there is not the primary's {remote.shared_dir} (a file written on "
                        f"the primary is not visible there): {fix}")
        else:
            report.steps["shared"] = "ok"
    free = facts.get("shm_free")
    report.steps["shm"] = "?" if free is None else f"{free / 2**20:.0f} MiB"
    if free is not None and free < remote.min_shm:
        report.fail(f"only {free / 2**20:.0f} MiB free in /dev/shm (need {remote.min_shm / 2**20:.0f} MiB): "
                    "give the container more (--shm-size=1g or --ipc=host) or remove stale files in /dev/shm")
    return note


def _resolve_waiting(host: str, remote: RemoteConfig, until: float) -> Target:
    """``resolve``, retrying with backoff until ``until`` while the name does not resolve."""
    pause = HOST_WAIT_RETRY_S
    while True:
        try:
            return resolve(host, remote)
        except SSHFailure:
            if time.monotonic() + pause >= until:
                raise
        time.sleep(pause)
        pause = min(pause * 2, HOST_WAIT_MAX_S)


def _connect(target: Target, policy: HostKeyPolicy, deadline: float, wait_until: float) -> Connection:
    """``connect``, retrying with backoff while TCP is refused or silent until ``wait_until``
    (``host_wait_s``), as OpenSSH's ``ConnectionAttempts``."""
    pause = HOST_WAIT_RETRY_S
    while True:
        try:
            return connect(target, policy, deadline)
        except SSHFailure as e:
            if e.step != "tcp" or time.monotonic() + pause >= min(wait_until, deadline):
                raise
        time.sleep(pause)
        pause = min(pause * 2, HOST_WAIT_MAX_S)


def _check_host(report: HostReport, remote: RemoteConfig, policy: HostKeyPolicy, python: str,
                params: dict, deadline: float, abandoned: threading.Event, wait_until: float) -> None:
    try:
        if report.target is None:  # not resolved yet: looked up again until host_wait_s (wait_dns)
            report.target = _resolve_waiting(report.host, remote, min(wait_until, deadline))
        report.step = "tcp"
        report.conn = _connect(report.target, policy, deadline, wait_until)
        report.steps.update(tcp="ok", ssh="ok")
        report.step = "probe"
        params = dict(params)
        if not params.get("targets"):
            params["targets"] = [report.conn.local_address]  # no peer: its route to the primary
        _probe_remote(report, remote, python, params, deadline)
    except SSHFailure as e:
        if e.step == "resolve":
            report.steps["tcp"] = "unresolved"
        elif e.step == "tcp":
            report.steps["tcp"] = _tcp_word(str(e))
            if remote.wait_dns and report.steps["tcp"] == "refused" and report.target is not None:
                port = report.target.port  # a Kubernetes pod: no `appliance secondary` to start there
                e = SSHFailure(e.host, e.step, (
                    f"{report.host}:{port} refused the connection for {remote.host_wait_s:g} s: no sshd listens on "
                    f"port {port} in that pod (its container is not up, or its sshd uses another port: the operators' "
                    "images use 2222, from ~/.ssh/config or /etc/ssh/ssh_config; -p overrides)"))
        else:
            report.steps["tcp"] = "ok"
            report.steps["ssh"] = {"auth": "denied", "hostkey": "host key", "ssh": "failed"}.get(e.step, "ok")
            if e.step == "exec":
                report.steps["python"] = "failed"
        report.fail(str(e))
    except Exception as e:  # noqa: BLE001 - one host's surprise must not hide the others' results
        report.fail(f"unexpected error at step {report.step}: {type(e).__name__}: {e}")
    finally:
        report.done = True
        if abandoned.is_set() and report.conn is not None:
            report.conn.close()
            report.conn = None


def _tcp_word(message: str) -> str:
    for word, short in (("refused", "refused"), ("did not answer", "timeout"), ("unreachable", "unreachable")):
        if word in message:
            return short
    return "failed"


def run_preflight(hosts: Sequence[str], local: set[str], remote: RemoteConfig, timeout_s: float, *,
                  cwd: str | None = None, check_shared: bool = True, on_report=None) -> Preflight:
    """Check ``hosts`` (names from -H, in job order; ``local`` are this machine) within ``timeout_s``
    (plus ``remote.host_wait_s`` for hosts still starting); ``on_report``: see the module docstring."""
    start = time.monotonic()
    wait_until = start + remote.host_wait_s
    deadline = wait_until + timeout_s
    cwd = cwd or os.getcwd()
    python = remote.remote_python or sys.executable
    policy = HostKeyPolicy(os.path.join(remote.shared_dir, "ssh", "known_hosts"), record=remote.record_hosts,
                           trusted_key=remote.key if not remote.record_hosts else None)
    reports = {h: HostReport(h, h in local) for h in hosts}
    warnings: list[str] = []
    notes: list[str] = []
    remotes = [h for h in hosts if h not in local]

    unresolved: dict[str, SSHFailure] = {}
    for h in remotes:  # names first (fast, local): the routes need them
        try:
            reports[h].target = resolve(h, remote)
        except SSHFailure as e:
            if remote.wait_dns and remote.host_wait_s > 0:
                unresolved[h] = e  # its thread looks it up again until host_wait_s (a pod not in DNS yet)
                continue
            reports[h].steps["tcp"] = "unresolved"
            reports[h].fail(str(e))
    connect_addr = {h: reports[h].target.address for h in remotes if reports[h].target is not None}

    primary_addr, primary_dev = None, ""
    first_remote = next((h for h in remotes if h in connect_addr), None)
    if first_remote is not None and remote.network_interface is None:
        route = probe.route_get(connect_addr[first_remote])
        try:
            primary_addr, primary_dev = network.choose("this machine", first_remote, route)
        except network.NetworkError as e:
            for h in hosts:
                if h in local:
                    reports[h].fail(str(e).replace("this machine", h, 1))

    nonce, nonce_file = None, None
    if check_shared and remotes:
        if os.path.isdir(remote.shared_dir):
            nonce, nonce_file = secrets.token_hex(16), f".appliance-check-{secrets.token_hex(6)}"
            try:
                with open(os.path.join(remote.shared_dir, nonce_file), "w") as f:
                    f.write(nonce)
            except OSError as e:
                notes.append(f"shared directory {remote.shared_dir} is not writable here ({e.strerror}); not checked")
                nonce = None
        elif remote.shared_explicit:
            for h in hosts:
                if h in local:
                    reports[h].fail(f"the shared directory {remote.shared_dir} does not exist on the primary")
        else:
            notes.append(f"no shared directory at {remote.shared_dir} on the primary; not checked (--shared DIR)")

    targets = network.reference_targets(hosts, local, connect_addr, primary_addr)
    base = {"cwd": cwd, "iface": remote.network_interface}
    if nonce is not None:
        base.update(shared_dir=remote.shared_dir, nonce_file=nonce_file)
    abandoned = threading.Event()
    threads = []
    for h in remotes:
        if reports[h].target is None and h not in unresolved:
            reports[h].done = True
            continue
        params = dict(base, targets=[targets[h]] if h in targets else [])
        t = threading.Thread(target=_check_host, name=f"preflight-{h}", daemon=True,
                             args=(reports[h], remote, policy, python, params, deadline, abandoned, wait_until))
        t.start()
        threads.append(t)
    for h in hosts:  # this machine: the same probe, in-process
        if h in local:
            reports[h].facts = probe.probe(dict(base, targets=[]))
            reports[h].steps.update(tcp="local", ssh="local")
            reports[h].done = True
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    abandoned.set()
    if nonce_file is not None:
        try:
            os.unlink(os.path.join(remote.shared_dir, nonce_file))
        except OSError:
            pass
    for h in remotes:
        r = reports[h]
        if not r.done:
            r.fail(f"no answer within {deadline - start:g} s (stuck at step {r.step}): check that {h} is up and its "
                   "sshd responds, or raise --start-timeout")
    warnings.extend(policy.warnings)
    for h in hosts:
        note = _evaluate(reports[h], remote, nonce, python)
        if note:
            notes.append(note)
    _unique_hostnames(reports)
    _addresses(hosts, reports, remote, targets, primary_addr, primary_dev)
    if on_report is not None:
        for h in hosts:
            try:
                on_report(reports[h])
            except Exception as e:  # noqa: BLE001 - a caller's hook must not hide the checks' results
                warnings.append(f"{h}: the report hook failed: {type(e).__name__}: {e}")
    return Preflight(reports, warnings, notes)


def _unique_hostnames(reports: dict[str, HostReport]) -> None:
    seen: dict[str, str] = {}
    for h, r in reports.items():
        name = r.facts.get("hostname")
        if not name:
            continue
        r.steps["hostname"] = name
        if name in seen and not (r.local and reports[seen[name]].local):
            r.fail(f"reports the same hostname {name!r} as {seen[name]}: these are one machine (list it once, with "
                   "all its slots) or the hosts need distinct hostnames")
        seen.setdefault(name, h)


def _addresses(hosts: Sequence[str], reports: dict[str, HostReport], remote: RemoteConfig,
               targets: dict[str, str], primary_addr: str | None, primary_dev: str) -> None:
    """Fill ``address``/``iface`` of every host that has no failure yet."""
    for h in hosts:
        r = reports[h]
        if r.failures:
            continue
        try:
            if remote.network_interface:
                iface = r.facts.get("iface") or {}
                r.address, r.iface = network.by_interface(h, remote.network_interface, iface.get("address"),
                                                          r.facts.get("interfaces", []))
            elif r.local:
                if primary_addr is None:  # only this machine in the job
                    r.address, r.iface = network.LOOPBACK
                else:
                    r.address, r.iface = primary_addr, primary_dev
            else:
                routes = r.facts.get("routes", {})
                target = targets.get(h) or next(iter(routes), None)
                peer = next((p for p in hosts if p != h), "the primary")
                r.address, r.iface = network.choose(h, peer, routes.get(target, {"error": "not probed"}))
            r.steps["network"] = f"{r.address} ({r.iface})"
        except network.NetworkError as e:
            r.steps["network"] = "failed"
            r.fail(str(e))
