"""Host probe: the facts ``appliance check`` and the launch preflight need about one host.

Standard library only, on purpose: for another host the launcher sends this file's text over
SSH to ``PYTHON - PARAMS_JSON`` (the program on stdin, parameters that are not secret as the one
argument), so it runs and explains itself even where ``appliance`` is missing or broken. For the
primary's own hosts it is imported and ``probe()`` is called directly. It prints one JSON object:

``hostname``, ``python`` (sys.executable), ``python_version``, ``appliance`` (version) or
``appliance_error``, ``cwd_ok``, ``shared`` (``exists``, the ``nonce`` read from the shared
directory or an ``error``), ``shm_free`` (bytes free in /dev/shm, or None), ``routes``
(per target address: ``dev``, ``src`` or ``error``; from ``ip -o route get``, or, without
iproute2, from a connected UDP socket), ``iface`` (``name``, ``address`` of
``--network-interface`` on this host) and ``interfaces`` (names).

Env vars: none. Failure modes: none raised; every problem is a field of the report.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys


def parse_route(text: str) -> dict:
    """One line of ``ip -o route get ADDR`` -> ``{type, dev, src, via}`` (missing keys absent)."""
    words = text.replace("\\", " ").split()
    out: dict = {}
    if words and words[0] in ("local", "unreachable", "blackhole", "prohibit", "broadcast", "multicast"):
        out["type"] = words[0]
    for key in ("dev", "src", "via"):
        if key in words and words.index(key) + 1 < len(words):
            out[key] = words[words.index(key) + 1]
    return out


def iface_address(name: str) -> str | None:
    """IPv4 address of interface ``name`` here, or None."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> list[str]:
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def _route_by_socket(address: str) -> dict:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))  # no packet is sent: this only asks the kernel for a route
            src = s.getsockname()[0]
    except OSError as e:
        return {"error": e.strerror or str(e)}
    dev = "lo" if src.startswith("127.") or src == "::1" else next(
        (n for n in interfaces() if iface_address(n) == src), "")
    return {"dev": dev, "src": src}


def route_get(address: str) -> dict:
    """How this host reaches ``address``: ``{dev, src}`` or ``{error}``."""
    for ip in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"):
        if os.access(ip, os.X_OK):
            break
    else:
        return _route_by_socket(address)
    try:
        r = subprocess.run([ip, "-o", "route", "get", address], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return _route_by_socket(address)
    if r.returncode != 0:
        return {"error": (r.stderr.strip() or f"ip route get exited {r.returncode}").splitlines()[-1]}
    route = parse_route(r.stdout.splitlines()[0] if r.stdout else "")
    if "src" not in route:
        fallback = _route_by_socket(address)
        route.setdefault("src", fallback.get("src", ""))
        route.setdefault("dev", fallback.get("dev", ""))
    return route


def probe(params: dict) -> dict:
    report: dict = {
        "hostname": socket.gethostname(),
        "python": sys.executable,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
    }
    try:
        import appliance

        report["appliance"] = getattr(appliance, "__version__", "?")
        report["appliance_path"] = os.path.dirname(os.path.abspath(appliance.__file__))
    except Exception as e:  # noqa: BLE001 - any import failure is a finding, not a crash
        report["appliance_error"] = f"{type(e).__name__}: {e}"
    cwd = params.get("cwd")
    report["cwd_ok"] = bool(cwd) and os.path.isdir(cwd)
    shared = params.get("shared_dir")
    if shared:
        info: dict = {"exists": os.path.isdir(shared)}
        name = params.get("nonce_file")
        if name and info["exists"]:
            try:
                with open(os.path.join(shared, name), encoding="utf-8") as f:
                    info["nonce"] = f.read().strip()
            except OSError as e:
                info["error"] = e.strerror or str(e)
        report["shared"] = info
    try:
        st = os.statvfs("/dev/shm")
        report["shm_free"] = st.f_bavail * st.f_frsize
    except OSError:
        report["shm_free"] = None
    report["routes"] = {t: route_get(t) for t in params.get("targets", [])}
    report["interfaces"] = interfaces()
    iface = params.get("iface")
    if iface:
        report["iface"] = {"name": iface, "address": iface_address(iface)}
    return report


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})))
