"""Simulated hosts for the SSH tests: network namespaces, a bridge, one real sshd per host.

Layout (``tag`` is unique per test session: the machine is shared)::

    root netns (the primary)            netns TAG-sw (the "switch")         netns TAG-hN ("hosts")
    TAGp 10.X.Y.1/24  <--veth-->  sw0 ─┐                                   own UTS namespace (hostname)
                                        br0 ── swN  <--veth-->  NIC (named differently per host)
                                                                            10.X.Y.(N+1)/24, lo up
                                                                            sshd -D -p 12345, key from
                                                                            `appliance keys`

The bridge lives in its own namespace so the root namespace's firewall (Docker sets FORWARD to
DROP) never sees host-to-host traffic. Hosts share the filesystem and the pid namespace with the
primary (so tests can check pids and read job directories), but not the network or hostname.
``Cluster.close()`` kills every process in every namespace (sshd, sessions, any worker), deletes
the namespaces (their veths go with them) and the root-side veth, even after a failure; stale
clusters of dead test sessions (same prefix, pid gone) are removed at start.
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "aps"  # appliance ssh tests
PORT = 12345
NICS = ["data0", "ens5", "enp3s0", "eth9"]
SSHD = "/usr/sbin/sshd"


def sh(*argv: str, check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def available() -> str | None:
    """Why the SSH tier cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in (SSHD, shutil.which("ip"), shutil.which("unshare")):
        if not tool or not os.path.exists(tool):
            return f"missing {tool or 'ip/unshare'} (apt-get install openssh-server iproute2 util-linux)"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def netns_pids(ns: str) -> list[int]:
    r = sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def _kill_netns(ns: str) -> None:
    for _ in range(50):
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def remove_stale() -> None:
    """Namespaces and veths of earlier test sessions whose pid is gone."""
    pat = re.compile(rf"^{PREFIX}(\d+)x")
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = pat.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _kill_netns(name)
            sh("ip", "netns", "del", name, check=False)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        m = pat.match(name)
        if m and not _pid_alive(int(m.group(1))):
            sh("ip", "link", "del", name, check=False)


def _free_subnet() -> str:
    used = sh("ip", "-o", "addr").stdout + sh("ip", "route").stdout
    for _ in range(100):
        net = f"10.{random.randint(150, 250)}.{random.randint(0, 255)}"
        if f"{net}." not in used:
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet")


class Host:
    def __init__(self, index: int, ns: str, hostname: str, address: str, nic: str):
        self.index, self.ns, self.hostname, self.address, self.nic = index, ns, hostname, address, nic
        self.sshd: subprocess.Popen | None = None
        self.log = ""

    def pids(self) -> list[int]:
        """Every process in this host's network namespace except its sshd listener."""
        listener = self.sshd.pid if self.sshd else -1  # ip netns exec, unshare and sh all exec into sshd
        return [p for p in netns_pids(self.ns) if p != listener]


class Cluster:
    """``n`` hosts with sshd on PORT, keyed by the ``appliance keys`` material under ``shared``."""

    def __init__(self, n: int, shared: str, workdir: str, private_mount: str | None = None):
        self.tag = f"{PREFIX}{os.getpid()}x{random.randint(0, 99):02d}"
        self.shared, self.workdir = shared, workdir
        self.net = _free_subnet()
        self.primary_addr = f"{self.net}.1"
        self.primary_nic = f"{self.tag}p"
        self.switch = f"{self.tag}-sw"
        self.hosts: list[Host] = []
        self._created_ns: list[str] = []
        self._private_mount = private_mount
        try:
            self._setup(n)
        except BaseException:
            self.close()
            raise

    @property
    def down_addr(self) -> str:
        """An address on the hosts' subnet where nothing answers."""
        return f"{self.net}.250"

    def _ns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self._created_ns.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def _setup(self, n: int) -> None:
        remove_stale()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        self._ns(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        sh("ip", "link", "add", self.primary_nic, "type", "veth", "peer", "name", "sw0", "netns", self.switch)
        sh("ip", "-n", self.switch, "link", "set", "sw0", "master", "br0", "up")
        sh("ip", "addr", "add", f"{self.primary_addr}/24", "dev", self.primary_nic)
        sh("ip", "link", "set", self.primary_nic, "up")
        for i in range(1, n + 1):
            ns, nic, addr = f"{self.tag}-h{i}", NICS[(i - 1) % len(NICS)], f"{self.net}.{i + 1}"
            self._ns(ns)
            sh("ip", "-n", self.switch, "link", "add", f"sw{i}", "type", "veth", "peer", "name", nic, "netns", ns)
            sh("ip", "-n", self.switch, "link", "set", f"sw{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", nic)
            sh("ip", "-n", ns, "link", "set", nic, "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", self.primary_addr)
            host = Host(i, ns, f"{self.tag}-host{i}", addr, nic)
            self.hosts.append(host)
            self._start_sshd(host)
        for host in self.hosts:
            self._wait_listening(host)

    def _start_sshd(self, host: Host) -> None:
        ssh_dir = os.path.join(self.shared, "ssh")
        conf = os.path.join(self.workdir, f"sshd_{host.index}.conf")
        with open(conf, "w") as f:
            f.write(f"""Port {PORT}
ListenAddress {host.address}
HostKey {ssh_dir}/ssh_host_ed25519_key
AuthorizedKeysFile {ssh_dir}/authorized_keys
PidFile none
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes yes
MaxStartups 64:30:128
ClientAliveInterval 1
ClientAliveCountMax 3
LogLevel VERBOSE
""")
        sh(SSHD, "-t", "-f", conf)
        host.log = os.path.join(self.workdir, f"sshd_{host.index}.log")
        script = f"hostname {host.hostname} && "
        flags = ["--uts"]
        if self._private_mount and host.index == 2:  # this host does not see the primary's files there
            flags.append("--mount")
            script += f"mount -t tmpfs none {self._private_mount} && "
        script += f"exec {SSHD} -D -e -f {conf}"
        with open(host.log, "wb") as log:
            host.sshd = subprocess.Popen(["ip", "netns", "exec", host.ns, "unshare", *flags, "--", "sh", "-c", script],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)

    def _wait_listening(self, host: Host, limit: float = 10.0) -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if host.sshd is not None and host.sshd.poll() is not None:
                raise RuntimeError(f"sshd of {host.ns} exited {host.sshd.returncode}: {open(host.log).read()[-500:]}")
            try:
                with socket.create_connection((host.address, PORT), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd of {host.ns} does not listen on {host.address}:{PORT}")

    def close(self) -> None:
        for ns in self._created_ns:
            _kill_netns(ns)
        for host in self.hosts:
            if host.sshd is not None:
                try:
                    os.killpg(host.sshd.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    host.sshd.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for ns in reversed(self._created_ns):
            sh("ip", "netns", "del", ns, check=False)
        self._created_ns.clear()
        sh("ip", "link", "del", self.primary_nic, check=False)


@contextlib.contextmanager
def keyed_cluster(n: int, prefix: str):
    """For the benchmarks: ``n`` simulated hosts with the cluster's keys from ``appliance keys``.
    Yields (cluster, base, shared, out): ``base`` is a fresh directory under ~/.cache (sshd's
    StrictModes refuses an authorized_keys below /tmp) to use as HOME, ``shared`` the keys'
    mount, ``out`` an empty directory. Everything is torn down on exit, whatever happened."""
    os.makedirs(os.path.expanduser("~/.cache"), exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=os.path.expanduser("~/.cache")))
    cluster = None
    try:
        shared, out = base / "share", base / "out"
        out.mkdir()
        subprocess.run([sys.executable, "-m", "appliance", "keys", "--shared", str(shared)], check=True,
                       capture_output=True, timeout=60)
        cluster = Cluster(n, str(shared), str(base))
        yield cluster, base, shared, out
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(base, ignore_errors=True)
