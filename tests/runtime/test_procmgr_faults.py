"""The bootstrap under a process manager that is not ours, under bad input and faults: every case
of the bad-input probe's mpirun (PMIx) and hydra (PMI-1) surface, each a real ``mpirun
--allow-run-as-root`` or ``mpiexec.hydra`` of at most 3 ranks of ``tests/ranks/pm_bootstrap.py``
with HOROVOD_START_TIMEOUT small. Each ends on its own within its bound, with the line that names
the culprit (the variable as the user set it, the ranks that never arrived, the two processes
that claim one rank), no traceback of an error our code did not mean, and no process left.

A case: ``(id, args, set on one rank or all, fault, expected rc == 0, lines expected)``; the
rank's faults are ``PM_*`` variables the rank program applies to itself (see its text).
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import time

import pytest

from appliance.common import netif
from fixtures import RANKS
from fixtures import mpirun_lines as ml

pytestmark = pytest.mark.timeout(120)

START = 4            # HOROVOD_START_TIMEOUT of a case that waits it out
CALM = 60            # that of the others: a rank that starts late under load is no fault
BOUND = START + 20   # a case's own bound: its ranks' start, the start timeout and the end
UNMEANT = re.compile(r"^\w*(ValueError|KeyError|TypeError|IndexError|AttributeError|UnboundLocalError|OSError)\b",
                     re.M)
SLOW = "waited", "did not complete within HOROVOD_START_TIMEOUT"
NAMES = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else ["lo"]
WITH_V4 = [n for n, _ in netif.interfaces()]
UP_OTHER = next((n for n in WITH_V4 if n != "lo"), "")
NO_V4 = next((n for n in NAMES if n not in WITH_V4), "")
EVERY = ",".join(NAMES) + ",0.0.0.0/0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FENCE = "mpirun's PMIx fence did not complete within HOROVOD_START_TIMEOUT=4 s"
BARRIER = "hydra's PMI-1 barrier did not complete within HOROVOD_START_TIMEOUT=4 s"
URIS = "PMIX_SERVER_URI*"

# id, np, mpirun's extra args, env set on PM_ONLY (None: every rank), PM_* fault, rc == 0, expected lines
MPIRUN = [
    ("m01", 2, "", {}, None, {}, True, ["OK rank 0 size 2 local 0/2 val 3", "OK rank 1 size 2 local 1/2 val 3"]),
    ("m02", 2, "", {}, "1", {"PM_FAULT": "kill"}, False, ["signal 9"]),
    ("m03", 2, "", {}, "0", {"PM_FAULT": "kill"}, False, ["signal 9"]),
    ("m04", 2, "", {}, "1", {"PM_FAULT": "kill", "PM_DELAY": "0.05"}, False, ["signal 9"]),
    ("m05", 2, "", {}, "0", {"PM_FAULT": "kill", "PM_DELAY": "0.3"}, False, ["signal 9"]),
    ("m06", 2, "", {}, "1", {"PM_FAULT": "kill", "PM_LATE": "1.5", "PM_DELAY": "0.5"}, False, ["signal 9"]),
    ("m07", 2, "", {}, "0", {"PM_FAULT": "kill", "PM_LATE": "1.5", "PM_DELAY": "0.5"}, False, ["signal 9"]),
    ("m08", 2, "", {}, "1", {"PM_FAULT": "kill", "PM_DELAY": "0.01"}, False, ["signal 9"]),
    ("m09", 2, "", {}, "1", {"PM_FAULT": "stop"}, False,
     [f"rank 0 of 2 under mpirun: {FENCE}: rank(s) 1 never arrived (1 of 2 did)"]),
    ("m10", 3, "", {}, "2", {"PM_FAULT": "never"}, False,
     [f"of 3 under mpirun: {FENCE}: rank(s) 2 never arrived (2 of 3 did)"]),
    ("m11", 2, "", {}, "1", {"PM_FAULT": "never"}, False,
     [f"rank 0 of 2 under mpirun: {FENCE}: rank(s) 1 never arrived (1 of 2 did)"]),
    ("m12", 2, "", {}, None, {"PM_UNSET": "PMIX_SERVER_URI*"}, False,
     [f"{URIS} is not set though mpirun's PMIx server set PMIX_NAMESPACE, PMIX_RANK"]),
    ("m13", 2, "", {}, None, {"PM_SET": ";".join(f"{k}=garbage" for k in ("PMIX_SERVER_URI4", "PMIX_SERVER_URI41",
                                                                         "PMIX_SERVER_URI3", "PMIX_SERVER_URI2",
                                                                         "PMIX_SERVER_URI21"))},
     False, ["under mpirun: PMIx_Init failed"]),
    ("m14", 2, "", {}, "1", {"PM_SET": ";".join(f"{k}=x.0;tcp4://127.0.0.1:1" for k in (
        "PMIX_SERVER_URI4", "PMIX_SERVER_URI41", "PMIX_SERVER_URI3", "PMIX_SERVER_URI2", "PMIX_SERVER_URI21"))},
     False, ["rank 1 of 2 under mpirun: PMIx_Init failed"]),
    ("m15", 2, "", {}, None, {"PM_UNSET": "PMIX_NAMESPACE"}, False,
     [f"PMIX_NAMESPACE is not set though mpirun's PMIx server set PMIX_RANK, {URIS}"]),
    ("m16", 2, "", {}, "1", {"PM_SET": "PMIX_NAMESPACE=bogus"}, False, ["rank 1 of 2 under mpirun: PMIx_Init failed"]),
    ("m17", 2, "", {}, None, {"PM_UNSET": "PMIX_RANK"}, False,
     [f"PMIX_RANK is not set though mpirun's PMIx server set PMIX_NAMESPACE, {URIS}"]),
    ("m18", 2, "", {}, "1", {"PM_SET": "PMIX_RANK=0"}, False,
     ["OMPI_COMM_WORLD_RANK=1 but PMIx knows this process as rank 0 (PMIX_RANK=0): two processes of the job "
      "claim rank 0"]),
    ("m19", 2, "", {}, "1", {"PM_SET": "PMIX_RANK=7"}, False, ["rank 1 of 2 under mpirun: PMIx_Init failed"]),
    ("m20", 2, "", {}, "1", {"PM_SET": "OMPI_COMM_WORLD_RANK=0"}, False,
     ["OMPI_COMM_WORLD_RANK=0 but PMIx knows this process as rank 1 (PMIX_RANK=1): two processes of the job "
      "claim rank 0"]),
    ("m21", 2, "", {}, None, {"PM_SET": "OMPI_COMM_WORLD_SIZE=3"}, False,
     ["OMPI_COMM_WORLD_SIZE=3 but mpirun's job has 2 ranks (PMIx)"]),
    ("m22", 2, "", {}, None, {"PM_SET": "OMPI_COMM_WORLD_SIZE=abc"}, False,
     ["OMPI_COMM_WORLD_SIZE='abc' is not a whole number"]),
    ("m23", 2, "", {}, None, {"PM_UNSET": "OMPI_COMM_WORLD_SIZE"}, False,
     ["OMPI_COMM_WORLD_SIZE is not set though OMPI_COMM_WORLD_RANK="]),
    ("m24", 2, "", {}, "1", {"PM_SET": "OMPI_COMM_WORLD_RANK=x1"}, False,
     ["OMPI_COMM_WORLD_RANK='x1' is not a whole number"]),
    ("m25", 2, "", {}, "1", {"PM_SET": "OMPI_COMM_WORLD_RANK=5"}, False,
     ["OMPI_COMM_WORLD_RANK=5 is not below OMPI_COMM_WORLD_SIZE=2"]),
    ("m26", 2, "-mca btl_tcp_if_include nosuchnic0", {}, None, {}, False,
     ["OMPI_MCA_btl_tcp_if_include='nosuchnic0' admits no interface"]),
    ("m27", 2, "-mca btl_tcp_if_include 10.99.0.0/24", {}, None, {}, False,
     ["OMPI_MCA_btl_tcp_if_include='10.99.0.0/24' admits no interface"]),
    ("m28", 2, "-mca btl_tcp_if_include 300.1.2.3/99", {}, None, {}, False,
     ["'300.1.2.3/99' is neither an interface name nor a subnet"]),
    ("m29", 2, "-mca btl_tcp_if_include 127.0.0.0/8", {}, None, {}, True, ["OK rank 0 size 2"]),
    ("m30", 2, f"-mca btl_tcp_if_exclude {EVERY}", {}, None, {}, False,  # by name, and by subnet for one
     [f"OMPI_MCA_btl_tcp_if_exclude='{EVERY}' admits no interface"]),        # that appears meanwhile (Docker's)
    ("m31", 2, "-mca btl_tcp_if_include ,,,", {}, None, {}, False, ["',,,' admits no interface"]),
    ("m32", 2, f"-mca btl_tcp_if_include {UP_OTHER}", {}, None, {}, True, ["OK rank 0 size 2"]),
    ("m33", 2, "", {"HOROVOD_GLOO_IFACE": "nosuchnic0"}, None, {}, False,
     ["network interface 'nosuchnic0' has no IPv4 address here"]),
    ("m34", 2, "", {"HOROVOD_GLOO_IFACE": NO_V4}, None, {}, False,
     [f"network interface '{NO_V4}' has no IPv4 address here"]),
    ("m35", 2, "", {"HOROVOD_GLOO_IFACE": "eth0;rm -rf x"}, None, {}, False,
     ["network interface 'eth0;rm -rf x' has no IPv4 address here"]),
    ("m36", 2, "", {"HOROVOD_GLOO_IFACE": ""}, None, {}, True, ["OK rank 0 size 2"]),
    ("m37", 2, "-mca btl_tcp_if_include nosuchnic0", {"HOROVOD_GLOO_IFACE": "lo"}, None, {}, True,
     ["OK rank 0 size 2"]),
    ("m38", 2, "", {"APPLIANCE_STORE_ADDR": "garbage"}, None, {}, False,
     ["APPLIANCE_STORE_ADDR='garbage': expected host:port"]),
    ("m39", 2, "", {"APPLIANCE_STORE_ADDR": "127.0.0.1:1"}, None, {}, False, ["APPLIANCE_JOB_SECRET is not set"]),
    ("m40", 2, "", {"APPLIANCE_STORE_ADDR": f"127.0.0.1:{_free_port()}", "APPLIANCE_JOB_SECRET": "00ff"}, None, {},
     True, ["OK rank 0 size 2"]),
    ("m41", 2, "", {"APPLIANCE_STORE_ADDR": "127.0.0.1:99999"}, None, {}, False,
     ["APPLIANCE_STORE_ADDR='127.0.0.1:99999': expected host:port"]),
    ("m42", 2, "", {"APPLIANCE_STORE_ADDR": "nosuchhost.invalid:5000", "APPLIANCE_JOB_SECRET": "00ff"}, None, {},
     False, ["nosuchhost.invalid:5000"]),
    ("m43", 2, "", {"APPLIANCE_STORE_ADDR": "127.0.0.1:5000", "APPLIANCE_JOB_SECRET": "zz-not-hex"}, None, {}, False,
     ["APPLIANCE_JOB_SECRET must be hexadecimal"]),
    ("m44", 2, "", {"APPLIANCE_STORE_ADDR": "192.0.2.77:5000", "APPLIANCE_JOB_SECRET": "00ff"}, None, {}, False,
     ["192.0.2.77"]),
    # a script's mistakes under mpirun: named at once (a mismatch on one name) or as a deadlock in seconds
    ("m45", 2, "", {"PM_MODE": "mismatch_op"}, None, {}, False,
     ["operation differs: rank 0 submitted allreduce, rank 1 submitted broadcast"]),
    ("m46", 2, "", {"PM_MODE": "mismatch_name"}, None, {}, False,
     ["rank 0 waits on: allreduce 't0'", "rank 1 waits on: allreduce 't1'"]),
    ("m47", 2, "", {"PM_MODE": "mismatch_shape"}, None, {}, False, ["shape differs: rank 0 has [2], rank 1 has [3]"]),
    ("m48", 2, "", {"PM_MODE": "mismatch_kind"}, None, {}, False,
     ["rank 0 waits on: allreduce 'a'", "rank 1 waits on: allgather 'g'"]),
    ("m49", 2, "", {"PM_MODE": "extra"}, None, {}, False, ["allreduce 'b': rank(s) [1] shut down without submitting it"]),
    ("m50", 2, "", {"PM_MODE": "init_twice"}, None, {}, True, ["OK rank 0 size 2", "OK rank 1 size 2"]),
    ("m51", 2, "", {}, "1", {"PM_FAULT": "never", "PM_SLEEP": "0"}, False,  # rank 1 exits 0 without init
     [f"rank 0 of 2 under mpirun: {FENCE}: rank(s) 1 never arrived"]),
    ("m52", 2, "", {"PM_MODE": "reinit"}, None, {}, True, ["OK rank 0 size 2", "OK rank 1 size 2"]),
    ("m53", 3, "", {}, None, {}, True, ["OK rank 2 size 3 local 2/3 val 6"]),
]

HYDRA = [
    ("h01", 2, "", {}, None, {}, True, ["OK rank 0 size 2 local 0/2 val 3", "OK rank 1 size 2 local 1/2 val 3"]),
    ("h02", 2, "", {}, "1", {"PM_SET": "PMI_FD=garbage"}, False,
     ["rank 1 of 2 under hydra: cannot reach the PMI-1 server (PMI_FD='garbage'", f"rank 0 of 2 under hydra: {BARRIER}"]),
    ("h03", 2, "", {}, "1", {"PM_SET": "PMI_FD=999"}, False,
     ["cannot reach the PMI-1 server (PMI_FD='999'", f"rank 0 of 2 under hydra: {BARRIER}"]),
    ("h04", 2, "", {}, "1", {"PM_SET": "PMI_FD=5"}, False, [f"rank 0 of 2 under hydra: {BARRIER}"]),
    ("h05", 2, "", {}, "1", {"PM_SET": "PMI_RANK=abc"}, False,
     ["PMI_RANK='abc' is not a whole number", f"rank 0 of 2 under hydra: {BARRIER}"]),
    ("h06", 2, "", {}, "1", {"PM_SET": "PMI_RANK=0"}, False, ["two processes claim PMI_RANK=0"]),
    ("h07", 2, "", {}, None, {"PM_SET": "PMI_SIZE=3"}, False, ["waiting for rank(s) 2 to join (2 of 3 arrived)"]),
    ("h08", 2, "", {}, None, {"PM_SET": "PMI_SIZE=0"}, False, ["PMI_SIZE=0 is not a job size (at least 1)"]),
    ("h09", 2, "", {}, "1", {"PM_UNSET": "PMI_FD"}, False,
     ["neither PMI_FD nor PMI_PORT is set", f"rank 0 of 2 under hydra: {BARRIER}"]),
    ("h10", 2, "", {}, "1", {"PM_FAULT": "kill", "PM_LATE": "1.5", "PM_DELAY": "0.5"}, False, ["EXIT CODE: 9"]),
    ("h11", 2, "", {}, "1", {"PM_FAULT": "never"}, False, [f"rank 0 of 2 under hydra: {BARRIER}"]),
    ("h12", 2, "", {}, "1", {"PM_SET": "PMI_FD=1"}, False,
     ["cannot reach the PMI-1 server (PMI_FD='1'", f"rank 0 of 2 under hydra: {BARRIER}"]),
    ("h14", 2, "", {"PM_MODE": "init_twice"}, None, {}, True, ["OK rank 0 size 2", "OK rank 1 size 2"]),
    ("h15", 2, "", {"PM_MODE": "reinit"}, None, {}, True, ["OK rank 0 size 2", "OK rank 1 size 2"]),
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("pm") / "job"
    d.mkdir()
    shutil.copy(RANKS / "pm_bootstrap.py", d / "pm_bootstrap.py")
    return d


def _run(job, launch: str, case) -> None:
    cid, n, args, env, only, fault, ok, expected = case
    pm = {k: v for k, v in {**fault, "PM_ONLY": only}.items() if v is not None}
    waits = any("HOROVOD_START_TIMEOUT" in text or "nosuchhost" in text or "192.0.2.77" in text or "to join" in text
                for text in expected)
    environ = ml.env(HOROVOD_START_TIMEOUT=str(START if waits else CALM), **env, **pm)
    if launch == "mpirun":
        names = " ".join(f"-x {k}" for k in ("HOROVOD_START_TIMEOUT", *env, *pm))
        line = f"mpirun --allow-run-as-root -np {n} -H localhost:{n} -bind-to none {args} {names} python pm_bootstrap.py"
    else:
        line = f"mpiexec.hydra -n {n} python pm_bootstrap.py"
    started = time.monotonic()
    rc, out, left = ml.run(line, job, environ, timeout=BOUND + 30)
    took = time.monotonic() - started
    assert (rc == 0) == ok, f"{cid}: rc={rc}\n{out[-4000:]}"
    for text in expected:
        assert text in out, f"{cid}: no {text!r} in:\n{out[-4000:]}"
    assert not UNMEANT.search(out), f"{cid}: a traceback of an unmeant error:\n{out[-4000:]}"
    assert took < BOUND, f"{cid}: took {took:.1f} s (bound {BOUND} s)\n{out[-3000:]}"
    assert not left, f"{cid}: processes left: {left}"


@pytest.mark.parametrize("case", MPIRUN, ids=[c[0] for c in MPIRUN])
def test_mpirun_bootstrap_under_bad_input(job, case, require_tool):
    require_tool("mpirun", "OpenMPI (openmpi-bin)")
    if case[0] == "m32" and not UP_OTHER or case[0] == "m34" and not NO_V4:
        pytest.skip("no such interface here")
    _run(job, "mpirun", case)


@pytest.mark.parametrize("case", HYDRA, ids=[c[0] for c in HYDRA])
def test_hydra_bootstrap_under_bad_input(job, case, require_tool):
    require_tool("mpiexec.hydra", "MPICH's hydra (Debian's mpich)")
    _run(job, "hydra", case)


def test_elastic_run_under_hydra_names_hydra(tmp_path, require_tool):
    """h13: the line hvd.elastic.run prints under hydra names hydra, not mpirun."""
    require_tool("mpiexec.hydra", "MPICH's hydra (Debian's mpich)")
    job = ml.job_dir(tmp_path)
    rc, out, left = ml.run("mpiexec.hydra -n 2 python train.py --elastic", job, ml.env(), timeout=180)
    assert rc == 0 and not left, out[-4000:]
    notes = [ln for ln in out.splitlines() if ln.startswith("hvd.elastic.run under ")]
    assert len(notes) == 1 and notes[0].startswith("hvd.elastic.run under hydra: ") and "mpirun" not in notes[0], out
