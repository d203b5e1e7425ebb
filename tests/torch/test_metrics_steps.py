"""Steps in the metrics a rank publishes: optimizer steps, else elastic commits, else explicit
``appliance.torch.step()`` calls, never two sources at once; samples and the total from
``appliance.torch.progress`` or the knob APPLIANCE_TOTAL_STEPS (the call wins). One plain
process each (steps are counted per rank), its samples read by a stand-in collector
(tests/fixtures/metrics_listener.py); bad arguments are one clear ValueError.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fixtures import RANKS, ROOT
from fixtures.metrics_listener import Listener


def run(tmp_path, sources: str, n: int, env: dict | None = None) -> tuple:
    """(the rank's report, its last sample) for torch_metrics.py SOURCES N."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_"))}
    with Listener() as lst:
        clean.update(env or {})
        clean.update(APPLIANCE_TEST_OUT=str(tmp_path), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
                     APPLIANCE_METRICS_ADDR=lst.addr, APPLIANCE_METRICS_INTERVAL="0.2")
        proc = subprocess.run([sys.executable, str(RANKS / "torch_metrics.py"), sources, str(n)], env=clean,
                              timeout=120, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-4000:]
        lst.wait_for(lambda ls: ls.of("bye"), 10, "bye")
        import json
        rep = json.loads((tmp_path / "rank0.json").read_text())
        samples = lst.of("sample")
        assert samples and lst.of("hello")[0]["size"] == 1
        return rep, samples[-1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sources,src", [("optimizer,commit,explicit", "optimizer"), ("commit,explicit", "commit"),
                                         ("explicit", "explicit")])
def test_the_first_source_present_counts_alone(tmp_path, sources, src):
    rep, last = run(tmp_path, sources, 5)
    assert rep["steps"][:2] == [5, src]
    assert (last["step"], last["step_src"]) == (5, src)  # not 10 or 15: never two sources at once
    assert last["samples"] == (20 if src == "explicit" else None)  # step(samples=4)
    assert last["total_steps"] is None


@pytest.mark.timeout(300)
def test_progress_gives_samples_and_total_and_wins_over_the_knob(tmp_path):
    _, last = run(tmp_path, "optimizer,progress", 4, env={"APPLIANCE_TOTAL_STEPS": "7"})
    assert (last["step"], last["samples"], last["total_steps"]) == (4, 8, 40)
    _, last = run(tmp_path, "optimizer", 4, env={"APPLIANCE_TOTAL_STEPS": "7"})
    assert (last["step"], last["samples"], last["total_steps"]) == (4, None, 7)


def test_bad_arguments_are_one_clear_error():
    import appliance.torch as hvd

    with pytest.raises(ValueError, match="samples must be a whole number"):
        hvd.step(samples=-1)
    with pytest.raises(ValueError, match="total must be a whole number"):
        hvd.progress(total=2.5)
