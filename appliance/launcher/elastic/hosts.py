"""The elastic machine's hosts: discovery's listings, the host checks, pending hosts, the target.

What it owns (the host rows of ``machine``'s table): ``on_discovered`` and
``on_discovery_failed`` (a discovery result, or a failed run: said once, retried),
``on_host_opened`` (a host's check finished: ready; pending on Kubernetes, ``pending.py``;
blacklisted elsewhere), ``open_hosts`` (check the target's hosts not checked yet),
``close_hosts`` (close the checked hosts no longer wanted) and ``target_slots`` (the slots that should
run workers now).

Env vars: none. Failure modes: none raised; a failed first discovery ends the job (``End``).
"""
from __future__ import annotations

from .events import CloseHosts, Discovered, DiscoveryFailed, HostOpened, OpenHosts
from .state import MachineState, when


def target_slots(m: MachineState, now: float) -> list[tuple[str, int]]:
    """The slots that should run workers: discovery's target less the free slots of held or
    pending hosts (listed, not answering yet), whose places in --max-np go to the next hosts."""
    held = {(w.host, w.index) for w in m.live() if not w.departing}
    return m.membership.target(now, lambda t: t in held or not (
        m.membership.is_held(t[0], now) or t[0] in m.pending.hosts))


def on_discovered(m: MachineState, ev: Discovered, now: float) -> None:
    if m.discovery_error:
        m.say("host discovery works again")
        m.discovery_error = ""
    m.membership.update(ev.hosts, now)
    m.pending.keep_only(ev.hosts)
    m.discovered = True
    for host in set(m.membership.clamped) - m.clamped:
        m.clamped.add(host)
        m.say(f"host {host} lists {ev.hosts[host]} slots; an elastic job uses at most "
              f"{m.membership.hosts[host].slots} on one host")


def on_discovery_failed(m: MachineState, ev: DiscoveryFailed, now: float) -> None:
    if ev.first:
        m.end(1, ev.message)
        return
    if ev.message != m.discovery_error:
        m.say(f"{ev.message} (retrying every {m.e.discovery_interval_s:g} s)")
    m.discovery_error = ev.message


def on_host_opened(m: MachineState, ev: HostOpened, now: float) -> None:
    m.opening.discard(ev.host)
    if ev.failure is None:
        m.opened.add(ev.host)
        waited = m.pending.opened(ev.host, now)
        if waited is not None:
            m.membership.renew(ev.host)
            m.say(f"host {ev.host} answers now, after {waited:.0f} s pending")
        return
    if m.e.kubernetes:  # listed (its pod is Running) but its sshd or DNS record is not up yet
        if m.pending.failed(ev.host, now):
            m.say(f"host {ev.host} is listed but does not answer yet; pending, checked again (this line at most "
                  f"once a minute): {ev.failure}")
        return
    until = m.membership.blacklist(ev.host, now)
    m.say(f"host {ev.host} cannot run ranks, blacklisted {when(until, now)}: {ev.failure}")


def open_hosts(m: MachineState, target: list[tuple[str, int]], now: float) -> bool:
    """Check the hosts ``pending.to_check`` names; True while any target host is being checked."""
    listed = [h for h in m.membership.order(now) if m.membership.wanted(h)]
    new = tuple(m.pending.to_check(listed, [h for h, _ in target], m.opened | m.opening,
                                   m.e.max_np is None or len(target) < m.e.max_np, now))
    if new:
        m.opening |= set(new)
        m.emit(OpenHosts(new))
    return any(h in m.opening and h not in m.pending.hosts for h, _ in target)  # a pending host is not waited for


def close_hosts(m: MachineState, now: float) -> None:
    """Close the connection of every checked host that no worker runs on any more and that is no
    longer wanted (not listed, or blacklisted for good; on Kubernetes also one in its cool-down or
    hold: the pod of that name is re-created, so its old connection is dead): a host listed again
    is checked again."""
    busy = {w.host for w in m.workers.values() if w.alive}
    gone = tuple(h for h in sorted(m.opened) if h not in busy and (not m.membership.wanted(h) or (
        m.e.kubernetes and (m.membership.is_blacklisted(h, now) or m.membership.is_held(h, now)))))
    if gone:
        m.opened -= set(gone)
        m.emit(CloseHosts(gone))


__all__ = ["close_hosts", "on_discovered", "on_discovery_failed", "on_host_opened", "open_hosts", "target_slots"]
