"""CPU binding of ranks (``appliance.launcher.binding``): the slices, and the spawn helper with
real processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from appliance.common.knobs import ConfigError
from appliance.launcher.binding import bound, cpus_for, rank_cpus


def test_slices_are_contiguous_disjoint_and_cover_the_cpus():
    assert [rank_cpus(r, 2, [0, 1, 2, 3]) for r in range(2)] == [[0, 1], [2, 3]]
    assert [rank_cpus(r, 3, [0, 1, 2, 3, 4, 5, 6]) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [rank_cpus(r, 2, [5, 3, 9]) for r in range(2)] == [[3, 5], [9]]  # any allowed set, sorted
    assert rank_cpus(0, 1, [0, 1]) == [0, 1]


def test_more_ranks_than_cpus_share_them_round_robin():
    assert [rank_cpus(r, 5, [0, 1]) for r in range(5)] == [[0], [1], [0], [1], [0]]
    assert [rank_cpus(r, 2, [0, 1]) for r in range(2)] == [[0], [1]]


def test_bad_layouts_are_refused():
    for args in ((2, 2, [0, 1]), (-1, 2, [0]), (0, 0, [0]), (0, 1, [])):
        with pytest.raises(ValueError):
            rank_cpus(*args)


def test_off_unless_asked_and_needs_the_local_layout():
    layout = {"HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1"}
    assert cpus_for(layout) is None
    assert cpus_for({**layout, "APPLIANCE_BIND": "none"}) is None
    assert cpus_for({"APPLIANCE_BIND": "core"}) is None
    assert cpus_for({**layout, "APPLIANCE_BIND": "CORE"}) == sorted(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match="APPLIANCE_BIND"):
        cpus_for({**layout, "APPLIANCE_BIND": "socket"})


def test_a_child_spawned_inside_starts_bound_and_the_spawner_is_restored():
    allowed = sorted(os.sched_getaffinity(0))
    last = len(allowed) - 1
    env = {"APPLIANCE_BIND": "core", "HOROVOD_LOCAL_RANK": str(last), "HOROVOD_LOCAL_SIZE": str(len(allowed))}
    with bound(env):
        out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                             capture_output=True, text=True, timeout=30).stdout
    assert out.strip() == str([allowed[last]])
    assert sorted(os.sched_getaffinity(0)) == allowed
