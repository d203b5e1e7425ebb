"""The cluster plane's job runner (``python -m appliance.cluster.jobrun``) and the preflight hooks
over real OpenSSH (the simulated hosts of ``tests/fixtures/netns.py``): the job runner checks each host once,
through the launcher's preflight, writes the startup view's host files from its reports, and a
secondary that starts late is waited for.

Effects asserted: SSH logins each host's sshd accepted, the job directory's files, exit codes,
the reports the hook received, time bounds, nothing left on the hosts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from fixtures.netns import PORT

pytestmark = [pytest.mark.ssh]

WORKER = ("import json, os, socket, sys; "
          "open(os.path.join(sys.argv[1], 'ran.%s' % os.environ['HOROVOD_RANK']), 'w').write(socket.gethostname())")


def logins(host) -> int:
    """SSH logins this host's sshd accepted so far (its log is the only record of them)."""
    with open(host.log, errors="replace") as f:
        return sum("Accepted publickey" in line for line in f)


def make_job(ssh_cluster, tmp_path, hosts: str, np_: int, *flags: str, wait: float = 5.0):
    from appliance.cluster.jobrun import create_job
    from appliance.launcher.flags import parse_launch_flags

    out = tmp_path / "out"
    out.mkdir()
    parsed, command = parse_launch_flags(["-np", str(np_), "-H", hosts, *flags, "--",
                                          sys.executable, "-c", WORKER, str(out)])
    job_dir = os.path.join(ssh_cluster.shared, "jobs", f"t{os.getpid()}{time.monotonic_ns() % 10**6}")
    create_job(job_dir, parsed, command, ssh_port=PORT, shared=ssh_cluster.shared, network="host", image="",
               workdir=ssh_cluster.base, secondary_wait_s=wait)
    return job_dir, out


def run_jobrun(ssh_cluster, job_dir: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance.cluster.jobrun", job_dir], capture_output=True,
                          text=True, cwd=ssh_cluster.base, env={**os.environ, **ssh_cluster.env()}, timeout=timeout)


def read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


@pytest.mark.timeout(90)
def test_jobrun_checks_each_host_once_then_runs_the_job(ssh_cluster, tmp_path):
    h1, h2 = ssh_cluster.hosts
    job_dir, out = make_job(ssh_cluster, tmp_path, f"localhost:1,{h1.address}:1,{h2.address}:1", 3)
    before = {h.address: logins(h) for h in (h1, h2)}
    r = run_jobrun(ssh_cluster, job_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    # One SSH login per host: the launcher's preflight, whose connection then carries the ranks.
    assert {h.address: logins(h) - before[h.address] for h in (h1, h2)} == {h1.address: 1, h2.address: 1}
    assert {p: open(out / p).read() for p in os.listdir(out)} == {
        "ran.0": os.uname().nodename, "ran.1": h1.hostname, "ran.2": h2.hostname}
    # The startup view's files, from the preflight's reports; the ranks' start records; the exit.
    assert read(os.path.join(job_dir, "hosts", "localhost.json"))["local"] is True
    for h in (h1, h2):
        facts = read(os.path.join(job_dir, "hosts", f"{h.address}.json"))
        assert (facts["local"], facts["reachable"], facts["authenticated"], facts["address"], facts["error"]) == (
            False, True, True, h.address, "")
    assert sorted(os.listdir(os.path.join(job_dir, "ranks"))) == ["0.json", "1.json", "2.json"]
    assert sorted(os.listdir(os.path.join(job_dir, "logs"))) == ["rank.0", "rank.1", "rank.2"]
    assert read(os.path.join(job_dir, "exit.json"))["returncode"] == 0
    assert ssh_cluster.wait_clean() == {}


@pytest.mark.timeout(60)
def test_jobrun_names_what_to_run_on_a_host_that_is_not_up(ssh_cluster, tmp_path):
    h1, _ = ssh_cluster.hosts
    bad_port = PORT + 1  # nothing listens there: refused, waited for, then failed
    job_dir, out = make_job(ssh_cluster, tmp_path, f"localhost:1,{h1.address}:1", 2, "-p", str(bad_port), wait=1.0)
    start = time.monotonic()
    r = run_jobrun(ssh_cluster, job_dir)
    elapsed = time.monotonic() - start
    assert r.returncode == 1, r.stdout + r.stderr
    hints = [l for l in r.stderr.splitlines() if "is not up" in l]
    assert hints == [f"appliance primary: {h1.address}:{bad_port} is not up: start its secondary on {h1.address}: "
                     f"appliance secondary --ssh-port {bad_port} --shared {ssh_cluster.shared}"], r.stderr
    facts = read(os.path.join(job_dir, "hosts", f"{h1.address}.json"))
    assert facts["reachable"] is False and facts["authenticated"] is None and facts["error"]
    assert read(os.path.join(job_dir, "exit.json"))["returncode"] == 1
    assert not os.listdir(out) and not os.listdir(os.path.join(job_dir, "ranks"))  # no rank started
    assert 0.7 <= elapsed < 20, elapsed  # waited about the secondary wait, not the whole start timeout


def _stop_sshd(host) -> None:
    host.sshd.kill()
    host.sshd.wait(timeout=5)


@pytest.mark.timeout(90)
def test_preflight_waits_for_a_secondary_that_starts_late(ssh_cluster, tmp_path):
    from appliance.launcher.config import LaunchConfig
    from appliance.launcher import LaunchError, run

    h1, _ = ssh_cluster.hosts
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-c", WORKER, str(out)]

    def config(wait: float) -> LaunchConfig:
        return LaunchConfig.create(command, 2, hosts=f"localhost:1,{h1.address}:1", port=PORT,
                                   start_timeout=10, shared=ssh_cluster.shared, host_wait_s=wait,
                                   environ={**os.environ, **ssh_cluster.env()}, cwd=ssh_cluster.base)

    restarter = None
    try:
        _stop_sshd(h1)
        reports: list = []
        start = time.monotonic()
        with pytest.raises(LaunchError, match="refused"):  # no wait: refused fails at once
            run(config(0.0), echo=False, capture=True, on_host_report=reports.append)
        assert time.monotonic() - start < 3
        assert sorted(r.host for r in reports) == sorted(["localhost", h1.address])
        assert [r.failures != [] for r in reports if r.host == h1.address] == [True]

        restarter = threading.Timer(1.5, ssh_cluster.c._start_sshd, args=(h1,))  # the secondary comes up late
        restarter.start()
        reports.clear()
        start = time.monotonic()
        result = run(config(15.0), echo=False, capture=True, on_host_report=reports.append)
        elapsed = time.monotonic() - start
        assert result.returncode == 0, result
        assert elapsed >= 1.5 and sorted(os.listdir(out)) == ["ran.0", "ran.1"]
        assert sorted(r.host for r in reports) == sorted(["localhost", h1.address])  # once per host
        assert all(not r.failures for r in reports)
    finally:
        if restarter is not None:
            restarter.join()
        if h1.sshd.poll() is not None:
            ssh_cluster.c._start_sshd(h1)
        ssh_cluster.c._wait_listening(h1)
    assert ssh_cluster.wait_clean() == {}
