"""The core's dlopen loader for the CUDA runtime and NCCL, and the capability truth table.

Real dlopen of real shared libraries: the stand-ins of tests/fixtures/devices.py, the system's CUDA
runtime where one is installed, and paths that do not exist. What is checked is what
``capabilities()``, ``hvd.nccl_built()`` and ``hvd.cuda_built()`` say, in fresh processes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from appliance.runtime import _core, devices
from fixtures import ROOT

MISSING = "/nonexistent/libnccl.so.2"


def caps(fake_libs, knob="", nccl=(), cudart=None):
    cudart = [fake_libs["cudart"]] if cudart is None else cudart
    return dict(_core.capabilities(knob, list(nccl), list(cudart)))


def test_nccl_absent(fake_libs):
    c = caps(fake_libs, nccl=[MISSING])
    assert c["nccl_version"] == 0 and c["nccl"] is False and c["nccl_library"] == ""
    assert "no NCCL library found" in c["why"] and MISSING in c["why"]
    assert c["cuda"] is True and c["cuda_devices"] == 1


def test_nccl_present_and_runnable(fake_libs):
    c = caps(fake_libs, nccl=[MISSING, fake_libs["nccl"]])
    assert (c["nccl"], c["nccl_version"], c["nccl_library"], c["why"]) == (True, 22907, fake_libs["nccl"], "")


def test_nccl_too_old_is_reported_with_its_version(fake_libs):
    c = caps(fake_libs, nccl=[fake_libs["nccl_old"], fake_libs["nccl"]])
    # The first library that loads decides (the process would use it anyway).
    assert c["nccl"] is False and c["nccl_version"] == 2708
    assert "NCCL 2.7.8" in c["why"] and "older than 2.12.0" in c["why"]


def test_nccl_missing_symbols(fake_libs):
    c = caps(fake_libs, nccl=[fake_libs["nccl_bare"]])
    assert c["nccl"] is False and c["nccl_version"] == 22907
    assert "lacks ncclGetUniqueId" in c["why"]


def test_explicit_knob_wins_and_never_falls_through(fake_libs):
    c = caps(fake_libs, knob=fake_libs["nccl"], nccl=[fake_libs["nccl_old"]])
    assert c["nccl_version"] == 22907 and c["nccl"] is True
    c = caps(fake_libs, knob=MISSING, nccl=[fake_libs["nccl"]])
    assert c["nccl"] is False and c["nccl_version"] == 0
    assert c["why"].startswith(f"APPLIANCE_NCCL_LIBRARY={MISSING}: cannot load")


def test_loaded_but_no_device_is_not_runnable(fake_libs):
    # NCCL loads (its version is reported) but there is no usable CUDA runtime: nothing runs.
    c = caps(fake_libs, nccl=[fake_libs["nccl"]], cudart=["/nonexistent/libcudart.so.13"])
    assert (c["cuda"], c["nccl"], c["nccl_version"]) == (False, False, 22907)
    assert "no CUDA runtime library found" in c["why"]


def _probe(env_extra: dict, fake_libs) -> dict:
    """hvd's probes in a fresh process whose core finds `env_extra`'s libraries."""
    code = (
        "import json, sys\n"
        "from appliance.runtime import devices\n"
        f"devices.cudart_candidates = lambda: {[fake_libs['cudart']]!r}\n"
        "import appliance.torch as hvd\n"
        "from appliance.runtime import engine\n"
        "print(json.dumps([hvd.nccl_built(), hvd.cuda_built(), engine.capabilities()]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("lib,expect_built,expect_version", [
    ("nccl", 22907, 22907),      # loads and can run: Horovod's nccl_built() is the version code
    ("nccl_old", 0, 2708),       # too old: not built, version still reported
    ("nccl_bare", 0, 22907),     # incomplete: not built
])
def test_truth_table_through_the_horovod_probes(fake_libs, lib, expect_built, expect_version):
    built, cuda, c = _probe({"APPLIANCE_NCCL_LIBRARY": fake_libs[lib]}, fake_libs)
    assert built == expect_built and cuda is True and c["nccl_version"] == expect_version


def test_wheel_next_to_torch_comes_before_the_loader_path(tmp_path):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    lib = site / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib" / "libcudart.so.13").write_bytes(b"")
    code = ("import json; from appliance.runtime import devices; "
            "print(json.dumps([devices.nccl_candidates(), devices.cudart_candidates()]))")
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    nccl, cudart = json.loads(p.stdout)
    assert nccl == [str(lib / "libnccl.so.2"), "libnccl.so.2"]
    assert cudart[0] == str(site / "nvidia/cu13/lib/libcudart.so.13") and cudart[-1] == "libcudart.so"


def test_this_process_reports_what_it_found():
    c = devices.capabilities()
    assert set(c) >= {"cuda", "nccl", "nccl_version", "nccl_library", "why"}
    assert c["nccl"] == (c["cuda"] and c["nccl_version"] > 0 and c["why"] == "")
    if not c["nccl"]:
        assert c["why"]  # never silent about why CUDA collectives do not run through NCCL


def test_a_cpu_job_never_asks_for_cuda():
    # hvd.init gives the core torch's allocator but touches no device: whether CUDA memory is
    # usable is asked at the first CUDA tensor, so host collectives never load the CUDA runtime.
    code = (
        "import json, torch\n"
        "from appliance.runtime import devices\n"
        "asked = []\n"
        "devices.capabilities = lambda *a, **k: asked.append(1) or {}\n"
        "import appliance.torch as hvd\n"
        "hvd.init()\n"
        "x = hvd.allreduce(torch.ones(3), op=hvd.Sum)\n"
        "hvd.grouped_allreduce_([torch.ones(2), torch.ones(2)])\n"
        "hvd.allgather(torch.ones(2, 1)); hvd.broadcast_(torch.ones(2), 0); hvd.barrier()\n"
        "hvd.shutdown(); hvd.init(); hvd.shutdown()\n"
        "print(json.dumps(len(asked)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_"))}
    p = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == 0
