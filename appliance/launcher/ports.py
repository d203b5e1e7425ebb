"""Free TCP ports for a job's store and ``MASTER_PORT``, on this machine or (through the remote
stub's ``ports`` command) on another host.

What it owns: ``PORT_RANGE`` and ``pick_free_ports()``. Ports are drawn at random below Linux's
ephemeral range (32768-60999), so they do not collide with the source ports of outgoing
connections; every candidate is held bound until all are chosen, so the ports returned are
distinct. It imports nothing of the launcher, so the remote stub can use it on any host.

Env vars: none. Failure modes: ``NoFreePorts`` when ``count`` ports cannot be bound after a
bounded number of tries (the launcher turns it into a ``LaunchError``).
"""
from __future__ import annotations

import random
import socket

PORT_RANGE = (20000, 32767)
TRIES = 200


class NoFreePorts(RuntimeError):
    """Not enough ports of ``PORT_RANGE`` could be bound on the address."""


def pick_free_ports(address: str, count: int, rng: random.Random | None = None) -> list[int]:
    """Distinct ports in ``PORT_RANGE`` that can be bound on ``address`` right now (all held while choosing)."""
    rng = rng or random.Random()
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    held: list[socket.socket] = []
    try:
        for _ in range(TRIES):
            if len(held) == count:
                break
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.bind((address, rng.randint(*PORT_RANGE)))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < count:
            raise NoFreePorts(f"no free TCP port on {address} in {PORT_RANGE[0]}-{PORT_RANGE[1]}")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
