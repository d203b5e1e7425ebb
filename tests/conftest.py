"""Shared fixtures: start N real ranks and collect what each one reports.

``run_ranks(np, worker, *args)`` starts ``np`` processes through the real launcher API
(``appliance.launcher.launch``: real processes, rendezvous over real sockets), each running
``tests/ranks/<worker>.py`` with ``args``; every rank writes a JSON report into a temporary
directory (``APPLIANCE_TEST_OUT``) and the fixture returns them in rank order together with the
launch result. Time is bounded by ``timeout``; the launcher kills everything it started.

Prerequisite tools (sshd, mpirun, docker) are checked by ``require_tool``: a missing one skips
the test locally but fails it under ``--strict-prereqs`` (CI), so a tier cannot silently vanish.

The fixtures of the infrastructure tiers (pytest markers ``ssh``, ``docker``, ``k8s``, ``slurm``, ``gpu``) and
the stand-in device libraries are plugins in ``tests/fixtures``, loaded below for every folder;
``run_ranks`` is ``fixtures.ranks.launch_ranks`` into the test's temporary directory.
"""
from __future__ import annotations

import shutil
import signal

import pytest

from fixtures.ranks import Ranks, launch_ranks

# The tiers' fixtures, usable from every folder of tests/ (see tests/fixtures/__init__.py).
pytest_plugins = [
    "fixtures.jobs",     # job: launchers and python -c workers that leave evidence in files
    "fixtures.ssh",      # ssh_cluster: simulated hosts with real sshd (marker ssh)
    "fixtures.docker",   # engine, image, gpu_image, cluster, shared_cluster (marker docker)
    "fixtures.k8s",      # k8s_jobs, MPIJob (TrainJob: fixtures.k8s_trainer), re-enacted with Docker (k8s, docker)
    "fixtures.slurm",    # slurm_cluster, slurm: a real two-node Slurm (marker slurm)
    "fixtures.devices",  # fake_libs: stand-in CUDA and NCCL libraries
    "fixtures.gpu",      # modules marked gpu are collected only where torch sees a GPU
    "fixtures.tiers",    # a test using a tier's fixtures or helpers must carry the tier's marker
]


def pytest_configure(config):
    # Tests press Ctrl-C on launchers they start, which inherit this process's disposition. A test
    # run started in the background (`cmd &` in a script, some CI runners) inherits an ignored
    # SIGINT, which the launcher rightly keeps ignored (nohup semantics): give the processes the
    # tests start the terminal's default, so those tests test the launcher, not how pytest began.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--strict-prereqs", action="store_true",
                     help="fail (instead of skip) tests whose prerequisite tools are missing")


@pytest.fixture
def require_tool(request):
    def check(tool: str, why: str = ""):
        if shutil.which(tool):
            return
        msg = f"{tool} not found ({why or 'needed by this test'}); .ci/run installs it"
        if request.config.getoption("--strict-prereqs"):
            pytest.fail(msg)
        pytest.skip(msg)
    return check


@pytest.fixture
def run_ranks(tmp_path):
    def run(np: int, worker: str, *args, **kwargs) -> Ranks:
        return launch_ranks(tmp_path / f"reports-{worker}-{np}", np, worker, *args, **kwargs)
    return run
