"""Worker output: where every rank's lines go, and the one relay that splits streams into lines.

What it owns:
- ``OutputSink``: where worker output goes. Every line becomes ``[rank]<stdout>:text`` or
  ``[rank]<stderr>:text`` on the launcher's stdout/stderr (one lock per stream, flushed per
  line, so lines never interleave; ``divert()`` hands them to the live view instead), optionally the raw bytes in ``DIR/rank.N/{stdout,stderr}``
  (``--output-filename``; N zero-padded to the width of the largest rank, as horovodrun) and
  optionally a captured list of ``(rank, stream, text)`` for the Python API. ``message()`` is a
  line of the launcher's own.
- ``relay(stream, deliver)``: reads a byte stream (anything with ``readline(limit)``: a local
  rank's pipe, srun's output, an SSH channel's stderr) line by line until EOF and hands each line
  to ``deliver``; a partial last line is still delivered, lines longer than ``MAX_LINE`` bytes
  in pieces. Local workers deliver to the sink; the srun step first reads srun's ``N: `` label
  to learn the rank.
- ``Lines``: the same splitting for bytes that arrive in pieces (the SSH worker's frames).
Bytes that are not UTF-8 are replaced when printed and kept as they are in the files.

Env vars: none. Failure modes: none raised; a closed launcher stdout stops the echo, not the
files or the capture.
"""
from __future__ import annotations

import io
import os
import sys
import threading
from typing import IO, Any, Callable

MAX_LINE = 1 << 16  # longer lines are delivered in pieces of this many bytes


def rank_dir_name(rank: int, size: int) -> str:
    """``rank.N``, N zero-padded to the width of ``size - 1`` (horovodrun's layout)."""
    return f"rank.{rank:0{len(str(max(size - 1, 0)))}d}"


class OutputSink:
    """Thread-safe destination of worker output lines. Use as a context manager (closes files)."""

    def __init__(self, size: int, *, echo: bool = True, capture: bool = False,
                 output_dir: str | None = None, stdout: IO[Any] | None = None, stderr: IO[Any] | None = None):
        self._size = size
        self._echo = echo
        self._targets = {"stdout": stdout or sys.stdout, "stderr": stderr or sys.stderr}
        self._locks = {"stdout": threading.Lock(), "stderr": threading.Lock()}
        self._capture: list[tuple[int, str, str]] | None = [] if capture else None
        self._capture_lock = threading.Lock()
        self._output_dir = output_dir
        self._files: dict[tuple[int, str], IO[bytes]] = {}
        self._files_lock = threading.Lock()
        self._divert: Callable[[str, str], None] | None = None
        if output_dir is not None:
            os.makedirs(output_dir, exist_ok=True)

    def open_rank(self, rank: int) -> None:
        """Create ``DIR/rank.N/{stdout,stderr}`` for ``rank`` (no-op without an output dir)."""
        if self._output_dir is None:
            return
        d = os.path.join(self._output_dir, rank_dir_name(rank, self._size))
        os.makedirs(d, exist_ok=True)
        with self._files_lock:
            for stream in ("stdout", "stderr"):
                self._files[(rank, stream)] = open(os.path.join(d, stream), "wb")

    def line(self, rank: int, stream: str, data: bytes) -> None:
        """One line of output (``data`` without or with its trailing newline)."""
        f = self._files.get((rank, stream))
        if f is not None:
            with self._files_lock:
                if not f.closed:
                    f.write(data if data.endswith(b"\n") else data + b"\n")
                    f.flush()
        text = data.rstrip(b"\n").decode("utf-8", errors="replace")
        if self._capture is not None:
            with self._capture_lock:
                self._capture.append((rank, stream, text))
        if self._echo:
            self._write(stream, f"[{rank}]<{stream}>:{text}\n")

    def message(self, text: str) -> None:
        """A line of the launcher's own (summary, --verbose) on its stderr."""
        self._write("stderr", text if text.endswith("\n") else text + "\n")

    def divert(self, write: Callable[[str, str], None] | None) -> None:
        """Hand every echoed line to ``write(stream, text)`` instead of the streams (the live view
        prints them above itself), or, with None, write to the streams again."""
        with self._locks["stdout"], self._locks["stderr"]:
            self._divert = write

    def _write(self, stream: str, text: str) -> None:
        target = self._targets[stream]
        with self._locks[stream]:
            if self._divert is not None:
                self._divert(stream, text)
                return
            try:
                buf = getattr(target, "buffer", None)
                if isinstance(buf, io.BufferedIOBase):
                    target.flush()
                    buf.write(text.encode("utf-8", errors="replace"))
                    buf.flush()
                else:
                    target.write(text)
                    target.flush()
            except (OSError, ValueError):
                pass  # the launcher's own stdout is gone (closed pipe): keep relaying to files

    def captured(self) -> tuple[tuple[int, str, str], ...]:
        with self._capture_lock:
            return tuple(self._capture or ())

    def close(self) -> None:
        with self._files_lock:
            for f in self._files.values():
                f.close()

    def __enter__(self) -> "OutputSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def relay(stream: Any, deliver: Callable[[bytes], None]) -> None:
    """Hand ``stream``'s lines to ``deliver`` until EOF (see the module docstring); closes ``stream``."""
    try:
        while True:
            try:
                data = stream.readline(MAX_LINE)
            except (OSError, ValueError):
                break
            if not data:
                break
            deliver(data)
    finally:
        try:
            stream.close()
        except Exception:  # noqa: BLE001 - closing a dead pipe must not kill the relay thread
            pass


class Lines:
    """Bytes that arrive in pieces -> whole lines for ``deliver`` (long lines in MAX_LINE pieces),
    as ``relay`` splits a stream."""

    def __init__(self, deliver: Callable[[bytes], None]):
        self._deliver = deliver
        self._buf = b""

    def feed(self, data: bytes) -> None:
        self._buf += data
        while True:
            end = self._buf.find(b"\n")
            if end < 0 or end >= MAX_LINE:
                if len(self._buf) < MAX_LINE:
                    return
                end = MAX_LINE - 1
            self._deliver(self._buf[:end + 1])
            self._buf = self._buf[end + 1:]

    def flush(self) -> None:
        """Deliver a last line without its newline, if any."""
        if self._buf:
            self._deliver(self._buf)
            self._buf = b""
