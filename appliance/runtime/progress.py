"""Steps and progress for the metrics a rank publishes (``appliance.runtime.metrics``), for any
framework: ``appliance.torch`` exports both functions, and a Keras job calls them from a callback.

``step(samples=None)``: one training step, for scripts that have neither a ``DistributedOptimizer``
nor elastic commits (those count steps by themselves; a script with several sources counts
optimizer steps, else commits, else these, never two at once). ``progress(total=None,
samples_per_step=None)``: the job's total steps (the launcher's view shows an ETA; the knob
APPLIANCE_TOTAL_STEPS gives it too, and this call wins) and the samples one step processes on this
rank (samples/s). Both are cheap, valid before ``init()``, and do nothing visible unless the
launcher collects metrics (APPLIANCE_METRICS_ADDR). Failure modes: ValueError for a negative
number.
"""
from __future__ import annotations

from typing import Optional

from appliance.runtime import metrics


def _count(name: str, v: Optional[int]) -> Optional[int]:
    if v is None:
        return None
    if int(v) != v or v < 0:
        raise ValueError(f"{name} must be a whole number >= 0, not {v!r}")
    return int(v)


def step(samples: Optional[int] = None) -> None:
    """One training step of this rank (``samples``: how many it processed; default: progress's
    samples_per_step)."""
    metrics.note_step("explicit", _count("samples", samples))


def progress(total: Optional[int] = None, samples_per_step: Optional[int] = None) -> None:
    """The job's total steps and/or the samples per step of this rank (for steps counted from any source)."""
    metrics.set_progress(_count("total", total), _count("samples_per_step", samples_per_step))
