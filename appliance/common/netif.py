"""Network interfaces: the IPv4 address of an interface named by the user (Linux).

What it owns: ``interface_address(name)``, used where a rank's listening address comes from an
interface name (``HOROVOD_GLOO_IFACE``, ``--network-interface``). Reads no environment.
Failure mode: an interface without an IPv4 address raises ``ConfigError`` naming it.
"""
from __future__ import annotations

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
