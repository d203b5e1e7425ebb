"""Seeing a job while it runs and after: the launcher's side of the metrics wire.

What it owns: ``Observer`` (``session.py``), the one context manager the launcher enters for a
job: it collects every rank's samples (``collector.py`` into ``state.py``), names stragglers
(``straggler.py``), shows the job (``view.py``: a live table on a terminal, summary lines
elsewhere), writes its record into the job directory (``record.py``), serves Prometheus
(``prometheus.py``, ``--metrics-port``) and draws ``report.png`` at the end (``report.py``).
``docs/observing.md`` is the user's page. Env vars: see ``session.py``. Failure modes: none of
its own reach the job; a port that cannot be bound for ``--metrics-port`` is a ``ConfigError``.
"""
from __future__ import annotations

from .session import Observer

__all__ = ["Observer"]
