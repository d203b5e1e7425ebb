#!/usr/bin/env bash
# The test command. Makes what the tests need, then runs pytest with the given arguments.
#
#   bash tests/run.sh                     # everything
#   bash tests/run.sh tests/launcher -x   # a part: tests/ mirrors the packages
#   bash tests/run.sh -m "not docker"     # by tier: the markers ssh, docker, k8s, slurm, gpu
#
# It creates .venv (Python packages from PyPI; torch pinned to 2.13.0, tensorflow-cpu to 2.21.0,
# whose op library, appliance.tensorflow's, it compiles once before pytest) and installs the
# project into it in editable mode with the test and bench extras (bench: matplotlib, and mpi4py,
# whose PyPI wheel runs on Debian's OpenMPI, so the benchmarks' OpenMPI legs need no
# libopenmpi-dev), which compiles the C++ core, here with APPLIANCE_BUILD_TESTS=ON: also the
# test-only extension appliance.runtime._core_testing and the C++ unit tests (tests/cpp, with
# GoogleTest from Debian's libgtest-dev), which the product never has. As root on Debian it also
# installs the system tools the integration tiers use (OpenSSH, OpenMPI, MPICH's hydra, iproute2, and munge and
# slurm-wlm for the Slurm tier, marker slurm, which starts its own two-node Slurm), makes sure a
# Docker engine answers (.ci/docker-up.sh: docker.io, docker-compose, debootstrap, dockerd) and
# runs pytest with --strict-prereqs, so a missing tool or engine fails its tests instead of
# skipping them. The Docker tier (marker docker) builds its CPU image (build.sh --cpu, first time
# ~4 min) and its GPU image (build.sh, ~6 min) once per run, then cached: in the background from
# the end of collection, while the other tiers run (the Docker tier runs last);
# APPLIANCE_TEST_IMAGE / APPLIANCE_TEST_GPU_IMAGE=NAME use given images. The Kubernetes tier
# (marker k8s, also marked docker, so it runs wherever the Docker tier runs) re-enacts the
# manifests in deploy/kubernetes with containers of that same CPU image (tests/fixtures/k8s.py:
# no kubelet can run here). The device tests
# (tests/runtime) compile stand-in CUDA/NCCL libraries with cc; the GPU tier (marker gpu) runs only
# where torch sees a GPU. The tiers' fixtures are in tests/fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[tests]\033[0m %s\n' "$*"; }

strict=()
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
  command -v mpirun >/dev/null || need+=(openmpi-bin)
  # MPICH's hydra (mpiexec.hydra, PMI-1) beside OpenMPI: mpirun stays OpenMPI's (alternatives priority 50 > 40)
  command -v mpiexec.hydra >/dev/null || need+=(mpich)
  command -v ip >/dev/null || need+=(iproute2)
  command -v iptables >/dev/null || need+=(iptables)  # the SSH tier firewalls a simulated host (bastion test)
  command -v tmux >/dev/null || need+=(tmux)  # a real terminal for the launcher's view (tests/launcher/*observe*)
  command -v cmake >/dev/null || need+=(cmake)
  command -v g++ >/dev/null || need+=(g++)
  [ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)  # the C++ unit tests (tests/cpp)
  # the Slurm tier (marker slurm) starts a real two-node Slurm: munged, slurmctld, two slurmd
  [ -x /usr/sbin/munged ] || need+=(munge)
  { [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v srun >/dev/null; } || need+=(slurm-wlm)
  if [ ${#need[@]} -gt 0 ]; then
    say "installing system packages: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  strict=(--strict-prereqs)
  if ! bash .ci/docker-up.sh; then
    say "WARNING: no Docker engine: the Docker tier (marker docker) will fail"
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
say "installing the project (compiles the C++ core)"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test,bench]' --config-settings=cmake.define.APPLIANCE_BUILD_TESTS=ON
# tests/keras runs under tf-keras too; it declares `tensorflow`, the module tensorflow-cpu installs (pyproject.toml).
.venv/bin/python -m pip install -q --no-deps tf-keras==2.21.0
# The test extra installs tensorflow-cpu: a failure here (no TensorFlow, a compile error) ends the run.
say "compiling the TensorFlow op library (appliance.tensorflow; once per TensorFlow and source)"
TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python -m appliance.tensorflow.build >/dev/null

say "running pytest $*"
exec .venv/bin/python -m pytest "${strict[@]}" "$@"
