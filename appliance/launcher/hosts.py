"""Hosts, slots and the rank layout: pure functions, no I/O beyond reading a hostfile.

What it owns: parsing ``-H host:slots,...`` and hostfiles (OpenMPI's ``host slots=N
[max_slots=M]`` and MPICH/Intel's ``host:N`` lines, ``#`` comments), the job's hosts (``hosts_from``: -H, else the hostfile, else the Slurm allocation,
else ``localhost``), and assigning ranks to slots the way horovodrun does: hosts in the order
given, each host's slots filled before the next host's, ``local_rank`` counting within a host
and ``cross_rank``/``cross_size`` as ``appliance.common.ranks.cross_of`` defines them. Each
rank's place is an ``appliance.common.ranks.Slot``, the type a Slurm task reads for itself too.
``merge_hosts`` folds entries that a caller-given key says are one machine into one host (first
name and place kept, slots summed); deciding that (name resolution) is
``executors.merge_same_machines``'s part.

Inside a Slurm allocation, with neither ``-H`` nor a hostfile, the hosts are the allocation's
nodes and tasks (``appliance.common.slurm.SlurmAllocation.nodes``: ``SLURM_JOB_NODELIST``,
``SLURM_TASKS_PER_NODE`` or else ``SLURM_NTASKS_PER_NODE``); this module checks every node name
as a host name.

Env vars: none read here (``SlurmAllocation`` carries Slurm's). Failure modes: every malformed
input raises ``HostsError`` (a ``ValueError``) whose message names the offending entry, and for
hostfiles the file and line number; asking for more processes than there are slots says how
many slots exist.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import select
import stat
import time
from typing import Callable, Iterable, Sequence

from appliance.common.ranks import Slot, cross_of
from appliance.common.slurm import SlurmAllocation, SlurmEnvError

__all__ = ["Host", "HostsError", "Slot", "check_host_name", "shown", "parse_slots", "parse_hosts", "parse_hostfile",
           "read_hostfile", "allocation_hosts",
           "hosts_from", "total_slots", "assign_ranks", "merge_hosts", "used_hosts"]


class HostsError(ValueError):
    """A host list, hostfile or process count cannot be used; the message names the culprit."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int


_NAME = re.compile(r"^[A-Za-z0-9_.:%\-]+$")  # host names, IPv4, IPv6 (with %scope)
_DIGITS = re.compile(r"^-?[0-9]{1,18}$")  # ASCII digits only: int() would take "1_0" and "٢"


def shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for a message, at most ``limit`` characters of it (a line of a megabyte
    makes no readable error)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def check_host_name(raw: str, where: str) -> str:
    """``raw`` as a host name (brackets of an IPv6 address removed); ``HostsError`` naming ``where``
    when it holds anything but letters, digits and ``_ . : % -``, or a colon outside an IPv6
    address (``localhost:2:3`` is neither a host nor ``host:slots``)."""
    name = raw.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]  # [v6 address]
    if not name or not _NAME.match(name) or name.count(":") == 1:  # one colon: "host:slots" in the wrong place
        raise HostsError(f"{where}: {shown(raw.strip())} is not a host name")
    if ":" in name:
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            raise HostsError(f"{where}: {shown(raw.strip())} is not a host name (only an IPv6 address holds colons; "
                             "with slots it is written [address]:slots)") from None
    return name


def parse_slots(raw: str, where: str) -> int:
    """A slot count (ASCII digits, at least 1); ``HostsError`` naming ``where`` otherwise."""
    text = raw.strip()
    if not _DIGITS.match(text):
        raise HostsError(f"{where}: slots must be a whole number, got {shown(text)}")
    n = int(text)
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
        where = f"-H entry {i + 1} ({shown(entry.strip())})"
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
            slots = parse_slots(rest[1:], where) if rest else 1
        elif entry.count(":") == 1:
            name, raw = entry.split(":")
            slots = parse_slots(raw, where)
        else:  # plain name, or a bare IPv6 address (1 slot)
            name, slots = entry, 1
        hosts.append(Host(check_host_name(name, where), slots))
    return _check_unique(hosts, f"-H {spec!r}")


def parse_hostfile(text: str, source: str = "hostfile", default_slots: int = 1) -> list[Host]:
    """Hostfile text -> hosts. Lines in either dialect: OpenMPI's ``host [slots=N] [max_slots=M]``
    or MPICH/Intel's ``host[:N]``; a line without slots gets ``default_slots``; names are kept as
    given (fully qualified ones too); ``#`` starts a comment."""
    hosts = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{source}:{number}"
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        try:
            hosts.append(_hostfile_line(body, line, where, default_slots))
        except HostsError as e:
            if shown(line.strip()) in str(e):
                raise
            raise HostsError(f"{e} (line {shown(line.strip())})") from None
    if not hosts:
        raise HostsError(f"{source}: no hosts in the file")
    return _check_unique(hosts, source)


def _hostfile_line(body: str, line: str, where: str, default_slots: int = 1) -> Host:
    fields = body.split()
    expected = f"{where}: expected 'host slots=N' or 'host:N', got {shown(line.strip())}"
    first = fields[0]
    slots = default_slots
    if first.count(":") == 1 and not first.startswith("["):  # host:N (one colon: not an IPv6 address)
        first, _, count = first.partition(":")
        if not count or len(fields) > 1:
            raise HostsError(expected)
        slots = parse_slots(count, where)
    elif first.startswith("[") and "]:" in first:  # [v6]:N
        first, _, count = first[1:].partition("]:")
        slots = parse_slots(count, where)
    name = check_host_name(first, where)
    seen = set()
    for field in fields[1:]:
        key, eq, value = field.partition("=")
        if key not in ("slots", "max_slots") or not eq or key in seen:
            raise HostsError(expected)
        seen.add(key)
        n = parse_slots(value, where)
        if key == "slots":
            slots = n
    return Host(name, slots)


MAX_HOSTFILE = 16 << 20  # bytes
PIPE_WAIT_S = 10.0


def read_hostfile(path: str | os.PathLike, default_slots: int = 1) -> list[Host]:
    """Read and parse a hostfile; a missing or unreadable file is a ``HostsError`` naming it, and
    so is anything but a regular file or a pipe (a pipe is read for at most ``PIPE_WAIT_S``; a FIFO
    with no writer is empty) or one over ``MAX_HOSTFILE``."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise HostsError(f"hostfile {name!r}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise HostsError(f"hostfile {name!r}: not a regular file or a pipe")
        data = bytearray()
        deadline = time.monotonic() + PIPE_WAIT_S  # a pipe (--hostfile <(...)) gets this long to say it all
        while len(data) <= MAX_HOSTFILE:
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise HostsError(f"hostfile {name!r}: the pipe said nothing more for {PIPE_WAIT_S:g} s") from None
                continue
            if not chunk:
                break  # the end (a FIFO with no writer ends at once)
            data += chunk
    except OSError as e:
        raise HostsError(f"hostfile {name!r}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_HOSTFILE:
        raise HostsError(f"hostfile {name!r}: larger than {MAX_HOSTFILE} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HostsError(f"hostfile {name!r}: not text ({e.reason})") from None
    return parse_hostfile(text, name, default_slots)


def allocation_hosts(allocation: SlurmAllocation) -> list[Host]:
    """The hosts of a Slurm allocation (``SlurmAllocation.nodes``), every node name checked."""
    try:
        nodes = allocation.nodes()
    except SlurmEnvError as e:
        raise HostsError(str(e)) from None
    hosts = [Host(check_host_name(name, "SLURM_JOB_NODELIST"), tasks) for name, tasks in nodes]
    return _check_unique(hosts, f"SLURM_JOB_NODELIST={allocation.nodelist!r}")


def hosts_from(hosts: str | None, hostfile: str | None, slurm: SlurmAllocation | None,
               np: int | None, default_slots: int = 1) -> list[Host]:
    """The job's hosts: -H, else --hostfile (``default_slots`` for its lines without slots), else
    the Slurm allocation (when ``slurm`` names nodes), else ``localhost:np``."""
    if hosts is not None:
        return parse_hosts(hosts)
    if hostfile is not None:
        return read_hostfile(hostfile, default_slots)
    if slurm is not None and slurm.nodelist:
        return allocation_hosts(slurm)
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
    counts, left = [], np  # ranks per host: each host's slots filled before the next host's
    for h in hosts:
        counts.append(min(h.slots, left))
        left -= counts[-1]
    slots = []
    for index, (h, count) in enumerate(zip(hosts, counts)):
        for local_rank in range(count):
            cross_rank, cross_size = cross_of(counts, index, local_rank)
            slots.append(Slot(rank=len(slots), size=np, local_rank=local_rank, local_size=count,
                              cross_rank=cross_rank, cross_size=cross_size, host=h.name))
    return slots


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
