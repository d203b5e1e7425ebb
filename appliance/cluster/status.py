"""``appliance status``: the appliance containers on this Docker engine and their health, and the
secondaries registered on the shared mount.

What it owns: ``list_containers()`` (every container labelled ``appliance.managed``, running or not,
as ``ContainerInfo`` rows), ``list_secondaries()`` (the registrations under ``SHARED/secondaries/``,
read through ``mount.registry``, as ``SecondaryInfo`` rows: name, slots, SSH port, container,
heartbeat age, live or stale by ``APPLIANCE_SECONDARY_STALE`` as the elastic primary's discovery
counts them), ``list_jobs()`` (the jobs running on each share: their record's
``SHARED/jobs/<id>/live.json``, written by the launcher's observer while the job runs, as
``JobInfo`` rows: id, hosts, ranks, step, steps/s, age; a job whose file has not changed for
``JOB_STALE_S`` is not running; each field is checked, and a job whose file is not a readable
regular file of the record's fields is skipped and said, without blocking on a FIFO) and
``render()`` (rich tables: the containers' name, role, state, health, network and address, SSH port,
shared directory, job, image, age; then each share's secondaries and running jobs). Containers of
other tools are never listed. Env vars: none read here (the CLI passes the share and the stale
threshold). Failure modes: ``ClusterError`` when Docker is unreachable; a share that is not a
directory has no secondaries; a record that cannot be read (a secondary's or a job's) is skipped and
said through the callers' ``on_skip``; a ``jobs/`` that cannot be listed is said as such
(``on_unlisted``), not as "no job running".
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import time
from typing import IO, Any, Callable, Iterable, Mapping, Optional

from . import docker
from ..mount import Layout
from ..mount.atomic import read_small
from ..mount.registry import is_live, registrations

LIVE = "live.json"  # the record's file for this command (observe/record.py writes it)
JOB_STALE_S = 30.0  # a running job's live.json is rewritten every few seconds


@dataclasses.dataclass(frozen=True)
class ContainerInfo:
    name: str
    role: str
    state: str
    health: str
    network: str
    address: str
    ssh_port: str
    shared: str
    job: str
    image: str
    created: str

    @property
    def healthy(self) -> bool:
        return self.state == "running" and self.health in ("healthy", "running")


@dataclasses.dataclass(frozen=True)
class SecondaryInfo:
    shared: str
    name: str
    slots: int
    ssh_port: int
    container: str
    heartbeat_age_s: float
    live: bool


@dataclasses.dataclass(frozen=True)
class JobInfo:
    shared: str
    job: str
    hosts: tuple
    ranks: int
    reporting: int
    step: Optional[float]
    total_steps: Optional[int]
    steps_per_s: Optional[float]
    age_s: float


MAX_LIVE_BYTES = 4 << 20  # a live.json is a few hundred bytes (its hosts' names)


def _finite(live: dict, key: str, required: bool = False) -> Optional[float]:
    v = live.get(key)
    if v is None and not required:
        return None
    if type(v) not in (int, float) or not math.isfinite(v):
        raise ValueError(f"{key!r} must be a finite number, got {json.dumps(v)[:40]}")
    return float(v)


def _count(live: dict, key: str) -> int:
    v = live.get(key)
    if v is None:
        return 0
    if type(v) is not int or v < 0:  # noqa: E721 - a bool is not a count
        raise ValueError(f"{key!r} must be a whole number from 0, got {json.dumps(v)[:40]}")
    return v


def job_row(shared: str, job: str, live: object, now: float, stale_after_s: float) -> Optional[JobInfo]:
    """The row of one job's ``live.json`` content; None when the job has ended or its file is stale;
    ``ValueError`` naming the field when the content is not what the record writes."""
    if not isinstance(live, dict):
        raise ValueError(f"not a JSON object but {type(live).__name__}")
    if _finite(live, "ended") is not None:
        return None
    updated = _finite(live, "updated") or 0.0
    if now - updated > stale_after_s:
        return None
    hosts = live.get("hosts") or []
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ValueError(f"'hosts' must be a list of host names, got {json.dumps(hosts)[:40]}")
    total = _count(live, "total_steps")
    started = _finite(live, "started")
    return JobInfo(shared=shared, job=job, hosts=tuple(hosts), ranks=_count(live, "ranks"),
                   reporting=_count(live, "reporting"), step=_finite(live, "step"), total_steps=total or None,
                   steps_per_s=_finite(live, "steps_per_s"),
                   age_s=max(0.0, now - (now if started is None else started)))


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a symlink loop: not a job directory
        return False


def list_jobs(shares: Iterable[str], now: Optional[float] = None, stale_after_s: float = JOB_STALE_S,
              on_skip: Optional[Callable[[str, str], None]] = None,
              on_unlisted: Optional[Callable[[str, str], None]] = None) -> list[JobInfo]:
    """The jobs running on each share (see the module docstring), oldest first. A job directory
    whose ``live.json`` cannot be read (not a regular file, no permission, not JSON, a field of the
    wrong type) is skipped and said through ``on_skip(path, why)``; a share whose ``jobs/`` cannot
    be listed (no permission, not a directory) through ``on_unlisted(shared, why)``. Never blocks
    on a FIFO."""
    now = time.time() if now is None else now
    rows = []
    for shared in dict.fromkeys(shares):
        jobs = Layout(shared).jobs
        try:
            with os.scandir(jobs) as it:
                entries = sorted((e.name, _is_dir(e)) for e in it)
        except FileNotFoundError:
            continue
        except OSError as e:
            if on_unlisted is not None:
                on_unlisted(shared, f"cannot read {jobs}: {e.strerror or e}")
            continue
        for name, is_dir in entries:
            if not is_dir:  # a stray file beside the job directories
                continue
            path = os.path.join(jobs, name, LIVE)
            try:
                text, _ = read_small(path, MAX_LIVE_BYTES)
                if text is None:  # no record (yet)
                    continue
                try:
                    live = json.loads(text)
                except (ValueError, RecursionError) as e:
                    raise ValueError(f"not JSON ({type(e).__name__})") from None
                row = job_row(shared, name, live, now, stale_after_s)
            except ValueError as e:  # NotReadable too
                if on_skip is not None:
                    on_skip(path, str(e))
                continue
            if row is not None:
                rows.append(row)
    return sorted(rows, key=lambda r: -r.age_s)


def _age(created: str) -> str:
    try:
        t = datetime.datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00" if "." in created[:26]
                                            else created.replace("Z", "+00:00"))
    except ValueError:
        return "?"
    s = int((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds())
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def list_containers(client: Optional[Any] = None) -> list[ContainerInfo]:
    client = client or docker.connect()
    rows = []
    for c in client.containers.list(all=True, filters={"label": f"{docker.MANAGED}=1"}):
        network = docker.label(c, "appliance.network", "?")
        nets = c.attrs.get("NetworkSettings", {}).get("Networks") or {}
        address = "" if network == "host" else (nets.get(network) or {}).get("IPAddress", "")
        rows.append(ContainerInfo(
            name=c.name, role=docker.label(c, docker.ROLE, "?"), state=c.status, health=docker.health(c),
            network=network, address=address, ssh_port=docker.label(c, "appliance.ssh-port"),
            shared=docker.label(c, "appliance.shared"), job=docker.label(c, "appliance.job"),
            image=docker.label(c, "appliance.image") or (c.attrs.get("Config", {}).get("Image", "")),
            created=_age(c.attrs.get("Created", ""))))
    return sorted(rows, key=lambda r: (r.role != "secondary", r.name))


def list_secondaries(shares: Iterable[str], stale_after_s: float, now: Optional[float] = None,
                     on_skip: Optional[Callable[[str, str], None]] = None) -> list[SecondaryInfo]:
    """The registrations on each share (one that is not a directory has none), oldest registration
    first, with their heartbeat age and whether discovery counts them; ``on_skip(path, why)`` for
    each file that is not a usable record."""
    now = time.time() if now is None else now
    rows = []
    for shared in dict.fromkeys(shares):
        if not os.path.isdir(shared):
            continue
        for reg, beat_at in registrations(Layout(shared), on_skip):
            rows.append(SecondaryInfo(shared=shared, name=reg.name, slots=reg.slots, ssh_port=reg.ssh_port,
                                      container=reg.container, heartbeat_age_s=max(0.0, now - beat_at),
                                      live=is_live(beat_at, now, stale_after_s)))
    return rows


def _beat_age(s: float) -> str:
    return f"{s:.1f}s ago" if s < 120 else f"{int(s) // 60}m ago" if s < 7200 else f"{int(s) // 3600}h ago"


def shares_of(rows: Iterable[ContainerInfo], default: str) -> list[str]:
    """The shares to read: ``default`` and those of the containers, each directory once."""
    out, seen = [], set()
    for shared in [default, *(r.shared for r in rows)]:
        key = os.path.realpath(shared) if shared else ""
        if shared and key not in seen and os.path.isdir(shared):
            seen.add(key)
            out.append(shared)
    return out


def render(rows: Optional[list[ContainerInfo]], out: IO[str], secondaries: Optional[list[SecondaryInfo]] = None,
           shares: Iterable[str] = (), jobs: Optional[list[JobInfo]] = None,
           unlisted: Optional[Mapping[str, str]] = None) -> None:
    """The containers' table (none when ``rows`` is None: Docker did not answer), then each share's
    secondaries, then the jobs running on it (``unlisted``: share -> why its jobs could not be
    listed, said instead of "no job running")."""
    from rich.console import Console
    from rich.table import Table

    probe = Console(file=out)
    console = Console(file=out, highlight=False, width=probe.width if probe.is_terminal else 220)
    if rows is not None and not rows:
        console.print("no appliance containers here (start one with: appliance secondary --ssh-port 12345)")
    elif rows:
        console.print(_containers_table(rows, Table))
    if secondaries is not None:
        _render_secondaries(console, secondaries, shares)
    if jobs is not None:
        _render_jobs(console, jobs, shares, unlisted or {})


def _hosts_text(hosts: tuple) -> str:
    return ", ".join(hosts) if len(hosts) <= 4 else f"{', '.join(hosts[:3])} +{len(hosts) - 3}"


def _render_jobs(console: Any, rows: list[JobInfo], shares: Iterable[str], unlisted: Mapping[str, str]) -> None:
    from rich.markup import escape
    from rich.table import Table

    for shared in dict.fromkeys(shares):
        mine = [r for r in rows if r.shared == shared]
        if not mine and shared in unlisted:
            console.print(f"jobs on {shared}: not known ({unlisted[shared]})", markup=False)
            continue
        if not mine:
            console.print(f"no job running on {shared}")
            continue
        table = Table(title=f"jobs running on {shared}", title_justify="left", show_lines=False)
        for col in ("job", "hosts", "ranks", "step", "steps/s", "age"):
            table.add_column(col)
        for r in mine:
            step = "-" if r.step is None else f"{r.step:.0f}" + (f"/{r.total_steps}" if r.total_steps else "")
            ranks = str(r.ranks) if r.reporting in (0, r.ranks) else f"{r.reporting}/{r.ranks}"
            sps = "-" if r.steps_per_s is None else f"{r.steps_per_s:.2f}"
            table.add_row(escape(r.job), escape(_hosts_text(r.hosts)), ranks, step, sps,
                          _beat_age(r.age_s).removesuffix(" ago"))
        console.print(table)


def _containers_table(rows: list[ContainerInfo], Table: Any) -> Any:
    table = Table(show_lines=False)
    for col in ("name", "role", "state", "health", "network", "ssh port", "shared", "job", "image", "age"):
        table.add_column(col)
    for r in rows:
        color = "green" if r.healthy else "red" if r.state != "running" or r.health == "unhealthy" else "yellow"
        net = r.network + (f" {r.address}" if r.address else "")
        table.add_row(r.name, r.role, r.state, f"[{color}]{r.health}[/{color}]", net, r.ssh_port, r.shared,
                      r.job or "-", r.image, r.created)
    return table


def _render_secondaries(console: Any, rows: list[SecondaryInfo], shares: Iterable[str]) -> None:
    from rich.table import Table

    for shared in dict.fromkeys(shares):
        mine = [r for r in rows if r.shared == shared]
        if not mine:
            console.print(f"no secondary registered on {shared}")
            continue
        table = Table(title=f"secondaries registered on {shared}", title_justify="left", show_lines=False)
        for col in ("name", "slots", "ssh port", "container", "heartbeat", "state"):
            table.add_column(col)
        for r in mine:
            state = "[green]live[/green]" if r.live else "[red]stale[/red]"
            table.add_row(r.name, str(r.slots), str(r.ssh_port), r.container or "-", _beat_age(r.heartbeat_age_s),
                          state)
        console.print(table)
