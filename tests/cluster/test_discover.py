"""The appliance's own host discovery (appliance/cluster/discover.py) and the secondaries'
heartbeat (heartbeat.py): pure logic with the time passed in, then real files and processes,
and the launcher's discovery-script machinery running the generated script."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from appliance.cluster.discover import host_lines, write_script
from appliance.cluster.heartbeat import keep_alive
from appliance.launcher.elastic.discovery import ScriptDiscovery
from appliance.mount import Layout
from appliance.mount.registry import Registration, register, registrations
from fixtures import ROOT
from fixtures.bad_records import BAD_CASES, GOOD, make_bad_entry


def _reg(name: str, port: int = 12345, slots: int = 1, started: float = 0.0) -> Registration:
    return Registration(name=name, ssh_port=port, slots=slots, started=started, token=name)


def test_host_lines_are_the_live_registrations_in_order():
    found = [(_reg("node2", slots=2), 100.0), (_reg("node3"), 90.0), (_reg("node4", port=2222), 100.0),
             (_reg("node5"), 103.0), (_reg("node2", slots=4), 103.0)]
    assert host_lines(found, now=101.0, stale_after_s=5.0) == ["node2:2", "node4:1", "node5:1"]
    assert host_lines(found, now=101.0, stale_after_s=5.0, port=12345) == ["node2:2", "node5:1"]
    assert host_lines(found, now=200.0, stale_after_s=5.0) == []
    assert host_lines([], now=0.0, stale_after_s=5.0) == []


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_the_discovery_command_prints_live_secondaries_from_real_files(tmp_path):
    layout = Layout(str(tmp_path)).ensure()
    for name, port, slots in (("node2", 12345, 1), ("node3", 12345, 2), ("node4", 2222, 1), ("dead", 12345, 1)):
        register(layout, Registration.create(name, port, slots))
    os.utime(layout.secondary_path("dead"), (time.time() - 60, time.time() - 60))
    cmd = [sys.executable, "-m", "appliance.cluster.discover", str(tmp_path)]
    out = subprocess.run([*cmd, "--port", "12345"], env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["node2:1", "node3:2"]
    out = subprocess.run([*cmd, "--stale", "3600"], env=_env(), capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["node2:1", "node3:2", "node4:1", "dead:1"]
    out = subprocess.run([*cmd[:-1], str(tmp_path / "missing")], env=_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "missing does not exist" in out.stderr


def test_the_job_script_goes_through_the_launchers_discovery(tmp_path):
    """JOB_DIR/discover.sh is an ordinary discovery script: the elastic driver's ScriptDiscovery
    runs it and parses its lines; a secondary registered later appears at the next run."""
    share = tmp_path / "share with space"
    share.mkdir()
    layout = Layout(str(share)).ensure()
    job_dir = share / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    script = write_script(str(job_dir), str(share), 12345, python=sys.executable)
    discovery = ScriptDiscovery(script, None, 30.0, _env())
    assert discovery.find() == {}
    register(layout, Registration.create("node2", 12345, 2))
    assert discovery.find() == {"node2": 2}
    register(layout, Registration.create("node3", 12345, 1))
    assert discovery.find() == {"node2": 2, "node3": 1}
    os.unlink(layout.secondary_path("node2"))
    assert discovery.find() == {"node3": 1}


def test_keep_alive_registers_beats_and_stops_when_its_record_is_removed(tmp_path):
    layout = Layout(str(tmp_path)).ensure()
    reg = Registration.create("node2", 12345, 1)
    stop, result = threading.Event(), []
    t = threading.Thread(target=lambda: result.append(keep_alive(layout, reg, 0.05, stop)))
    t.start()
    try:
        path = layout.secondary_path("node2")
        deadline = time.monotonic() + 10
        while not os.path.exists(path):
            assert time.monotonic() < deadline, "no registration within 10 s"
            time.sleep(0.01)
        os.utime(path, (1000.0, 1000.0))
        while os.stat(path).st_mtime == 1000.0:
            assert time.monotonic() < deadline, "no heartbeat within 10 s"
            time.sleep(0.01)
        os.unlink(path)
        t.join(timeout=10)
        assert result == ["its record was removed or replaced"]
        assert not os.path.exists(path)  # it does not come back
    finally:
        stop.set()
        t.join(timeout=10)


def test_the_heartbeat_process_registers_once_sshd_answers_and_unregisters_on_sigterm(tmp_path):
    """A real process, as the secondary container's entrypoint starts it; a listening socket
    stands in for sshd."""
    layout = Layout(str(tmp_path)).ensure()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    env = {**_env(), "APPLIANCE_SECONDARY_HEARTBEAT": "0.1", "APPLIANCE_CONTAINER": "appliance-node7@engine"}
    p = subprocess.Popen([sys.executable, "-m", "appliance.cluster.heartbeat", "--name", "node7", "--port", str(port),
                          "--slots", "3", "--shared", str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        time.sleep(0.5)
        assert registrations(layout) == []  # nothing listens yet: not registered
        listener.listen()
        deadline = time.monotonic() + 20
        while not registrations(layout):
            assert p.poll() is None and time.monotonic() < deadline, "not registered within 20 s"
            time.sleep(0.05)
        (reg, first), = registrations(layout)
        assert (reg.name, reg.ssh_port, reg.slots, reg.container) == ("node7", port, 3, "appliance-node7@engine")
        while registrations(layout)[0][1] == first:
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
        assert p.returncode == 0, err
        assert registrations(layout) == [] and "no longer beating: stopped" in err
    finally:
        listener.close()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_the_heartbeat_gives_up_naming_the_port_when_sshd_never_answers(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "appliance.cluster.heartbeat", "--name", "node8", "--port", str(port),
                          "--wait", "0.5", "--shared", str(tmp_path)], env=_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and f"port {port}" in out.stderr and "not registered" in out.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", BAD_CASES)
def test_the_discovery_command_skips_one_bad_file_with_one_line(tmp_path, case):
    layout = Layout(str(tmp_path)).ensure()
    os.makedirs(layout.secondaries, exist_ok=True)
    with open(layout.secondary_path("node1"), "w") as f:
        json.dump(GOOD, f)
    bad = os.path.join(layout.secondaries, "bad.json")
    make_bad_entry(case, bad)
    out = subprocess.run([sys.executable, "-m", "appliance.cluster.discover", str(tmp_path), "--stale", "1e9"],
                         env=_env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.split() == ["node1:1"], (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and f"skipped {bad}: " in lines[0] and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("stale", ["-1", "nan", "0", "inf"])
def test_a_stale_time_that_is_not_a_positive_number_is_refused(tmp_path, stale):
    out = subprocess.run([sys.executable, "-m", "appliance.cluster.discover", str(tmp_path), "--stale", stale],
                         env=_env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--stale must be a positive number of seconds" in out.stderr, out.stderr


def test_a_file_name_cannot_forge_a_line(tmp_path):
    layout = Layout(str(tmp_path)).ensure()
    os.makedirs(layout.secondaries, exist_ok=True)
    with open(layout.secondary_path("node1"), "w") as f:
        json.dump(GOOD, f)
    with open(os.path.join(layout.secondaries, "x\nappliance discover: forged.json"), "w") as f:
        f.write("[]")
    out = subprocess.run([sys.executable, "-m", "appliance.cluster.discover", str(tmp_path), "--stale", "1e9"],
                         env=_env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.split() == ["node1:1"], (out.stdout, out.stderr)
    assert len(out.stderr.splitlines()) == 1 and "x?appliance discover: forged.json" in out.stderr, out.stderr
