"""``appliance secondary`` and ``appliance status`` through the real CLI against the real engine."""
from __future__ import annotations

import os
import time

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240, func_only=True)]


def test_secondary_starts_once_reports_and_stops(cluster):
    first = cluster.secondary("node2")
    c = cluster.container("node2")
    c.reload()
    # What the container got: sshd on the port, key-only, share at the same path, flags, labels.
    assert c.status == "running"
    assert c.attrs["HostConfig"]["Init"] is True
    assert c.attrs["HostConfig"]["ShmSize"] >= 1 << 30          # private /dev/shm on a simulated host
    assert [u["Name"] for u in c.attrs["HostConfig"]["Ulimits"]] == ["memlock"]
    assert {m["Source"]: m["Destination"] for m in c.attrs["Mounts"]} == {cluster.shared: cluster.shared}
    assert c.labels["appliance.managed"] == "1" and c.labels["appliance.role"] == "secondary"
    assert cluster.host("node2") in c.attrs["NetworkSettings"]["Networks"][cluster.network]["Aliases"]
    for name in ("id_ed25519", "id_ed25519.pub", "authorized_keys", "known_hosts", "ssh_host_ed25519_key"):
        assert os.path.isfile(os.path.join(cluster.shared, "ssh", name)), name  # made on first use
    for sub in ("data", "models", "locks", "jobs"):
        assert os.path.isdir(os.path.join(cluster.shared, sub))

    # Idempotent: the same container is reported, not a second one.
    again = cluster.secondary("node2")
    assert "already running" in again.stdout
    cluster.container("node2").reload()
    assert cluster.container("node2").id == c.id
    assert c.id[:12] in first.stdout and c.id[:12] in again.stdout

    # Other settings while it runs: refused, saying how to stop it.
    clash = cluster.run("secondary", "--network", cluster.network, "--name", cluster.host("node2"), "--ssh-port", "2222")
    assert clash.returncode == 1 and "--stop" in clash.stdout and len(clash.stdout.strip().splitlines()) == 1

    # sshd listens with key-only auth: the cluster key logs in from another container of the image.
    rc, out = c.exec_run(["ssh", "-p", "12345", "-o", "PreferredAuthentications=none", "-v",
                          cluster.host("node2"), "true"])
    assert b"Authentications that can continue: publickey\r" in out or b"continue: publickey\n" in out

    # status lists it, healthy by Docker's own check once its first interval has passed.
    deadline = time.monotonic() + 30
    while True:
        status = cluster.run("status")
        line = next((l for l in status.stdout.splitlines() if f"appliance-{cluster.host('node2')}" in l), "")
        if "healthy" in line and "unhealthy" not in line:
            break
        assert time.monotonic() < deadline, status.stdout
        time.sleep(1)
    assert "secondary" in line and "12345" in line

    stop = cluster.run("secondary", "--network", cluster.network, "--name", cluster.host("node2"), "--stop")
    assert stop.returncode == 0
    assert not [x for x in cluster.ours() if x.name == f"appliance-{cluster.host('node2')}"]
    assert not cluster.engine.networks.list(names=[cluster.network])  # made by us, now empty: removed


def test_missing_image_share_or_docker_is_one_clear_line(cluster, tmp_path):
    cases = [
        (dict(APPLIANCE_IMAGE="appliance:does-not-exist"), "build.sh"),
        (dict(APPLIANCE_SHARED=str(tmp_path / "nope")), "does not exist"),
        (dict(DOCKER_HOST="unix:///nonexistent/docker.sock"), "Docker engine"),
    ]
    for env, words in cases:
        for cmd in (["secondary"], ["primary", "-np", "1", "--", "python", "-m", "train"]):
            res = cluster.run(*cmd, timeout=60, **env)
            lines = res.stdout.strip().splitlines()
            assert res.returncode == 1 and len(lines) == 1, (cmd, env, res.stdout)
            assert words in lines[0] and lines[0].startswith(f"appliance {cmd[0]}: error:"), lines[0]
    assert not cluster.ours()
