"""The SSH layer's use of fabric without a network: what ``~/.ssh/config`` resolves to (through
``fabric.Connection``), which keys and agent are offered, and the preflight's per-host results in
fabric's ``GroupResult``/``GroupException`` shapes."""
import pytest
from fabric import GroupResult
from fabric.exceptions import GroupException

from appliance.launcher.config import RemoteConfig
from appliance.launcher.ssh.preflight import HostFailed, HostReport, Preflight
from appliance.launcher.ssh.connection import resolve_target


@pytest.fixture
def home(tmp_path, monkeypatch):
    (tmp_path / ".ssh").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return tmp_path


def test_ssh_config_gives_hostname_port_user_keys_and_jump_hosts(home, monkeypatch):
    key = home / "k1"
    key.write_text("x")
    (home / ".ssh" / "config").write_text(
        f"Host gw\n  HostName 192.0.2.1\n  User jumper\n  Port 2222\n"
        f"Host inner\n  HostName 10.1.2.3\n  Port 2200\n  User alice\n  IdentityFile {key}\n  ProxyJump gw\n"
        f"Host plain\n  IdentityAgent none\n  ProxyJump none\n"
        f"Host gw2\n  ProxyJump none\n"
        f"Host viagw2\n  ProxyJump gw2\n")
    t = resolve_target("inner", RemoteConfig(shared_dir=str(home / "none")))
    assert (t.hostname, t.port, t.user, t.keys) == ("10.1.2.3", 2200, "alice", (str(key),))
    assert t.via == "jumper@gw:2222" and not t.allow_agent  # no $SSH_AUTH_SOCK
    monkeypatch.setenv("SSH_AUTH_SOCK", str(home / "agent.sock"))
    assert resolve_target("inner", RemoteConfig(shared_dir=str(home / "none"))).allow_agent
    assert not resolve_target("plain", RemoteConfig(shared_dir=str(home / "none"))).allow_agent  # IdentityAgent none
    # Flags win over the config; -i is the only key offered, without the agent (IdentitiesOnly).
    t = resolve_target("inner", RemoteConfig(port=12345, user="root", key=str(home / "k2"), shared_dir=str(home)))
    assert (t.port, t.user, t.keys, t.allow_agent) == (12345, "root", (str(home / "k2"),), False)
    assert resolve_target("10.9.9.9", RemoteConfig(shared_dir=str(home))).via == ""
    # OpenSSH's "none": no jump host (fabric alone would jump through a host named "none").
    assert resolve_target("plain", RemoteConfig(shared_dir=str(home))).via == ""
    assert resolve_target("viagw2", RemoteConfig(shared_dir=str(home))).via.endswith("@gw2:22")


def test_shared_key_before_config_keys(home):
    shared = home / "share"
    (shared / "ssh").mkdir(parents=True)
    (shared / "ssh" / "id_ed25519").write_text("x")
    (home / ".ssh" / "id_rsa").write_text("x")
    assert resolve_target("h", RemoteConfig(shared_dir=str(shared))).keys == (str(shared / "ssh" / "id_ed25519"),)
    assert resolve_target("h", RemoteConfig(shared_dir=str(home / "none"))).keys == (str(home / ".ssh" / "id_rsa"),)


def test_preflight_results_are_a_group_result_and_its_error_carries_them():
    good, bad = HostReport("a", local=False), HostReport("b", local=False)
    bad.fail("b:22 refused the connection")
    bad.fail("something else")
    pf = Preflight({"a": good, "b": bad}, [], [])
    res = pf.results
    assert isinstance(res, GroupResult)
    assert res.succeeded == {"a": good} and list(res.failed) == ["b"]
    assert isinstance(res.failed["b"], HostFailed) and res.failed["b"].report is bad
    err = pf.error()
    assert isinstance(err, GroupException) and err.result.succeeded == {"a": good}
    assert err.lines == ["b:22 refused the connection", "b: something else"]
    assert Preflight({"a": good}, [], []).error() is None


@pytest.mark.timeout(30)
def test_unresolvable_name_fails_the_preflight_at_once(home):
    """A name that does not resolve is a finding at once, never waited for or retried."""
    import time

    from appliance.launcher.ssh.preflight import run_preflight

    (home / ".ssh" / "config").write_text("Host alias-of-nothing\n  HostName nothing-here.invalid\n")
    start = time.monotonic()
    pf = run_preflight(["no-such-host.invalid", "alias-of-nothing"], set(), RemoteConfig(shared_dir=str(home)), 20.0)
    elapsed = time.monotonic() - start
    with pf:
        assert not pf.ok and set(pf.results.failed) == {"no-such-host.invalid", "alias-of-nothing"}
        assert all(r.steps.get("tcp") == "unresolved" for r in pf.reports.values())
        assert "does not resolve" in str(pf.error())
    assert elapsed < 3.0, elapsed
