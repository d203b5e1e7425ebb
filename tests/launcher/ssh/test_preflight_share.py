"""The preflight's shared-directory verdict (``appliance.launcher.ssh.preflight``), pure logic on a
host's probe facts: a directory that is not the primary's fails the host with the fix; in a
Kubernetes launcher pod (``RemoteConfig.per_pod_share``) each pod's own (an emptyDir) is a note
unless --shared asked for one share, and the failure there names the manifest's fix (a
ReadWriteMany persistentVolumeClaim at that path). No process, no network."""
from __future__ import annotations

import pytest

from appliance.launcher.config import CheckConfig, LaunchConfig, RemoteConfig
from appliance.launcher.ssh.preflight import HostReport, _evaluate

NONCE = "n" * 32


def verdict(remote: RemoteConfig, seen: str | None) -> tuple[HostReport, str | None]:
    from appliance import __version__

    report = HostReport("job-worker-0.job.default.svc", False)
    report.facts = {"python_version": "3.11", "appliance": __version__, "cwd_ok": True, "shm_free": 1 << 30,
                    "shared": {"exists": True, **({"nonce": seen} if seen is not None else {})}}
    note = _evaluate(report, remote, NONCE, "/usr/bin/python3")
    return report, note


def test_the_same_share_passes_everywhere():
    for per_pod in (False, True):
        report, note = verdict(RemoteConfig(shared_dir="/mnt/share", per_pod_share=per_pod), NONCE)
        assert report.failures == [] and note is None and report.steps["shared"] == "ok"


def test_another_directory_fails_with_the_fix_outside_kubernetes():
    report, note = verdict(RemoteConfig(shared_dir="/mnt/share"), "other")
    assert note is None and report.steps["shared"] == "not shared"
    assert report.failures == ["job-worker-0.job.default.svc: /mnt/share there is not the primary's /mnt/share (a file written on the primary is "
                               "not visible there): mount the same share at /mnt/share"]


def test_on_kubernetes_each_pods_own_directory_is_a_note_naming_the_claim():
    report, note = verdict(RemoteConfig(shared_dir="/mnt/share", per_pod_share=True), None)
    assert report.failures == [] and report.steps["shared"] == "its own"
    assert note.startswith("job-worker-0.job.default.svc: /mnt/share there is its pod's own")
    assert "ReadWriteMany persistentVolumeClaim at /mnt/share in every pod template" in note


def test_on_kubernetes_a_share_asked_for_with_shared_fails_naming_the_manifest_field():
    remote = RemoteConfig(shared_dir="/mnt/share", per_pod_share=True, shared_explicit=True)
    report, note = verdict(remote, "other")
    assert note is None and report.steps["shared"] == "not shared"
    (line,) = report.failures
    assert line.startswith("job-worker-0.job.default.svc: /mnt/share there is not the primary's /mnt/share")
    assert "mount one ReadWriteMany persistentVolumeClaim at /mnt/share in every pod template" in line
    assert "persistentVolumeClaim.claimName" in line and "an emptyDir is per pod" in line


@pytest.mark.parametrize("make", [lambda env: LaunchConfig.create(["python", "t.py"], 2, environ=env),
                                  lambda env: CheckConfig.create(environ=env)], ids=["launch", "check"])
def test_a_launcher_pod_allows_a_share_per_pod_and_other_machines_do_not(tmp_path, make):
    (tmp_path / "hostfile").write_text("job-worker-0.job.default.svc slots=2\n")
    pod = {"K_MPI_JOB_ROLE": "launcher", "APPLIANCE_MPI_CONFIG_DIR": str(tmp_path), "HOME": str(tmp_path)}
    assert make(pod).remote.per_pod_share
    assert not make({"HOME": str(tmp_path)}).remote.per_pod_share
