"""Horovod's launch lines with OpenMPI's mpirun, verbatim (but the script's name): the ranks
bootstrap through PMIx (no address, port or secret from the user), train, and report the layout
``appliance launch`` gives; the flags' meaning; bad input; a lost rank; Ctrl-C; elastic.

Each mpirun starts from a job directory with ``train.py`` (tests/ranks/mpirun_train.py); after
each, no process may still work there.
"""
from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from fixtures import mpirun_lines as ml

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def job(tmp_path, require_tool):
    require_tool("mpirun", "OpenMPI (openmpi-bin)")
    return ml.job_dir(tmp_path)


def test_issue_lines_on_this_machine_match_appliance_launch(job):
    """The issue's first two lines, 8 ranks on localhost: every rank trains, the weights agree, and
    rank, size, local and cross rank and size and the allreduce equal those `appliance launch`
    gives: the launcher's own placement (hosts.assign_ranks for localhost:8; that ranks under the
    launcher see it is tests/runtime/test_engine.py::test_every_op_dtype_and_size's and
    tests/launcher/test_launch_api.py's) and the sum of 1..8."""
    from appliance.launcher.hosts import Host, assign_ranks

    placed = assign_ranks([Host("localhost", 8)], 8)
    under_launch = [(s.rank, s.size, s.local_rank, s.local_size, s.cross_rank, s.cross_size, [36.0] * 4)
                    for s in placed]
    rc, out, left = ml.run(ml.LINE1, job, ml.env(), timeout=240)
    assert rc == 0, out[-4000:]
    assert not left
    under_mpirun = ml.reports(out)
    assert sorted(under_mpirun) == list(range(8)), out[-4000:]
    assert all(r["same_weights"] for r in under_mpirun.values())
    assert "APPLIANCE_STORE_ADDR" not in out
    assert ml.layout(under_mpirun) == under_launch, out[-4000:]
    rc, out, left = ml.run(ml.LINE2, job, ml.env(), timeout=240)
    assert rc == 0 and not left, out[-4000:]
    assert ml.layout(ml.reports(out)) == under_launch


def test_interface_lists_choose_the_store_address(job):
    """-mca btl_tcp_if_include lo puts rank 0's store on 127.0.0.1 (verbose names it); a list that
    admits no interface here is one line naming it, and mpirun fails with nothing left."""
    line = "mpirun -np 2 -H localhost:2 -bind-to none -mca btl_tcp_if_include lo python train.py"
    rc, out, left = ml.run(line, job, ml.env(APPLIANCE_VERBOSE="1"), timeout=180)
    assert rc == 0 and not left, out[-4000:]
    assert "appliance: under mpirun, rank 0 on " in out and "(interface lo, from btl_tcp_if_include)" in out, out[-3000:]
    assert ":" in out.split("chose 127.0.0.1", 1)[1][:2], out[-3000:]
    line = "mpirun -np 2 -H localhost:2 -bind-to none -mca btl_tcp_if_include nosuch9 python train.py"
    rc, out, left = ml.run(line, job, ml.env(), timeout=180)
    assert rc != 0 and not left, out[-4000:]
    assert "btl_tcp_if_include='nosuch9' admits no interface" in out, out[-4000:]


def test_binding_is_mpirun_s(job):
    """-bind-to core: each rank keeps the single CPU mpirun bound it to (the runtime binds nothing);
    -bind-to none: every rank may run on all of this process's CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    line = "mpirun -np 2 -H localhost:2 -bind-to core -map-by core python train.py"
    rc, out, left = ml.run(line, job, ml.env(), timeout=180)
    assert rc == 0 and not left, out[-4000:]
    bound = [r["cpus"] for r in ml.reports(out).values()]
    assert len(bound) == 2 and all(len(c) == 1 for c in bound) and bound[0] != bound[1], bound
    line = "mpirun -np 2 -H localhost:2 -bind-to none python train.py"
    rc, out, left = ml.run(line, job, ml.env(), timeout=180)
    assert rc == 0 and not left, out[-4000:]
    assert [r["cpus"] for r in ml.reports(out).values()] == [cpus, cpus]


def _init_alone(job, **env) -> subprocess.CompletedProcess:
    code = "import appliance.runtime as rt; rt.init()"
    return subprocess.run([sys.executable, "-c", code], cwd=job, env=ml.env(**env), capture_output=True,
                          text=True, timeout=60)


def test_an_mpi_without_pmix_is_one_line(job):
    """OpenMPI's rank variables with no PMIx server (an older or foreign mpirun), or a PMIx server
    that is gone: one line each saying what is missing, exit non-zero, within seconds."""
    p = _init_alone(job, OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_SIZE="2")
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1].endswith(
        "rank 1 of 2 under mpirun: started by an mpirun (OMPI_COMM_WORLD_SIZE=2) without a PMIx server "
        "(no PMIX_NAMESPACE / PMIX_SERVER_URI*): use OpenMPI 4 or later, or pass "
        "-x APPLIANCE_STORE_ADDR=<rank 0 host>:<port> -x APPLIANCE_JOB_SECRET"), p.stderr
    started = time.monotonic()
    p = _init_alone(job, OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", PMIX_NAMESPACE="gone",
                    PMIX_RANK="1", PMIX_SERVER_URI4="gone.0;tcp4://127.0.0.1:9", PMIX_SERVER_URI41="gone.0;tcp4://127.0.0.1:9")
    assert p.returncode != 0 and time.monotonic() - started < 30
    assert "rank 1 of 2 under mpirun: PMIx_Init failed" in p.stderr.strip().splitlines()[-1], p.stderr


def test_hydra_ranks_without_a_pmi_server_are_one_line(job):
    p = _init_alone(job, PMI_RANK="0", PMI_SIZE="2")
    assert p.returncode != 0
    assert "rank 0 of 2 under hydra: neither PMI_FD nor PMI_PORT is set" in p.stderr.strip().splitlines()[-1], p.stderr


def test_a_killed_rank_is_named_and_mpirun_fails_with_nothing_left(job):
    """Rank 1 SIGKILLs itself mid-job: the others raise HorovodInternalError naming rank 1 well within
    the heartbeat bound, mpirun reports the failure (exit non-zero), and no rank is left."""
    line = "mpirun -np 3 -H localhost:3 -bind-to none -map-by slot python train.py --die 1"
    started = time.monotonic()
    rc, out, left = ml.run(line, job, ml.env(HOROVOD_HEARTBEAT_TIMEOUT="10"), timeout=180)
    assert rc != 0 and not left, out[-4000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("HOROVOD_ERROR")]
    assert errors and all("rank 1" in ln for ln in errors), out[-4000:]
    assert "rank 1" in out and "signal 9" in out, out[-4000:]
    assert time.monotonic() - started < 150


def test_ctrl_c_of_mpirun_stops_every_rank(job):
    line = "mpirun -np 2 -H localhost:2 -bind-to none python train.py --hang"

    proc = subprocess.Popen(shlex.split(line), cwd=job, env=ml.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue = queue.Queue()  # read aside, so that the wait below keeps its bound
    threading.Thread(target=lambda: [lines.put(out) for out in proc.stdout], daemon=True).start()
    try:
        seen = []
        end = time.monotonic() + 150
        while len([s for s in seen if s.startswith("UP ")]) < 2 and time.monotonic() < end:
            try:
                seen.append(lines.get(timeout=max(0.1, end - time.monotonic())))
            except queue.Empty:
                break
        assert len([s for s in seen if s.startswith("UP ")]) == 2, "".join(seen)[-3000:]
        assert len(ml.leftovers(job)) == 3  # mpirun and its two ranks
        proc.send_signal(signal.SIGINT)  # the terminal's Ctrl-C reaches mpirun
        proc.wait(timeout=30)
        assert proc.returncode != 0
        assert not ml.wait_clean(job)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        ml.kill(ml.leftovers(job))


def test_elastic_run_under_mpirun_says_the_ranks_are_fixed(job):
    line = "mpirun -np 2 -H localhost:2 -bind-to none python train.py --elastic"
    rc, out, left = ml.run(line, job, ml.env(), timeout=180)
    assert rc == 0 and not left, out[-4000:]
    notes = [ln for ln in out.splitlines() if ln.startswith("hvd.elastic.run under mpirun")]
    assert len(notes) == 1 and "horovodrun --min-np" in notes[0], out[-4000:]
