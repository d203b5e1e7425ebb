"""The appliance plane's logic without Docker: config, argument splitting, the launch configuration
the job runner builds, the rank start record (a real exec), the startup view's reading of a job dir."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.cli import _primary_parser, _split_primary
from appliance.cluster.jobrun import create_job, job_config, job_hosts
from appliance.mount import write_json
from appliance.cluster.view import StartupView
from appliance.cluster.config import ClusterConfig
from appliance.common.knobs import ConfigError
from appliance.launcher.flags import LaunchFlags, parse_launch_flags
from fixtures import ROOT


def test_cluster_config_precedence_and_defaults():
    c = ClusterConfig.create(environ={})
    assert (c.shared, c.image, c.network, c.ssh_port, c.shm, c.gpus) == (
        "/mnt/share", "appliance:latest", "host", 12345, "host", "auto")
    env = {"APPLIANCE_SHARED": "/srv/s", "APPLIANCE_IMAGE": "img:1", "APPLIANCE_NETWORK": "appliance-x",
           "APPLIANCE_SSH_PORT": "2200", "APPLIANCE_GPUS": "2"}
    c = ClusterConfig.create(environ=env)
    assert (c.shared, c.image, c.network, c.ssh_port, c.shm, c.gpus) == ("/srv/s", "img:1", "appliance-x", 2200, "1g", "2")
    c = ClusterConfig.create(shared="rel", ssh_port=22, network="host", shm_size="2g", environ=env)
    assert c.shared == os.path.abspath("rel") and c.ssh_port == 22 and c.shm == "2g"
    for bad in (dict(ssh_port=70000), dict(shm_size="10k"), dict(shm_size="lots"), dict(gpus="some"),
                dict(network="bad name"), dict(name="a/b")):
        with pytest.raises(ConfigError):
            ClusterConfig.create(environ={}, **bad)


def test_primary_arguments_split_into_own_launcher_and_command():
    argv = ["-np", "2", "--image", "x:1", "-H", "localhost:1,n2:1", "-p", "2222", "--verbose", "-x", "A=1",
            "--network", "appliance-n", "--", "python", "-m", "train", "-p", "3"]
    before, command = _split_primary(argv)
    own, launch = _primary_parser().parse_known_args(before)
    assert command == ["python", "-m", "train", "-p", "3"]
    assert (own.image, own.ssh_port, own.network) == ("x:1", 2222, "appliance-n")
    assert launch == ["-np", "2", "-H", "localhost:1,n2:1", "--verbose", "-x", "A=1"]
    flags, cmd = parse_launch_flags([*launch, "--", *command])
    assert cmd == command and job_hosts(flags) == [("localhost", 1), ("n2", 1)] and flags.np == 2 and flags.verbose
    # without "--", the launcher's parser finds where the command starts
    flags, cmd = parse_launch_flags(["-np", "1", "python", "-m", "train", "-p", "3"])
    assert cmd == ["python", "-m", "train", "-p", "3"] and flags.ssh_port is None


def test_jobrun_wraps_the_command_and_keeps_user_flags():
    job = {"launch": LaunchFlags(np=2, hosts="a:1,b:1").to_json(), "command": ["python", "-m", "train"],
           "ssh_port": 12345, "shared": "/s", "secondary_wait_s": 7.5}
    config = job_config(job, "/s/jobs/j1", environ={})
    assert (config.np, config.hosts, config.remote.port, config.output_dir) == (2, "a:1,b:1", 12345, "/s/jobs/j1/logs")
    assert config.remote.shared_dir == "/s" and config.remote.host_wait_s == 7.5
    assert config.command[1:5] == ("-m", "appliance.cluster.rankexec", "/s/jobs/j1", "--")
    assert list(config.command[5:]) == job["command"]
    job["launch"] = LaunchFlags(np=2, hosts="a:1,b:1", ssh_port=22, output_filename="/mine").to_json()
    config = job_config(job, "/s/jobs/j1", environ={})
    assert (config.remote.port, config.output_dir) == (22, "/mine")


def test_job_json_keeps_the_flags_and_a_copy_of_the_hostfile(tmp_path):
    hostfile = tmp_path / "hf"
    hostfile.write_text("localhost slots=2\nn2 slots=1\n")
    flags, command = parse_launch_flags(["-np", "3", "--hostfile", str(hostfile), "-x", "A=1", "--", "prog", "-p", "1"])
    job_dir = tmp_path / "jobs" / "j1"
    hosts = create_job(str(job_dir), flags, command, ssh_port=2222, shared=str(tmp_path), network="host",
                       image="img", workdir=str(tmp_path), secondary_wait_s=3.0)
    assert hosts == [("localhost", 2), ("n2", 1)]
    job = json.loads((job_dir / "job.json").read_text())
    stored = LaunchFlags.from_json(job["launch"])
    assert stored.hostfile == str(job_dir / "hostfile") and (job_dir / "hostfile").read_text() == hostfile.read_text()
    assert stored.x == ("A=1",) and stored.np == 3 and job["command"] == ["prog", "-p", "1"]
    config = job_config(job, str(job_dir), environ={})
    assert config.hostfile == str(job_dir / "hostfile") and config.remote.port == 2222 and config.env == {"A": "1"}
    with pytest.raises(ConfigError):
        LaunchFlags.from_json({**job["launch"], "np_typo": 1})


def test_an_elastic_job_without_hosts_discovers_the_registered_secondaries(tmp_path):
    """--min-np without -H: job.json has no hosts; its launch flags carry JOB_DIR/discover.sh (the
    job's SSH port in it) as the discovery script, and the launcher's config is elastic over it.
    -H, a hostfile or a script of the user's keep their meaning."""
    flags, command = parse_launch_flags(["-np", "2", "--min-np", "1", "--max-np", "3", "--", "python", "-m", "train"])
    job_dir = tmp_path / "jobs" / "j1"
    hosts = create_job(str(job_dir), flags, command, ssh_port=2222, shared=str(tmp_path), network="n",
                       image="img", workdir=str(tmp_path), secondary_wait_s=3.0)
    assert hosts is None
    job = json.loads((job_dir / "job.json").read_text())
    script = job_dir / "discover.sh"
    assert job["hosts"] == [] and LaunchFlags.from_json(job["launch"]).host_discovery_script == str(script)
    assert os.access(script, os.X_OK) and "appliance.cluster.discover" in script.read_text()
    assert f"'{tmp_path}' --port 2222" in script.read_text()
    config = job_config(job, str(job_dir), environ={})
    assert config.elastic is not None and config.elastic.discovery_script == str(script)
    assert (config.elastic.min_np, config.elastic.max_np) == (1, 3)
    for given in (["-H", "a:1,b:1"], ["--host-discovery-script", "/bin/mine"]):
        flags, _ = parse_launch_flags(["-np", "2", "--min-np", "1", *given, "--", "x"])
        hosts = create_job(str(tmp_path / "jobs" / given[0]), flags, ["x"], ssh_port=2222, shared=str(tmp_path),
                           network="n", image="img", workdir=str(tmp_path), secondary_wait_s=3.0)
        assert hosts == ([("a", 1), ("b", 1)] if given[0] == "-H" else None)
        assert not (tmp_path / "jobs" / given[0] / "discover.sh").exists()


def test_jobrun_new_takes_the_port_from_the_launch_flags(tmp_path, monkeypatch):
    from appliance.cluster.jobrun import new_job

    monkeypatch.setenv("APPLIANCE_SHARED", str(tmp_path))
    monkeypatch.delenv("APPLIANCE_SSH_PORT", raising=False)
    job_dir = new_job(["-np", "2", "-H", "primary:1,node1:1", "-p", "2222", "--", "python", "-m", "train", "-p", "9"])
    job = json.loads((Path(job_dir) / "job.json").read_text())
    assert job["ssh_port"] == 2222 and job["command"] == ["python", "-m", "train", "-p", "9"]
    assert job["hosts"] == [{"name": "primary", "slots": 1}, {"name": "node1", "slots": 1}]
    assert job_config(job, job_dir, environ={}).remote.port == 2222
    assert (tmp_path / "ssh" / "id_ed25519").is_file()  # the cluster keys, made on first use


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fail", [False, True])
def test_jobrun_runs_a_local_job_through_the_launcher(tmp_path, fail):
    body = ("import os, sys; r = os.environ['HOROVOD_RANK']; open(os.path.join(sys.argv[1], 'ran.' + r), 'w').close(); "
            f"sys.exit(3 if {fail} and r == '1' else 0)")
    flags, command = parse_launch_flags(["-np", "2", "--", sys.executable, "-c", body, str(tmp_path)])
    job_dir = tmp_path / "jobs" / "j1"
    create_job(str(job_dir), flags, command, ssh_port=12345, shared=str(tmp_path), network="host", image="",
               workdir=str(tmp_path), secondary_wait_s=1.0)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "APPLIANCE_STOP_GRACE": "1"}
    r = subprocess.run([sys.executable, "-m", "appliance.cluster.jobrun", str(job_dir)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=50)
    want = 3 if fail else 0
    assert r.returncode == want, r.stdout + r.stderr
    assert json.loads((job_dir / "exit.json").read_text())["returncode"] == want
    host = json.loads((job_dir / "hosts" / "localhost.json").read_text())  # no preflight: reported local
    assert (host["local"], host["reachable"], host["authenticated"]) == (True, True, True)
    assert sorted(os.listdir(job_dir / "ranks")) == ["0.json", "1.json"]
    assert sorted(os.listdir(job_dir / "logs")) == ["rank.0", "rank.1"]
    assert (tmp_path / "ran.0").exists() and (tmp_path / "ran.1").exists()


def test_rankexec_records_the_rank_then_becomes_the_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOROVOD_RANK": "3", "HOROVOD_HOSTNAME": "nodeX"}
    out = subprocess.run([sys.executable, "-m", "appliance.cluster.rankexec", str(tmp_path), "--",
                          "python", "-c", "import os, sys; print(os.getpid(), sys.executable)"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pid, exe = out.stdout.split()
    rec = json.loads((tmp_path / "ranks" / "3.json").read_text())
    assert rec["pid"] == int(pid) and rec["host"] == "nodeX" and rec["rank"] == 3
    assert exe == sys.executable  # "python" ran as the launcher-side interpreter
    missing = subprocess.run([sys.executable, "-m", "appliance.cluster.rankexec", str(tmp_path), "--",
                              "/no/such/program"], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 127 and "/no/such/program" in missing.stderr


def test_startup_view_reports_each_host_once_and_ends_when_all_ranks_started(tmp_path):
    err = io.StringIO()
    view = StartupView(str(tmp_path), [("localhost", 1), ("n2", 2), ("unused", 4)], 3, live=False,
                       out=io.StringIO(), err=err)
    assert view.expected == {"localhost": 1, "n2": 2}
    (tmp_path / "hosts").mkdir()
    write_json(str(tmp_path / "hosts" / "localhost.json"), {"local": True, "reachable": True, "authenticated": True})
    write_json(str(tmp_path / "hosts" / "n2.json"), {"reachable": True, "address": "10.0.0.2", "authenticated": None})
    assert not view.poll()
    write_json(str(tmp_path / "hosts" / "n2.json"), {"reachable": True, "address": "10.0.0.2", "authenticated": True})
    (tmp_path / "ranks").mkdir()
    for rank, host in ((0, "localhost"), (1, "n2")):
        write_json(str(tmp_path / "ranks" / f"{rank}.json"), {"rank": rank, "host": host})
    assert not view.poll()
    write_json(str(tmp_path / "ranks" / "2.json"), {"rank": 2, "host": "n2"})
    assert view.poll() and view.poll()
    lines = err.getvalue().splitlines()
    assert lines[0] == "appliance primary: n2: reachable (10.0.0.2)"  # the first poll: reachable, not yet in
    assert sum("n2: reachable" in l for l in lines) == 1 and sum("n2: authenticated" in l for l in lines) == 1
    assert "appliance primary: n2: 2 ranks started" in lines
    assert lines[-1].startswith("appliance primary: all 3 ranks started after")


def test_startup_view_prints_output_above_its_table_in_whole_lines(tmp_path):
    # The start-up table drawn (live): the job's output arrives in pieces and comes out whole, the
    # unfinished rest when the view closes.
    err = io.StringIO()
    view = StartupView(str(tmp_path), [("localhost", 1)], 1, live=True, out=io.StringIO(), err=err)
    assert view.active
    view.write("stdout", b"[0]<stdout>:one\n[0]<std")
    view.write("stdout", b"out>:two\n[0]<stdout>:thr")
    view.close()
    assert not view.active
    lines = [l for l in err.getvalue().splitlines() if l.startswith("[0]")]
    assert lines == ["[0]<stdout>:one", "[0]<stdout>:two", "[0]<stdout>:thr"], err.getvalue()


def test_job_view_prints_whole_lines_and_stands_aside_once_closed(tmp_path):
    # The primary's job table (its drawing is checked in a terminal by test_primary.py): the
    # container's output arrives in pieces and is printed in whole lines; once closed (the job
    # ended, or Ctrl-C) the primary writes the rest itself.
    from appliance.cluster.view import JobView
    from appliance.launcher.observe.record import RecordWriter

    with RecordWriter(str(tmp_path), "j1", 1, every_s=0) as rec:
        rec._write({"kind": "rank", "rank": 0, "host": "n1", "t": 1000.0, "step": 5, "wall_s": 1.0,
                    "busy_s": 0.1, "late_s": 0.0})
    out = io.StringIO()
    view = JobView(str(tmp_path), "j1", out, ranks=False)
    assert view.active and view.done
    view.write("stdout", b"[0]<stdout>:one\n[0]<std")
    view.write("stdout", b"out>:two\n[0]<stdout>:thr")
    view.write("stderr", b"[0]<stderr>:warn\n")
    view.close()
    assert not view.active
    view.close()  # twice: nothing more
    text = out.getvalue()
    lines = [l for l in text.splitlines() if l.startswith("[0]")]
    assert lines == ["[0]<stdout>:one", "[0]<stdout>:two", "[0]<stderr>:warn", "[0]<stdout>:thr"], text
    assert "job j1 · 1/1 ranks on 1 host · step 5" in text                # the last table, left on screen


def test_gpu_requests_follow_the_engines_runtimes():
    from appliance.cluster.docker import gpu_requests

    class FakeClient:  # pure logic: only the engine's runtime list matters
        def __init__(self, runtimes):
            self.runtimes = runtimes

        def info(self):
            return {"Runtimes": self.runtimes}

    plain, nvidia = FakeClient({"runc": {}}), FakeClient({"runc": {}, "nvidia": {}})
    assert gpu_requests(plain, "auto") == [] and gpu_requests(nvidia, "none") == []
    (auto,) = gpu_requests(nvidia, "auto")
    assert auto["Count"] == -1 and auto["Capabilities"] == [["gpu"]]
    (two,) = gpu_requests(plain, "2")  # asked explicitly: passed to the engine, which decides
    assert two["Count"] == 2


def test_a_secondarys_slots_are_a_positive_count():
    assert ClusterConfig.create(environ={}).slots == 1
    assert ClusterConfig.create(environ={}, slots=4).slots == 4
    for bad in (0, -1, 10000):
        with pytest.raises(ConfigError, match="--slots"):
            ClusterConfig.create(environ={}, slots=bad)


def test_a_stopping_secondary_waits_only_for_ranks():
    """What ``appliance secondary --stop`` counts as a rank still running in the container (ps
    lines of a secondary during an elastic job)."""
    from appliance.cluster.secondary import idle_process

    idle = ["/sbin/docker-init -- /usr/local/bin/appliance-entrypoint secondary --port 12345 --slots 1",
            "sshd: /usr/sbin/sshd -D -e -p 12345 [listener] 0 of 200-400 startups",
            "/opt/venv/bin/python -m appliance.cluster.heartbeat --port 12345 --slots 1 --shared /s",
            "sshd: root@notty", "/opt/venv/bin/python -m appliance.launcher.ssh.remote_stub"]
    assert all(idle_process(p) for p in idle)
    assert not idle_process("/opt/venv/bin/python -m train --fresh --step-time 0.2")
    assert not idle_process("python my_script.py")
