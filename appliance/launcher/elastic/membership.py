"""An elastic job's membership, as pure logic: hosts, slots, the blacklist, resets, rank layout.

What it owns (no I/O, no threads; every clock reading is passed in as ``now``):
- ``Membership``: the hosts discovery has reported, each with its slots and the moment it (last)
  became available: older hosts come first, so they take the lowest ranks and rank 0 always
  holds up-to-date training state. ``update(discovered, now)`` applies one discovery result and
  says what changed (``HostUpdate``, Horovod's ``HostUpdateResult`` values: a host or slots
  appearing is ``added``, disappearing is ``removed``; a blacklisted host whose cool-down ended
  comes back as ``added``). ``blacklist(host, now)`` takes a failed host out: for good, or, with
  a cool-down range (MIN, MAX), until ``now`` + MIN·2^n plus up to MIN of jitter, capped at MAX,
  where n counts the host's earlier blacklistings (10, 20, 40... for MIN 10). ``target(now)``
  is where workers should run: each available host's slots in host order, at most ``max_np``
  in all (``None``: every listed slot, as Horovod's launcher without ``--max-np``), less the
  slots a ``usable`` test refuses, which leave their place to later hosts; it is built
  from the listed slots, never one entry per ``max_np``, and a host counts at most
  ``MAX_HOST_SLOTS`` slots (``clamped`` names the hosts cut down by the last ``update``).
  ``renew(host)`` puts a host that answers only now (listed while its pod was starting) last.
  ``hold(host, now)`` keeps new workers off a host whose new worker failed before it joined a
  round, without taking the host's running workers out (the same cool-down as the blacklist).
  ``count_reset()`` counts one membership change against ``reset_limit``.
- ``layout(members, order)``: the rank of every worker of a round: hosts in ``order``, each
  host's workers by slot, local and cross ranks as horovodrun gives them
  (``appliance.common.ranks.cross_of``).

Env vars: none. Failure modes: ``ResetLimitExceeded`` (its message names the limit and carries
Horovod's sentence for it) from ``count_reset``; nothing else raises.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import random
from typing import Callable, Iterable, Mapping, Sequence

from appliance.common.ranks import Slot, cross_of

MAX_HOST_SLOTS = 1024  # slots of one host an elastic job uses at most (a host listing more is cut down)


class HostUpdate(enum.IntFlag):
    """What a discovery result changed (the values of Horovod's ``HostUpdateResult``)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class ResetLimitExceeded(RuntimeError):
    """The job changed its membership more often than ``--reset-limit`` allows."""


@dataclasses.dataclass
class HostState:
    name: str
    slots: int = 0                    # as last discovered; 0 = not in the last result
    seq: int = 0                      # when it last became available (lower = older)
    failures: int = 0                 # times it was blacklisted
    blacklisted_until: float | None = None  # None = not blacklisted; math.inf = for good
    holds: int = 0                    # times a new worker there failed before it joined a round
    held_until: float | None = None   # no new worker starts there before this (math.inf = never)


def cooldown_s(failures: int, cooldown_range: tuple[float, float], jitter: float) -> float:
    """Seconds a host stays out after its ``failures``-th blacklisting (1 = first): MIN·2^(n-1)
    plus ``jitter``·MIN (``jitter`` in [0, 1)), within [MIN, MAX]."""
    low, high = cooldown_range
    delay = low * (2 ** max(0, failures - 1)) + jitter * low
    return max(low, min(high, delay))


class Membership:
    """Hosts, the blacklist and the reset count of one elastic job (see the module docstring)."""

    def __init__(self, min_np: int, max_np: int | None, cooldown_range: tuple[float, float] | None = None,
                 reset_limit: int | None = None, rand: Callable[[], float] = random.random):
        self.min_np, self.max_np = min_np, max_np
        self.cooldown_range, self.reset_limit = cooldown_range, reset_limit
        self.resets = 0
        self.hosts: dict[str, HostState] = {}
        self._rand = rand
        self._seq = 0
        self._available: dict[str, int] = {}  # the available hosts as of the last update/blacklist
        self.clamped: list[str] = []  # hosts whose listed slots the last update cut to MAX_HOST_SLOTS
        self._sorted: list[tuple[str, int]] | None = None  # available(), until the next change

    # -- queries ------------------------------------------------------------------------------
    def is_blacklisted(self, host: str, now: float) -> bool:
        """Whether ``host`` is out; a host whose cool-down ended stays out until the next ``update``
        (discovery) brings it back."""
        h = self.hosts.get(host)
        return h is not None and h.blacklisted_until is not None

    def wanted(self, host: str) -> bool:
        """Whether ``host`` may still run workers of this job: listed by the last discovery and
        not blacklisted for good."""
        h = self.hosts.get(host)
        return h is not None and h.slots > 0 and h.blacklisted_until != math.inf

    def available(self, now: float) -> list[tuple[str, int]]:
        """(host, slots) of every discovered host that is not blacklisted, oldest first."""
        if self._sorted is None:  # kept until the next change (update, blacklist, renew)
            hosts = [h for h in self.hosts.values() if h.slots > 0 and not self.is_blacklisted(h.name, now)]
            self._sorted = [(h.name, h.slots) for h in sorted(hosts, key=lambda h: h.seq)]
        return list(self._sorted)

    def order(self, now: float) -> list[str]:
        return [name for name, _ in self.available(now)]

    def total_slots(self, now: float) -> int:
        return sum(slots for _, slots in self.available(now))

    def target(self, now: float, usable: Callable[[tuple[str, int]], bool] | None = None) -> list[tuple[str, int]]:
        """(host, slot index) of every slot that should run a worker: hosts oldest first, each
        host's slots in order, at most ``max_np`` in all (``None``: no limit). ``usable``: a slot
        it refuses is skipped and leaves its place in ``max_np`` to the next host's slots (a host
        listed before it answers must not keep a ready one out)."""
        out: list[tuple[str, int]] = []
        left = math.inf if self.max_np is None else self.max_np
        for name, slots in self.available(now):
            for index in range(slots):
                if left <= 0:
                    return out
                if usable is None or usable((name, index)):
                    out.append((name, index))
                    left -= 1
        return out

    def is_held(self, host: str, now: float) -> bool:
        """Whether new workers must not start on ``host`` now (see ``hold``)."""
        h = self.hosts.get(host)
        return h is not None and h.held_until is not None and now < h.held_until

    def hold(self, host: str, now: float) -> float:
        """A new worker on ``host`` failed before it joined a round: no new worker starts there
        until the returned time (``math.inf``: for good); its running workers stay."""
        h = self.hosts.setdefault(host, HostState(host))
        if self.is_held(host, now):
            return h.held_until
        h.holds += 1
        h.held_until = (math.inf if self.cooldown_range is None else
                        now + cooldown_s(h.holds, self.cooldown_range, self._rand()))
        return h.held_until

    def next_cooldown_end(self, now: float) -> float | None:
        """When the next blacklisted host may come back (None: none will)."""
        ends = [h.blacklisted_until for h in self.hosts.values()
                if h.blacklisted_until is not None and now < h.blacklisted_until < math.inf]
        return min(ends) if ends else None

    # -- changes ------------------------------------------------------------------------------
    def update(self, discovered: Mapping[str, int], now: float) -> HostUpdate:
        """Apply one discovery result (``{host: slots}`` in the order printed)."""
        for h in self.hosts.values():
            if h.blacklisted_until is not None and now >= h.blacklisted_until:
                h.blacklisted_until = None  # the cool-down is over: the host may come back
        self.clamped = []
        for name, slots in discovered.items():
            if int(slots) > MAX_HOST_SLOTS:
                self.clamped.append(name)
            self.hosts.setdefault(name, HostState(name)).slots = min(int(slots), MAX_HOST_SLOTS)
        for name, h in self.hosts.items():
            if name not in discovered:
                h.slots = 0
        return self._refresh(now)

    def renew(self, host: str) -> None:
        """``host``, listed before it answered, answers now: it goes last in the order, as a host
        that just became available, so it does not push hosts already running out of ``max_np``."""
        h = self.hosts.get(host)
        if h is not None:
            self._seq += 1
            h.seq, self._sorted = self._seq, None

    def blacklist(self, host: str, now: float) -> float:
        """Take ``host`` out after a failure; returns when it may come back (``math.inf``: never)."""
        h = self.hosts.setdefault(host, HostState(host))
        if h.blacklisted_until is not None:
            return h.blacklisted_until
        h.failures += 1
        h.blacklisted_until = (math.inf if self.cooldown_range is None else
                               now + cooldown_s(h.failures, self.cooldown_range, self._rand()))
        self._refresh(now)
        return h.blacklisted_until

    def count_reset(self) -> int:
        """Count one membership change; ``ResetLimitExceeded`` when the limit is already used up."""
        if self.reset_limit is not None and self.resets >= self.reset_limit:
            raise ResetLimitExceeded(f"the job changed its membership {self.resets} time"
                                     f"{'s' if self.resets != 1 else ''} and --reset-limit {self.reset_limit} "
                                     "allows no more (Horovod was shutdown because number of resets during "
                                     f"elastic job exceeded limit: {self.reset_limit})")
        self.resets += 1
        return self.resets

    def _refresh(self, now: float) -> HostUpdate:
        """Renumber hosts that became available (they go last) and say what changed."""
        before, self._sorted = self._available, None
        current: dict[str, int] = {}
        for h in self.hosts.values():
            if h.slots > 0 and not self.is_blacklisted(h.name, now):
                if h.name not in before:
                    self._seq += 1
                    h.seq = self._seq
                current[h.name] = h.slots
        result = HostUpdate.no_update
        for name, slots in before.items():
            if current.get(name, 0) < slots:
                result |= HostUpdate.removed
        for name, slots in current.items():
            if slots > before.get(name, 0):
                result |= HostUpdate.added
        self._available = current
        return result


def layout(members: Iterable[tuple[int, str, int]], order: Sequence[str]) -> dict[int, Slot]:
    """``members``: (worker id, host, slot index) of every worker of a round; ``order``: hosts,
    oldest first (a host missing from it goes after those in it). Returns worker id -> ``Slot``."""
    rank_of_host = {h: i for i, h in enumerate(order)}
    ordered = sorted(members, key=lambda m: (rank_of_host.get(m[1], len(rank_of_host)), m[1], m[2], m[0]))
    hosts: list[str] = []
    per_host: dict[str, list[int]] = {}
    for wid, host, _ in ordered:
        if host not in per_host:
            hosts.append(host)
            per_host[host] = []
        per_host[host].append(wid)
    counts = [len(per_host[h]) for h in hosts]
    size = sum(counts)
    out: dict[int, Slot] = {}
    rank = 0
    for index, host in enumerate(hosts):
        for local_rank, wid in enumerate(per_host[host]):
            cross_rank, cross_size = cross_of(counts, index, local_rank)
            out[wid] = Slot(rank=rank, size=size, local_rank=local_rank, local_size=counts[index],
                            cross_rank=cross_rank, cross_size=cross_size, host=host)
            rank += 1
    return out


__all__ = ["MAX_HOST_SLOTS", "HostUpdate", "HostState", "Membership", "ResetLimitExceeded", "cooldown_s", "layout"]
