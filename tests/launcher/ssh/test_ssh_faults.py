"""Faults between the primary and a remote host, over real OpenSSH in network namespaces (see
``tests/fixtures/netns.py``): a silent network cut (the switch port of a host goes down: nothing is closed or
reset, packets just vanish) and the fault report a remote rank leaves behind.

Asserts effects: exit code, the failed rank and host of the launch result, time bounds, and that
no process (rank, stub, sshd session) is left in the host's namespace.
"""
from __future__ import annotations

import os
import threading
import time

import pytest

from fixtures.netns import PORT, sh

pytestmark = [pytest.mark.ssh]

ALLREDUCE_LOOP = '''
import numpy as np
import appliance.runtime as rt
rt.init()
mark("up")
while True:
    rt.allreduce(np.ones(16, np.float32), name="x")
    time.sleep(0.01)
'''


@pytest.mark.timeout(90)
def test_network_cut_names_the_unreachable_host_and_leaves_nothing(ssh_cluster, job, monkeypatch):
    """Rank 1 runs on host 2, whose link is cut mid-job: the job ends within 12 s, the result
    names rank 1 and host 2, and host 2's namespace is empty a few seconds later."""
    from appliance.launcher import launch

    _, h2 = ssh_cluster.hosts
    for name, value in ssh_cluster.env().items():
        monkeypatch.setenv(name, value)
    result: dict = {}

    def run():
        try:
            result["r"] = launch(job.argv(ALLREDUCE_LOOP), np=2, hosts=f"localhost:1,{h2.address}:1", ssh_port=PORT,
                                 timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported by the assertions below
            result["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    port = f"sw{h2.index}"
    try:
        job.wait_files("up", 2, limit=40)
        time.sleep(1.0)  # both ranks in the allreduce loop
        sh("ip", "-n", ssh_cluster.c.switch, "link", "set", port, "down")
        cut = time.monotonic()
        t.join(30)
        ended = time.monotonic() - cut
        assert "e" not in result, result
        r = result["r"]
        assert r.returncode == 255 and not r.timed_out, r.reason
        assert (r.failed_rank, r.failed_host) == (1, h2.address), r.reason
        assert f"became unreachable: no reply over SSH from {h2.address}" in r.reason
        assert ended < 12.0, ended
        assert ssh_cluster.wait_clean(10.0) == {}  # rank, stub and the sshd session on host 2 (~3-4 s)
        assert job.wait_dead(job.pids(), 3.0) == []
        print(f"\nnetwork cut: job ended {ended:.2f} s after the cut")
    finally:
        sh("ip", "-n", ssh_cluster.c.switch, "link", "set", port, "up", check=False)
        t.join(30)


FAULT_WORKER = '''
path = os.environ["APPLIANCE_FAULT_FILE"]
with open(path + ".tmp", "w") as f:
    json.dump({"rank": RANK, "host": "remote", "origin_rank": 0, "origin_host": "localhost", "kind": "aborted",
               "message": "aborted by rank 0", "time": time.time()}, f)
os.replace(path + ".tmp", path)
mark("fault_path", path)
sys.exit(1)
'''


@pytest.mark.timeout(60)
def test_remote_fault_report_reaches_the_ssh_worker(ssh_cluster, job, monkeypatch):
    """The rank writes the fault file the stub gave it; the launcher's worker gets it as ``fault``."""
    from appliance.launcher.config import LaunchConfig
    from appliance.launcher.hostset import open_executors
    from appliance.launcher.output import OutputSink

    h1, _ = ssh_cluster.hosts
    for name, value in ssh_cluster.env().items():
        monkeypatch.setenv(name, value)
    argv = job.argv(FAULT_WORKER)
    config = LaunchConfig.create(argv, 1, hosts=f"{h1.address}:1", port=PORT, shared=ssh_cluster.shared)
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "APPLIANCE_FAULT_FILE": "/nonexistent/launcher-side.json"}
    with open_executors([h1.address], config) as executors, OutputSink(1, echo=False, capture=True) as sink:
        worker = executors[h1.address].spawn(0, argv, env, os.getcwd(), sink)
        assert worker.wait() == 1
        assert worker.fault is not None, sink.captured()
        assert (worker.fault["kind"], worker.fault["origin_rank"], worker.fault["rank"]) == ("aborted", 0, 0)
    path = job.read("fault_path", 0)
    assert path != env["APPLIANCE_FAULT_FILE"] and not os.path.exists(path)
    assert ssh_cluster.wait_clean() == {}


@pytest.mark.timeout(60)
def test_blocked_launcher_output_is_not_silence(ssh_cluster, job):
    """The launcher's own stdout blocks (a pager, Ctrl-S) while a remote rank prints: its channel
    still delivers heartbeats, so after twice the SSH timeout the job is still fine and succeeds."""
    h1, _ = ssh_cluster.hosts
    body = '''
sys.stdout.write(("x" * 1023 + "\\n") * 512)  # 512 KiB: far more than the launcher's stdout pipe holds
sys.stdout.flush()
mark("printed")
time.sleep(7)
'''
    p = job.cli("-np", "1", "-H", f"{h1.address}:1", "-p", str(PORT), "--", *job.argv(body),
                env=ssh_cluster.env(APPLIANCE_SSH_TIMEOUT="2"))
    job.wait_files("printed", 1, limit=30)
    time.sleep(5.0)  # nobody reads the launcher's stdout meanwhile
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err.decode(errors="replace")[-2000:]
    assert out.count(b"\n") == 512
