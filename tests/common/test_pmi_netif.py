"""The pieces of the bootstrap under a foreign process manager that need no MPI: the PMI-1 client
against a PMI-1 server speaking the wire protocol on a real socket pair (as hydra hands one over
PMI_FD), and the choice of interface from OpenMPI's include/exclude lists on this host's real
interfaces (loopback is always there)."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from appliance.common import netif, pmi1, pmix
from appliance.common.knobs import ConfigError
from appliance.runtime import procmgr


def _serve(sock: socket.socket, kvs: dict, log: list, silent_after: str = "") -> None:
    """One rank's side of a PMI-1 server: answers what hydra answers, logs every command."""
    f = sock.makefile("rw")
    for line in f:
        fields = dict(x.split("=", 1) for x in line.split() if "=" in x)
        cmd = fields.get("cmd")
        log.append(cmd)
        if cmd == silent_after:
            return
        reply = {"init": "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
                 "get_maxes": "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0",
                 "get_my_kvsname": "cmd=my_kvsname kvsname=kvs_7_0 rc=0",
                 "barrier_in": "cmd=barrier_out",
                 "finalize": "cmd=finalize_ack"}.get(cmd)
        if cmd == "put":
            assert fields["kvsname"] == "kvs_7_0"
            kvs[fields["key"]] = fields["value"]
            reply = "cmd=put_result rc=0 msg=success"
        elif cmd == "get":
            value = kvs.get(fields["key"])
            reply = (f"cmd=get_result rc=0 value={value} msg=success" if value is not None
                     else "cmd=get_result rc=-1 msg=key_not_found")
        f.write(reply + "\n")
        f.flush()
        if cmd == "finalize":
            return


def _client_env(theirs: socket.socket, env: dict | None = None) -> dict:
    return {"PMI_FD": str(theirs.fileno()), "PMI_RANK": "0", "PMI_SIZE": "1", **(env or {})}


def test_pmi1_put_barrier_get_round_trip_with_spaces_in_values():
    ours, theirs = socket.socketpair()
    kvs, log = {}, []
    t = threading.Thread(target=_serve, args=(ours, kvs, log), daemon=True)
    t.start()
    try:
        got = pmi1.exchange(_client_env(theirs), {"appliance.store": "10.0.0.1:5000 (interface eth0, from x=y)"},
                            ["appliance.store"])
    finally:
        theirs.close()
    t.join(5)
    assert got == {"appliance.store": "10.0.0.1:5000 (interface eth0, from x=y)"}
    assert log == ["init", "get_maxes", "get_my_kvsname", "put", "barrier_in", "get", "finalize"]
    assert " " not in kvs["appliance.store"] and "=" not in kvs["appliance.store"]


def test_pmi1_missing_key_and_silent_server_are_one_line_each():
    ours, theirs = socket.socketpair()
    t = threading.Thread(target=_serve, args=(ours, {}, []), daemon=True)
    t.start()
    with pytest.raises(pmi1.Pmi1Error, match="PMI-1 cmd=get failed: key_not_found"):
        pmi1.exchange(_client_env(theirs), {}, ["appliance.store"])
    theirs.close()
    ours, theirs = socket.socketpair()
    t = threading.Thread(target=_serve, args=(ours, {}, [], "barrier_in"), daemon=True)
    t.start()
    with pmi1.Client(_client_env(theirs), timeout=0.5) as c:
        with pytest.raises(pmi1.Pmi1Timeout, match="did not answer within 0.5 s"):
            c.barrier()
    theirs.close()


def test_interface_lists_by_name_subnet_and_exclusion():
    have = netif.interfaces()
    assert ("lo", "127.0.0.1") in have
    assert netif.select("nosuch0,lo") == ("lo", "127.0.0.1")
    assert netif.select("127.0.0.0/8") == ("lo", "127.0.0.1")
    others = [(n, a) for n, a in have if n != "lo"]
    if others:  # exclusion never yields loopback
        assert netif.select(exclude="docker0") != ("lo", "127.0.0.1")
    with pytest.raises(ConfigError, match="OMPI_MCA_btl_tcp_if_include='nosuch0' admits no interface on .*lo 127.0.0.1"):
        netif.select("nosuch0", source="OMPI_MCA_btl_tcp_if_include")
    with pytest.raises(ConfigError, match="neither an interface name nor a subnet"):
        netif.select("10.0.0.0/99")


def test_store_address_order():
    env = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert procmgr.store_address(env, 4) == ("127.0.0.1", "lo", "every rank on this host")
    assert procmgr.store_address({**env, "OMPI_MCA_btl_tcp_if_include": "lo"}, 8) == (
        "127.0.0.1", "lo", "btl_tcp_if_include")
    assert procmgr.store_address({**env, "HOROVOD_GLOO_IFACE": "lo", "OMPI_MCA_btl_tcp_if_include": "x"}, 8) == (
        "127.0.0.1", "lo", "HOROVOD_GLOO_IFACE")
    assert procmgr.store_address({"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, 2)[2] == "every rank on this host"
    addr, _, why = procmgr.store_address({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, 2)
    assert why in ("the default route", "the first interface") and addr != "127.0.0.1"


def test_started_by():
    assert procmgr.started_by({"OMPI_COMM_WORLD_SIZE": "2"}) == "mpirun"
    assert procmgr.started_by({"PMI_RANK": "0", "PMI_SIZE": "2"}) == "hydra"
    assert procmgr.started_by({"SLURM_PROCID": "0"}) == ""


def test_pmix_library_found_here_and_its_absence_is_one_line():
    assert pmix.load()  # Debian's libpmix2 (OpenMPI's dependency)
    with pytest.raises(pmix.PmixError, match=r"^no PMIx library \(libpmix.so.2\) here: install libpmix2"):
        pmix.load(["/nonexistent/libpmix.so.2"])
    assert not pmix.server_present({"PMIX_RANK": "0"})
    assert pmix.server_present({"PMIX_NAMESPACE": "x", "PMIX_RANK": "0", "PMIX_SERVER_URI41": "x.0;tcp4://127.0.0.1:1"})
    assert pmix.missing_vars({"PMIX_RANK": "0", "PMIX_SERVER_URI4": "x"}) == ["PMIX_NAMESPACE"]
