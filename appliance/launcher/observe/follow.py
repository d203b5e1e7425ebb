"""A job's state read back from its record while it grows: the view of a process beside the launcher.

What it owns: ``RecordFollower``, which tails ``JOB_DIR/metrics.jsonl`` (``record.py``) and feeds
what the launcher wrote there into a ``JobState`` of its own: the job's size, each rank's rows
(a rank's host, its cumulative counters), the launcher's events and the elastic rounds.
``snapshot()`` reads what was appended since the last call and returns the state's snapshot, so
``view.LiveDisplay`` draws a job whose launcher runs elsewhere (``appliance primary`` draws the
job of its primary container on the user's terminal from the shared job directory). The
straggler rule and the stall watch run here again on the same numbers, so their events in the
record are not taken twice. Rows arrive as the record writes them (every ``every_s``), so the
rates lag the launcher's own view by up to that much.

Env vars: none. Failure modes: none raised; a record not written yet reads as a job with no
numbers, a line cut mid-write waits for its end, a line that does not parse is skipped.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable, Optional

from .record import RECORD
from .state import JobState, Snapshot

OWN_EVENTS = ("straggler", "stall")  # sources the follower's own state says again
READ_MAX = 4 << 20                    # bytes read per call: a long record catches up over a few draws


class RecordFollower:
    def __init__(self, job_dir: str, job_id: str = "", *, clock: Callable[[], float] = time.time):
        self.path = os.path.join(job_dir, RECORD)
        self.state = JobState(job_id, clock=clock)
        self.end: Optional[dict] = None
        self._pos = 0
        self._partial = b""
        self._hosts: dict[int, str] = {}

    def poll(self) -> None:
        """Take in what the record gained since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read(READ_MAX)
        except OSError:
            return
        self._pos += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                self._take(obj)

    def _take(self, obj: dict) -> None:
        kind, st = obj.get("kind"), self.state
        if kind == "job":
            st.job_id = str(obj.get("job") or st.job_id)
            if isinstance(obj.get("size"), int) and obj["size"] > 0:
                st.size = obj["size"]
        elif kind == "rank" and "rank" in obj:
            rank, host = obj["rank"], str(obj.get("host") or "?")
            if self._hosts.get(rank) != host:
                self._hosts[rank] = host
                st.message({"kind": "hello", "rank": rank, "host": host, "pid": ("record", rank)})
            st.message({**obj, "kind": "sample"})
        elif kind == "event" and obj.get("source") not in OWN_EVENTS:
            st.event(str(obj.get("text", "")), t=obj.get("t"), source=str(obj.get("source") or "job"))
        elif kind == "round":
            st.note_round(int(obj.get("round", 0)))
        elif kind == "end":
            self.end = obj

    def snapshot(self) -> Snapshot:
        self.poll()
        return self.state.snapshot()


__all__ = ["RecordFollower"]
