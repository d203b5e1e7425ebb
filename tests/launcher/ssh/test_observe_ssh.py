"""The launcher's view of a job of 32 ranks on 4 real hosts (network namespaces with sshd).

One job, in a tmux terminal: 8 ranks on each of 4 simulated hosts, rank 13 (the second host's
sixth) 50 ms slower per step. What a person sees: the header counts 32 ranks on 4 hosts, one row
per host (the names given with -H), the straggler named with its host within 10 s of the first
numbers, and every line of the job's output whole in the scrollback. While it runs, a Prometheus
scrape (``--metrics-port``, parsed by prometheus_client's parser) has every rank of every host,
and ``appliance status`` lists the job from its record on the share; afterwards
``appliance report JOB_ID`` redraws report.png from that record. Rank program:
``tests/ranks/observe_worker.py``.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from fixtures import RANKS, netns
from fixtures.netns import PORT
from fixtures.tmux import Terminal, available

pytestmark = [pytest.mark.ssh, pytest.mark.slow, pytest.mark.timeout(300)]
WORKER = str(RANKS / "observe_worker.py")
LINE = re.compile(r"^\[(\d+)\]<stdout>:rank (\d+) step (\d+) line (\d+)$")


@pytest.fixture(scope="module")
def four_hosts(request):
    why = netns.available() or available()
    if why:
        if request.config.getoption("--strict-prereqs", default=False):
            pytest.fail(f"SSH tier: {why}")
        pytest.skip(f"SSH tier: {why}")
    os.makedirs(os.path.expanduser("~/.cache"), exist_ok=True)
    base = tempfile.mkdtemp(prefix="appliance-observe-", dir=os.path.expanduser("~/.cache"))
    cluster = None
    try:
        shared = os.path.join(base, "share")
        subprocess.run([sys.executable, "-m", "appliance", "keys", "--shared", shared], check=True,
                       capture_output=True, timeout=60)
        cluster = netns.Cluster(4, shared, base)
        yield cluster, base, shared
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(base, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def scrape(port: int) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return [s for fam in text_string_to_metric_families(body) for s in fam.samples]


def test_32_ranks_on_4_hosts(four_hosts, tmp_path):
    cluster, base, shared = four_hosts
    hosts = [h.address for h in cluster.hosts]
    port = free_port()
    env = {"APPLIANCE_SHARED": shared, "HOME": base, "APPLIANCE_STOP_GRACE": "1", "APPLIANCE_METRICS_INTERVAL": "0.5",
           "APPLIANCE_SSH_TIMEOUT": "30"}  # 32 ranks starting on a loaded machine
    argv = [sys.executable, "-m", "appliance", "launch", "-np", "32", "-H", ",".join(f"{h}:8" for h in hosts),
            "-p", str(PORT), "--metrics-port", str(port), "--", sys.executable, WORKER, "150", "60", "13", "50", "25"]
    with Terminal(200, 50, env=env, cwd=str(tmp_path)) as term:
        term.type(shlex.join(argv) + "; echo EXIT=$?")
        header = re.compile(r"job (\w+) · 32/32 ranks on 4 hosts · step \d+/150 · [\d.]+ steps/s")
        screen = term.wait_for(lambda s: header.search(s), 150, "the header of 32 ranks on 4 hosts")
        job_id = header.search(screen).group(1)
        t0 = time.monotonic()
        for i, h in enumerate(hosts):
            assert re.search(rf"^{re.escape(h)}\b.*\s{i * 8}-{i * 8 + 7}\s+\d+\s", screen, re.M), screen

        samples = scrape(port)
        up = {(s.labels["host"], s.labels["rank"]) for s in samples if s.name == "appliance_rank_up" and s.value == 1}
        assert up == {(hosts[r // 8], str(r)) for r in range(32)}
        assert {s.labels["job"] for s in samples} == {job_id}

        want = re.compile(rf"{job_id}\s*│\s*{re.escape(', '.join(hosts))}\s*│\s*32\s*│\s*\d+/150\s*│\s*[\d.]+\s*│")
        for _ in range(10):  # live.json is rewritten every 2 s
            status = subprocess.run([sys.executable, "-m", "appliance", "status", "--shared", shared],
                                    capture_output=True, text=True, timeout=60, env={**os.environ, **env})
            if want.search(status.stdout):
                break
            time.sleep(1)
        assert want.search(status.stdout), status.stdout + status.stderr

        term.wait_for(lambda s: f"straggler: rank 13 on {hosts[1]} keeps the others waiting" in s, 30,
                      "the straggler named")
        assert time.monotonic() - t0 < 10.0 + 3.0  # the scrape and `appliance status` ran in between
        term.wait_for(lambda s: re.search(r"^EXIT=\d+", s, re.M), 150, "the job's end")
        history = term.history()
    assert re.search(r"^EXIT=0$", history, re.M), history[-3000:]
    got: dict = {}
    for raw in history.splitlines():
        if "<stdout>:" in raw:
            m = LINE.match(raw.rstrip())
            assert m, f"a garbled output line: {raw!r}"
            got.setdefault(int(m.group(1)), []).append(int(m.group(4)))
    assert got == {r: [1, 2, 3, 4, 5, 6] for r in range(32)}

    job_dir = os.path.join(shared, "jobs", job_id)
    os.remove(os.path.join(job_dir, "report.png"))
    r = subprocess.run([sys.executable, "-m", "appliance", "report", job_id, "--shared", shared],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == os.path.join(job_dir, "report.png")
    assert re.match(rf"summary: \d+/150 steps .*top straggler rank 13 on {re.escape(hosts[1])}", r.stdout), r.stdout
    assert os.path.getsize(os.path.join(job_dir, "report.png")) > 10000
