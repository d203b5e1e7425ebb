"""Fixtures for the Docker tier: a real engine, the CPU image built once per run, and cleanup.

- ``engine``: the docker SDK client. No engine: the test fails under ``--strict-prereqs`` (CI,
  tests/run.sh as root) and is skipped otherwise, so the tier cannot vanish silently in CI.
- ``image`` (session): ``bash build.sh --cpu --tag appliance:test-<hash of this checkout>``, i.e. the
  debootstrapped base plus a wheelhouse made on the host; built once per run (Docker's layer cache
  makes later runs take seconds). ``APPLIANCE_TEST_IMAGE=NAME`` uses an existing image instead.
- ``gpu_image`` (session): ``bash build.sh --tag appliance:test-gpu-<hash>``, the GPU variant (PyPI's
  CUDA torch and torchvision, NCCL as a wheel) on the same base; it runs on this GPU-less machine
  with CPU tensors. Built once per run, only by the tests that ask for it (first time ~6 min: a
  2.7 GB wheelhouse, ~5.5 GB image). ``APPLIANCE_TEST_GPU_IMAGE=NAME`` uses an existing image.
- ``Cluster`` (``cluster`` fixture, per test; ``shared_cluster`` per module): a fresh shared
  directory, a user-defined network ``appliance-t<id>-net`` and helpers that run the real CLI
  (``python -m appliance secondary|primary|status``) as subprocesses in their own sessions. On
  teardown, whatever happened, it kills those subprocesses and removes every container whose
  name starts with ``appliance-t<id>`` or whose ``appliance.shared`` label is its shared directory,
  then the network. Nothing else on the engine is touched.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1500


def _strict(config) -> bool:
    return bool(config.getoption("--strict-prereqs"))


@pytest.fixture(scope="session")
def engine(pytestconfig):
    try:
        import docker
        client = docker.from_env(timeout=120)
        client.ping()
        return client
    except Exception as e:  # noqa: BLE001 - any failure means: no usable engine
        msg = f"no Docker engine answers ({type(e).__name__}: {str(e)[:160]}); .ci/run starts one (bash .ci/docker-up.sh)"
        if _strict(pytestconfig):
            pytest.fail(msg)
        pytest.skip(msg)


def _build(tag: str, *variant: str) -> str:
    """build.sh in its own session: on timeout the whole group (docker client, wheelhouse server) dies."""
    t0 = time.monotonic()
    cmd = ["bash", str(ROOT / "build.sh"), *variant, "--tag", tag]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"{' '.join(cmd[1:])} did not finish within {BUILD_TIMEOUT_S} s:\n{out[-4000:]}")
    if p.returncode != 0:
        pytest.fail(f"{' '.join(cmd[1:])} failed (exit {p.returncode}):\n{out[-4000:]}")
    print(f"\n[appliance tests] built {tag} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return tag


def _checkout_hash() -> str:
    return hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]


@pytest.fixture(scope="session")
def image(engine, pytestconfig):
    given = os.environ.get("APPLIANCE_TEST_IMAGE")
    if given:
        return given
    return _build("appliance:test-" + _checkout_hash(), "--cpu")


@pytest.fixture(scope="session")
def gpu_image(engine, pytestconfig):
    given = os.environ.get("APPLIANCE_TEST_GPU_IMAGE")
    if given:
        return given
    return _build("appliance:test-gpu-" + _checkout_hash())


class Cluster:
    def __init__(self, engine, image: str):
        self.engine, self.image = engine, image
        self.id = "t" + secrets.token_hex(3)
        self.prefix = f"appliance-{self.id}"
        self.network = f"{self.prefix}-net"
        # Bind-mounted into containers at the same path: under /tmp, not a pytest tmp dir that a
        # later run's cleanup may remove while containers still use it.
        self.shared = tempfile.mkdtemp(prefix=f"appliance-{self.id}-share.")
        self.procs: list[subprocess.Popen] = []

    # --- running the CLI ------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "APPLIANCE_IMAGE": self.image, "APPLIANCE_SHARED": self.shared,
               "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        env.pop("APPLIANCE_NETWORK", None)
        env.update(extra)
        return env

    def start(self, *args: str, **env: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-m", "appliance", *args], cwd=ROOT, env=self.env(**env),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.procs.append(p)
        return p

    def run(self, *args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
        p = self.start(*args, **env)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            pytest.fail(f"appliance {' '.join(args)} did not finish within {timeout} s:\n{out[-4000:]}")
        return subprocess.CompletedProcess(p.args, p.returncode, out, "")

    def secondary(self, host: str, *extra: str) -> subprocess.CompletedProcess:
        res = self.run("secondary", "--network", self.network, "--name", f"{self.id}-{host}", *extra, timeout=120)
        assert res.returncode == 0, res.stdout
        return res

    def host(self, name: str) -> str:
        """The host name a simulated host answers to (its container is appliance-<id>-<name>)."""
        return f"{self.id}-{name}"

    def primary(self, *args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
        return self.run("primary", "--network", self.network, *args, timeout=timeout, **env)

    # --- looking inside -------------------------------------------------------------------------
    def container(self, host: str):
        return self.engine.containers.get(f"appliance-{self.host(host)}")

    def processes(self, host: str) -> list[str]:
        """Command lines of the processes in a simulated host (its container), except ps itself."""
        rc, out = self.container(host).exec_run(["ps", "-eo", "args="])
        assert rc == 0
        return [line for line in out.decode().splitlines() if line.strip() and not line.startswith("ps ")]

    def ours(self) -> list:
        found = []
        for c in self.engine.containers.list(all=True):
            labels = c.attrs.get("Config", {}).get("Labels") or {}
            if c.name.startswith(self.prefix) or labels.get("appliance.shared") == self.shared:
                found.append(c)
        return found

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)
            if p.stdout:
                p.stdout.close()
        for c in self.ours():
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        for net in self.engine.networks.list(names=[self.network]):
            try:
                net.remove()
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(self.shared, ignore_errors=True)


@pytest.fixture
def cluster(engine, image):
    c = Cluster(engine, image)
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture(scope="module")
def shared_cluster(engine, image):
    c = Cluster(engine, image)
    try:
        yield c
    finally:
        c.cleanup()
