"""Fixtures for launcher tests: worker scripts that leave evidence in files, and cleanup.

Workers are ``python -c`` scripts (no dependency on the collective runtime). Every worker
records its pid in ``OUT/pid.<rank>``; the ``job`` fixture kills every recorded process group
and every launcher it started when the test ends, whatever happened.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

PREAMBLE = r'''
import json, os, signal, subprocess, sys, time
OUT = sys.argv[1]
RANK = int(os.environ["HOROVOD_RANK"])
SIZE = int(os.environ["HOROVOD_SIZE"])
def mark(name, data=""):
    tmp = os.path.join(OUT, ".%s.%d.tmp" % (name, RANK))
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, os.path.join(OUT, "%s.%d" % (name, RANK)))
def wait_for(*names, limit=30.0):
    end = time.time() + limit
    while not all(os.path.exists(os.path.join(OUT, n)) for n in names):
        if time.time() > end:
            sys.exit(99)
        time.sleep(0.02)
def grandchild():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mark("grandchild", str(p.pid))
    return p
mark("pid", str(os.getpid()))
'''


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class Job:
    def __init__(self, out):
        self.out = str(out)
        self.launchers: list[subprocess.Popen] = []

    def argv(self, body: str) -> list[str]:
        return [sys.executable, "-c", PREAMBLE + body, self.out]

    def read(self, name: str, rank: int) -> str:
        with open(os.path.join(self.out, f"{name}.{rank}")) as f:
            return f.read()

    def env(self, rank: int) -> dict:
        return json.loads(self.read("env", rank))

    def files(self, name: str) -> dict[int, str]:
        found = {}
        for entry in os.listdir(self.out):
            base, _, rank = entry.rpartition(".")
            if base == name and rank.isdigit():
                found[int(rank)] = self.read(name, int(rank))
        return found

    def pids(self) -> list[int]:
        return [int(v) for name in ("pid", "grandchild") for v in self.files(name).values()]

    def wait_files(self, name: str, count: int, limit: float = 20.0) -> dict[int, str]:
        end = time.monotonic() + limit
        while True:
            found = self.files(name)
            if len(found) >= count:
                return found
            for p in self.launchers:
                if p.poll() is not None:
                    raise AssertionError(f"launcher exited {p.returncode} before {count} {name} files: "
                                         f"{p.stderr.read().decode(errors='replace') if p.stderr else ''}")
            if time.monotonic() > end:
                raise AssertionError(f"only {sorted(found)} of {count} {name} files after {limit} s")
            time.sleep(0.05)

    def cli(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        """``python -m appliance launch ARGS`` in its own session, output piped."""
        p = subprocess.Popen([sys.executable, "-m", "appliance", "launch", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True,
                             env=None if env is None else {**os.environ, **env})
        self.launchers.append(p)
        return p

    alive = staticmethod(lambda pid: alive(pid))
    wait_dead = staticmethod(lambda pids, limit=5.0: wait_dead(pids, limit))

    def cleanup(self) -> None:
        for p in self.launchers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            try:
                p.communicate(timeout=5)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        for pid in self.pids():
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def wait_dead(pids, limit: float = 5.0) -> list[int]:
    """Pids still alive after ``limit`` seconds (empty when all are gone)."""
    end = time.monotonic() + limit
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


@pytest.fixture
def job(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    j = Job(out)
    try:
        yield j
    finally:
        j.cleanup()


# --- SSH tier: simulated hosts (network namespaces + real sshd), see _netns.py ---------------
class SSHCluster:
    """What the SSH tests need: hosts, the shared directory with `appliance keys` material, helpers."""

    def __init__(self, cluster, base: str, shared: str, notshared: str):
        self.c, self.base, self.shared, self.notshared = cluster, base, shared, notshared
        self.hosts = cluster.hosts
        self.key = os.path.join(shared, "ssh", "id_ed25519")
        self.home = os.path.join(base, "home")
        os.makedirs(self.home, exist_ok=True)

    def env(self, **extra) -> dict:
        """Environment for launcher processes: the share, fast stops (a short grace for survivors of a
        failure, which here are sleeping scripts), a private HOME (a first-use host key must never
        land in the real ~/.ssh/known_hosts)."""
        return {"APPLIANCE_SHARED": self.shared, "APPLIANCE_STOP_GRACE": "1", "APPLIANCE_FAILURE_GRACE": "0.5",
                "HOME": self.home, **extra}

    def leftovers(self) -> dict:
        """Processes other than sshd in each host's namespace (should be none between jobs)."""
        return {h.ns: h.pids() for h in self.hosts if h.pids()}

    def wait_clean(self, limit: float = 5.0) -> dict:
        end = time.monotonic() + limit
        while True:
            left = self.leftovers()
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.05)


@pytest.fixture(scope="session")
def ssh_cluster(request):
    import shutil
    import tempfile

    import _netns

    why = _netns.available()
    if why:
        if request.config.getoption("--strict-prereqs", default=False):
            pytest.fail(f"SSH tier: {why}")
        pytest.skip(f"SSH tier: {why}")
    # Under the home directory: sshd's StrictModes refuses an authorized_keys below /tmp (mode 1777).
    home_cache = os.path.expanduser("~/.cache")
    os.makedirs(home_cache, mode=0o755, exist_ok=True)
    base = tempfile.mkdtemp(prefix="appliance-ssh-tests-", dir=home_cache)
    shared, notshared = os.path.join(base, "share"), os.path.join(base, "notshared")
    os.makedirs(notshared)
    r = subprocess.run([sys.executable, "-m", "appliance", "keys", "--shared", shared], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cluster = None
    try:
        cluster = _netns.Cluster(2, shared, base, private_mount=notshared)
        yield SSHCluster(cluster, base, shared, notshared)
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(base, ignore_errors=True)
