"""The shipped compose/docker-compose.yml, run with docker-compose (v1, what Debian ships): a
primary and two secondaries on a private network with a shared volume train the default job to
the end. Every container, network and volume carries the test's own project name and is removed
(``down -v``) whatever happens."""
from __future__ import annotations

import json
import os
import secrets
import subprocess

import pytest

from appliance.cluster.docker import memlock_ulimit
from fixtures import ROOT

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300, func_only=True)]
COMPOSE = ROOT / "compose" / "docker-compose.yml"


def test_compose_file_is_valid_for_v1_and_has_no_v1_only_keys(require_tool):
    require_tool("docker-compose", "the compose tier")
    for files in (["-f", str(COMPOSE)], ["-f", str(COMPOSE), "-f", str(ROOT / "compose" / "gpu.yml")]):
        res = subprocess.run(["docker-compose", *files, "config", "-q"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
    text = COMPOSE.read_text()
    # Keys compose v2 (the Compose Specification) rejects or ignores: v1-only tuning and links.
    for v1_only in ("links:", "external_links:", "container_name:", "volume_driver:", "cpu_quota:", "extends:"):
        assert v1_only not in text


def test_compose_cluster_runs_the_demo_to_the_end(engine, image, require_tool):
    require_tool("docker-compose", "the compose tier")
    project = f"appliance-t{secrets.token_hex(3)}"
    env = {**os.environ, "APPLIANCE_IMAGE": image, "APPLIANCE_EPOCHS": "3",
           "APPLIANCE_MEMLOCK": str(memlock_ulimit(engine)["Hard"])}
    base = ["docker-compose", "-p", project, "-f", str(COMPOSE)]
    try:
        res = subprocess.run([*base, "up", "--exit-code-from", "primary", "--no-color"], env=env, capture_output=True,
                             text=True, timeout=240)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert "[0]<stdout>:epoch 3/3:" in out
        # The checkpoint and the job records are on the shared volume.
        volume = f"{project}_share"
        code = ("import json, os, glob, torch; c = torch.load('/mnt/share/models/digits/checkpoint.pt', "
                "weights_only=False); job = sorted(glob.glob('/mnt/share/jobs/*'))[-1]; "
                "print(json.dumps({'epoch': c['epoch'], 'size': c['size'], "
                "'hosts': sorted(json.load(open(p))['hostname'] for p in glob.glob(job + '/ranks/*.json'))}))")
        got = engine.containers.run(image, ["/opt/venv/bin/python", "-c", code], remove=True, entrypoint=[],
                                    volumes={volume: {"bind": "/mnt/share", "mode": "ro"}}, network_mode="none")
        facts = json.loads(got.decode().strip().splitlines()[-1])
        assert facts == {"epoch": 3, "size": 3, "hosts": ["node1", "node2", "primary"]}
    finally:
        subprocess.run([*base, "down", "-v", "--remove-orphans", "-t", "2"], env=env, capture_output=True, timeout=120)
    assert not engine.containers.list(all=True, filters={"name": project})
    assert not engine.volumes.list(filters={"name": project})
