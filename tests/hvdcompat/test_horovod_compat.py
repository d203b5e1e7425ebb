"""The ``horovod`` compatibility package (shim/horovod) on real ranks: a Horovod-style
script with unchanged ``horovod.*`` imports through ``appliance.launcher.launch``, a lost peer
caught as ``horovod.common.exceptions.HorovodInternalError``, and ``horovod.run``."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from fixtures import RANKS, ROOT

SHIM = ROOT / "shim"
PATH = os.pathsep.join([str(ROOT), str(SHIM), str(RANKS)])


@pytest.mark.parametrize("np", [2, 3])
def test_horovod_script_runs_unchanged(run_ranks, np):
    ranks = run_ranks(np, "horovod_script", env={"PYTHONPATH": PATH}, timeout=90)
    for r in range(np):
        rep = ranks[r]
        assert rep["rank"] == r and rep["size"] == np and rep["version"] == "0.28.1"
        assert rep["pow2"] == (np == 2) and rep["homogeneous"] is True
        tri = np * (np + 1) / 2
        assert rep["threads"] == [i * tri for i in range(4)]
        assert rep["after"] == np
        if r == 0:
            assert {"adasum", "after"} <= set(rep["timeline"]), rep["timeline"]
        assert rep["adasum"] == [2.0, 2.0, 2.0]
        mean = sum(q * (q + 1) for q in range(np)) / sum(q + 1 for q in range(np))
        assert rep["sbn_running_mean"] == pytest.approx([mean] * 4) and rep["elastic"] == 0, rep
        assert rep["even_set"] == [float(sum(q for q in range(0, np, 2)))] * 2


def test_lost_peer_is_caught_as_horovod_internal_error(run_ranks):
    ranks = run_ranks(2, "horovod_script", "--lose-rank-1", env={"PYTHONPATH": PATH}, timeout=90)
    assert ranks[1] is None  # rank 1 vanished before reporting
    assert ranks[0]["caught"] == "appliance.runtime.errors.HorovodInternalError"


def _horovod_run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=PATH)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def test_horovod_run_returns_each_rank_result():
    p = _horovod_run("import horovod, horovod_run_fn as f; "
                     "print(horovod.run(f.rank_and_sum, args=(2.0,), num_proc=3, hosts='localhost:3'))")
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.strip().splitlines()[-1] == "[(0, 3, 12.0), (1, 3, 12.0), (2, 3, 12.0)]"


def test_horovod_run_names_the_failed_rank_and_refuses_mpi_arguments():
    p = _horovod_run("import horovod, horovod_run_fn as f\n"
                     "try:\n    horovod.run(f.fail_on_rank_1, num_proc=2)\n"
                     "except RuntimeError as e:\n    print('RAISED', e)\n"
                     "try:\n    horovod.run(f.fail_on_rank_1, num_proc=2, use_mpi=True)\n"
                     "except NotImplementedError as e:\n    print('REFUSED', e)\n")
    assert p.returncode == 0, p.stderr[-4000:]
    assert "RAISED horovod.run: rank 1" in p.stdout
    assert "REFUSED horovod.run(use_mpi=...): mpirun is not used" in p.stdout


def test_horovod_run_with_elastic_arguments_runs_an_elastic_job():
    """``min_num_proc`` makes an elastic job over the fixed hosts (as horovodrun's --min-np): the
    function runs under the driver, a worker that fails takes its host out, and the results are the
    survivors', by their final rank."""
    p = _horovod_run("import horovod, horovod_run_fn as f\n"
                     "print(horovod.run(f.elastic_sum, num_proc=3, min_num_proc=2, "
                     "hosts='127.0.0.2:1,127.0.0.3:1,127.0.0.4:1'))", timeout=150)
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.strip().splitlines()[-1] == "[(0, 2, 3.0), (1, 2, 3.0)]"
