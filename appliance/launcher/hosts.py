"""Hosts, slots and the rank layout: pure functions, no I/O beyond reading a hostfile.

What it owns: parsing ``-H host:slots,...`` and hostfiles (``host slots=N`` lines, ``#``
comments), and assigning ranks to slots the way horovodrun does: hosts in the order given, each
host's slots filled before the next host's, ``local_rank`` counting within a host and
``cross_rank``/``cross_size`` counting the hosts that hold the same ``local_rank`` (Horovod's
definition; for the usual layout with equal ranks per host that is simply the host's index and
the number of hosts). ``merge_hosts`` folds entries that a caller-given key says are one machine
into one host (first name and place kept, slots summed); deciding that (name resolution) is
``executors.merge_same_machines``'s part.

Inside a Slurm allocation, with neither ``-H`` nor a hostfile, the hosts are Slurm's:
``SLURM_JOB_NODELIST`` in its compressed form (``node[01-03,07],gpu-a[1-2]-x``) and the slots
from ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) or else ``SLURM_NTASKS_PER_NODE``; ``appliance.common.slurm``
expands those forms, and this module checks every name as a host name.

Env vars: the three Slurm variables, read through ``appliance.common.slurm.SlurmAllocation``.
Failure modes: every malformed input raises ``HostsError`` (a ``ValueError``) whose message
names the offending entry, and for hostfiles the file and line number; asking for more
processes than there are slots says how many slots exist.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable, Iterable, Sequence

from appliance.common import slurm


class HostsError(ValueError):
    """A host list, hostfile or process count cannot be used; the message names the culprit."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int


@dataclasses.dataclass(frozen=True)
class Slot:
    """One rank's place in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host: str


_NAME = re.compile(r"^[A-Za-z0-9_.:%\-]+$")  # host names, IPv4, IPv6 (with %scope)


def _host_name(raw: str, where: str) -> str:
    name = raw.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]  # [v6 address]
    if not name or not _NAME.match(name) or name.count(":") == 1:  # one colon: "host:slots" in the wrong place
        raise HostsError(f"{where}: {raw.strip()!r} is not a host name")
    return name


def _slots(raw: str, where: str) -> int:
    try:
        n = int(raw.strip())
    except ValueError:
        raise HostsError(f"{where}: slots must be a whole number, got {raw.strip()!r}") from None
    if n < 1:
        raise HostsError(f"{where}: slots must be at least 1, got {n}")
    return n


def _check_unique(hosts: Sequence[Host], where: str) -> list[Host]:
    seen: set[str] = set()
    for h in hosts:
        if h.name in seen:
            raise HostsError(f"{where}: host {h.name!r} is listed more than once (give it all its slots in one entry)")
        seen.add(h.name)
    return list(hosts)


def parse_hosts(spec: str) -> list[Host]:
    """``"a:2,b:1"`` -> ``[Host("a", 2), Host("b", 1)]``; a host without ``:slots`` has 1 slot.

    IPv6 addresses are written in brackets when they carry a slot count: ``[::1]:2``.
    """
    hosts = []
    for i, entry in enumerate(spec.split(",")):
        where = f"-H entry {i + 1} ({entry.strip()!r})"
        entry = entry.strip()
        if not entry:
            raise HostsError(f"-H {spec!r}: entry {i + 1} is empty")
        if entry.startswith("["):  # [v6]:slots or [v6]
            close = entry.find("]")
            if close < 0:
                raise HostsError(f"{where}: missing ']'")
            name, rest = entry[: close + 1], entry[close + 1:]
            if rest and not rest.startswith(":"):
                raise HostsError(f"{where}: expected ':slots' after ']'")
            slots = _slots(rest[1:], where) if rest else 1
        elif entry.count(":") == 1:
            name, raw = entry.split(":")
            slots = _slots(raw, where)
        else:  # plain name, or a bare IPv6 address (1 slot)
            name, slots = entry, 1
        hosts.append(Host(_host_name(name, where), slots))
    return _check_unique(hosts, f"-H {spec!r}")


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """Hostfile text -> hosts. Lines: ``host`` (1 slot) or ``host slots=N``; ``#`` starts a comment."""
    hosts = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{source}:{number}"
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        fields = body.split()
        name = _host_name(fields[0], where)
        slots = 1
        for field in fields[1:]:
            key, eq, value = field.partition("=")
            if key != "slots" or not eq:
                raise HostsError(f"{where}: expected 'host slots=N', got {line.strip()!r}")
            slots = _slots(value, where)
        if len(fields) > 2:
            raise HostsError(f"{where}: expected 'host slots=N', got {line.strip()!r}")
        hosts.append(Host(name, slots))
    if not hosts:
        raise HostsError(f"{source}: no hosts in the file")
    return _check_unique(hosts, source)


def read_hostfile(path: str | os.PathLike) -> list[Host]:
    """Read and parse a hostfile; a missing or unreadable file is a ``HostsError`` naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise HostsError(f"hostfile {os.fspath(path)!r}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise HostsError(f"hostfile {os.fspath(path)!r}: not text ({e.reason})") from None
    return parse_hostfile(text, os.fspath(path))


def expand_nodelist(spec: str, source: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Slurm's compressed host list -> names (``appliance.common.slurm.expand_nodelist``), every name checked."""
    try:
        names = slurm.expand_nodelist(spec, source)
    except slurm.SlurmEnvError as e:
        raise HostsError(str(e)) from None
    for name in names:
        _host_name(name, source)
    return names


def expand_tasks_per_node(spec: str, source: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]`` (``appliance.common.slurm.expand_tasks_per_node``)."""
    try:
        return slurm.expand_tasks_per_node(spec, source)
    except slurm.SlurmEnvError as e:
        raise HostsError(str(e)) from None


def slurm_hosts(nodelist: str, tasks_per_node: str | None = None, ntasks_per_node: str | None = None) -> list[Host]:
    """Hosts of a Slurm allocation; slots from SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE, else 1."""
    names = expand_nodelist(nodelist)
    if tasks_per_node:
        counts = expand_tasks_per_node(tasks_per_node)
        if len(counts) == 1:
            counts = counts * len(names)
        if len(counts) != len(names):
            raise HostsError(f"SLURM_TASKS_PER_NODE={tasks_per_node!r} gives {len(counts)} counts for "
                             f"{len(names)} nodes in SLURM_JOB_NODELIST={nodelist!r}")
    elif ntasks_per_node:
        counts = expand_tasks_per_node(ntasks_per_node, "SLURM_NTASKS_PER_NODE")[:1] * len(names)
    else:
        counts = [1] * len(names)
    return _check_unique([Host(n, c) for n, c in zip(names, counts)], f"SLURM_JOB_NODELIST={nodelist!r}")


def hosts_from(hosts: str | None, hostfile: str | None, slurm: object | None, np: int | None) -> list[Host]:
    """The job's hosts: -H, else --hostfile, else the Slurm allocation, else ``localhost:np``.

    ``slurm`` is an ``appliance.common.slurm.SlurmAllocation`` (or None).
    """
    if hosts is not None:
        return parse_hosts(hosts)
    if hostfile is not None:
        return read_hostfile(hostfile)
    nodelist = getattr(slurm, "nodelist", None)
    if nodelist:
        return slurm_hosts(nodelist, getattr(slurm, "tasks_per_node", None), getattr(slurm, "ntasks_per_node", None))
    return [Host("localhost", max(1, np or 1))]


def total_slots(hosts: Iterable[Host]) -> int:
    return sum(h.slots for h in hosts)


def assign_ranks(hosts: Sequence[Host], np: int) -> list[Slot]:
    """Place ``np`` ranks on ``hosts`` as horovodrun does; returns one ``Slot`` per rank, by rank."""
    if np < 1:
        raise HostsError(f"-np must be at least 1, got {np}")
    available = total_slots(hosts)
    if np > available:
        listing = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        raise HostsError(
            f"-np {np} asks for more processes than there are slots: {available} slot"
            f"{'s' if available != 1 else ''} on {len(hosts)} host{'s' if len(hosts) != 1 else ''} ({listing})")
    placed: list[tuple[str, int]] = []  # (host, local_rank) by rank
    per_host: dict[str, int] = {}
    for h in hosts:
        for local_rank in range(h.slots):
            if len(placed) == np:
                break
            placed.append((h.name, local_rank))
            per_host[h.name] = local_rank + 1
    # cross communicator: hosts that hold a given local_rank, in host order
    holders: dict[int, list[str]] = {}
    for host, local_rank in placed:
        holders.setdefault(local_rank, []).append(host)
    return [
        Slot(rank=rank, size=np, local_rank=local_rank, local_size=per_host[host],
             cross_rank=holders[local_rank].index(host), cross_size=len(holders[local_rank]), host=host)
        for rank, (host, local_rank) in enumerate(placed)
    ]


def merge_hosts(hosts: Sequence[Host], key: Callable[[str], object]) -> tuple[list[Host], list[list[str]]]:
    """Hosts whose ``key`` is equal (and not None) become one: the first one's name and place,
    slots summed. Returns the hosts and the groups of names that were merged (first name first)."""
    merged: dict[str, Host] = {}
    groups: dict[str, list[str]] = {}
    first_of: dict[object, str] = {}
    for h in hosts:
        k = key(h.name)
        head = first_of.setdefault(k, h.name) if k is not None else h.name
        if head in merged:
            merged[head] = Host(head, merged[head].slots + h.slots)
            groups[head].append(h.name)
        else:
            merged[head] = h
            groups[head] = [h.name]
    return list(merged.values()), [g for g in groups.values() if len(g) > 1]


def used_hosts(slots: Sequence[Slot]) -> list[str]:
    """Hosts that received at least one rank, in order."""
    return list(dict.fromkeys(s.host for s in slots))
