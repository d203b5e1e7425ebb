"""The benchmarks run end to end: each script's --quick mode exits 0, prints its table and writes
its JSON (and collectives.py/plot.py a PNG) with a number for every backend. No timed assertions.

The OpenMPI legs (mpirun + mpi4py, installed by tests/run.sh) are expected wherever both are
present; a missing one skips them here and fails the tests under --strict-prereqs (CI).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from fixtures import ROOT

BENCH = ROOT / "benchmarks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

sys.path.insert(0, str(BENCH))
import benchlib  # noqa: E402  (benchmarks/ is scripts, not a package)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture
def with_mpi(request) -> bool:
    """True when the OpenMPI legs must run; fails under --strict-prereqs when they cannot."""
    why = benchlib.mpi_missing()
    if why and request.config.getoption("--strict-prereqs"):
        pytest.fail(f"benchmarks' OpenMPI legs: {why}; tests/run.sh installs it")
    return why is None


@pytest.fixture
def with_matplotlib(request) -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if request.config.getoption("--strict-prereqs"):
            pytest.fail("matplotlib not installed (pip install '.[bench]'); tests/run.sh installs it")
        return False
    return True


def run(script: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, str(BENCH / script), "--quick", *map(str, args)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_collectives_quick(tmp_path, with_mpi, with_matplotlib):
    out, png = tmp_path / "c.json", tmp_path / "busbw.png"
    args = ["--json", out] + (["--plot", png] if with_matplotlib else [])
    proc = run("collectives.py", *args)
    result = json.loads(out.read_text())
    want = {"ours", "ours-tcp", "gloo", "memcpy"} | ({"mpi-shm", "mpi-tcp"} if with_mpi else set())
    assert want <= set(result["backends"]), (result["backends"], result["skipped"], proc.stderr[-2000:])
    ops = ("allreduce", "allgather", "broadcast", "alltoall")
    for op in ops:
        assert f"\n{op}, float32, 2 ranks" in proc.stdout
        for backend in want - {"memcpy"}:
            rows = [r for r in result["rows"] if r["op"] == op and r["backend"] == backend]
            assert len(rows) == 2, (op, backend, rows)  # 4K and 64K
            assert all(r["time_s"] > 0 and r["busbw_GBps"] > 0 for r in rows)
    assert "gloo/ours" in proc.stdout and (not with_mpi or "shm/ours" in proc.stdout)
    if with_matplotlib:
        assert png.read_bytes()[:8] == PNG_MAGIC
        png2 = tmp_path / "again.png"
        subprocess.run([sys.executable, str(BENCH / "plot.py"), str(out), str(png2), "--op", "alltoall"],
                       check=True, timeout=120, capture_output=True)
        assert png2.read_bytes()[:8] == PNG_MAGIC


def test_collectives_quick_float16(tmp_path):
    out = tmp_path / "c16.json"
    proc = run("collectives.py", "--dtype", "float16", "--ops", "allreduce", "--json", out)
    result = json.loads(out.read_text())
    assert result["dtype"] == "float16" and "\nallreduce, float16, 2 ranks" in proc.stdout
    assert {"ours", "ours-tcp", "gloo"} <= set(result["backends"])
    assert not {"mpi-shm", "mpi-tcp"} & set(result["backends"]), result["backends"]
    assert "no float16 reduction" in proc.stderr
    rows = {(r["backend"], r["bytes"]) for r in result["rows"]}
    assert {("ours", 4096), ("ours", 65536), ("gloo", 65536)} <= rows, rows


def test_fusion_quick(tmp_path, with_mpi):
    out = tmp_path / "f.json"
    proc = run("fusion.py", "--json", out)
    result = json.loads(out.read_text())
    want = {"ours", "ours-grouped", "ours-opt", "ours-fused", "gloo"} | ({"mpi-shm"} if with_mpi else set())
    assert want <= set(result["backends"])
    got = {(r["case"], r["backend"]): r for r in result["rows"]}
    for case, tensors in (("100x4K", 100), ("1x400K", 1), ("resnet18", 62), ("transformer", None)):
        for backend in want:
            r = got[(case, backend)]
            assert r["time_s"] > 0
            assert tensors is None or r["tensors"] == tensors
    assert "fusion ratio (100 x 4K time / 1 x 400K time): ours" in proc.stdout
    assert "resnet18: time / one fused allreduce of the same bytes (ours-fused): ours " in proc.stdout


def test_fusion_floor_quick():
    """The Python path's floor at one rank: every way of calling prints a per-call time."""
    proc = run("fusion.py", "--floor", timeout=120)
    for way in ("core_calls", "each", "batch", "optimizer"):
        line = next((x for x in proc.stdout.splitlines() if x.split()[:1] == [way]), None)
        assert line is not None and float(line.split()[1]) > 0, proc.stdout


def test_train_quick(tmp_path):
    out = tmp_path / "t.json"
    proc = run("train.py", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["impl"], r["ranks"]) for r in rows) == [("ddp-gloo", 1), ("ddp-gloo", 2), ("ours", 1), ("ours", 2)]
    for r in rows:
        assert r["samples_per_s"] > 0 and math.isfinite(r["last_loss"])
        assert r["rounds"] == [r["samples_per_s"]]  # --quick: one round
    # the same seed, data and model: both implementations compute the same losses at each size
    for n in (1, 2):
        ours, ddp = (next(r for r in rows if r["impl"] == i and r["ranks"] == n) for i in ("ours", "ddp-gloo"))
        assert ours["last_loss"] == pytest.approx(ddp["last_loss"], rel=1e-3)
    assert "ours / ddp-gloo samples/s at 2 ranks" in proc.stdout and "torch threads per rank" in proc.stdout


def test_train_quick_resnet18(tmp_path):
    """ResNet-18 at 2 ranks, ours with a knob set (KEY=VALUE impls) against DDP; the plain "ours"
    impl runs in test_train_quick (a knob changes the timing, never the losses)."""
    out = tmp_path / "t.json"
    proc = run("train.py", "--model", "resnet18", "--ranks", "2", "--impls", "ours+HOROVOD_CYCLE_TIME=2,ddp-gloo",
               "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["impl"] for r in rows) == ["ddp-gloo", "ours+HOROVOD_CYCLE_TIME=2"]
    for r in rows:
        assert r["ranks"] == 2 and r["samples_per_s"] > 0 and r["allreduce_ms"] > 0
        assert r["phases_ms"]["backward"] > 0
        assert (r["overlap"] is None) == (r["impl"] == "ddp-gloo")
    losses = {r["impl"]: r["last_loss"] for r in rows}
    assert losses["ours+HOROVOD_CYCLE_TIME=2"] == pytest.approx(losses["ddp-gloo"], rel=1e-3)
    assert "ResNet-18" in proc.stdout and "ours+HOROVOD_CYCLE_TIME=2 / ddp-gloo samples/s at 2 ranks" in proc.stdout


def test_train_paired_quick(tmp_path):
    out = tmp_path / "p.json"
    proc = run("train.py", "--paired", "--ranks", "2", "--json", out)
    (row,) = json.loads(out.read_text())["paired"]
    assert row["impl"] == "ours" and row["ranks"] == 2 and row["paired_ours_over_ddp"] > 0
    sides = {s["side"]: s for s in row["sides"]}
    assert set(sides) == {"ours", "ddp-gloo", "local"}
    assert all(s["samples_per_s"] > 0 and len(s["blocks_s"]) == 2 for s in sides.values())
    # the same seed and data: the two data-parallel sides compute the same losses
    assert sides["ours"]["last_loss"] == pytest.approx(sides["ddp-gloo"]["last_loss"], rel=1e-3)
    assert "ours/ddp-gloo paired" in proc.stdout and "local/ddp" in proc.stdout
    bad = subprocess.run([sys.executable, str(BENCH / "train.py"), "--paired", "--impls", "ddp-gloo"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--impls as ours" in bad.stderr


# A Horovod-style synthetic benchmark (its arguments and its last line), standing in for Horovod's
# examples/pytorch/pytorch_synthetic_benchmark.py, which is not part of this repository.
HVD_SCRIPT = """
import argparse, timeit
import torch, torch.nn.functional as F
from torchvision import models
import horovod.torch as hvd
p = argparse.ArgumentParser()
for a in ("--batch-size", "--num-warmup-batches", "--num-batches-per-iter", "--num-iters"):
    p.add_argument(a, type=int)
p.add_argument("--model")
args = p.parse_args()
hvd.init()
model = getattr(models, args.model)()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
data, target = torch.randn(args.batch_size, 3, 32, 32), torch.zeros(args.batch_size, dtype=torch.long)
def step():
    opt.zero_grad(); F.cross_entropy(model(data), target).backward(); opt.step()
t = timeit.timeit(step, number=args.num_batches_per_iter)
if hvd.rank() == 0:
    print("Total img/sec on %d CPU(s): %.1f +-%.1f" % (hvd.size(), hvd.size() * args.batch_size / t, 0.0))
"""


def test_train_horovod_script_quick(tmp_path):
    script, out = tmp_path / "synthetic.py", tmp_path / "h.json"
    script.write_text(HVD_SCRIPT)
    proc = run("train.py", "--ranks", "2", "--horovod-script", script, "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["impl"], r["ranks"]) for r in rows) == [("ddp-twin", 2), ("horovod-script", 2)]
    assert all(r["img_per_s"] > 0 for r in rows)
    assert "horovod-script / ddp-twin img/sec at 2 ranks" in proc.stdout
    bad = subprocess.run([sys.executable, str(BENCH / "train.py"), "--horovod-script", tmp_path / "missing.py"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "missing.py: no such file" in bad.stderr and "Traceback" not in bad.stderr


def test_metrics_cost_quick(tmp_path):
    out = tmp_path / "m.json"
    proc = run("metrics_cost.py", "--json", out)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ranks"] == 2 and row["off_ms"] > 0 and row["on_ms"] > 0
    assert row["lines_per_s_per_rank"] > 0  # the collector heard the ranks with the metrics on (and nothing off)
    assert 0 <= row["publisher_cpu_share"] < 1
    assert "on/off" in proc.stdout and "load average" in proc.stdout
    run("metrics_cost.py", "--paired", "1", "--json", out)  # the publisher toggled within one job
    (row,) = json.loads(out.read_text())["rows"]
    assert row["pairs"] == 1 and row["wall_ratio"] > 0 and row["cpu_ratio"] > 0


def test_hops_quick(tmp_path):
    out = tmp_path / "h.json"
    proc = run("hops.py", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    rings = {(r["mode"], r["wait"], r["bytes"]): r for r in rows if r["part"] == "rings"}
    for wait in ("spin", "backoff"):
        for nbytes in (64, 4096):
            r = rings["pingpong", wait, nbytes]
            assert r["a_to_b_us"] > 0 and r["b_to_a_us"] > 0
        assert rings["op1", wait, 4096]["op_us"] > 0 and rings["op3", wait, 4096]["op_us"] > 0
    (eng,) = [r for r in rows if r["part"] == "engine"]
    assert [k["rank"] for k in eng["ranks"]] == [0, 1]
    # A cached op: one control frame each way. The counters are read around the timed loop while
    # the peer may already have sent its first frame, or not yet its last: one frame either end.
    for k in eng["ranks"]:
        assert k["op_us"] > 0
        assert k["ctrl_in"] == pytest.approx(1.0, abs=0.01) and k["ctrl_out"] == pytest.approx(1.0, abs=0.01), k
    assert "one-way latency" in proc.stdout and "load average" in proc.stdout


def test_train_rounds_report_the_median_run(tmp_path):
    """One impl is enough: the rounds and their median are per (impl, ranks) row, whichever impl."""
    out = tmp_path / "t.json"
    proc = run("train.py", "--ranks", "1", "--impls", "ours", "--rounds", "3", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == ["ours"]
    for r in rows:
        assert len(r["rounds"]) == 3 and r["samples_per_s"] == sorted(r["rounds"])[1]
        assert " ".join(f"{x:.1f}" for x in r["rounds"]) in proc.stdout


def test_scale_quick(tmp_path, with_matplotlib):
    """The scale harness at 2, 4 and 8 ranks: every metric of every size, the growth fits and the plot."""
    out, png = tmp_path / "s.json", tmp_path / "scale.png"
    proc = run("scale.py", "--json", out, *(["--plot", png] if with_matplotlib else []))
    result = json.loads(out.read_text())
    assert [r["np"] for r in result["rows"]] == [2, 4, 8]
    for r in result["rows"]:
        assert r["startup_s"] > 0 and r["store_per_rank"] >= 1 and r["store_served"] >= r["np"]
        assert r["fds_max"] >= r["sockets_max"] >= 1 and r["rss_mib"] > 0
        assert r["latency_us"] > 0 and r["rank0_frames"] > 0
    assert {"startup_s", "store_per_rank", "fds_max", "latency_us"} <= set(result["fits"])
    assert "growth: power-law fit" in proc.stdout and "at 4096" in proc.stdout
    # The virtual ranks, from the test build's simulator: N = 2 ... 64, both protocols.
    assert [r["np"] for r in result["virtual"]] == [2, 4, 8, 16, 32, 64]
    for r in result["virtual"]:
        assert r["tree_rank0_ns"] > 0 and r["star_rank0_ns"] > 0 and r["star_hops"] >= 1, r
    assert "virtual ranks" in proc.stdout
    if with_matplotlib:
        assert png.read_bytes()[:8] == PNG_MAGIC


def test_elastic_quick(tmp_path):
    """One run of the local cases: a killed rank and an added host, with the new worker's own start."""
    out = tmp_path / "e.json"
    proc = run("elastic.py", "--json", out)
    samples = json.loads(out.read_text())["samples"]
    assert sorted(samples) == ["local: host added", "local: kill of a rank", "local: new worker's own start"]
    assert all(len(v) == 1 and 0 < v[0] < 30 for v in samples.values())
    assert "local: kill of a rank" in proc.stdout


def test_startup_mpirun_quick(tmp_path, require_tool):
    require_tool("mpirun", "OpenMPI (openmpi-bin)")
    out = tmp_path / "s.json"
    proc = run("startup_mpirun.py", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert [r["ranks"] for r in rows] == [2]
    assert all(rows[0][k] > 0 for k in ("mpirun_wall_s", "mpirun_init_s", "launch_wall_s", "launch_init_s",
                                        "mpirun_alone_s"))
    assert "mpirun alone" in proc.stdout


@pytest.mark.parametrize("script", ["collectives.py", "fusion.py", "train.py", "plot.py", "nccl_allreduce.py",
                                    "launch_ssh.py", "scale.py", "elastic.py", "elastic_soak.py",
                                    "startup_mpirun.py", "metrics_cost.py"])
def test_every_script_answers_help(script):
    """Each script imports what it needs (its siblings included) and parses its flags; the GPU and
    SSH ones cannot run here, but must not rot."""
    proc = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout
