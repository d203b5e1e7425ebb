"""Network interfaces: the IPv4 address of an interface named by the user, and the choice of one
by OpenMPI's include/exclude lists (Linux).

What it owns: ``interface_address(name)``, used where a rank's listening address comes from an
interface name (``HOROVOD_GLOO_IFACE``, ``--network-interface``); ``interfaces()``, this host's
interfaces with an IPv4 address; ``select(include, exclude)``, the first of them an OpenMPI-style
list admits (``btl_tcp_if_include`` / ``_exclude``: names or CIDR subnets, comma separated);
``route_address()``, the source address of the default route. Reads no environment.
Failure mode: an interface without an IPv4 address, or a list that admits none here, raises
``ConfigError`` naming it and what this host has.
"""
from __future__ import annotations

import ipaddress
import socket

from appliance.common.knobs import ConfigError


def interface_address(name: str) -> str:
    """IPv4 address of network interface ``name`` (Linux)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError as e:
            raise ConfigError(f"network interface {name!r} has no IPv4 address here: {e.strerror}") from None
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> list[tuple[str, str]]:
    """``(name, IPv4 address)`` of this host's interfaces that have one, in the kernel's order."""
    found = []
    for _, name in socket.if_nameindex():
        try:
            found.append((name, interface_address(name)))
        except ConfigError:
            pass
    return found


def _admits(entry: str, name: str, addr: str) -> bool:
    if "/" in entry:
        try:
            return ipaddress.ip_address(addr) in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(f"{entry!r} is neither an interface name nor a subnet (a.b.c.d/n)") from None
    return entry == name


def select(include: str = "", exclude: str = "", source: str = "") -> tuple[str, str]:
    """The first interface ``include`` names (in its order), else the first one ``exclude`` leaves
    (loopback excluded too, as OpenMPI's default list does): ``(name, address)``. ConfigError,
    naming ``source`` (where the list came from) and this host's interfaces, when none is left."""
    have = interfaces()
    if include:
        for entry in (e.strip() for e in include.split(",") if e.strip()):
            for name, addr in have:
                if _admits(entry, name, addr):
                    return name, addr
    else:
        drop = [e.strip() for e in exclude.split(",") if e.strip()]
        for name, addr in have:
            if not ipaddress.ip_address(addr).is_loopback and not any(_admits(e, name, addr) for e in drop):
                return name, addr
    listed = ", ".join(f"{n} {a}" for n, a in have) or "none"
    raise ConfigError(f"{source or 'the interface list'}={include or exclude!r} admits no interface on "
                      f"{socket.gethostname()} (it has: {listed})")


def route_address() -> str:
    """The source address of this host's default route; "" when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the kernel only picks a route
            return s.getsockname()[0]
        except OSError:
            return ""
