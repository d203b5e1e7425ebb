"""The appliance plane's own lines: ``appliance primary: TEXT``, one per call.

What it owns: ``PREFIX`` and ``say(text, file=None)``, the one way ``appliance primary`` (on the
host), its job runner (``jobrun``, inside the primary container) and the startup view (``view``)
print a line of their own, as opposed to the job's output, which the launcher prefixes with each
rank: on stderr unless a stream is given, flushed at once. Env vars: none. Failure modes: none.
"""
from __future__ import annotations

import sys
from typing import IO

PREFIX = "appliance primary:"


def say(text: str, file: IO[str] | None = None) -> None:
    """``appliance primary: TEXT`` on ``file`` (default: stderr), flushed."""
    print(f"{PREFIX} {text}", file=file or sys.stderr, flush=True)
