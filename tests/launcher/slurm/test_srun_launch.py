"""``appliance launch`` inside a real Slurm allocation: ranks started by one srun step.

Every test runs ``salloc ... -- appliance launch ...`` in the module's two-node cluster
(``tests/fixtures/slurm.py``) with a rank program (``tests/ranks/slurm_layout.py``) that joins the
job, runs a real allreduce and reports its layout, environment and timings. Effects checked: the
node each rank ran on (its hostname, which only a task started by slurmd on that node has), the
layout the runtime reports, the contract variables, exit codes, the summary naming rank and node,
output files, and that no process of the job is left in the cluster afterwards. Each test bounds
its own time.

Measurements (printed with ``-s``, lines starting ``MEASURE``): launch to the first collective,
and the fault times (SIGKILL of a rank -> survivors' error and launcher exit; scancel -> exit).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fixtures

ROOT = Path(os.environ.get("APPLIANCE_SLURM_TEST_ROOT") or fixtures.ROOT)
LAYOUT = fixtures.RANKS / "slurm_layout.py"
PY = sys.executable

pytestmark = pytest.mark.slurm


class Launch:
    """One ``salloc SALLOC -- appliance launch ARGS -- slurm_layout.py MODE OUT`` in the cluster."""

    def __init__(self, slurm, tmp_path: Path, salloc: list[str], args: list[str], mode: str = "once",
                 env: dict | None = None):
        self.slurm, self.out, self.home = slurm, tmp_path / "out", tmp_path / "home"
        self.out.mkdir()
        self.home.mkdir()
        self.pidfile = tmp_path / "launcher.pid"
        script = 'echo $$ > "$0"; date +%s.%N > "$0.t0"; exec "$@"'
        argv = ["salloc", *salloc, "--", "sh", "-c", script, str(self.pidfile),
                PY, "-m", "appliance", "launch", *args, "--", PY, str(LAYOUT), mode, str(self.out)]
        full_env = {"HOME": str(self.home), "PYTHONPATH": str(ROOT), **(env or {})}
        self.t0 = time.time()
        self.proc = slurm.popen(argv, env=full_env, cwd=str(ROOT), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.stdout = self.stderr = ""

    @property
    def launcher_pid(self) -> int:
        return int(self.pidfile.read_text())

    @property
    def launcher_t0(self) -> float:
        return float(Path(f"{self.pidfile}.t0").read_text())

    def wait(self, timeout: float = 60) -> int:
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launch did not end within {timeout} s:\n{self.stderr[-3000:]}")
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.stdout, self.stderr = self.proc.communicate(timeout=10)

    def wait_ready(self, n: int, timeout: float = 40) -> None:
        end = time.monotonic() + timeout
        while not all((self.out / f"ready.{r}").exists() for r in range(n)):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.kill()
                pytest.fail(f"ranks not ready (rc={self.proc.returncode}):\n{self.stderr[-3000:]}")
            time.sleep(0.02)

    def report(self, rank: int) -> dict:
        return json.loads((self.out / f"rank{rank}.json").read_text())

    def step_dirs(self) -> list[str]:
        d = self.home / ".appliance" / "slurm"
        return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.fixture
def launches(slurm, tmp_path):
    started: list[Launch] = []

    def start(*a, **kw) -> Launch:
        sub = tmp_path / f"launch{len(started)}"
        sub.mkdir()
        started.append(Launch(slurm, sub, *a, **kw))
        return started[-1]

    yield start
    for launch in started:
        launch.kill()


def layout(launch: Launch, n: int) -> list[tuple]:
    return [tuple(launch.report(r)[k] for k in ("node", "rank", "size", "local_rank", "local_size", "cross_rank",
                                                  "cross_size")) for r in range(n)]


def test_srun_launch_places_four_ranks_on_two_named_nodes(launches, tmp_path):
    files = tmp_path / "files"
    launch = launches(["-N2", "--ntasks-per-node=2"], ["-np", "4", "--output-filename", str(files)])
    assert launch.wait(60) == 0, launch.stderr[-4000:]
    assert layout(launch, 4) == [("node1", 0, 4, 0, 2, 0, 2), ("node1", 1, 4, 1, 2, 0, 2),
                                 ("node2", 2, 4, 0, 2, 1, 2), ("node2", 3, 4, 1, 2, 1, 2)]
    reports = [launch.report(r) for r in range(4)]
    assert {r["sum"] for r in reports} == {10.0}  # a real allreduce across both nodes
    for r, rep in enumerate(reports):
        env = rep["env"]
        assert env["HOROVOD_HOSTNAME"] == rep["node"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
            str(r), "4", str(r % 2), "2")
        assert env["APPLIANCE_STORE_ADDR"].startswith("127.0.0.2:")  # node1: rank 0's node
        assert env["APPLIANCE_DATA_ADDR"] == ("127.0.0.2" if r < 2 else "127.0.0.3")
        assert env["MASTER_ADDR"] == "127.0.0.2" and env["MASTER_PORT"] != env["APPLIANCE_STORE_ADDR"].split(":")[1]
        assert env["APPLIANCE_FAULT_FILE"].endswith(f"/rank.{r}.json")
        assert env["APPLIANCE_FAULT_FILE"].startswith(str(launch.home / ".appliance" / "slurm"))
        assert "SLURM_HOSTFILE" not in env and rep["secret_len"] == 32
    assert len({rep["env"]["APPLIANCE_JOB_ID"] for rep in reports}) == 1
    assert len({rep["env"]["APPLIANCE_STORE_ADDR"] for rep in reports}) == 1
    for r in range(4):  # rank-prefixed output and per-rank files, as with every launcher
        node = "node1" if r < 2 else "node2"
        assert f"[{r}]<stdout>:layout {r} {node}\n" in launch.stdout
        assert (files / f"rank.{r}" / "stdout").read_text() == f"layout {r} {node}\n"
    assert launch.step_dirs() == []  # the step's directory is removed
    first = max(rep["t_first"] for rep in reports)
    print(f"\nMEASURE srun launch: launcher start -> every rank past its first allreduce "
          f"{first - launch.launcher_t0:.3f} s (salloc + launch: {first - launch.t0:.3f} s)")


def test_hostlist_ranges_and_uneven_tasks_per_node(launches):
    launch = launches(["-N2", "-n3"], ["-np", "3"])
    assert launch.wait(60) == 0, launch.stderr[-4000:]
    env = launch.report(0)["env"]
    assert env["SLURM_JOB_NODELIST"] == "node[1-2]" and env["SLURM_TASKS_PER_NODE"] == "2,1"
    assert layout(launch, 3) == [("node1", 0, 3, 0, 2, 0, 2), ("node1", 1, 3, 1, 2, 0, 1),
                                 ("node2", 2, 3, 0, 1, 1, 2)]
    assert {launch.report(r)["sum"] for r in range(3)} == {6.0}


def test_fewer_ranks_than_the_allocation_fill_the_first_node(launches):
    launch = launches(["-N2", "--ntasks-per-node=2"], ["-np", "3"])
    assert launch.wait(60) == 0, launch.stderr[-4000:]
    assert [row[0] for row in layout(launch, 3)] == ["node1", "node1", "node2"]


def test_sigkilled_task_is_named_on_every_survivor_and_in_the_summary(launches, slurm):
    launch = launches(["-N2", "--ntasks-per-node=2"], ["-np", "4"], mode="train")
    launch.wait_ready(4)
    victim = launch.report(2)["pid"]
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    assert launch.wait(30) == 128 + signal.SIGKILL, launch.stderr[-4000:]
    ended = time.time()
    summary = [line for line in launch.stderr.splitlines() if line.startswith("appliance launch: ")]
    assert summary and re.search(r"rank 2 \(host node2\) was killed by signal 9", summary[-1]), launch.stderr[-3000:]
    seen = {}
    for r in (0, 1, 3):
        err = launch.out / f"error.{r}"
        assert err.exists(), f"rank {r} did not get the runtime's error:\n{launch.stderr[-3000:]}"
        assert "rank 2" in err.read_text()
        seen[r] = err.stat().st_mtime - killed
    assert slurm.wait_no_strays(5) == {}
    assert launch.step_dirs() == []
    print(f"\nMEASURE SIGKILL of rank 2: survivors' error after {max(seen.values()):.3f} s, "
          f"launcher exit after {ended - killed:.3f} s")
    assert ended - killed < 10


def test_scancel_mid_training_ends_the_launcher_with_no_leftovers(launches, slurm):
    launch = launches(["-N2", "--ntasks-per-node=2"], ["-np", "4"], mode="train")
    launch.wait_ready(4)
    job = launch.report(0)["env"]["SLURM_JOB_ID"]
    cancelled = time.time()
    r = slurm.run(["scancel", job], timeout=10)
    assert r.returncode == 0, r.stderr
    rc = launch.wait(30)
    ended = time.time()
    assert rc != 0
    assert re.search(r"appliance launch: rank \d \(host node\d\) .*Slurm cancelled the (step|job) \(scancel\)",
                     launch.stderr), launch.stderr[-3000:]
    assert slurm.wait_no_strays(5) == {}
    assert launch.step_dirs() == []
    print(f"\nMEASURE scancel of the job: launcher (and salloc) exit after {ended - cancelled:.3f} s (rc {rc})")
    assert ended - cancelled < 10


def test_ctrl_c_to_the_launcher_stops_every_rank(launches, slurm):
    launch = launches(["-N2", "--ntasks-per-node=2"], ["-np", "4"], mode="train")
    launch.wait_ready(4)
    sent = time.time()
    os.kill(launch.launcher_pid, signal.SIGINT)
    assert launch.wait(30) == 130, launch.stderr[-3000:]
    ended = time.time()
    assert "interrupted by SIGINT" in launch.stderr
    assert slurm.wait_no_strays(5) == {}
    assert launch.step_dirs() == []
    print(f"\nMEASURE SIGINT to the launcher: exit after {ended - sent:.3f} s")
    assert ended - sent < 10


def test_a_failing_rank_is_named_with_its_code(launches):
    launch = launches(["-N2", "--ntasks-per-node=2"], ["-np", "4", "-x", "LAYOUT_FAIL_RANK=3"], mode="fail")
    assert launch.wait(60) == 3, launch.stderr[-3000:]
    assert re.search(r"appliance launch: rank 3 \(host node2\) exited with code 3", launch.stderr), launch.stderr


def test_a_missing_command_is_reported_as_such(slurm, tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    r = slurm.run(["salloc", "-N2", "--ntasks-per-node=1", "--", PY, "-m", "appliance", "launch", "-np", "2", "--",
                   "/nonexistent/program"], env={"HOME": str(home), "PYTHONPATH": str(ROOT)}, cwd=str(ROOT), timeout=60)
    assert r.returncode == 127, r.stderr
    assert "could not start: command not found: '/nonexistent/program'" in r.stderr
    assert not any((home / ".appliance" / "slurm").iterdir())


def test_launcher_ssh_inside_an_allocation_runs_ranks_here(launches):
    # node1/node2 are addresses of this machine, so the ssh launcher needs no sshd: it merges them
    # into one host and starts the ranks as its own subprocesses (not on the nodes).
    launch = launches(["-N2", "--ntasks-per-node=2"], ["-np", "4", "--launcher", "ssh"])
    assert launch.wait(60) == 0, launch.stderr[-3000:]
    assert {launch.report(r)["node"] for r in range(4)} - {"node1", "node2"}
    assert {launch.report(r)["sum"] for r in range(4)} == {10.0}
    reports = [launch.report(r) for r in range(4)]
    first = max(rep["t_first"] for rep in reports)
    print(f"\nMEASURE --launcher ssh (local spawn: the nodes are this machine): launcher start -> every rank "
          f"past its first allreduce {first - launch.launcher_t0:.3f} s")


def test_launcher_local_inside_an_allocation_ignores_it(launches):
    launch = launches(["-N2", "--ntasks-per-node=1"], ["-np", "3", "--launcher", "local"])
    assert launch.wait(60) == 0, launch.stderr[-3000:]
    assert layout(launch, 3)[2][1:] == (2, 3, 2, 3, 0, 1)  # localhost:3, though the allocation has 2 slots
    assert {launch.report(r)["node"] for r in range(3)}.isdisjoint({"node1", "node2"})


def test_horovodrun_inside_an_allocation_uses_srun(slurm, tmp_path):
    # the command a Horovod user types in an allocation: the console script installed with the package
    out, home = tmp_path / "out", tmp_path / "home"
    out.mkdir()
    home.mkdir()
    horovodrun = os.path.join(os.path.dirname(PY), "horovodrun")
    r = slurm.run(["salloc", "-N2", "--ntasks-per-node=1", "--", horovodrun,
                   "-np", "2", PY, str(LAYOUT), "once", str(out)],
                  env={"HOME": str(home), "PYTHONPATH": str(ROOT)}, cwd=str(ROOT), timeout=60)
    assert r.returncode == 0, r.stderr
    nodes = [json.loads((out / f"rank{k}.json").read_text())["node"] for k in range(2)]
    assert nodes == ["node1", "node2"]


def test_sbatch_script_launches_on_the_allocation(slurm, tmp_path):
    out, home = tmp_path / "out", tmp_path / "home"
    out.mkdir()
    home.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nexec {PY} -m appliance launch -np 4 -- {PY} {LAYOUT} once {out}\n")
    r = slurm.run(["sbatch", "--wait", "-N2", "--ntasks-per-node=2", "-o", str(tmp_path / "slurm.out"), str(script)],
                  env={"HOME": str(home), "PYTHONPATH": str(ROOT)}, cwd=str(ROOT), timeout=90)
    text = (tmp_path / "slurm.out").read_text() if (tmp_path / "slurm.out").exists() else ""
    assert r.returncode == 0, r.stderr + text
    assert [json.loads((out / f"rank{k}.json").read_text())["node"] for k in range(4)] == ["node1", "node1",
                                                                                           "node2", "node2"]
    assert "[3]<stdout>:layout 3 node2" in text


def test_a_killed_launcher_leaves_nothing_behind(launches, slurm):
    launch = launches(["-N2", "--ntasks-per-node=2"], ["-np", "4"], mode="train")
    launch.wait_ready(4)
    killed = time.time()
    os.kill(launch.launcher_pid, signal.SIGKILL)
    launch.wait(30)
    assert slurm.wait_no_strays(10) == {}
    print(f"\nMEASURE SIGKILL of the launcher: salloc and every task gone after {time.time() - killed:.3f} s")


@pytest.mark.parametrize("launcher, hosts, in_allocation, expected", [
    ("auto", None, True, "srun"), ("auto", "localhost:2", True, "ssh"), ("auto", None, False, "ssh"),
    ("ssh", None, True, "ssh"), ("local", None, True, "local"), ("srun", None, True, "srun")])
def test_which_launcher(launcher, hosts, in_allocation, expected):
    from appliance.launcher.config import LaunchConfig
    from appliance.launcher.slurm.step import launcher_of

    environ = {"PATH": os.environ.get("PATH", ""), "APPLIANCE_LAUNCHER": launcher}
    if in_allocation:
        environ.update(SLURM_JOB_ID="7", SLURM_JOB_NODELIST="n[1-2]", SLURM_TASKS_PER_NODE="2(x2)")
    config = LaunchConfig.create(["true"], 2, hosts=hosts, environ=environ)
    assert launcher_of(config) == expected


def test_launcher_srun_with_hosts_is_refused():
    from appliance.common.knobs import ConfigError
    from appliance.launcher.config import LaunchConfig
    from appliance.launcher.slurm.step import launcher_of

    environ = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    with pytest.raises(ConfigError, match="leave out -H"):
        launcher_of(LaunchConfig.create(["true"], 2, hosts="n1:2", environ=environ, launcher="srun"))
    with pytest.raises(ConfigError, match="--launcher"):
        LaunchConfig.create(["true"], 2, environ=environ, launcher="mpirun")


def test_launcher_srun_outside_an_allocation_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run([PY, "-m", "appliance", "launch", "-np", "1", "--launcher", "srun", "--", "true"],
                       env={**env, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "needs a Slurm allocation" in r.stderr


def _task_env(tmp_path: Path, rank: int, node: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=str(ROOT), SLURM_JOB_ID="5", SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_NTASKS="2",
               SLURM_LOCALID="0", SLURM_NODEID=str(rank), SLURMD_NODENAME=node, SLURM_STEP_NODELIST="n[1-2]",
               SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_HOSTFILE=str(tmp_path / "hostfile"),
               APPLIANCE_JOB_ID="j1", APPLIANCE_JOB_SECRET="ab" * 16, HOROVOD_START_TIMEOUT="5.0")
    return env


def test_task_wrapper_gives_the_rank_contract_and_records_its_exit(tmp_path):
    (tmp_path / "hostfile").write_text("n1\nn2\n")
    (tmp_path / "rendezvous.json").write_text(json.dumps({"store_addr": "10.0.0.1:2000", "master_addr": "10.0.0.1",
                                                          "master_port": 2001}))
    r = subprocess.run([PY, "-m", "appliance.launcher.slurm.task", str(tmp_path), "0", "--", PY, "-c",
                        "import json, os; print(json.dumps(dict(os.environ))); raise SystemExit(7)"],
                       env=_task_env(tmp_path, 1, "n2"), capture_output=True, text=True, timeout=30, cwd=str(ROOT))
    assert r.returncode == 7, r.stderr
    env = json.loads(r.stdout)
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"], env["HOROVOD_CROSS_RANK"],
            env["HOROVOD_CROSS_SIZE"], env["HOROVOD_HOSTNAME"]) == ("1", "2", "0", "1", "2", "n2")
    assert (env["APPLIANCE_STORE_ADDR"], env["MASTER_PORT"], env["APPLIANCE_JOB_ID"]) == ("10.0.0.1:2000", "2001", "j1")
    assert env["APPLIANCE_FAULT_FILE"] == str(tmp_path / "rank.1.json") and "SLURM_HOSTFILE" not in env
    record = json.loads((tmp_path / "exit.1.json").read_text())
    assert (record["rank"], record["host"], record["returncode"]) == (1, "n2", 7)
    assert json.loads((tmp_path / "start.1.json").read_text())["step"] == "5.0"


def test_task_wrapper_refuses_a_node_other_than_the_layouts(tmp_path):
    (tmp_path / "hostfile").write_text("n1\nn1\n")
    r = subprocess.run([PY, "-m", "appliance.launcher.slurm.task", str(tmp_path), "0", "--", "true"],
                       env=_task_env(tmp_path, 1, "n2"), capture_output=True, text=True, timeout=30, cwd=str(ROOT))
    assert r.returncode == 2
    assert "placed rank 1 on n2, the launcher's layout on n1" in r.stderr
    assert json.loads((tmp_path / "exit.1.json").read_text())["returncode"] == 2
    r = subprocess.run([PY, "-m", "appliance.launcher.slurm.task", str(tmp_path), "0", "--", "true"],
                       env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
                       capture_output=True, text=True, timeout=30, cwd=str(ROOT))
    assert r.returncode == 2 and "not a Slurm task" in r.stderr
