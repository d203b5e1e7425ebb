"""A launcher that stalls is not a silent host: the SSH heartbeat over real OpenSSH (network
namespaces, ``fixtures/netns.py``) while the launcher's own Python cannot run.

The launcher's threads (paramiko's transport, the channel readers, the pings) need the GIL; a C call
that holds it (a large extension module's import, such as torch's, seconds long on a loaded machine)
or a stopped launcher process stops them all for as long. Such a
stall of 4.5 s, over twice ``APPLIANCE_SSH_TIMEOUT`` (here 2 s), while a remote rank runs, must
neither end the job as "became unreachable" nor make the stub there stop the rank. A real cut is
still seen within the bound (``test_ssh_faults.py``).
"""
from __future__ import annotations

import ctypes
import os
import threading
import time

import pytest

from fixtures.netns import PORT

pytestmark = [pytest.mark.ssh]

STALL_S = 4.5
TIMEOUT_S = "2"

WAIT_FOR_STALL = '''
mark("up")
wait_for("stalled", limit=60)
print("rank %d done" % RANK, flush=True)
'''


def _hold_the_gil(seconds: float) -> None:
    """Sleep in C without releasing the GIL (PyDLL calls keep it): every other thread of this
    process, the launcher's included, stands still meanwhile."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


@pytest.mark.timeout(90)
def test_a_launcher_stalled_longer_than_the_ssh_timeout_keeps_its_remote_rank(ssh_cluster, job, monkeypatch):
    from appliance.launcher import launch

    h1, _ = ssh_cluster.hosts
    for name, value in ssh_cluster.env(APPLIANCE_SSH_TIMEOUT=TIMEOUT_S).items():
        monkeypatch.setenv(name, value)
    result: dict = {}

    def run():
        try:
            result["r"] = launch(job.argv(WAIT_FOR_STALL), np=1, hosts=f"{h1.address}:1", ssh_port=PORT, timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported by the assertions below
            result["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        job.wait_files("up", 1, limit=40)
        time.sleep(1.0)  # a heartbeat each way after the start
        t0 = time.monotonic()
        _hold_the_gil(STALL_S)
        stalled = time.monotonic() - t0
        with open(os.path.join(job.out, "stalled"), "w"):
            pass
        t.join(30)
        assert "e" not in result, result
        r = result["r"]
        assert stalled >= STALL_S - 0.1, stalled
        assert r.returncode == 0, r.reason
    finally:
        with open(os.path.join(job.out, "stalled"), "w"):
            pass
        t.join(30)
    assert ssh_cluster.wait_clean(10.0) == {}
