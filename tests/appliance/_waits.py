"""Polling helper for the Docker-tier tests: wait for a condition with a bound, failing early
(with the primary's last output) when the primary process it watches has already exited."""
from __future__ import annotations

import time

import pytest


def wait_for(predicate, timeout: float, what: str, proc=None, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the primary exited early ({proc.returncode}):\n{proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(poll_s)
