"""Atomic files on the shared mount: a reader (or a crash) sees the old or the new content.

What it owns: ``save_atomically(write, path)`` (write a temporary file next to ``path``, fsync
it, rename it over ``path``, fsync the directory) and the JSON helpers built on it
(``write_json``; ``read_json``, which answers None for a missing or unparseable file, and for
anything that is not a regular file it may read: a directory, a FIFO, a file without read
permission; it never blocks),
``read_with_mtime`` (a file's text and modification time, read from one open file),
``read_small`` (the same for a file anyone may have put there: never blocks, never reads more
than a bound; ``NotReadable`` says why it is not a small regular UTF-8 file) and
``remove_temporaries(path)``: the temporary files a writer killed mid-save left next to ``path``.

Env vars: none. Failure modes: ``OSError`` from the file system (the temporary file is removed
and the old ``path`` left as it was); whatever ``write`` raises, after the same cleanup;
``NotReadable`` from ``read_small``.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import socket
import stat
from typing import Any, Callable, Optional


TMP_INFIX = ".tmp."   # temporaries are .<name>.tmp.<host>.<pid>


def remove_temporaries(path: str) -> list[str]:
    """Remove what writers of ``path`` killed mid-save left behind (their temporary files);
    call it only while no one else may be writing ``path`` (e.g. under its run lock)."""
    directory, base = os.path.split(os.path.abspath(path))
    removed = []
    for tmp in glob.glob(os.path.join(glob.escape(directory), glob.escape(f".{base}{TMP_INFIX}") + "*")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
            removed.append(tmp)
    return removed


def save_atomically(write: Callable[[Any], None], path: str, mode: str = "wb") -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, fsync it, rename it over ``path``,
    then fsync the directory: a reader (or a crash) sees the old or the new file, never a torn one."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}{TMP_INFIX}{socket.gethostname()}.{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str, data: Any) -> None:
    save_atomically(lambda f: f.write(json.dumps(data, indent=1, sort_keys=True) + "\n"), path, "w")


MAX_JSON_BYTES = 64 << 20  # read_json's bound: the records it reads are a few KB


def read_json(path: str, limit: int = MAX_JSON_BYTES) -> Optional[Any]:
    """The JSON in ``path``; None when there is none, it does not parse, or the file is not a
    regular file of at most ``limit`` bytes this process may read (``read_small``: never blocks)."""
    try:
        text, _ = read_small(path, limit)
        return None if text is None else json.loads(text)
    except (ValueError, RecursionError):  # NotReadable is a ValueError
        return None


def read_with_mtime(path: str) -> tuple[Optional[str], Optional[float]]:
    """(text, mtime) of ``path``, both from one open file; (None, None) when there is none."""
    try:
        with open(path) as f:
            return f.read(), os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None, None


class NotReadable(ValueError):
    """A file that is there but is not a small regular UTF-8 file; the message says why."""


def read_small(path: str, limit: int) -> tuple[Optional[str], Optional[float]]:
    """(text, mtime) of ``path``, both from one open file; (None, None) when there is none. Never
    blocks (opened non-blocking, checked to be a regular file on the open descriptor) and never
    reads more than ``limit`` bytes; ``NotReadable`` for anything else (a directory, a FIFO, a
    device, a symlink loop, more than ``limit`` bytes, not UTF-8)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        raise NotReadable(e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable("not a regular file")
        data = bytearray()
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise NotReadable(f"larger than {limit} bytes")
        try:
            return data.decode("utf-8"), st.st_mtime
        except UnicodeDecodeError:
            raise NotReadable("not UTF-8 text") from None
    except OSError as e:
        raise NotReadable(e.strerror or str(e)) from None
    finally:
        os.close(fd)
