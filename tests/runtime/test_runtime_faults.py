"""Faults the runtime must end or survive by itself, over real ranks (processes, sockets).

Covers: a deadlock (one rank skips an allreduce) is reported on every rank and fails every rank
after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, which is on by default; the fault report
(APPLIANCE_FAULT_FILE) after a killed rank, a stopped rank (heartbeats), a stall and a rank that
never arrives; the store and data-plane listeners listen on the job's address only; a flood of bad connections to the store costs a bounded
number of log lines and the job goes on. Ranks are started directly (rank_group.RankGroup), so
nothing but the runtime decides when a rank fails.
"""
import os
import re
import signal
import socket
import time

import pytest

from rank_group import RankGroup

def test_stall_shutdown_is_on_by_default():
    from appliance.common.knobs import KNOBS
    from appliance.runtime.config import RuntimeConfig
    from appliance.runtime import _core

    assert KNOBS["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"].default > 0
    assert RuntimeConfig.from_env({}).options["stall_shutdown_s"] == 300.0
    assert _core.RuntimeConfig().stall_shutdown_s == 300.0
    assert RuntimeConfig.from_env({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"}).options["stall_shutdown_s"] == 0.0


def test_deadlock_is_reported_on_every_rank_and_fails_every_rank(tmp_path):
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"}
    with RankGroup(3, "stall", 1, out=tmp_path, env=env) as g:
        rcs = g.wait(timeout=30)
        assert rcs == [3, 3, 3], f"exit codes {rcs}\n" + g.all_stderr()
        for r in range(3):
            rep = g.report(r)
            assert rep and rep["error"], f"rank {r}: {rep}\n" + g.all_stderr()
            assert rep["origin_rank"] == 1 and rep["code"] == "stalled", rep
            assert "rank 1" in rep["error"] and "grad.skipped" in rep["error"], rep["error"]
            took = rep["at"] - rep["started"]
            assert 2.5 <= took <= 6.0, f"rank {r} failed {took:.1f} s after the stall began"
            # the stall report reached this rank too (the waiting ones and the one they wait for)
            report_lines = [ln for ln in g.stderr(r).splitlines() if "stall:" in ln]
            assert any("grad.skipped" in ln and "[1]" in ln for ln in report_lines), g.stderr(r)
            fault = g.fault(r)
            assert fault and fault["kind"] == "stall" and fault["origin_rank"] == 1, fault
            assert fault["rank"] == r and "grad.skipped" in fault["message"], fault


def _start_steps(tmp_path, env=None):
    g = RankGroup(3, "steps", out=tmp_path, env=env)
    g.wait_for_file("ready*", timeout=30, count=3)
    time.sleep(0.3)  # collectives in flight
    return g


def _survivors_name(g, victim, t_fault, within):
    host = socket.gethostname()
    for r in range(3):
        if r == victim:
            continue
        fault = g.fault(r)
        assert fault, f"rank {r} wrote no fault report\n" + g.all_stderr()
        assert fault["rank"] == r and fault["host"] == host, fault
        assert fault["origin_rank"] == victim and fault["origin_host"] == host, fault
        assert fault["kind"] == "peer_lost", fault
        assert f"rank {victim}" in fault["message"], fault
        assert fault["time"] - t_fault < within, f"rank {r}: {fault['time'] - t_fault:.2f} s"
        rep = g.report(r)
        assert rep and rep["origin_rank"] == victim, rep


@pytest.mark.parametrize("victim", [0, 1])
def test_killed_rank_is_in_every_survivors_fault_report(tmp_path, victim):
    with _start_steps(tmp_path) as g:
        t_kill = time.time()
        os.killpg(g.procs[victim].pid, signal.SIGKILL)
        rcs = g.wait(timeout=20)
        assert [rc for r, rc in enumerate(rcs) if r != victim] == [3, 3], f"{rcs}\n" + g.all_stderr()
        _survivors_name(g, victim, t_kill, within=5.0)
        assert g.fault(victim) is None


@pytest.mark.parametrize("victim", [0, 2])
def test_stopped_rank_is_named_after_the_heartbeat_timeout(tmp_path, victim):
    with _start_steps(tmp_path, env={"APPLIANCE_HEARTBEAT_TIMEOUT": "2"}) as g:
        t_stop = time.time()
        os.killpg(g.procs[victim].pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(g.procs[r].poll() is None for r in range(3) if r != victim):
                time.sleep(0.05)
        finally:
            os.killpg(g.procs[victim].pid, signal.SIGKILL)
        _survivors_name(g, victim, t_stop, within=6.0)
        for r in range(3):
            if r != victim:
                took = g.fault(r)["time"] - t_stop
                assert took >= 1.5, f"rank {r} blamed rank {victim} after {took:.2f} s, before the heartbeat timeout"


def test_rank_that_never_arrives_is_in_the_fault_report(tmp_path):
    with RankGroup(3, "hold", out=tmp_path, env={"HOROVOD_START_TIMEOUT": "2"}, only=[0, 1]) as g:
        assert g.wait(timeout=30) == [1, 1], g.all_stderr()
        fault = g.fault(0)
        assert fault and fault["rank"] == 0 and fault["origin_rank"] == 2, fault
        assert fault["kind"] == "error" and "rank(s) 2" in fault["message"], fault
        # rank 1 times out the same way, or first sees the store (on rank 0) go away
        fault = g.fault(1)
        assert fault and fault["rank"] == 1 and fault["origin_rank"] in (2, 0), fault


@pytest.mark.parametrize("addr", ["127.0.0.1", "127.0.0.2"])
def test_store_listens_on_the_jobs_address_only(tmp_path, addr):
    with RankGroup(2, "hold", out=tmp_path, addr=addr) as g:
        g.wait_for_file("ready*", timeout=30, count=2)
        # rank 0: the store and its data listener (links are opened on first use); rank 1: its
        # data listener; all on the chosen address only
        got = [g.listening(0), g.listening(1)]
        assert (addr, g.store_port) in got[0] and len(got[0]) == 2 and len(got[1]) == 1, got
        assert all(a == addr for lst in got for a, _ in lst), got
        g.touch("go")
        assert g.wait(timeout=30) == [0, 0], g.all_stderr()


def test_data_plane_listens_on_the_jobs_address_only(tmp_path):
    """Ranks 0 and 1 of 3 wait in the rendezvous for rank 2 with their data listeners open."""
    addr = "127.0.0.2"
    with RankGroup(3, "hold", out=tmp_path, addr=addr, only=[0, 1]) as g:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (len(g.listening(0)) == 2 and len(g.listening(1)) == 1):
            time.sleep(0.05)
        got = [g.listening(0), g.listening(1)]
        assert len(got[0]) == 2 and len(got[1]) == 1, got  # rank 0: store + data; rank 1: data
        assert all(a == addr for lst in got for a, _ in lst), got


def test_bad_connections_cost_bounded_log_lines_and_the_job_goes_on(tmp_path):
    n = 300
    with RankGroup(2, "hold", out=tmp_path) as g:
        g.wait_for_file("ready*", timeout=30, count=2)
        for i in range(n):
            with socket.create_connection(("127.0.0.1", g.store_port), timeout=5) as s:
                if i % 3 == 0:
                    s.sendall(os.urandom(64))  # garbage instead of a handshake
                elif i % 3 == 1:
                    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                # else: connect and hang up at once
        time.sleep(0.5)
        g.touch("go")
        assert g.wait(timeout=30) == [0, 0], g.all_stderr()
        assert all(g.report(r)["ok"] for r in range(2))
        store_lines = [ln for ln in g.stderr(0).splitlines() if ln.startswith("[appliance store")]
        assert 1 <= len(store_lines) <= 8, f"{len(store_lines)} store log lines for {n} bad connections:\n" + \
            "\n".join(store_lines[:20])
        assert any(re.search(r"left out \d+ more", ln) for ln in store_lines), store_lines
