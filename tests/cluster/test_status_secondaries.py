"""``appliance status`` lists the secondaries registered on the share next to the containers: the
real heartbeat process registers two secondaries in a real share directory (a listening socket
stands in for each one's sshd), one is SIGKILLed and stops beating, and the real CLI prints both
with their slots, SSH port, container, heartbeat age and live or stale. Docker is not needed for
that part: with no engine reachable the command still lists the share, then says Docker is
unreachable in one line and exits 1; with the engine (Docker tier) it exits 0.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from appliance.mount import Layout
from appliance.mount.registry import registrations
from fixtures import ROOT


def _beating(share, name: str, slots: int, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "APPLIANCE_SECONDARY_HEARTBEAT": "0.1",
           "APPLIANCE_CONTAINER": f"appliance-{name}@engine1"}
    return subprocess.Popen([sys.executable, "-m", "appliance.cluster.heartbeat", "--name", name, "--port", str(port),
                             "--slots", str(slots), "--shared", str(share)], env=env, stderr=subprocess.DEVNULL,
                            start_new_session=True)


@pytest.fixture
def share(tmp_path):
    """A share with node2 (2 slots, beating) and node3 (1 slot, killed: its record goes stale)."""
    layout = Layout(str(tmp_path)).ensure()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    procs = [_beating(tmp_path, "node2", 2, port), _beating(tmp_path, "node3", 1, port)]
    try:
        deadline = time.monotonic() + 30
        while len(registrations(layout)) < 2:
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "not registered in 30 s"
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)  # a killed secondary: its record stays, unbeaten
        procs[1].wait(10)
        yield tmp_path, port
    finally:
        listener.close()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def _status(share, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "APPLIANCE_SECONDARY_STALE": "1.5", **(env or {})}
    return subprocess.run([sys.executable, "-m", "appliance", "status", *extra], env=full, capture_output=True,
                          text=True, timeout=60)


def _row(out: str, name: str) -> list[str]:
    line = next((line for line in out.splitlines() if f" {name} " in line), "")
    return [cell.strip() for cell in line.strip("│| \n").split("│")]


def _check_rows(out: str, port: int) -> None:
    assert "secondaries registered on" in out, out
    live, stale = _row(out, "node2"), _row(out, "node3")
    assert live[:4] == ["node2", "2", str(port), "appliance-node2@engine1"] and live[5] == "live", out
    assert stale[:4] == ["node3", "1", str(port), "appliance-node3@engine1"] and stale[5] == "stale", out
    assert float(live[4].split("s")[0]) < 1.5 <= float(stale[4].split("s")[0]), out


def test_status_lists_the_shares_secondaries_even_without_docker(share):
    shared, port = share
    time.sleep(1.6)  # node3's last beat is now older than APPLIANCE_SECONDARY_STALE
    r = _status(shared, "--shared", str(shared), env={"DOCKER_HOST": f"unix://{shared}/no-docker.sock"})
    _check_rows(r.stdout, port)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, (r.returncode, r.stderr)
    assert r.stderr.startswith("appliance status: error:") and "docker" in r.stderr.lower(), r.stderr
    # the share by default is APPLIANCE_SHARED
    r = _status(shared, env={"DOCKER_HOST": f"unix://{shared}/no-docker.sock", "APPLIANCE_SHARED": str(shared)})
    _check_rows(r.stdout, port)


def test_status_says_when_no_secondary_is_registered_and_refuses_a_missing_share(tmp_path):
    empty = tmp_path / "share"
    empty.mkdir()
    Layout(str(empty)).ensure()
    no_docker = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    r = _status(empty, "--shared", str(empty), env=no_docker)
    assert f"no secondary registered on {empty}" in r.stdout, r.stdout
    r = _status(empty, "--shared", str(tmp_path / "missing"), env=no_docker)
    assert r.returncode == 2 and r.stderr.strip() == f"appliance status: error: --shared {tmp_path / 'missing'}: " \
                                                      "no such directory", r.stderr


@pytest.mark.docker
def test_status_lists_them_next_to_the_containers(share, engine):
    shared, port = share
    time.sleep(1.6)
    r = _status(shared, "--shared", str(shared))
    assert r.returncode == 0, r.stderr
    _check_rows(r.stdout, port)
