"""What the SSH tier's elastic tests share.

``cluster``: the session's simulated SSH hosts (``fixtures.ssh``), with this test's environment
pointing the launcher at them and discovery run every 0.2 s; after the test, nothing of the job
may be left in the hosts' namespaces.
"""
from __future__ import annotations

import pytest


@pytest.fixture
def cluster(ssh_cluster, monkeypatch):
    for name, value in ssh_cluster.env(APPLIANCE_DISCOVERY_INTERVAL="0.2").items():
        monkeypatch.setenv(name, value)
    yield ssh_cluster
    assert ssh_cluster.wait_clean(12.0) == {}, "processes left in the hosts' namespaces"
