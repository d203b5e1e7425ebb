"""``srun python script.py`` with no launcher, on a real two-node Slurm (``tests/fixtures/slurmcluster.py``).

Each task runs ``tests/ranks/slurm_direct.py``: ``hvd.init()`` takes its layout from Slurm, meets the others
at the store rank 0 hosts on the step's first node (the port derived from the job and step ids)
with the job's secret file that ``appliance secret`` made inside the allocation, runs one
allreduce and writes a JSON report. Checked: ranks, local and cross ranks on the two named nodes
(even ``2(x2)``, uneven ``2,1``, cyclic), the allreduce; without a secret every task fails with the one
line and srun ends promptly; a taken derived port is named (node, port, the override) and the
override works. HOME is a per-test directory, so the secret files live there.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from fixtures import RANKS

WORKER = RANKS / "slurm_direct.py"
PY = sys.executable
EVEN = ["-N2", "--ntasks-per-node=2"]  # 2(x2): without it Slurm may pack 3+1 onto the 4-CPU nodes

pytestmark = pytest.mark.slurm


def reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank.*.json"), key=lambda p: int(p.name.split(".")[1]))]


def salloc(slurm, tmp_path, layout, script, *, timeout=90, env=None):
    """``salloc LAYOUT... sh -c script`` (the script runs with the allocation's variables)."""
    return slurm.run(["salloc", *layout, "--quiet", "sh", "-c", script], timeout=timeout,
                     env={"HOME": str(tmp_path), "PY": PY, "WORKER": str(WORKER), **(env or {})})


def check_layout(rs, expected):
    """``expected``: per rank (node, local_rank, local_size, cross_rank, cross_size)."""
    size = len(expected)
    assert [r["rank"] for r in rs] == list(range(size))
    for r, (node, lr, ls, cr, cs) in zip(rs, expected):
        assert r["hostname"] == node == r["slurm"]["SLURMD_NODENAME"], r
        assert (r["rank"], r["local_rank"]) == (int(r["slurm"]["SLURM_PROCID"]), int(r["slurm"]["SLURM_LOCALID"])), r
        assert (r["size"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) == (size, lr, ls, cr, cs), r
        assert r["sum"] == [size * (size + 1) / 2] * 7


def test_srun_n4_on_two_nodes_through_hvd_init(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    start = time.monotonic()
    r = salloc(slurm, tmp_path, EVEN, '"$PY" -m appliance secret >/dev/null && '
               'srun --kill-on-bad-exit=1 -N2 -n4 "$PY" "$WORKER" "$OUT"', env={"OUT": str(out)})
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stdout + r.stderr
    rs = reports(out)
    check_layout(rs, [("node1", 0, 2, 0, 2), ("node1", 1, 2, 0, 2), ("node2", 0, 2, 1, 2), ("node2", 1, 2, 1, 2)])
    assert len({x["slurm"]["SLURM_JOB_ID"] for x in rs}) == 1
    secret = list((tmp_path / ".appliance" / "slurm").glob("job-*.secret"))
    assert [p.name for p in secret] == [f"job-{rs[0]['slurm']['SLURM_JOB_ID']}.secret"]
    assert secret[0].stat().st_mode & 0o777 == 0o600
    print(f"salloc + secret + srun -N2 -n4 to exit: {elapsed:.2f} s; init->first allreduce "
          f"{max(x['t_first_allreduce'] for x in rs) - min(x['t_start'] for x in rs):.2f} s after the first task started")


def test_uneven_tasks_per_node(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = salloc(slurm, tmp_path, ["-N2", "-n3"], '"$PY" -m appliance secret >/dev/null && '
               'srun --kill-on-bad-exit=1 -N2 -n3 "$PY" "$WORKER" "$OUT"', env={"OUT": str(out)})
    assert r.returncode == 0, r.stdout + r.stderr
    check_layout(reports(out), [("node1", 0, 2, 0, 2), ("node1", 1, 2, 0, 1), ("node2", 0, 1, 1, 2)])


def test_cyclic_distribution(slurm, tmp_path):
    """Ranks dealt round-robin over the nodes: the runtime's local and cross ranks still follow Slurm's."""
    out = tmp_path / "out"
    out.mkdir()
    r = salloc(slurm, tmp_path, EVEN, '"$PY" -m appliance secret >/dev/null && '
               'srun --kill-on-bad-exit=1 -m cyclic -n4 "$PY" "$WORKER" "$OUT"', env={"OUT": str(out)})
    assert r.returncode == 0, r.stdout + r.stderr
    check_layout(reports(out), [("node1", 0, 2, 0, 2), ("node2", 0, 2, 1, 2), ("node1", 1, 2, 0, 2), ("node2", 1, 2, 1, 2)])


def test_two_steps_of_one_job_each_meet_on_their_own_port(slurm, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    r = salloc(slurm, tmp_path, EVEN, '"$PY" -m appliance secret >/dev/null && '
               'srun --kill-on-bad-exit=1 -n4 "$PY" "$WORKER" "$A" && '
               'srun --kill-on-bad-exit=1 -n2 "$PY" "$WORKER" "$B"', env={"A": str(a), "B": str(b)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert [x["slurm"]["SLURM_STEP_ID"] for x in reports(a)] == ["0"] * 4
    assert [x["slurm"]["SLURM_STEP_ID"] for x in reports(b)] == ["1"] * 2


def test_without_a_secret_every_task_fails_with_one_line_and_srun_ends(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    start = time.monotonic()
    r = salloc(slurm, tmp_path, EVEN, 'srun --label -N2 -n4 "$PY" "$WORKER" "$OUT"', env={"OUT": str(out)}, timeout=60)
    elapsed = time.monotonic() - start
    assert r.returncode != 0
    assert not list(out.iterdir())
    lines = [line for line in (r.stdout + r.stderr).splitlines() if "no job secret" in line]
    assert sorted(int(line.split(":")[0]) for line in lines) == [0, 1, 2, 3], r.stdout + r.stderr
    for line in lines:
        assert "appliance secret" in line and "APPLIANCE_JOB_SECRET=" in line
    assert elapsed < 30, elapsed


def test_a_taken_store_port_is_named_and_the_override_works(slurm, tmp_path):
    """Something else listens on the step's derived port: rank 0 says node, port and how to choose
    another; the next step with APPLIANCE_STORE_ADDR runs."""
    out = tmp_path / "out"
    out.mkdir()
    occupy = ("import socket, sys, time\n"
              "from appliance.common.slurm import store_port\n"
              "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              "port = store_port(int(sys.argv[1]), 0)\n"
              "s.bind(('127.0.0.1', port)); s.listen()\n"
              "open(sys.argv[2], 'w').write(str(port)); time.sleep(60)\n")
    (tmp_path / "occupy.py").write_text(occupy)
    script = ('"$PY" -m appliance secret >/dev/null && '
              '"$PY" "$HOME/occupy.py" "$SLURM_JOB_ID" "$HOME/port" & occupier=$!; '
              'while [ ! -s "$HOME/port" ]; do sleep 0.05; done; '
              't0=$(date +%s%N); HOROVOD_START_TIMEOUT=20 srun --label --kill-on-bad-exit=1 -N2 -n4 "$PY" "$WORKER" "$OUT"; '
              'echo "first=$? after $(( ($(date +%s%N) - t0) / 1000000 )) ms"; '
              'APPLIANCE_STORE_ADDR=node1:$(( $(cat "$HOME/port") + 1 )) '
              'srun --kill-on-bad-exit=1 -N2 -n4 "$PY" "$WORKER" "$OUT"; echo "second=$?"; kill $occupier')
    start = time.monotonic()
    r = salloc(slurm, tmp_path, EVEN, script, env={"OUT": str(out)})
    text = r.stdout + r.stderr
    port = int((tmp_path / "port").read_text())
    first = int(re.search(r"first=(\d+)", text).group(1))
    assert first != 0, text
    assert re.search(rf"^0: .*port {port} on node1 is already in use .*APPLIANCE_STORE_ADDR=node1:PORT", text, re.M), text
    assert int(re.search(r"second=(\d+)", text).group(1)) == 0, text
    assert len(reports(out)) == 4
    print(re.search(r"first=.*", text).group(0))
    assert time.monotonic() - start < 30
