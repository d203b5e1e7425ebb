"""Hosts that discovery lists but that do not answer yet: pending, retried, never blacklisted.

What it owns: ``PendingHosts``, the part of an elastic job's state (``state.MachineState.pending``)
that a Kubernetes launcher pod needs (``ElasticConfig.kubernetes``): the MPI Operator's
``discover_hosts.sh`` lists every worker pod in phase Running, which says nothing of its sshd (or
of its DNS record) being up. A listed host whose check fails is pending: it is checked again
after a pause that doubles from ``FIRST_PAUSE_S`` to ``MAX_PAUSE_S``, its slots are not used
meanwhile (they leave their places in --max-np to the hosts after them), and one line says so
at most every ``SAY_EVERY_S`` per host, and ``SAY_HOSTS`` lines in that time in all (a name
that never resolves says it once a minute, never more; a thousand pods listed at once, five).
``to_check`` chooses the hosts to check next: the target's, a batch ahead of it while some are
pending, and pending ones again only while the target is short. A host that discovery drops is
forgotten.

Env vars: none. Failure modes: none (pure bookkeeping; the clock is passed in).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Collection, Iterable, Sequence

FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 10.0
SAY_EVERY_S = 60.0
SAY_HOSTS = 5  # pending-host lines a minute at most, all hosts together (a thousand pods listed at once)
CHECK_AHEAD = 64  # hosts checked at once beyond the target while some are pending, and pending ones rechecked


@dataclasses.dataclass
class Pending:
    retry_at: float
    pause: float
    said_at: float = -math.inf
    since: float = 0.0


class PendingHosts:
    """Pending hosts and when each is checked again (see the module docstring)."""

    def __init__(self) -> None:
        self.hosts: dict[str, Pending] = {}
        self._said: list[float] = []  # when the lines of the last SAY_EVERY_S were due

    def failed(self, host: str, now: float) -> bool:
        """``host``'s check failed: pending until its next try. True when a line is due now (once
        a minute per host, and ``SAY_HOSTS`` lines a minute at most in all)."""
        p = self.hosts.get(host)
        if p is None:
            p = self.hosts[host] = Pending(now, FIRST_PAUSE_S, since=now)
        p.retry_at, p.pause = now + p.pause, min(p.pause * 2, MAX_PAUSE_S)
        self._said = [t for t in self._said if now - t < SAY_EVERY_S]
        if now - p.said_at >= SAY_EVERY_S and len(self._said) < SAY_HOSTS:
            p.said_at = now
            self._said.append(now)
            return True
        return False

    def opened(self, host: str, now: float) -> float | None:
        """``host`` answers now; how long it was pending (None: it was not)."""
        p = self.hosts.pop(host, None)
        return None if p is None else now - p.since

    def waiting(self, host: str, now: float) -> bool:
        """Whether ``host`` must not be checked yet."""
        p = self.hosts.get(host)
        return p is not None and now < p.retry_at

    def to_check(self, listed: Sequence[str], target: Sequence[str], checked: Collection[str], short: bool,
                 now: float) -> list[str]:
        """The hosts to check now, in discovery's order (``listed``), none of ``checked`` (open or
        being checked): the ``target``'s hosts not pending; while a listed host is pending, as many
        further unchecked hosts as are pending (at most ``CHECK_AHEAD``), so that a run of pods
        that do not answer yet is walked past in doubling batches, not one host at a time; and,
        while the target is ``short`` of --max-np, pending hosts whose pause is over (at most
        ``CHECK_AHEAD``)."""
        out = [h for h in dict.fromkeys(target) if h not in checked and h not in self.hosts]
        if self.hosts:
            ahead = min(len(self.hosts), CHECK_AHEAD)
            rest = [h for h in listed if h not in checked and h not in self.hosts and h not in out]
            out += rest[:ahead]
        if short:
            out += [h for h in listed if h in self.hosts and h not in checked and not self.waiting(h, now)][:CHECK_AHEAD]
        return out

    def keep_only(self, listed: Iterable[str]) -> None:
        """Forget the hosts discovery no longer lists."""
        keep = set(listed)
        for host in [h for h in self.hosts if h not in keep]:
            del self.hosts[host]


__all__ = ["PendingHosts", "CHECK_AHEAD", "FIRST_PAUSE_S", "MAX_PAUSE_S", "SAY_EVERY_S", "SAY_HOSTS"]
