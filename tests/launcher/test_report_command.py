"""``appliance report`` on a real, messy share: the CLI run as a process against a job's record
(``SHARED/jobs/<id>/metrics.jsonl``) damaged in every way a share, a killed launcher or another
user leaves it, and the report.png it draws.

What is asserted, per case: the exit status, the one line that names the file and the cause
(never a traceback), no wait (a FIFO, ``/dev/zero``), nothing left behind beside the picture or the
``-o`` directory; a row of the wrong types is skipped and counted, not fatal; ``-o`` is the way
out of a job directory that cannot be written. The permission cases run the CLI without
CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH when the tests run as root (``fixtures.privileges``). The
picture: ticks on the rank heatmap are whole ranks (the ranks that reported, gaps included), and a
host whose line lies exactly under another's still shows in the pixels.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import ROOT
from fixtures.privileges import without_dac

pytestmark = pytest.mark.timeout(120)

T0 = 1_700_000_000.0


def rank_row(rank: int, host: str, sec: float, step_s: float = 0.1, late: float = 0.0) -> dict:
    steps = int(sec / step_s)
    return {"kind": "rank", "rank": rank, "host": host, "t": T0 + sec, "step": steps, "samples": steps * 16,
            "busy_s": sec * 0.2, "wall_s": sec, "wait_s": 0.0, "late_s": late * steps,
            "ops": {"allreduce": [steps, steps * 1e6, sec * 0.1]}, "rss": 1 << 28, "gpu_util": None,
            "gpu_mem": None, "round": 0, "total_steps": None}


def write_record(job_dir: Path, ranks=((0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")),
                 seconds: int = 60, slow: int | None = None, end: bool = True) -> None:
    """A clean record of a 60 s job: every rank at 10 steps/s, a row per rank every 2 s."""
    job_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"kind": "job", "job": job_dir.name, "size": len(ranks), "t": T0}]
    for sec in range(2, seconds + 1, 2):
        lines += [rank_row(r, h, sec, late=0.02 if r == slow else 0.0) for r, h in ranks]
        if sec == 30:
            lines.append({"kind": "round", "t": T0 + sec, "round": 1, "ranks": len(ranks)})
    if end:
        lines.append({"kind": "end", "t": T0 + seconds, "returncode": 0,
                      "summary": f"summary: {seconds * 10} steps in {seconds} s"})
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def report(share: Path, job: str, *extra: str, prefix: list[str] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*prefix, sys.executable, "-m", "appliance", "report", "--shared", str(share), job, *extra],
                          env=env, capture_output=True, text=True, timeout=60)


def _replace_lines(path: Path, edit) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(edit(lines)))


def _bad_row_types(job: Path) -> None:
    row = {**rank_row(1, "node0", 61.0), "t": "abc", "rank": "x", "ops": 7}
    _replace_lines(job / "metrics.jsonl", lambda ls: ls[:20] + [json.dumps(row) + "\n"] + ls[20:])


def _bad_numbers(job: Path) -> None:
    rows = [{**rank_row(0, "node0", 61.0), "t": 1e308}, {**rank_row(0, "node0", 62.0), "t": float("nan")},
            {**rank_row(0, "node0", 63.0), "t": float("inf")}, {**rank_row(0, "node0", 64.0), "wall_s": -5.0}]
    _replace_lines(job / "metrics.jsonl", lambda ls: ls[:-1] + [json.dumps(r) + "\n" for r in rows] + ls[-1:])


def _odd_lines(job: Path) -> None:
    extra = ["[1,2,3]\n", "null\n", '"str"\n']
    end = json.dumps({"kind": "end", "t": T0 + 60, "returncode": 0, "summary": {"x": 1}}) + "\n"
    _replace_lines(job / "metrics.jsonl", lambda ls: ls[:5] + extra + ls[5:-1] + [end])


def _fifo(job: Path) -> None:
    (job / "metrics.jsonl").unlink()
    os.mkfifo(job / "metrics.jsonl")


def _dev_zero(job: Path) -> None:
    (job / "metrics.jsonl").unlink()
    (job / "metrics.jsonl").symlink_to("/dev/zero")


def _directory(job: Path) -> None:
    (job / "metrics.jsonl").unlink()
    (job / "metrics.jsonl").mkdir()


SUMMARY = "summary: 600 steps in 60 s"
NOT_REGULAR = "appliance report: cannot read {job}/metrics.jsonl: not a regular file"

# id: (damage to the job directory, extra args, exit status, a stdout line, the stderr (None: empty))
CASES = {
    "r01 clean record": (None, (), 0, SUMMARY, None),
    "r02 last line cut mid-JSON": (lambda j: _replace_lines(j / "metrics.jsonl", lambda ls: ls[:-1] + [ls[-1][:30]]),
                                   (), 0, "(the job is running or was killed: the record has no end)", None),
    "r03 binary junk as a middle line": (lambda j: _replace_lines(
        j / "metrics.jsonl", lambda ls: ls[:9] + [bytes(range(256)).decode("latin-1") * 12 + "\n"] + ls[9:]),
        (), 0, SUMMARY, None),
    "r04 a 16 MB event line": (lambda j: _replace_lines(j / "metrics.jsonl", lambda ls: ls[:9] + [json.dumps(
        {"kind": "event", "t": T0 + 5, "text": "x" * (16 << 20), "source": "job"}) + "\n"] + ls[9:]),
        (), 0, SUMMARY, None),
    "r04b a 16 MB line of junk": (lambda j: _replace_lines(j / "metrics.jsonl",
                                                           lambda ls: ls[:9] + ["{" * (16 << 20) + "\n"] + ls[9:]),
                                  (), 0, SUMMARY, None),
    "r05 metrics.jsonl missing": (lambda j: (j / "metrics.jsonl").unlink(), (), 1, "",
                                  "appliance report: no record of job {id} in {share}/jobs (--shared or "
                                  "APPLIANCE_SHARED to look elsewhere)"),
    "r06 metrics.jsonl a directory": (_directory, (), 1, "", NOT_REGULAR),
    "r11 empty metrics.jsonl": (lambda j: (j / "metrics.jsonl").write_text(""), (), 1,
                                "summary: no samples in the record",
                                "appliance report: {job}: the record has no sample of any rank to draw"),
    "r12 -o in a directory that does not exist": (None, ("-o", "{tmp}/nonexistent/dir/x.png"), 1, SUMMARY,
                                                  "appliance report: cannot write {tmp}/nonexistent/dir/x.png: No "
                                                  "such file or directory (appliance report -o FILE writes the picture elsewhere)"),
    "r13 -o naming a directory": (None, ("-o", "{tmp}/out"), 0, "{tmp}/out/report.png", None),
    "r14 metrics.jsonl a FIFO": (_fifo, (), 1, "", NOT_REGULAR),
    "r15 metrics.jsonl -> /dev/zero": (_dev_zero, (), 1, "", NOT_REGULAR),
    "r16 a rank row of the wrong types": (_bad_row_types, (), 0, SUMMARY,
                                          "appliance report: skipped 1 row(s) of {job}/metrics.jsonl whose fields "
                                          "are not of the record's types"),
    "r17 rows with t 1e308, NaN, Infinity and negative seconds": (
        _bad_numbers, (), 0, SUMMARY, "appliance report: skipped 3 row(s) of {job}/metrics.jsonl whose fields are "
                                      "not of the record's types"),
    "r18 lines that are not objects, an end whose summary is not text": (
        _odd_lines, (), 0, "summary: 600 steps in 60 s, communication 20% of step time", None),
}


@pytest.fixture
def share(tmp_path):
    (tmp_path / "out").mkdir()
    return tmp_path / "share"


def _entries(*dirs: Path) -> dict:
    return {str(d): sorted(os.listdir(d)) for d in dirs if d.is_dir()}


@pytest.mark.parametrize("case", list(CASES))
def test_report_on_a_damaged_record(share, tmp_path, case):
    damage, extra, code, out_line, err = CASES[case]
    job_id = case.split()[0]
    job = share / "jobs" / job_id
    write_record(job)
    if damage is not None:
        damage(job)
    fill = lambda s: s.format(job=job, id=job_id, share=share, tmp=tmp_path)  # noqa: E731
    before = _entries(job, tmp_path, tmp_path / "out")
    t0 = time.monotonic()
    r = report(share, job_id, *(fill(a) for a in extra))
    assert time.monotonic() - t0 < 30
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert (r.stderr.strip() == fill(err)) if err else r.stderr == "", r.stderr
    assert any(fill(out_line) in line for line in r.stdout.splitlines()) if out_line else r.stdout == "", r.stdout
    after = _entries(job, tmp_path, tmp_path / "out")
    drawn = {str(job): ["report.png"], str(tmp_path / "out"): ["report.png"]}
    for d, names in after.items():  # nothing beside the picture: no temporary file anywhere
        new = set(names) - set(before.get(d, []))
        assert new <= set(drawn.get(d, [])), (d, new)
    if code == 0:
        path = r.stdout.splitlines()[-1]
        assert os.path.isfile(path) and Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_a_job_that_does_not_exist(share, tmp_path):
    (share / "jobs").mkdir(parents=True)
    r = report(share, "nosuchjob")                                         # r07
    assert r.returncode == 1 and r.stderr.strip() == f"appliance report: no record of job nosuchjob in {share}/jobs " \
                                                      "(--shared or APPLIANCE_SHARED to look elsewhere)", r.stderr
    r = report(share, str(tmp_path / "no" / "dir"))                         # r07b
    assert r.returncode == 1 and r.stderr.strip() == \
        f"appliance report: no record of job {tmp_path}/no/dir in {tmp_path}/no/dir", r.stderr


# id: (mode of the job directory, mode of metrics.jsonl, exit status, stderr)
PERMISSIONS = {
    "r08 job directory 000": (0o000, 0o644, 1, "appliance report: cannot read {job}/metrics.jsonl: Permission denied"),
    "r09 metrics.jsonl 000": (0o755, 0o000, 1, "appliance report: cannot read {job}/metrics.jsonl: Permission denied"),
    "r10 job directory read-only": (0o555, 0o644, 1, "appliance report: cannot write {job}/report.png: Permission "
                                                     "denied (appliance report -o FILE writes the picture elsewhere)"),
}


@pytest.mark.parametrize("case", list(PERMISSIONS))
def test_report_without_permission(share, tmp_path, case):
    dir_mode, file_mode, code, err = PERMISSIONS[case]
    prefix = without_dac()
    job_id = case.split()[0]
    job = share / "jobs" / job_id
    write_record(job)
    os.chmod(job / "metrics.jsonl", file_mode)
    os.chmod(job, dir_mode)
    try:
        r = report(share, job_id, prefix=prefix)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == code and r.stderr.strip() == err.format(job=job), (r.returncode, r.stderr)
        os.chmod(job, 0o755)
        assert sorted(os.listdir(job)) == ["metrics.jsonl"]               # no temporary left behind
        if case.startswith("r10"):                                          # -o is the way out
            os.chmod(job, dir_mode)
            r = report(share, job_id, "-o", str(tmp_path / "out" / "r10.png"), prefix=prefix)
            assert r.returncode == 0 and r.stdout.splitlines() == [SUMMARY, str(tmp_path / "out" / "r10.png")], r
    finally:
        os.chmod(job, 0o755)


def _pixels_of(img, rgb, tol: float = 0.25) -> int:
    import numpy as np

    return int((np.abs(img[..., :3] - np.array(rgb)).max(axis=-1) < tol).sum())


def test_report_png_labels_whole_ranks_and_shows_a_host_under_another(tmp_path):
    import matplotlib
    import matplotlib.colors
    import matplotlib.image

    from appliance.launcher.observe.report import draw, figure

    # three hosts at the same speed: their lines lie on one another; ranks 0, 1, 2 and 5 reported
    job = tmp_path / "jobs" / "j1"
    write_record(job, ranks=((0, "node0"), (1, "node1"), (2, "node2"), (5, "node2")), slow=5)
    fig = figure(str(job))
    speed, _, late = fig.axes[:3]
    fig.canvas.draw()
    labels = [t.get_text() for t in late.get_yticklabels() if t.get_text()]
    assert labels and all(lab.isdigit() for lab in labels) and set(labels) <= {"0", "1", "2", "5"}, labels
    assert all(float(y).is_integer() for y, t in zip(late.get_yticks(), late.get_yticklabels()) if t.get_text())
    assert "5" in labels                                                    # the row of rank 5 is labelled 5
    path = draw(str(job), str(tmp_path / "r.png"))
    img = matplotlib.image.imread(path)
    top = img[: img.shape[0] // 3]                                          # the steps/s panel
    colors = [matplotlib.colors.to_rgb(line.get_color()) for line in speed.get_lines()
              if not line.get_label().startswith("_")]
    assert len(colors) == 3
    counts = [_pixels_of(top, rgb) for rgb in colors]
    # every host's colour shows in the panel, not only in its legend's swatch (a line drawn over
    # another of the same width hides it: ~2% of the top line's pixels are then the legend's)
    assert max(counts) > 500 and min(counts) > 0.2 * max(counts), counts
