"""Pure logic of the SSH launcher: address choice, route parsing, host key matching, stub frames,
remote argv and environment, remote knobs. No processes, no network."""
import base64
import hashlib
import hmac
import random

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from appliance.cli import build_parser
from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig, RemoteConfig
from appliance.launcher.ssh import network, probe
from appliance.launcher.executors import LocalExecutor, SSHExecutor, remote_argv
from appliance.launcher.ssh.hostkeys import HostKeyPolicy, HostKeyRejected, KnownHosts, lookup_names, patterns_match
from appliance.launcher.ssh.preflight import HostReport, _unique_hostnames
from appliance.launcher.ssh.remote_stub import EXITED, HEADER, STDERR, STDOUT, FrameDecoder, encode
from appliance.launcher.output import MAX_LINE, Lines


# --- network --------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("10.0.0.2 dev veth0 src 10.0.0.1 uid 0 \\    cache ", {"dev": "veth0", "src": "10.0.0.1"}),
    ("8.8.8.8 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \\    cache", {"dev": "eth0", "src": "192.0.2.2", "via": "192.0.2.1"}),
    ("local 127.0.0.1 dev lo src 127.0.0.1 uid 0 \\    cache <local>", {"type": "local", "dev": "lo", "src": "127.0.0.1"}),
    ("unreachable 10.9.9.9 uid 0", {"type": "unreachable"}),
    ("", {}),
])
def test_parse_route(text, want):
    assert probe.parse_route(text) == want


def test_route_get_loopback_here():
    assert probe.route_get("127.0.0.1")["dev"] == "lo"


def test_choose_refuses_loopback_docker_and_unroutable():
    assert network.choose("h", "p", {"dev": "ens5", "src": "10.0.0.3"}) == ("10.0.0.3", "ens5")
    for route, words in [
        ({"type": "local", "dev": "lo", "src": "127.0.0.1"}, ["through lo", "resolve to loopback"]),
        ({"dev": "lo", "src": "127.0.0.1"}, ["through lo"]),
        ({"dev": "docker0", "src": "172.17.0.1"}, ["docker0", "overlaps Docker"]),
        ({"type": "unreachable"}, ["unreachable"]),
        ({"error": "RTNETLINK answers: Network is unreachable"}, ["no route to p", "RTNETLINK"]),
        ({"dev": "eth0"}, ["without a source address"]),
    ]:
        with pytest.raises(network.NetworkError) as e:
            network.choose("h", "p", route)
        assert str(e.value).startswith("h: ") and "--network-interface" in str(e.value)
        for w in words:
            assert w in str(e.value)


def test_reference_targets():
    addr = {"b": "10.0.0.2", "c": "10.0.0.3", "a": "10.0.0.9"}
    # -H localhost:1,b:1,c:1 -> every remote host looks towards the primary
    assert network.reference_targets(["localhost", "b", "c"], {"localhost"}, addr, "10.0.0.1") == {
        "b": "10.0.0.1", "c": "10.0.0.1"}
    # all remote: towards the first other host (rank 0's host for everyone else)
    assert network.reference_targets(["a", "b", "c"], set(), addr, None) == {"a": "10.0.0.2", "b": "10.0.0.9",
                                                                           "c": "10.0.0.9"}
    # remote rank 0, local host later: rank 0's host looks at the primary
    assert network.reference_targets(["b", "vm"], {"vm"}, addr, "10.0.0.1") == {"b": "10.0.0.1"}
    assert network.reference_targets(["b"], set(), addr, None) == {}  # alone: its route to the primary


def test_by_interface():
    assert network.by_interface("h", "ib0", "10.1.0.5", ["lo", "ib0"]) == ("10.1.0.5", "ib0")
    with pytest.raises(network.NetworkError, match=r"h: --network-interface ib0: no IPv4 address on ib0 there \(its interfaces: lo, eth0\)"):
        network.by_interface("h", "ib0", None, ["lo", "eth0"])


# --- host keys ------------------------------------------------------------------------------
def _key() -> paramiko.PKey:
    import io
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


def _hashed(name: str) -> str:
    salt = bytes(random.getrandbits(8) for _ in range(20))
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


def test_patterns():
    assert patterns_match("*", "[10.0.0.2]:12345")
    assert patterns_match("[10.0.0.2]:12345", "[10.0.0.2]:12345")   # brackets are literal
    assert not patterns_match("[10.0.0.2]:12345", "1")
    assert patterns_match("node?,other", "node7") and not patterns_match("node?", "node17")
    assert patterns_match("*.cluster,!bad.cluster", "good.cluster")
    assert not patterns_match("*.cluster,!bad.cluster", "bad.cluster")
    assert patterns_match("NODE1", "node1")
    assert patterns_match(_hashed("[h]:22"), "[h]:22") and not patterns_match(_hashed("x"), "y")
    assert lookup_names("h", 22, "10.0.0.2") == ["h", "10.0.0.2"]
    assert lookup_names("10.0.0.2", 12345, "10.0.0.2") == ["[10.0.0.2]:12345"]


def test_known_hosts_verdicts(tmp_path):
    k1, k2 = _key(), _key()
    f = tmp_path / "known_hosts"
    f.write_text(f"# comment\n* {k1.get_name()} {k1.get_base64()}\n"
                 f"[a]:2 {k2.get_name()} {k2.get_base64()}\n"
                 f"@revoked * {k2.get_name()} AAAArevoked\n")
    kh = KnownHosts(str(f))
    assert kh.verdict(["[b]:2"], k1) == "match"
    assert kh.verdict(["[a]:2"], k2) == "match"
    assert kh.verdict(["[b]:2"], k2) == "not-cluster"   # only the wildcard line applies
    assert kh.verdict(["[a]:2"], _key()) == "mismatch"
    assert KnownHosts(str(tmp_path / "missing")).verdict(["x"], k1) == "unknown"
    f.write_text(f"@revoked * {k1.get_name()} {k1.get_base64()}\n")
    assert KnownHosts(str(f)).verdict(["x"], k1) == "revoked"


def test_policy_tofu_records_then_refuses_a_changed_key(tmp_path):
    user = tmp_path / "home" / ".ssh" / "known_hosts"
    policy = HostKeyPolicy(str(tmp_path / "share" / "ssh" / "known_hosts"), str(user))
    k = _key()
    assert not policy.strict
    policy.check("h", 12345, "10.0.0.2", k)                       # first use: accepted, recorded, warned
    assert user.read_text() == f"[h]:12345 {k.get_name()} {k.get_base64()}\n"
    assert len(policy.warnings) == 1 and "trusted its key" in policy.warnings[0]
    policy.check("h", 12345, "10.0.0.2", k)                       # known: silent
    assert len(policy.warnings) == 1
    with pytest.raises(HostKeyRejected, match=r"h:12345 presented a host key .* differs .*ssh-keygen -f"):
        policy.check("h", 12345, None, _key())


def test_policy_strict_with_cluster_known_hosts(tmp_path):
    cluster, user = tmp_path / "known_hosts", tmp_path / "user_known_hosts"
    k = _key()
    cluster.write_text(f"* {k.get_name()} {k.get_base64()}\n")
    policy = HostKeyPolicy(str(cluster), str(user))
    assert policy.strict
    policy.check("any", 12345, "10.0.0.7", k)
    with pytest.raises(HostKeyRejected, match="not in the cluster.s .*sshd -h .*ssh_host_ed25519_key"):
        policy.check("other", 12345, None, _key())
    assert not user.exists()  # strict mode never records anything


# --- the stub's frames and line assembly ------------------------------------------------------
class _Sink:
    def __init__(self):
        self.lines = []

    def line(self, rank, stream, data):
        self.lines.append((rank, stream, data))


def test_frames_round_trip_in_any_chunking():
    frames = [(STDOUT, b"hello\n"), (STDERR, b""), (STDOUT, b"y" * 65536),
              (EXITED, b'{"returncode": -9}')]
    wire = b"".join(encode(k, p) for k, p in frames)
    rng = random.Random(7)
    for _ in range(20):
        d, got, i = FrameDecoder(), [], 0
        while i < len(wire):
            n = rng.randint(1, 9000)
            got += d.feed(wire[i:i + n])
            i += n
        assert got == frames and d.pending == 0
    with pytest.raises(ValueError, match="not a stub frame"):
        FrameDecoder().feed(HEADER.pack(b"Z", 1) + b"x")
    with pytest.raises(ValueError, match="not a stub frame"):
        FrameDecoder().feed(HEADER.pack(STDOUT, 1 << 20))


def test_lines_split_like_the_local_relay():
    sink = _Sink()
    lines = Lines(lambda data: sink.line(3, "stdout", data))
    for piece in (b"ab", b"c\nde", b"f\n\n", b"tail"):
        lines.feed(piece)
    assert [d for _, _, d in sink.lines] == [b"abc\n", b"def\n", b"\n"]
    lines.flush()
    assert sink.lines[-1] == (3, "stdout", b"tail")
    sink.lines.clear()
    lines.feed(b"z" * (MAX_LINE + 10) + b"\n")
    assert [len(d) for _, _, d in sink.lines] == [MAX_LINE, 11]


# --- executors, knobs, CLI -----------------------------------------------------------------------
def test_remote_argv_uses_the_remote_interpreter():
    import sys
    for prog in ("python", "python3", "python3.11", sys.executable):
        assert remote_argv([prog, "-m", "train"], "/opt/venv/bin/python") == ["/opt/venv/bin/python", "-m", "train"]
    assert remote_argv(["./run.sh", "python"], "/x/python") == ["./run.sh", "python"]
    assert remote_argv(["/usr/bin/python3", "t.py"], "/x/python") == ["/usr/bin/python3", "t.py"]


def test_base_env_remote_forwards_all_but_the_host_specific_names():
    environ = {"PATH": "/p", "PYTHONPATH": "/pp", "LD_LIBRARY_PATH": "/l", "HOROVOD_CYCLE_TIME": "2",
               "NCCL_DEBUG": "INFO", "APPLIANCE_SHM": "0", "HOME": "/root", "SECRET_TOKEN": "x", "TERM": "xterm",
               "NCCL_SOCKET_IFNAME": "ib0", "HOSTNAME": "me", "PWD": "/here", "OLDPWD": "/there", "SSH_CLIENT": "a",
               "SSH_AUTH_SOCK": "/s", "DISPLAY": ":0", "XDG_RUNTIME_DIR": "/run/user/0", "BASH_FUNC_f%%": "() {}",
               "USER": "root", "TMPDIR": "/tmp/me", "HOROVOD_SECRET_KEY": "k", "APPLIANCE_CONTAINER": "c@e"}
    ex = SSHExecutor("h", None, LaunchConfig.create(["p"], 1, environ={}), "10.0.0.2", "ens5")
    env = ex.base_env(environ)
    assert env == {"PATH": "/p", "PYTHONPATH": "/pp", "LD_LIBRARY_PATH": "/l", "HOROVOD_CYCLE_TIME": "2",
                   "NCCL_DEBUG": "INFO", "APPLIANCE_SHM": "0", "NCCL_SOCKET_IFNAME": "ib0", "SECRET_TOKEN": "x",
                   "TERM": "xterm", "HOROVOD_GLOO_IFACE": "ens5"}  # a user's own NCCL_SOCKET_IFNAME wins
    local = LocalExecutor("localhost", "10.0.0.1", "eth0").base_env({"HOME": "/root"})
    assert local == {"HOME": "/root", "HOROVOD_GLOO_IFACE": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}


def test_remote_config_precedence_and_errors():
    r = RemoteConfig.create(environ={})
    assert (r.port, r.key, r.shared_dir, r.remote_python, r.network_interface) == (None, None, "/mnt/share", None, None)
    env = {"APPLIANCE_SSH_PORT": "2222", "APPLIANCE_SSH_KEY": "/k", "APPLIANCE_SHARED": "/s",
           "APPLIANCE_REMOTE_PYTHON": "/opt/venv/bin/python", "HOROVOD_GLOO_IFACE": "eth1", "APPLIANCE_MIN_SHM": "1G"}
    r = RemoteConfig.create(environ=env)
    assert (r.port, r.key, r.shared_dir, r.remote_python, r.network_interface, r.min_shm) == (
        2222, "/k", "/s", "/opt/venv/bin/python", "eth1", 1 << 30)
    r = RemoteConfig.create(port=12345, key="/k2", shared="/s2", network_interface="ib0", environ=env)
    assert (r.port, r.key, r.shared_dir, r.shared_explicit, r.network_interface) == (12345, "/k2", "/s2", True, "ib0")
    for kwargs, words in [(dict(remote_python="python3"), "must be an absolute path"), (dict(port=70000), "-p 70000"),
                          (dict(network_interface="eth0; rm"), "not an interface name")]:
        with pytest.raises(ConfigError, match=words):
            RemoteConfig.create(environ={}, **kwargs)
    with pytest.raises(ConfigError, match="APPLIANCE_SSH_PORT='x'"):
        RemoteConfig.create(environ={"APPLIANCE_SSH_PORT": "x"})
    c = LaunchConfig.create(["p"], 2, environ={"APPLIANCE_SSH_PORT": "2"}, forward=["APPLIANCE_SSH_PORT=3"])
    assert c.remote.port == 3  # -x reaches the launcher's own knobs too, as for the others


def test_cli_remote_flags():
    a = build_parser().parse_args(["launch", "-np", "2", "-H", "localhost:1,h:1", "-p", "12345", "-i", "/k",
                                   "--network-interface", "eth0", "--remote-python", "/x/python", "--", "python", "t.py"])
    assert (a.ssh_port, a.ssh_identity_file, a.network_interface, a.remote_python) == (12345, "/k", "eth0", "/x/python")
    a = build_parser().parse_args(["check", "--hostfile", "f", "--shared", "/s", "-np", "4"])
    assert (a.hostfile, a.shared, a.np) == ("f", "/s", 4)
    assert build_parser().parse_args(["keys", "--shared", "/s"]).shared == "/s"


def test_unique_hostnames():
    reports = {h: HostReport(h, local) for h, local in [("localhost", True), ("127.0.0.1", True), ("a", False),
                                                        ("b", False)]}
    for h, name in [("localhost", "vm"), ("127.0.0.1", "vm"), ("a", "n1"), ("b", "n1")]:
        reports[h].facts = {"hostname": name}
    _unique_hostnames(reports)
    assert not reports["127.0.0.1"].failures  # two names of this machine are fine
    assert reports["b"].failures == ["b: reports the same hostname 'n1' as a: these are one machine (list it once, "
                                     "with all its slots) or the hosts need distinct hostnames"]


def test_a_remote_ranks_stderr_is_read_in_lines_from_the_channel():
    """The SSH worker's stderr reader (for ``output.relay``): whole lines whatever the chunks,
    long lines cut at the limit, the rest at EOF, the last three lines kept; a failing channel
    reads as an OSError (relay's end)."""
    from appliance.launcher.output import relay
    from appliance.launcher.ssh.worker import _StderrTail

    class Chan:
        def __init__(self, chunks):
            self.chunks = list(chunks)

        def recv_stderr(self, n):
            item = self.chunks.pop(0) if self.chunks else b""
            if isinstance(item, Exception):
                raise item
            return item

    tail = _StderrTail(Chan([b"one\ntw", b"o\n", b"x" * 10, b"y\nthree\nlast"]))
    assert [tail.readline(4) for _ in range(8)] == [b"one\n", b"two\n", b"xxxx", b"xxxx", b"xxy\n", b"thre",
                                                      b"e\n", b"last"]
    assert tail.readline(4) == b"" and tail.tail == ["thre", "e", "last"]
    got: list[bytes] = []
    relay(_StderrTail(Chan([b"one\ntw", b"o\n", b"last"])), got.append)
    assert got == [b"one\n", b"two\n", b"last"]
    tail = _StderrTail(Chan([b"a\nb\nc\nd\n"]))
    assert [tail.readline(MAX_LINE) for _ in range(5)] == [b"a\n", b"b\n", b"c\n", b"d\n", b""]
    assert tail.tail == ["b", "c", "d"]
    broken = _StderrTail(Chan([b"partial", EOFError("socket closed")]))
    with pytest.raises(OSError, match="socket closed"):
        broken.readline(MAX_LINE)
    got = []
    relay(_StderrTail(Chan([b"ok\n", EOFError("gone")])), got.append)
    assert got == [b"ok\n"]
