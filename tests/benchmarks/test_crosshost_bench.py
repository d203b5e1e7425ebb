"""benchmarks/crosshost.py runs end to end: its --quick mode builds its own two simulated hosts
(network namespaces + sshd, tests/fixtures/netns.py), exits 0, prints the allreduce table with a row per size and
a number for ours, gloo and OpenMPI tcp, writes its JSON, and leaves no namespace behind. No timed
assertions. Needs root (namespaces), sshd, and for the OpenMPI column mpirun + mpi4py: a missing one
skips here and fails under --strict-prereqs (CI).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from fixtures import ROOT

BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import benchlib  # noqa: E402  (benchmarks/ is scripts, not a package)
from fixtures import netns  # noqa: E402

pytestmark = [pytest.mark.ssh]


def prereqs(request) -> bool:
    """Skip (fail under --strict-prereqs) without namespaces; True when the OpenMPI column must run."""
    strict = request.config.getoption("--strict-prereqs", default=False)
    why = netns.available()
    if why and strict:
        pytest.fail(f"SSH tier: {why}")
    if why:
        pytest.skip(f"SSH tier: {why}")
    missing = benchlib.mpi_missing()
    if missing and strict:
        pytest.fail(f"crosshost benchmark's OpenMPI column: {missing}; tests/run.sh installs it")
    return missing is None


def namespaces(pid: int) -> list[str]:
    """Namespaces of the simulated hosts built by process ``pid`` (netns names them by pid)."""
    lines = netns.sh("ip", "netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in lines if line.startswith(f"{netns.PREFIX}{pid}x")]


@pytest.mark.timeout(300)
def test_crosshost_quick(request, tmp_path):
    with_mpi = prereqs(request)
    out = tmp_path / "crosshost.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = str(ROOT)
    # its own session, so a timeout kills the script and everything it started
    p = subprocess.Popen([sys.executable, str(BENCH / "crosshost.py"), "--quick", "--json", str(out)], env=env,
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            netns.remove_stale()  # its namespaces, now that its pid is gone
    assert p.returncode == 0, f"crosshost.py exited {p.returncode}:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    want = ["ours", "gloo"] + (["mpi-tcp"] if with_mpi else [])
    assert "\nallreduce, float32, 2 ranks on two hosts" in stdout and "link kind tcp" in stdout, stdout
    head = next(line for line in stdout.splitlines() if line.lstrip().startswith("size"))
    assert head.split("|")[0].split()[1:] == want, head
    for size in ("4K", "64K"):
        row = next(line for line in stdout.splitlines() if line.split()[:1] == [size])
        assert "-" not in row.split("|")[0].split(), row
    result = json.loads(out.read_text())
    assert result["backends"] == want, (result["backends"], result["skipped"], stderr[-2000:])
    assert len({r["host"] for r in result["ranks"]}) == 2
    for backend in want:
        rows = [r for r in result["rows"] if r["backend"] == backend]
        assert sorted(r["bytes"] for r in rows) == [4096, 65536], (backend, rows)
        assert all(r["time_s"] > 0 and r["busbw_GBps"] > 0 for r in rows)
    assert namespaces(p.pid) == [], "namespaces left behind"
