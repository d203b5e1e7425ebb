"""Elastic TensorFlow (``hvd.elastic.run`` with ``TensorFlowKerasState``/``TensorFlowState``) in real
elastic jobs on this machine: ``appliance launch`` with a host discovery script, loopback addresses
as hosts (127.0.0.x), the rank program ``tests/ranks/elastic_tf.py`` (Horovod's elastic TF2 pattern,
a commit every step), evidence read through ``fixtures.elastic_grow.GrowJob``.

Asserted effects: a job started at one rank grows to two (the newcomer takes rank 0's variables and
optimizer slots: every rank holds the same model after every step); a rank SIGKILLed mid-training is
survived: the survivor's next collective fails inside a TensorFlow op, ``run`` takes that for
``HorovodInternalError``, restores the last commit and goes on at the new size in the same process
(its PID never changes), every step is taken exactly once by as many ranks as the job had then, and
the final model equals a one-process replay of those sizes (no committed step lost or doubled);
rc 0 and no process left. Needs TensorFlow (conftest.py); pytest itself never imports it.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import RANKS, ROOT
from fixtures.elastic_grow import GrowJob

pytestmark = pytest.mark.timeout(420)

A, B = "127.0.0.2", "127.0.0.3"


class TFJob(GrowJob):
    """A GrowJob of ``tests/ranks/elastic_tf.py``."""

    def start(self, cli: list[str], *, modes: tuple = (), step_s: float = 0.05, env: dict | None = None) -> "TFJob":
        bin_dir = Path(sys.executable).parent
        argv = [str(bin_dir / cli[0]), *cli[1:], "--host-discovery-script", str(self.script),
                sys.executable, str(RANKS / "elastic_tf.py"), str(self.out), "5000", str(step_s), *modes]
        full = dict(os.environ, PYTHONPATH=str(ROOT / "shim"), OMP_NUM_THREADS="1", TF_NUM_INTEROP_THREADS="1",
                    TF_NUM_INTRAOP_THREADS="1", APPLIANCE_DISCOVERY_INTERVAL="0.2", APPLIANCE_STOP_GRACE="1",
                    APPLIANCE_VIEW="off", TF_CPP_MIN_LOG_LEVEL="2")
        full.update(env or {})
        full["PATH"] = f"{bin_dir}:{full.get('PATH', '')}"
        self.output = open(self.out / "launcher.txt", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.output, stderr=subprocess.STDOUT, env=full,
                                     start_new_session=True, cwd=self.out)
        return self

    def kill_at(self, worker: str, step: int) -> None:
        tmp = self.out / f".kill.{worker}.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, self.out / f"kill.{worker}")

    def check_survivor(self, worker: str, sizes: dict[int, int], resets: list[int]) -> None:
        """``worker`` ran the whole job in one process, finished with the replay's model, and was
        reset for each change of size."""
        done = self.done()
        assert set(done) == {worker}, done.keys()
        d = done[worker]
        pid = int((self.out / f"pid.{worker}").read_text())
        assert d["pid"] == pid and {r["pid"] for r in self.log()[worker]} == {pid}, (pid, d["pid"])
        assert d["sizes"] == [sizes[s] for s in sorted(sizes)], (d["sizes"], sizes)
        assert d["resets"] == resets, d["resets"]
        for got, ref in zip(d["params"], d["replay"], strict=True):
            assert len(got) == len(ref) and all(math.isclose(g, r, rel_tol=1e-4, abs_tol=1e-5)
                                                for g, r in zip(got, ref)), (got[:3], ref[:3])


def _changes(sizes: dict[int, int]) -> list[int]:
    return [s for i, s in sorted(sizes.items()) if i == 1 or s != sizes[i - 1]]


def test_a_keras_job_grows_from_one_rank_to_two_and_survives_a_killed_rank(tmp_path):
    """1 -> 2 (a host appears) -> 1 (the new host's rank SIGKILLs itself as it starts step K)."""
    with TFJob(tmp_path, f"{A}:1") as job:
        job.start(["appliance", "launch", "-np", "1", "--min-np", "1", "--max-np", "2"])
        job.steps(1, n=3, limit=150)
        job.set_hosts(f"{A}:1,{B}:1")
        job.steps(2, n=3, limit=150)
        kill = job.max_step() + 3
        job.kill_at("1", kill)
        job.steps(1, n=3, limit=150)
        job.stop(extra=2)
        assert job.wait() == 0, job.tail()
        sizes = job.check_equal()
        assert _changes(sizes) == [1, 2, 1], sizes
        # the killed step K was never committed at 2 ranks: the survivor took it again, from commit K - 1, alone
        assert sizes[kill - 1] == 2 and sizes[kill] == 1, (kill, sizes)
        job.check_survivor("0", sizes, resets=[2, 1])
        assert job.leftovers() == []


def test_tensorflow_state_syncs_from_rank_0_and_a_lost_rank_restores_the_commit(tmp_path):
    """Two ranks started without a launcher (tests/runtime/rank_group.py): ``run`` syncs a
    ``TensorFlowState`` (variables and attributes) from rank 0; rank 1 dies after a commit and rank
    0's next allreduce fails inside the op: ``run`` restores the commit and, the hosts being fixed,
    re-raises ``HorovodInternalError`` naming rank 1. An UnknownError that is not the runtime's
    is not taken for one."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from rank_group import RankGroup

    with RankGroup(2, "static", out=tmp_path, worker=RANKS / "elastic_tf.py",
                   env={"PYTHONPATH": f"{ROOT / 'shim'}:{ROOT}", "OMP_NUM_THREADS": "1",
                        "TF_CPP_MIN_LOG_LEVEL": "2"}) as g:
        codes = g.wait(150)
        assert codes == [0, -9], (codes, g.all_stderr())
        assert g.report(1)["synced"] == [[1.0, 1.0, 1.0], 0, 0, "rank 0"], g.report(1)
        rep = g.report(0)
        assert rep and rep["ok"], g.all_stderr()
        assert rep["synced"] == [[1.0, 1.0, 1.0], 0, 0, "rank 0"], rep
        assert rep["kind"] == "HorovodInternalError" and rep["origin_rank"] == 1 and "rank 1" in rep["error"], rep
        assert rep["restored"] == [[2.0, 2.0, 2.0], 10], rep
        assert rep["foreign_mapped"] is False, rep
