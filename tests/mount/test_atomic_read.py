"""``read_json`` (``appliance.mount.atomic``) on what a share can hold where a JSON file should be:
it answers None, at once, for anything that is not a regular file it may read (a FIFO is never
opened blocking, a device never read to its end), and the JSON for one that is. The permission
case runs in a process without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH when the tests run as root.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from appliance.mount import read_json, write_json
from fixtures import ROOT
from fixtures.privileges import without_dac

pytestmark = pytest.mark.timeout(30)

CASES = {
    "missing": lambda p: None,
    "a directory": lambda p: p.mkdir(),
    "a FIFO": lambda p: os.mkfifo(p),
    "/dev/zero": lambda p: p.symlink_to("/dev/zero"),
    "a symlink loop": lambda p: p.symlink_to(p.name),
    "not JSON": lambda p: p.write_text("{"),
    "not UTF-8": lambda p: p.write_bytes(b'{"a": "\xff"}'),
    "deep nesting": lambda p: p.write_text("[" * 100000 + "]" * 100000),
}


@pytest.mark.parametrize("case", list(CASES))
def test_read_json_answers_none_at_once(tmp_path, case):
    path = tmp_path / "x.json"
    CASES[case](path)
    t0 = time.monotonic()
    assert read_json(str(path)) is None
    assert time.monotonic() - t0 < 5


def test_read_json_reads_what_write_json_wrote_and_bounds_the_size(tmp_path):
    path = str(tmp_path / "x.json")
    write_json(path, {"a": [1, 2.5, None]})
    assert read_json(path) == {"a": [1, 2.5, None]}
    assert read_json(path, limit=4) is None


def test_read_json_without_permission_is_none(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"a": 1}))
    path.chmod(0o000)
    code = f"from appliance.mount import read_json; print(repr(read_json({str(path)!r})))"
    r = subprocess.run([*without_dac(), sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr
