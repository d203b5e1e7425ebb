"""build_mesh (transport/mesh.h) across real processes, and the topology rule.

Each worker process builds its mesh through a store client and sends one greeting each way
on every link; two "hosts" are simulated on this machine by giving ranks different host
names (as HOROVOD_HOSTNAME would).
"""
import socket
import struct
import time

import pytest

from appliance.runtime import _core_testing as T
from bootstrap_util import Workers

pytestmark = pytest.mark.timeout(60)

SECRET = b"mesh-secret-\x00\xff"

MESH = r"""
def main():
    a = ARGS
    return T.mesh_smoke(a["store_host"], a["store_port"], bytes.fromhex(a["secret"]), a["job"], a["rank"],
                        a["size"], a.get("host", ""), a.get("bind_addr", ""), a["timeout_ms"], 5000,
                        a.get("allow_shm", False))
run(main)
"""


def start_mesh(w, server, job, size, ranks, hosts=None, timeout_ms=10000, secret=SECRET, **extra):
    procs = {}
    for r in ranks:
        args = dict(store_host="127.0.0.1", store_port=server.port, secret=secret.hex(), job=job, rank=r,
                    size=size, timeout_ms=timeout_ms, **extra)
        if hosts:
            args["host"] = hosts[r]
        procs[r] = w.start(MESH, args)
    return procs


def check_mesh(results, size, hosts, kind="tcp"):
    for r, res in enumerate(results):
        assert res.rc == 0 and res.result and "error" not in res.result, (r, res.result, res.stderr)
        out = res.result
        assert [p["rank"] for p in out["peers"]] == list(range(size))
        assert [p["host"] for p in out["peers"]] == hosts
        assert out["topology"] == T.compute_topology(hosts, r)
        # One machine: every rank has the same host key (shm would be possible), even
        # across simulated hosts.
        assert len({p["host_key"] for p in out["peers"]}) == 1
        assert all(p["addr"] == "127.0.0.1" and 0 < p["port"] < 65536 for p in out["peers"])
        got = sorted((peer, ch, text) for peer, ch, kind, text in out["received"])
        want = [(p, "data", f"hello from rank {p} on data") for p in range(size) if p != r]
        if r == 0:
            want += [(p, "control", f"hello from rank {p} on control") for p in range(1, size)]
        else:
            want += [(0, "control", "hello from rank 0 on control")]
        assert got == sorted(want), r
        assert all(k == kind for _, _, k, _ in out["received"]), out["received"]


@pytest.fixture
def server():
    s = T.StoreServer("127.0.0.1", 0, SECRET, "mesh-job")
    yield s
    del s


def test_mesh_three_processes_one_host(server):
    with Workers() as w:
        start_mesh(w, server, "mesh-job", 3, range(3), bind_addr="")
        results = w.collect(30)
    hosts = [results[0].result["peers"][0]["host"]] * 3  # gethostname() when no name is given
    check_mesh(results, 3, hosts)
    assert [res.result["topology"]["local_rank"] for res in results] == [0, 1, 2]
    assert all(res.result["topology"]["cross_size"] == 1 for res in results)


def test_mesh_with_shm_puts_data_and_control_links_of_one_machine_in_shared_memory(server):
    with Workers() as w:
        start_mesh(w, server, "mesh-job", 3, range(3), bind_addr="", allow_shm=True)
        results = w.collect(30)
    hosts = [results[0].result["peers"][0]["host"]] * 3
    check_mesh(results, 3, hosts, kind="shm")  # rank 0's control links to 1 and 2 as well


def test_mesh_four_processes_two_simulated_hosts(server):
    hosts = ["nodeA", "nodeA", "nodeB", "nodeB"]
    with Workers() as w:
        procs = start_mesh(w, server, "mesh-job", 4, [3, 1, 2, 0], hosts=hosts, bind_addr="127.0.0.1")  # any order
        ordered = w.collect(30, [procs[r] for r in range(4)])
    check_mesh(ordered, 4, hosts)
    topo = [res.result["topology"] for res in ordered]
    assert [(t["local_rank"], t["local_size"], t["cross_rank"], t["cross_size"]) for t in topo] == [
        (0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]


def test_missing_rank_is_named_within_the_timeout(server):
    with Workers() as w:
        start_mesh(w, server, "mesh-job", 4, range(3), timeout_ms=1500)  # rank 3 never starts
        t0 = time.monotonic()
        results = w.collect(15)
        took = time.monotonic() - t0
    assert took < 1.5 + 3.0, took
    for res in results:
        assert res.result["code"] == "timeout", res.result
        assert res.result["origin_rank"] == 3
        assert "rank(s) 3 to join" in res.result["error"] and "3 of 4 arrived" in res.result["error"]


def test_rank_that_published_but_cannot_be_reached_is_named(server):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead_port = s.getsockname()[1]
    s.close()
    info = (struct.pack("<ii", 2, 3) + struct.pack("<I", 5) + b"ghost" + struct.pack("<I", 3) + b"key"
            + struct.pack("<I", 9) + b"127.0.0.1" + struct.pack("<i", dead_port))
    T.StoreClient("127.0.0.1", server.port, SECRET, "mesh-job").set("peer/2", info)
    with Workers() as w:
        start_mesh(w, server, "mesh-job", 3, range(2), timeout_ms=1500)
        t0 = time.monotonic()
        results = w.collect(15)
        assert time.monotonic() - t0 < 1.5 + 3.0
    for res in results:
        assert res.result["code"] == "timeout" and res.result["origin_rank"] == 2, res.result
        assert f"127.0.0.1:{dead_port}" in res.result["error"] and "Connection refused" in res.result["error"]
        assert "rank 2 (ghost)" in res.result["error"]


def test_ranks_started_with_different_sizes(server):
    with Workers() as w:
        procs = {0: start_mesh(w, server, "mesh-job", 2, [0], timeout_ms=1500)[0],
                 1: start_mesh(w, server, "mesh-job", 3, [1], timeout_ms=1500)[1]}
        r0, r1 = w.collect(15, [procs[0], procs[1]])
    assert r0.result["code"] == "mismatch" and r0.result["origin_rank"] == 1, r0.result
    assert "started with size 3" in r0.result["error"]
    assert r1.result["code"] == "timeout" and "rank(s) 2" in r1.result["error"]


def test_single_rank_mesh_in_process(server):
    out = T.mesh_smoke("127.0.0.1", server.port, SECRET, "mesh-job", 0, 1, "solo", "0.0.0.0", 5000, 5000)
    assert out["topology"] == dict(local_rank=0, local_size=1, cross_rank=0, cross_size=1)
    assert out["received"] == [] and out["peers"][0]["host"] == "solo"
    assert out["peers"][0]["addr"] == "127.0.0.1"  # wildcard bind publishes the routed address


def decode_peer(b: bytes):
    rank, size = struct.unpack("<ii", b[:8])
    off, fields = 8, []
    for _ in range(3):
        (n,) = struct.unpack("<I", b[off:off + 4])
        fields.append(b[off + 4:off + 4 + n].decode())
        off += 4 + n
    (port,) = struct.unpack("<i", b[off:off + 4])
    return dict(rank=rank, size=size, host=fields[0], host_key=fields[1], addr=fields[2], port=port)


def test_wrong_secret_cannot_join_and_strangers_do_not_disturb(server):
    job = "mesh-job"
    with Workers() as w:
        early = start_mesh(w, server, job, 3, [0, 1])
        impostor = start_mesh(w, server, job, 3, [2], secret=b"guessed")[2]
        bad = w.collect(10, [impostor])[0]
        assert bad.result["code"] == "authentication failed", bad.result
        assert "failed to prove the job secret" in bad.result["error"]

        # A stranger who learned rank 1's address knocks on its listener directly.
        c = T.StoreClient("127.0.0.1", server.port, SECRET, job)
        peer1 = decode_peer(c.get("peer/1", 5000))
        assert peer1["rank"] == 1 and peer1["size"] == 3
        with pytest.raises(T.BootstrapError) as ei:
            T.auth_probe(peer1["addr"], peer1["port"], b"guessed", job, 0, 1, 0, 5000)
        assert ei.value.code == "authentication failed" and ei.value.origin_rank == 1
        raw = socket.create_connection((peer1["addr"], peer1["port"]))
        raw.sendall(b"\x16\x03\x01 hello?" * 4)  # a TLS-ish knock: garbage
        raw.settimeout(5)
        try:
            assert raw.recv(10) == b""  # hung up on without an answer...
        except ConnectionResetError:
            pass  # ...or reset, as our unread garbage was still queued
        raw.close()

        late = start_mesh(w, server, job, 3, [2])
        results = w.collect(30, [early[0], early[1], late[2]])
    hosts = [results[0].result["peers"][0]["host"]] * 3
    check_mesh(results, 3, hosts)
    refusals = [line for line in results[1].stderr.splitlines() if "refused a connection from 127.0.0.1:" in line]
    assert len(refusals) == 2, results[1].stderr


def test_topology_rule_matches_horovodrun():
    def all_topo(hosts):
        return [tuple(T.compute_topology(hosts, r).values()) for r in range(len(hosts))]

    assert all_topo(["a"]) == [(0, 1, 0, 1)]
    assert all_topo(["a", "a", "b", "b", "c", "c"]) == [
        (0, 2, 0, 3), (1, 2, 0, 3), (0, 2, 1, 3), (1, 2, 1, 3), (0, 2, 2, 3), (1, 2, 2, 3)]
    # Uneven hosts (-H a:2,b:1): the cross group is "ranks with my local_rank", as horovodrun.
    assert all_topo(["a", "a", "b"]) == [(0, 2, 0, 2), (1, 2, 0, 1), (0, 1, 1, 2)]
    # Hosts interleaved in rank order: local ranks follow rank order within each host.
    assert all_topo(["b", "a", "b", "a"]) == [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]


def test_host_key_and_listen_address():
    key = T.host_key()
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert socket.gethostname() in key and boot in key and "/ipc:" in key and "/shm:" in key
    assert T.shm_possible(key, key) and not T.shm_possible(key, key + "x") and not T.shm_possible("", "")
    assert T.choose_listen_address("10.1.2.3", "127.0.0.1") == "10.1.2.3"
    assert T.choose_listen_address("", "127.0.0.1") == "127.0.0.1"
    assert T.choose_listen_address("", "") not in ("", "0.0.0.0")
