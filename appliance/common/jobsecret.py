"""A job's secret kept in a file: made once per job, read by every rank (a Slurm job's ranks).

What it owns: the file's format (one line of hex, 32 bytes of ``secrets.token_hex``), its
creation (``ensure``: directories made 0700, the file written under a temporary name opened
``O_EXCL`` with mode 0600, then linked into place, so a reader never sees half a secret and
concurrent callers for one job end up with one file) and the checks a reader makes (``read``:
a regular file, owned by the reader, not readable or writable by group or others, hex inside).
It reads no environment variable; ``appliance.runtime.config`` decides which file (APPLIANCE_JOB_SECRET_FILE,
else a Slurm job's ``appliance.common.slurm.default_secret_file``) and ``appliance secret`` makes it.

Failure modes: ``SecretFileError`` (a ``ValueError``) with one line naming the file and what to
run (``chmod 600 PATH``, ``appliance secret``); ``FileNotFoundError`` from ``read`` when there
is no file, for the caller to say how to make one.
"""
from __future__ import annotations

import os
import secrets
import stat

SECRET_BYTES = 32


class SecretFileError(ValueError):
    """A secret file that must not be used, or cannot be made; the message names the file."""


def read(path: str) -> bytes:
    """The secret in ``path``; FileNotFoundError when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise SecretFileError(f"cannot read the job secret file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        _check(path, st)
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if not secret:
        raise SecretFileError(f"the job secret file {path} holds no hex secret: remove it and run `appliance secret`")
    return secret


def _check(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise SecretFileError(f"the job secret file {path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise SecretFileError(f"the job secret file {path} belongs to uid {st.st_uid}, not to you "
                              f"(uid {os.geteuid()}): make your own (`appliance secret`)")
    if st.st_mode & 0o077:
        raise SecretFileError(f"the job secret file {path} is open to group or others "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}")


def ensure(path: str) -> bool:
    """Make the secret file ``path`` unless a usable one is there; True when this call made it.

    An existing file is kept when ``read`` accepts it and refused (SecretFileError) otherwise.
    """
    try:
        read(path)
        return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(os.path.abspath(path))
    _makedirs_private(directory)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise SecretFileError(f"cannot create the job secret file in {directory}: {e.strerror}") from None
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, (secrets.token_hex(SECRET_BYTES) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and fails when another caller got there first
        except FileExistsError:
            read(path)  # theirs, if it is usable
            return False
        except OSError as e:
            raise SecretFileError(f"cannot create the job secret file {path}: {e.strerror}") from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    _fsync_dir(directory)
    return True


def _makedirs_private(directory: str) -> None:
    """Create ``directory`` and its missing parents with mode 0700 (existing ones are left alone)."""
    missing = []
    d = directory
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        except OSError as e:
            raise SecretFileError(f"cannot create {d} for the job secret: {e.strerror}") from None
        os.chmod(d, 0o700)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
