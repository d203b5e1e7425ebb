"""How a running job ends: the first failure, the survivors' grace, and whom the summary blames.

What it owns: ``wait_for_end()``, which watches a ``mechanism.Mechanism``'s ranks until the job's fate is known,
and ``Outcome``, what ``run.py`` turns into the ``LaunchResult`` and the summary line.

1. It waits for the first rank to exit non-zero or be killed, for a signal to the launcher
   (``trap.received``), for the job timeout, or for every rank to exit 0.
2. After the first failure the surviving ranks already hold the runtime's error (a
   ``HorovodInternalError``): they get ``APPLIANCE_FAILURE_GRACE`` seconds to finish their
   handlers (an emergency checkpoint) and exit by themselves. The grace ends as soon as every
   rank has exited; a signal to the launcher or the job timeout end it at once. Ranks that exit
   during the grace, whatever their code, do not change the blame. The caller then stops what is
   left (SIGTERM, ``APPLIANCE_STOP_GRACE``, SIGKILL: ``WorkerGroup.stop``).
3. Blame: the first failed rank, unless its fault report (``worker.fault``: the runtime's
   ``APPLIANCE_FAULT_FILE`` object, or the SSH stub's copy of it) names another ``origin_rank``,
   e.g. a peer that went silent or was stopped and so never failed by itself. Then that rank and
   its host are blamed: ``rank 1 (host b) was lost: <message>; reported by rank 0``. A rank that
   exited with a code (not a signal) and has no report yet is given a moment (within the grace)
   for it to appear.

Exit codes (``Outcome.returncode``): the first failed rank's code (128+N when killed by signal
N), 128+N when the launcher got signal N, 124 on timeout.

Env vars: none (the graces come from ``LaunchConfig``). Failure modes: none of its own; every
wait here is bounded by the grace, the timeout or a signal.
"""
from __future__ import annotations

import dataclasses
import signal
import time
from typing import Any

EXIT_TIMEOUT = 124
REPORT_WAIT_S = 0.2  # how long a failed rank's fault report may trail its exit
POLL_S = 0.05        # how often signals and the timeout are looked at while ranks run

_KINDS = {"peer_lost": "was lost", "stall": "stalled", "aborted": "failed", "error": "failed"}


@dataclasses.dataclass
class Outcome:
    returncode: int = 0
    rank: int | None = None
    host: str | None = None
    reason: str = ""
    timed_out: bool = False
    interrupted: int | None = None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def exit_code(returncode: int) -> int:
    """A rank's return code as a shell would report it (128+N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by signal {-returncode} ({signal_name(-returncode)})"
    return f"exited with code {returncode}"


def _interrupted(sig: int) -> Outcome:
    return Outcome(128 + sig, reason=f"interrupted by {signal_name(sig)}", interrupted=sig)


def blame(worker: Any, code: int, fault: dict | None, hosts: dict[int, str],
          finished: frozenset[int] = frozenset()) -> Outcome:
    """The outcome of a job whose first failed rank is ``worker`` (exited ``code``); ``hosts``: rank -> host
    of every rank of the job (a report naming a rank outside it is not believed); ``finished``: ranks
    that exited 0 (a rank that finished cleanly, e.g. shut down and took its store along, is no culprit)."""
    own = f"rank {worker.rank} (host {worker.host}) {getattr(worker, 'cause', None) or describe_exit(code)}"
    origin = fault.get("origin_rank") if fault else None
    if (not isinstance(origin, int) or isinstance(origin, bool) or origin == worker.rank or origin not in hosts
            or origin in finished):
        return Outcome(exit_code(code), worker.rank, worker.host, own)
    host = hosts[origin]
    what = _KINDS.get(str(fault.get("kind")), "failed")  # type: ignore[union-attr]
    message = str(fault.get("message") or "").strip()  # type: ignore[union-attr]
    reason = f"rank {origin} (host {host}) {what}{': ' + message if message else ''}; reported by rank {worker.rank}"
    return Outcome(exit_code(code), origin, host, reason)


def _running(group: Any) -> bool:
    return any(w.rank not in group.returncodes for w in group.workers)


def wait_for_end(group: Any, trap: Any, deadline: float | None, timeout_s: float | None,
                 failure_grace_s: float) -> Outcome:
    """Watch ``group`` (a ``mechanism.Mechanism``: ``wait``, ``workers``, ``returncodes``) until the job's outcome is known (see the module docstring).

    Returns with ranks possibly still running: the caller stops them."""
    while True:
        if trap.received:
            return _interrupted(trap.received[0])
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return Outcome(EXIT_TIMEOUT, reason=f"timed out after {timeout_s:g} s", timed_out=True)
        event = group.wait(POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - now)))
        if event is not None and event[1] != 0:
            break
        if not _running(group):
            return Outcome(0)
    worker, code = event
    now = time.monotonic()
    grace_end = now + failure_grace_s
    report_end = min(grace_end, now + REPORT_WAIT_S) if code > 0 else now  # a signal leaves no report
    cut_short = None
    while True:
        now = time.monotonic()
        if trap.received:
            cut_short = trap.received[0]
            break
        if now >= grace_end or (deadline is not None and now >= deadline):
            break
        if not _running(group):
            if now >= report_end or getattr(worker, "fault", None) is not None:
                break
            time.sleep(0.02)  # everyone is gone; the first failed rank's report may trail its exit
            continue
        group.wait(min(POLL_S, grace_end - now))
    finished = frozenset(r for r, c in group.returncodes.items() if c == 0)
    outcome = blame(worker, code, getattr(worker, "fault", None), {w.rank: w.host for w in group.workers}, finished)
    if cut_short is not None:
        outcome.interrupted = cut_short
        outcome.reason += f"; the survivors' grace was cut short by {signal_name(cut_short)}"
    return outcome
