"""appliance.tensorflow's collectives on real ranks (2 and 3 processes through the launcher):
every op (reducescatter, alltoall and join on fewer dtypes) x dtype x a few shapes eagerly and inside tf.function against numpy, grouped allreduce,
IndexedSlices, the scalar ops, the gradients, a process set of the even ranks, a shape mismatch and an unsupported dtype, and
calls before hvd.init(). Needs TensorFlow (conftest.py).

A TensorFlow rank spends seconds importing TensorFlow, so each size is one job (``job``, once per
module) and the tests read its ranks' reports: 2 ranks run the cases, then what Horovod's own suite
needs; 3 ranks the cases, each dtype sweep's combination in one of the two modes (eager and
tf.function alternate, APPLIANCE_TEST_TF_ALTERNATE: the modes are the 2-rank job's concern, the
3-rank job's the odd size), then the process set of the even ranks. Both jobs run with dynamic
process sets (HOROVOD_DYNAMIC_PROCESS_SETS=1; the default mode is the training tests'). A case
that fails ends its job: the tests of the cases after it fail too, each showing the job's output.
"""
import os

import pytest

from fixtures import ROOT
from fixtures.ranks import launch_ranks

CASES = (
    "before_init,allreduce,grouped_allreduce,allgather,broadcast,reducescatter,alltoall,join,indexed_slices,scalars,"
    "gradients,errors")
AFTER = {2: "horovod_suite", 3: "process_sets"}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """job(np_): the reports of the np_-rank job (run at its first use) and its output's tail."""
    done = {}

    def run(np_):
        if np_ not in done:
            env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'shim'}", "OMP_NUM_THREADS": "1",
                   "HOROVOD_DYNAMIC_PROCESS_SETS": "1", "APPLIANCE_TEST_TF_ALTERNATE": "1" if np_ == 3 else "0"}
            ranks = launch_ranks(tmp_path_factory.mktemp(f"tf-collectives-{np_}"), np_, "tf_hvd",
                                 f"{CASES},{AFTER[np_]}", env=env, timeout=360, expect_ok=False)
            res = ranks.result
            done[np_] = (ranks.reports, f"rc {res.returncode} (rank {res.failed_rank}: {res.reason}):\n"
                                        f"{ranks.output()[-6000:]}")
        return done[np_]
    return run


def _ran(reports, tail, cases):
    """Every rank reported and ran ``cases`` (in order, as a part of its list: a case is listed
    once it has passed)."""
    for r, rep in enumerate(reports):
        assert rep is not None, f"rank {r} reported nothing; {tail}"
        at = rep["cases"].index(cases[0]) if cases[0] in rep["cases"] else -1
        assert at >= 0 and rep["cases"][at:at + len(cases)] == cases, (r, rep, tail)


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("np_", [2, 3])
def test_collectives(job, np_):
    reports, tail = job(np_)
    _ran(reports, tail, CASES.split(","))
    for r in range(np_):  # 3 ranks: every combination once, in one mode
        assert reports[r]["allreduce_checked"] >= (280 if np_ == 2 else 140), (reports[r], tail)


@pytest.mark.timeout(420)
def test_process_sets(job):
    reports, tail = job(3)
    _ran(reports, tail, ["process_sets"])
    assert all(rep["ok"] for rep in reports), tail


@pytest.mark.timeout(420)
def test_what_horovods_suite_needs(job):
    """uint16 through allgather/broadcast/alltoall, grouped allgather and grouped reducescatter
    (values, scaling, gradients, a scalar member refused), and in a v1 session broadcast_ of
    reference and resource variables and the object helpers; Horovod's module paths; an op on a
    process set this rank is not in: InvalidArgumentError when it runs."""
    reports, tail = job(2)
    _ran(reports, tail, ["horovod_suite"])
    assert all(rep["ok"] for rep in reports), tail
