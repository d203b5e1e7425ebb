"""``JobSetup``: the set-up and tear-down every job shares, static or elastic.

What it owns: one context manager that ``run.run`` (a static job) and ``elastic.launch.run_elastic``
(an elastic job) both enter. On entry: the signal trap (``signals.SignalTrap``) and the mechanism
that starts ranks (``mechanism.choose``: its hosts are released on exit), and in a Kubernetes
launcher pod one line on stderr saying where the hosts and key came from (``LaunchConfig.notice``). ``begin(fault_dir,
width)`` then opens the output sink (``output.OutputSink``), the reaper (``reaper.Reaper``: local
ranks die with a killed launcher, ``fault_dir`` removed with it) and the job-scoped observers
(``_observers``: the one place where something that watches the whole job is entered), and makes
sure every rank is stopped before the reaper is told the job ended normally. ``finish(outcome)``
stops what still runs and returns the job's summary line (printed when the job failed).

Env vars: none read (``LaunchConfig``). Failure modes: none of its own; whatever happens inside,
leaving the ``with`` block stops every rank and closes everything entered, in reverse order.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any

from appliance.launcher.config import LaunchConfig
from .mechanism import running
from .output import OutputSink
from .reaper import Reaper
from .signals import SignalTrap


class JobSetup:
    """The shared set-up of one job (see the module docstring)."""

    def __init__(self, config: LaunchConfig, mech: Any, *, echo: bool = True, capture: bool = False,
                 handle_signals: bool = True, stdout=None, stderr=None):
        self.config, self.mech = config, mech
        self.echo, self.capture, self.handle_signals = echo, capture, handle_signals
        self.stdout, self.stderr = stdout, stderr
        self.stack = contextlib.ExitStack()
        self.trap: SignalTrap | None = None
        self.sink: OutputSink | None = None
        self.reaper: Reaper | None = None

    def __enter__(self) -> "JobSetup":
        try:
            self.trap = self.stack.enter_context(SignalTrap(self.handle_signals))
            self.stack.enter_context(self.mech)
            self._say_where()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def _say_where(self) -> None:
        """In a Kubernetes launcher pod: the one line saying where the hosts and key came from
        (before any host is checked), and a key OpenSSH would refuse."""
        c = self.config
        lines = [c.notice] if c.notice else []
        if c.kubernetes is not None and c.remote.key:
            from .kubernetes import key_mode_warning

            warning = key_mode_warning(c.remote.key)
            if warning:
                lines.append(f"warning: {warning}")
        out = self.stderr or sys.stderr
        for line in lines:
            print(f"appliance launch: {line}", file=out, flush=True)

    def begin(self, fault_dir: str, width: int) -> OutputSink:
        """Open the sink (``width``: how many output prefixes to expect), the reaper and the
        observers; from here on every rank is stopped before the reaper closes."""
        c = self.config
        self.sink = self.stack.enter_context(OutputSink(width, echo=self.echo, capture=self.capture,
                                                        output_dir=c.output_dir, stdout=self.stdout,
                                                        stderr=self.stderr))
        self.reaper = self.stack.enter_context(Reaper(c.stop_grace_s, cleanup=[fault_dir] if fault_dir else []))
        if self.reaper.error:
            self.sink.message(f"appliance launch: warning: {self.reaper.error}")
        self._observers()
        self.stack.callback(self.mech.close)  # before the reaper is told the job ended normally
        return self.sink

    def _observers(self) -> None:
        """Job-scoped observers enter here (``self.stack.enter_context(...)``): they see the sink,
        the mechanism and the config, and are closed after every rank has been stopped."""

    def finish(self, outcome: Any, *, elastic: bool = False) -> str:
        """Stop what still runs; the job's summary line (printed when it failed)."""
        others = len(running(self.mech))
        self.mech.close()
        summary = outcome.reason
        if outcome.returncode != 0 and others:
            other = " other" if not elastic and outcome.rank is not None else ""
            summary += f"; stopped {others}{other} rank{'s' if others != 1 else ''}"
        if outcome.returncode != 0 and self.echo and self.sink is not None:
            self.sink.message(f"appliance launch: {summary}")
        return summary


__all__ = ["JobSetup"]
