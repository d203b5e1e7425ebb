"""Fixtures for the device tier: stand-in CUDA runtime and NCCL libraries, compiled per run.

``fake_libs`` compiles ``fake_cudart.c`` and ``fake_nccl.c`` with the system C compiler into a
temporary directory: a CUDA runtime whose "devices" are host memory, NCCL 2.29.7 (complete but
failing to make a communicator), NCCL 2.29.7 that works for one rank (its collectives are copies), NCCL 2.7.8 (too old) and an NCCL with nothing but ncclGetVersion.
They let the real core walk its loader, its capability truth table and its CUDA engine path
(store exchange, NCCL/staging decision, staging copies, NCCL failures) on machines without a
GPU. Real GPUs are the tests/gpu tier.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory, pytestconfig):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        msg = "no C compiler (cc) to build the stand-in CUDA/NCCL libraries; tests/run.sh installs g++"
        if pytestconfig.getoption("--strict-prereqs"):
            pytest.fail(msg)
        pytest.skip(msg)
    out = tmp_path_factory.mktemp("fakecuda")

    def build(src: str, name: str, *defines: str) -> str:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(path), str(HERE / src), *defines],
                       check=True, timeout=60)
        return str(path)

    return {
        "cudart": build("fake_cudart.c", "libcudart.so.13"),
        "nccl": build("fake_nccl.c", "nccl22907/libnccl.so.2", "-DFAKE_NCCL_VERSION=22907"),
        "nccl_old": build("fake_nccl.c", "nccl2708/libnccl.so.2", "-DFAKE_NCCL_VERSION=2708"),
        "nccl_solo": build("fake_nccl.c", "ncclsolo/libnccl.so.2", "-DFAKE_NCCL_VERSION=22907", "-DSOLO"),
        "nccl_bare": build("fake_nccl.c", "ncclbare/libnccl.so.2", "-DFAKE_NCCL_VERSION=22907", "-DONLY_VERSION"),
        "dir": str(out),
    }
