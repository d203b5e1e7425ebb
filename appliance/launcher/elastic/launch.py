"""``run_elastic(config)``: what ``launcher.run`` does for an elastic job.

What it owns: the setup around one ``driver.ElasticDriver``: the mechanism that starts ranks
(``mechanism.choose``) inside the set-up every job shares (``setup.JobSetup``: signal trap, output
sink, reaper, observers, stopping whatever still runs when the driver returns, the summary line). The driver decides everything else.

Env vars: none read here (``LaunchConfig``). Failure modes: ``ConfigError`` when ``-x``/env names
a variable the driver sets for every worker; otherwise the driver's (``LaunchError`` before any
rank starts, an ``Outcome`` after).
"""
from __future__ import annotations

from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig
from .. import env as envmod
from .. import mechanism as mech_mod
from ..setup import JobSetup
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
    with JobSetup(config, mech, echo=echo, capture=capture, handle_signals=handle_signals, stdout=stdout,
                  stderr=stderr) as job:
        fault_dir = mech.prepare(None).fault_dir
        sink = job.begin(fault_dir, config.elastic.max_np or config.np)
        driver = ElasticDriver(config, mech, sink, job.reaper, job.trap, deadline, fault_dir)
        outcome = driver.run()
        summary = job.finish(outcome, elastic=True)
        lines = sink.captured()
    return outcome, summary, lines, driver.job_id


__all__ = ["run_elastic"]
