"""``appliance status`` on a real, messy share: the CLI run as a process (no Docker engine reachable:
its one error line aside, the share's tables still print) against ``SHARED/jobs/<id>/live.json``
files that a crashed launcher, a damaged share or another user leave.

What is asserted, per case: the bad job is skipped with one line naming its file and the cause
(never a traceback, never a wait: a FIFO is not opened blocking), and the rest of the command
still prints: the secondaries' line and a good job beside it; an unreadable ``jobs/`` is said as
such, not as "no job running". The permission cases run the CLI without
CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH when the tests run as root (``fixtures.privileges``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import ROOT
from fixtures.privileges import without_dac

pytestmark = pytest.mark.timeout(120)


def live(**over) -> dict:
    now = time.time()
    return {"job": "j1", "hosts": ["localhost"], "ranks": 2, "reporting": 2, "step": 5, "total_steps": None,
            "steps_per_s": 1.0, "started": now - 10.3, "updated": now, "ended": None, "returncode": None,
            "pid": 1, **over}


def status(share: Path, prefix: list[str] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DOCKER_HOST": f"unix://{share}/no-docker.sock"}
    return subprocess.run([*prefix, sys.executable, "-m", "appliance", "status", "--shared", str(share)], env=env,
                          capture_output=True, text=True, timeout=30)


def _ours(stderr: str) -> list[str]:
    """stderr without the Docker engine's line (no engine here)."""
    return [line for line in stderr.splitlines() if "Docker engine" not in line]


def _write(path: Path, data) -> None:
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())


def _job_row(out: str, job: str) -> list[str]:
    line = next((line for line in out.splitlines() if re.match(rf"\W*{job}\s*│", line)), "")
    return [cell.strip() for cell in line.strip("│ \n").split("│")]


@pytest.fixture
def share(tmp_path):
    """A share with a good running job, ``good`` (the rest of the output must still show it)."""
    (tmp_path / "jobs" / "good").mkdir(parents=True)
    _write(tmp_path / "jobs" / "good" / "live.json", live(job="good", hosts=["a", "b"], ranks=4, reporting=4))
    (tmp_path / "jobs" / "j1").mkdir()
    return tmp_path


# id: (what j1/live.json is, the reason said (None: j1 is listed))
CASES = {
    "s01 clean": (lambda p: _write(p, live()), None),
    "s02 updated a string": (lambda p: _write(p, live(updated="abc")),
                             "'updated' must be a finite number, got \"abc\""),
    "s03 hosts a number": (lambda p: _write(p, live(hosts=5)), "'hosts' must be a list of host names, got 5"),
    "s04 ranks a word": (lambda p: _write(p, live(ranks="two")), "'ranks' must be a whole number from 0, got \"two\""),
    "s05 step and steps_per_s strings": (lambda p: _write(p, live(step="x", steps_per_s="fast")),
                                         "'step' must be a finite number, got \"x\""),
    "s06 binary junk": (lambda p: _write(p, bytes(range(256)) * 12), "not UTF-8 text"),
    "s07 a directory": (lambda p: p.mkdir(), "not a regular file"),
    "s08 a JSON list": (lambda p: _write(p, [1, 2]), "not a JSON object but list"),
    "s09 a FIFO": (lambda p: os.mkfifo(p), "not a regular file"),
    "ranks a boolean": (lambda p: _write(p, live(ranks=True)), "'ranks' must be a whole number from 0, got true"),
    "updated NaN": (lambda p: p.write_text(json.dumps(live()).replace('"updated": ', '"updated": NaN, "x": ')),
                    "'updated' must be a finite number, got NaN"),
    "not JSON": (lambda p: p.write_text("{"), "not JSON (JSONDecodeError)"),
    "a symlink loop": (lambda p: p.symlink_to(p.name), "Too many levels of symbolic links"),
    "a job name of rich markup": (None, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_status_skips_a_bad_job_with_one_line_and_prints_the_rest(share, case):
    make, why = CASES[case]
    job = "j1"
    if make is None:  # a job id that rich would read as markup is printed as it is
        job = "[bold]x"
        (share / "jobs" / job).mkdir()
        _write(share / "jobs" / job / "live.json", live(job=job, hosts=["[red]h"]))
    else:
        make(share / "jobs" / "j1" / "live.json")
    t0 = time.monotonic()
    r = status(share)
    assert time.monotonic() - t0 < 20
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and len(r.stderr.splitlines()) - len(_ours(r.stderr)) == 1, r.stderr  # Docker's line
    assert f"no secondary registered on {share}" in r.stdout, r.stdout
    assert _job_row(r.stdout, "good")[:3] == ["good", "a, b", "4"], r.stdout
    if why is None:
        assert _ours(r.stderr) == [], r.stderr
        row = _job_row(r.stdout, re.escape(job))
        assert row[0] == job and row[2:5] == ["2", "5", "1.00"], r.stdout
        if make is None:
            assert row[1] == "[red]h", r.stdout
    else:
        assert _ours(r.stderr) == [f"appliance status: skipped {share}/jobs/j1/live.json: {why}"], r.stderr
        assert _job_row(r.stdout, "j1") == [""], r.stdout


def test_status_of_a_share_without_jobs_or_with_a_file_for_jobs(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    r = status(share)                                                       # no jobs/ at all
    assert _ours(r.stderr) == [] and f"no job running on {share}" in r.stdout, (r.stdout, r.stderr)
    (share / "jobs").write_text("")                                         # s13: jobs/ is a file
    r = status(share)
    assert _ours(r.stderr) == [] and "Traceback" not in r.stderr, r.stderr
    assert f"jobs on {share}: not known (cannot read {share}/jobs: Not a directory)" in r.stdout, r.stdout
    (share / "jobs").unlink()                               # beside a job: a file, a loop, a broken link
    (share / "jobs" / "j1").mkdir(parents=True)
    _write(share / "jobs" / "j1" / "live.json", live())
    (share / "jobs" / "afile").write_text("")
    (share / "jobs" / "loop").symlink_to("loop")
    (share / "jobs" / "broken").symlink_to(tmp_path / "nowhere")
    r = status(share)
    assert _ours(r.stderr) == [] and _job_row(r.stdout, "j1")[:3] == ["j1", "localhost", "2"], (r.stdout, r.stderr)
    r = status(tmp_path / "missing")                                        # s10
    assert r.returncode == 2 and r.stderr.strip() == f"appliance status: error: --shared {tmp_path}/missing: " \
                                                      "no such directory", r.stderr


# id: (what gets mode 000, the stdout line, the stderr line)
PERMISSIONS = {
    "s11 jobs/ 000": ("jobs", "jobs on {share}: not known (cannot read {share}/jobs: Permission denied)", None),
    "s12 live.json 000": ("jobs/j1/live.json", None,
                          "appliance status: skipped {share}/jobs/j1/live.json: Permission denied"),
    "a job directory 000": ("jobs/j1", None, "appliance status: skipped {share}/jobs/j1/live.json: Permission denied"),
}


@pytest.mark.parametrize("case", list(PERMISSIONS))
def test_status_without_permission(share, case):
    what, out, err = PERMISSIONS[case]
    prefix = without_dac()
    _write(share / "jobs" / "j1" / "live.json", live())
    os.chmod(share / what, 0o000)
    try:
        r = status(share, prefix=prefix)
    finally:
        os.chmod(share / what, 0o755)
    assert "Traceback" not in r.stderr, r.stderr
    assert f"no secondary registered on {share}" in r.stdout, r.stdout
    assert f"no job running on {share}" not in r.stdout, r.stdout
    if out:
        assert out.format(share=share) in r.stdout.splitlines(), r.stdout
    if err:
        assert _ours(r.stderr) == [err.format(share=share)], r.stderr
        assert _job_row(r.stdout, "good")[:3] == ["good", "a, b", "4"], r.stdout
