"""``appliance primary`` on a user-defined network: simulated hosts are secondary containers
named like hosts; the job is the default training module (``python -m train``) of the image.

Effects asserted: exit codes, the checkpoint and lock files on the shared mount, which host each
rank ran on (``jobs/<id>/ranks/``), the processes left in each container, how long a failure takes.
"""
from __future__ import annotations

import glob
import json
import re
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from fixtures.waits import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture(scope="module")
def two_hosts(shared_cluster):
    shared_cluster.secondary("node2")
    return shared_cluster


def _job_dirs(cluster) -> list[str]:
    return sorted(glob.glob(os.path.join(cluster.shared, "jobs", "*")))


def _workers(cluster, host: str) -> list[str]:
    """Ranks running in a simulated host (the remote stubs beside them are counted by _python)."""
    return [p for p in cluster.processes(host) if " -m train" in p]


def _torch_load(cluster, path: str) -> dict:
    """Load a checkpoint inside the image (the host may lack torch), return its summary."""
    code = ("import json, torch; c = torch.load(%r, weights_only=False); "
            "print(json.dumps({'epoch': c['epoch'], 'size': c['size'], 'accuracy': c['accuracy'], "
            "'keys': sorted(c['model'])}))" % path)
    out = cluster.engine.containers.run(cluster.image, ["/opt/venv/bin/python", "-c", code], remove=True,
                                        volumes={cluster.shared: {"bind": cluster.shared, "mode": "ro"}},
                                        entrypoint=[], network_mode="none")
    return json.loads(out.decode().strip().splitlines()[-1])


def test_training_runs_across_two_containers(two_hosts):
    c = two_hosts
    node2 = c.host("node2")
    res = c.primary("-np", "2", "-H", f"localhost:1,{node2}:1", "--", "python", "-m", "train", "--epochs", "3")
    assert res.returncode == 0, res.stdout[-4000:]
    out = res.stdout.splitlines()
    # Prefixed output, rank 0 prints the epochs; nothing unprefixed from the ranks.
    assert [l for l in out if l.startswith("[0]<stdout>:epoch ")][-1].startswith("[0]<stdout>:epoch 3/3:")
    assert any(l.startswith(f"appliance primary: {node2}: authenticated") for l in out)
    job = _job_dirs(c)[-1]
    ranks = {r: json.load(open(os.path.join(job, "ranks", f"{r}.json"))) for r in (0, 1)}
    assert ranks[1]["host"] == node2 and ranks[1]["hostname"] == node2
    assert ranks[0]["hostname"] != node2
    assert json.load(open(os.path.join(job, "exit.json")))["returncode"] == 0
    assert os.path.getsize(os.path.join(job, "logs", "rank.1", "stderr")) >= 0
    # The launcher's record of the job (docs/observing.md) is in its job directory on the share: both
    # ranks' counters, the end, the picture; and the closing summary line is in the output.
    record = [json.loads(line) for line in open(os.path.join(job, "metrics.jsonl"))]
    assert record[0]["kind"] == "job" and record[0]["size"] == 2
    assert {r["rank"] for r in record if r["kind"] == "rank"} == {0, 1}
    assert record[-1]["kind"] == "end" and record[-1]["returncode"] == 0
    assert os.path.getsize(os.path.join(job, "report.png")) > 0
    assert any(re.search(r": summary: \d+(/\d+)? steps in ", line) for line in out), res.stdout[-2000:]
    # The checkpoint, written by rank 0 into the share atomically, under the run's job lock.
    model = os.path.join(c.shared, "models", "digits")
    ckpt = _torch_load(c, os.path.join(model, "checkpoint.pt"))
    assert ckpt["epoch"] == 3 and ckpt["size"] == 2 and ckpt["accuracy"] > 0.8
    assert sorted(os.listdir(model)) == ["checkpoint.pt", "metrics.json"]  # no temporary left
    assert not os.path.exists(os.path.join(c.shared, "locks", "run-digits.lock"))  # released
    # Nothing left behind: no worker on the secondary, no primary container.
    assert c.job_python("node2") == []
    assert [x.name for x in c.ours()] == [f"appliance-{node2}"]


def test_a_terminal_shows_the_hosts_starting_then_the_jobs_table(two_hosts, require_tool):
    # As a person sees it in a terminal: the start-up table, then the running job's table (drawn
    # on this side from the record on the share: the launcher in the container has no terminal),
    # the job's lines whole above it, its summary at the end and the terminal given back as it was.
    # Steps of 50 ms: the job runs long enough for the record (a row every 2 s) to give rates.
    require_tool("tmux", "a real terminal for the view")
    from fixtures.tmux import Terminal

    c = two_hosts
    node2 = c.host("node2")
    argv = [sys.executable, "-m", "appliance", "primary", "--network", c.network, "-np", "2",
            "-H", f"localhost:1,{node2}:1", "--", "python", "-m", "train", "--epochs", "12", "--step-time", "0.05"]
    with Terminal(160, 50, env=c.env(), cwd=ROOT) as term:
        term.type(shlex.join(argv) + "; echo EXIT=$?")
        term.wait_for(lambda s: "starting 2 ranks on 2 hosts" in s, 60, "the start-up table")
        header = re.compile(r"job \w+ · 2/2 ranks on 2 hosts · step \d+ · [\d.]+ steps/s")
        screen = term.wait_for(lambda s: header.search(s) and re.search(rf"^{re.escape(node2)}\s+1\s+\d+", s, re.M),
                               90, "the job's table with a row for each host")
        assert re.search(r"^host\s+ranks\s+step\s+steps/s", screen, re.M), screen
        term.type("r", enter=False)
        term.wait_for(lambda s: re.search(r"^\s+rank\s+1\s+\d+", s, re.M), 10, "a row per rank after r")
        screen = term.wait_for(lambda s: re.search(r"^EXIT=\d+", s, re.M), 120, "the job's end")
        assert re.search(r"^EXIT=0$", screen, re.M), screen
        history = term.history()
        # Every epoch line whole and in order (the job resumes from this module's earlier checkpoint).
        epochs = [int(l.split(":")[1].split()[1].split("/")[0]) for l in history.splitlines()
                  if re.match(r"^\[0\]<stdout>:epoch \d+/12: loss [\d.]+ accuracy", l)]
        assert epochs and epochs == list(range(epochs[0], 13)), history[-4000:]
        assert re.search(r"summary: \d+ steps in \d+s, [\d.]+ steps/s", history), history[-3000:]
        assert "appliance primary: job " in history.rsplit("summary:", 1)[1]   # the verdict comes last
        term.type("stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?icanon'")
        term.wait_for(lambda s: re.search(r"^icanon$", s, re.M), 5, "the terminal back in canonical mode")


def test_users_train_module_on_the_share_wins_and_horovod_names_work(two_hosts):
    c = two_hosts
    node2 = c.host("node2")
    with open(os.path.join(c.shared, "train.py"), "w") as f:
        f.write("import os, socket, sys, torch\n"
                "import horovod.torch as hvd, appliance.torch\n"
                "assert hvd is appliance.torch\n"
                "hvd.init()\n"
                "total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()\n"
                "open(os.path.join(os.path.dirname(__file__), 'data', 'user.%d' % hvd.rank()), 'w')"
                ".write('%s %s' % (socket.gethostname(), total))\n"
                "hvd.shutdown()\n")
    try:
        res = c.primary("-np", "2", "-H", f"localhost:1,{node2}:1", "--", "python", "-m", "train")
        assert res.returncode == 0, res.stdout[-4000:]
        host1, total1 = open(os.path.join(c.shared, "data", "user.1")).read().split()
        assert host1 == node2 and float(total1) == 3.0
        assert open(os.path.join(c.shared, "data", "user.0")).read().split()[1] == "3.0"
        # horovodrun is `appliance launch` in the image.
        out = c.engine.containers.run(c.image, ["horovodrun", "-np", "2", "-H", "localhost:2", "python", "-c",
                                                "import horovod.torch as h; h.init(); print(h.size())"],
                                      remove=True, entrypoint=[], network_mode="none", shm_size="256m")
        assert sorted(out.decode().split()) == ["[0]<stdout>:2", "[1]<stdout>:2"]
    finally:
        os.unlink(os.path.join(c.shared, "train.py"))


def test_second_job_on_a_run_is_refused_and_ctrl_c_stops_every_host(two_hosts):
    c = two_hosts
    node2 = c.host("node2")
    args = ("-np", "2", "-H", f"localhost:1,{node2}:1", "--", "python", "-m", "train", "--run", "busy",
            "--epochs", "100000")
    lock = os.path.join(c.shared, "locks", "run-busy.lock")
    first = c.start("primary", "--network", c.network, *args)
    wait_for(lambda: os.path.exists(lock) and len(_workers(c, "node2")) == 1, 120, "first job running", first)
    owner = json.load(open(lock))
    second = c.primary(*args, timeout=120)
    assert second.returncode != 0
    refusal = [l for l in second.stdout.splitlines() if "is being written by" in l]
    assert refusal and owner["host"] in refusal[0] and str(owner["pid"]) in refusal[0], second.stdout[-3000:]
    assert len(_workers(c, "node2")) == 1  # the first job was not disturbed

    t0 = time.monotonic()
    first.send_signal(signal.SIGINT)  # what Ctrl-C does
    try:
        out, _ = first.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail("the primary did not stop within 40 s of SIGINT")
    assert first.returncode == 130, out[-3000:]
    assert time.monotonic() - t0 < 30
    assert c.job_python("node2") == []
    assert [x.name for x in c.ours()] == [f"appliance-{node2}"]
    assert not os.path.exists(lock)


def test_killing_a_secondary_stops_the_job_naming_it(two_hosts):
    c = two_hosts
    node2, node3 = c.host("node2"), c.host("node3")
    c.secondary("node3")
    proc = c.start("primary", "--network", c.network, "-np", "3", "-H", f"localhost:1,{node2}:1,{node3}:1",
                   "--", "python", "-m", "train", "--run", "killed", "--epochs", "100000", "--batch-size", "96")
    wait_for(lambda: len(_workers(c, "node3")) == 1 and len(_workers(c, "node2")) == 1, 120, "job running", proc)
    time.sleep(2)  # well into training
    t0 = time.monotonic()
    c.container("node3").kill()
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the primary did not exit within 30 s of the secondary's death")
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0 and elapsed < 30
    failure = [l for l in out.splitlines() if l.startswith("appliance launch:")]
    assert failure and node3 in failure[-1], out[-3000:]
    assert c.job_python("node2") == []
    assert not [x for x in c.ours() if x.labels.get("appliance.role") == "primary"]


def test_a_secondary_that_is_not_up_is_one_line_saying_what_to_run(two_hosts):
    c = two_hosts
    res = c.primary("-np", "2", "-H", f"localhost:1,{c.host('ghost')}:1", "--", "python", "-m", "train",
                    timeout=60, APPLIANCE_SECONDARY_WAIT="1")
    assert res.returncode == 1
    lines = [l for l in res.stdout.splitlines() if c.host("ghost") in l and "is not up" in l]
    assert len(lines) == 1 and f"appliance secondary --ssh-port 12345 --shared {c.shared}" in lines[0], res.stdout
    assert "--name " + c.host("ghost") in lines[0]
