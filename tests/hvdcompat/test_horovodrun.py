"""``horovodrun`` as a user runs it (the installed command; real launcher and rank processes): its
own flags at 2 local ranks, ``--mpi`` refused before anything starts, and ``--check-build``
telling the truth."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

HOROVODRUN = [os.path.join(os.path.dirname(sys.executable), "horovodrun")]  # the package's console script

BODY = r'''
mark("env", json.dumps(dict(os.environ)))
import torch
import appliance.torch as hvd
hvd.init()
total = hvd.allreduce(torch.full((4,), float(RANK + 1)), op=hvd.Sum)
mark("sum", json.dumps(total.tolist()))
print("rank", RANK, "done", flush=True)
hvd.shutdown()
'''


def horovodrun(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([*HOROVODRUN, *args], capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)


@pytest.mark.timeout(120)
def test_horovodrun_flags_reach_the_ranks_as_knobs(job, tmp_path):
    logs = tmp_path / "logs"
    r = horovodrun("-np", "2", "--gloo", "--disable-cache", "--cache-capacity", "0", "--fusion-threshold-mb", "1", "--cycle-time-ms", "3",
                   "--log-level", "DEBUG", "--timeline-filename", str(tmp_path / "tl.json"), "--autotune",
                   "--output-filename", str(logs), "--verbose", "--start-timeout", "30",
                   "--", *job.argv(BODY), "--log-level", "kept")
    assert r.returncode == 0, r.stderr
    for rank in range(2):
        env = job.env(rank)
        assert env["HOROVOD_CACHE_CAPACITY"] == "0" and env["HOROVOD_FUSION_THRESHOLD"] == str(1 << 20)
        assert env["HOROVOD_CYCLE_TIME"] == "3.0" and env["HOROVOD_START_TIMEOUT"] == "30.0"
        assert env["HOROVOD_TIMELINE"] == str(tmp_path / "tl.json")
        assert json.loads(job.read("sum", rank)) == [3.0] * 4
        assert (logs / f"rank.{rank}" / "stdout").read_text() == f"rank {rank} done\n"
    warned = [line.split(":")[2].strip() for line in r.stderr.splitlines() if line.startswith("horovodrun: warning:")]
    assert warned == ["--log-level DEBUG", "--autotune"]
    assert json.loads((tmp_path / "tl.json").read_text())  # rank 0 wrote the timeline, complete


@pytest.mark.timeout(60)
def test_mpi_is_refused_by_name_before_any_rank_starts(job):
    r = horovodrun("-np", "2", "--mpi", "--", *job.argv('mark("ran")'))
    assert r.returncode == 2
    assert r.stderr.startswith("horovodrun: error: --mpi: ") and len(r.stderr.splitlines()) == 1
    assert job.files("pid") == {} and job.files("ran") == {}


@pytest.mark.timeout(60)
def test_check_build_reports_this_build_in_horovods_layout():
    from appliance.runtime import devices

    r = horovodrun("--check-build")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    torch = "X" if _has_torch() else " "
    mpi = "X" if shutil.which("mpirun") else " "
    nccl = "X" if devices.capabilities().get("nccl") else " "
    assert lines[:18] == [
        "Horovod v0.28.1:", "",
        "Available Frameworks:", "    [ ] TensorFlow", f"    [{torch}] PyTorch", "    [ ] MXNet", "",
        "Available Controllers:", f"    [{mpi}] MPI", "    [X] Gloo", "",
        "Available Tensor Operations:", f"    [{nccl}] NCCL", "    [ ] DDL", "    [ ] CCL", "    [ ] MPI",
        "    [X] Gloo", ""]
    assert horovodrun("-cb").stdout == r.stdout


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None
