"""``run_elastic(config)``: what ``launcher.run`` does for an elastic job.

What it owns: the setup around one ``driver.ElasticDriver``: the mechanism that starts ranks
(``mechanism.choose``), the signal trap, the output sink, the reaper, and stopping whatever still
runs when the driver returns; the summary line of the job. The driver decides everything else.

Env vars: none read here (``LaunchConfig``). Failure modes: ``ConfigError`` when ``-x``/env names
a variable the driver sets for every worker; otherwise the driver's (``LaunchError`` before any
rank starts, an ``Outcome`` after).
"""
from __future__ import annotations

import contextlib

from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig
from .. import env as envmod
from .. import mechanism as mech_mod
from ..output import OutputSink
from ..reaper import Reaper
from ..signals import SignalTrap
from .driver import ElasticDriver


def run_elastic(config: LaunchConfig, *, echo: bool = True, capture: bool = False, handle_signals: bool = True,
                stdout=None, stderr=None, on_host_report=None, deadline: float | None = None):
    """``launcher.run`` for an elastic job, the driver in charge of the ranks: returns the
    outcome, its summary line, the captured lines and the job id."""
    assert config.elastic is not None
    envmod.check_explicit(config.env)
    for name in ("HOROVOD_ELASTIC", "APPLIANCE_ELASTIC_ADDR", "APPLIANCE_ELASTIC_WORKER"):
        if name in config.env:
            raise ConfigError(f"-x/env {name}: the elastic driver sets {name} for every worker")
    mech = mech_mod.choose(config, on_host_report=on_host_report)
    with contextlib.ExitStack() as stack:
        trap = stack.enter_context(SignalTrap(handle_signals))
        stack.enter_context(mech)
        fault_dir = mech.open_elastic()
        sink = stack.enter_context(OutputSink(config.elastic.max_np or config.np, echo=echo, capture=capture,
                                              output_dir=config.output_dir, stdout=stdout, stderr=stderr))
        reaper = stack.enter_context(Reaper(config.stop_grace_s, cleanup=[fault_dir]))
        if reaper.error:
            sink.message(f"appliance launch: warning: {reaper.error}")
        stack.callback(mech.stop)
        driver = ElasticDriver(config, mech, sink, reaper, trap, deadline, fault_dir)
        outcome = driver.run()
        others = len(mech.running())
        mech.stop()
        summary = outcome.reason
        if outcome.returncode != 0 and others:
            summary += f"; stopped {others} rank{'s' if others != 1 else ''}"
        if outcome.returncode != 0 and echo:
            sink.message(f"appliance launch: {summary}")
        lines = sink.captured()
    return outcome, summary, lines, driver.job_id


__all__ = ["run_elastic"]
