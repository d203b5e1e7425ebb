"""Which address each host's ranks listen on: routes, not interface names. Pure functions.

What it owns: the rule the preflight applies. For a job on this machine only, everything is
loopback (``127.0.0.1``, ``lo``). Otherwise every host gets the source address of its route
towards a *reference peer*, as ``ip -o route get PEER`` reports it on that host:
- the primary's own hosts (``localhost``, its name, its addresses) look towards the first remote
  host of the job, so ``-H localhost:1,HOST2:1`` gives rank 0 (and the store) the primary's
  routable address even when its hostname resolves to 127.0.0.1;
- a remote host looks towards the first other host of the job: the primary's routable address
  when that host is the primary, else that host's address as the primary resolved it.
Hosts may name their NICs differently; only the route matters. A route through ``lo`` or
``docker0`` for traffic between two machines is refused (a name resolving to loopback, an
address overlapping Docker's bridge). ``--network-interface IF`` (or ``HOROVOD_GLOO_IFACE`` in
the launcher's environment) overrides all this: each host uses its own address on IF.

The result per host, ``(address, interface)``, reaches the workers as APPLIANCE_DATA_ADDR and
(unless set explicitly) HOROVOD_GLOO_IFACE and NCCL_SOCKET_IFNAME; the store address is rank 0's
host's address. Env vars: none. Failure modes: ``NetworkError`` naming host, peer and route.
"""
from __future__ import annotations

from typing import Mapping, Sequence

FORBIDDEN_DEVICES = ("lo", "docker0")
LOOPBACK = ("127.0.0.1", "lo")


class NetworkError(ValueError):
    """No usable address for a host; the message names host, peer and what to do."""


def reference_targets(order: Sequence[str], local: set[str], connect_addr: Mapping[str, str],
                      primary_addr: str | None) -> dict[str, str]:
    """For every host of ``order`` that is not this machine: the address its route is asked for.

    ``connect_addr``: remote host -> address the primary resolved it to; ``primary_addr``: the
    primary's routable address (needed when the primary is one of the job's hosts).
    """
    targets = {}
    for host in order:
        if host in local:
            continue
        peer = next((h for h in order if h != host), None)
        if peer is None:
            continue  # a single remote host: nothing to reach; its route to the primary is used
        if peer in local:
            if primary_addr:
                targets[host] = primary_addr
        elif peer in connect_addr:  # an unresolved peer is a preflight failure of its own
            targets[host] = connect_addr[peer]
    return targets


def choose(host: str, peer: str, route: Mapping[str, str]) -> tuple[str, str]:
    """``(address, device)`` for ``host`` from its route towards ``peer``; raises ``NetworkError``."""
    if "error" in route:
        raise NetworkError(f"{host}: no route to {peer} ({route['error']}): fix the routing between the hosts, "
                           "or pick the interface with --network-interface IF")
    kind, dev, src = route.get("type"), route.get("dev", ""), route.get("src", "")
    if kind in ("unreachable", "blackhole", "prohibit") or not src:
        raise NetworkError(f"{host}: the route to {peer} is {kind or 'without a source address'}: fix the routing "
                           "between the hosts, or pick the interface with --network-interface IF")
    if kind == "local" or dev in FORBIDDEN_DEVICES:
        why = ("is an address of this very host (does the name resolve to loopback in /etc/hosts?)"
               if kind == "local" or dev == "lo" else
               "overlaps Docker's bridge network docker0")
        raise NetworkError(f"{host}: the route to {peer} goes through {dev or 'lo'} ({src}): {peer} {why}; "
                           "give the hosts by routable names or addresses, or pick the interface with "
                           "--network-interface IF")
    return src, dev


def by_interface(host: str, iface: str, address: str | None, interfaces: Sequence[str]) -> tuple[str, str]:
    """``(address, iface)`` for ``--network-interface``; raises ``NetworkError`` when the host lacks it."""
    if not address:
        have = ", ".join(i for i in interfaces if i) or "none found"
        raise NetworkError(f"{host}: --network-interface {iface}: no IPv4 address on {iface} there "
                           f"(its interfaces: {have})")
    return address, iface
