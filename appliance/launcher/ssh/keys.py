"""``appliance keys --shared DIR``: the cluster's SSH material under DIR/ssh, idempotent.

What it owns: creating (once) and repairing (always) these files, with the ownership and modes
sshd's StrictModes demands (owned by the user, no group/other write anywhere, private keys
unreadable by others):

    DIR/ssh/                      0700  the directory
    DIR/ssh/id_ed25519            0600  the launcher's client key (``-i`` default when present)
    DIR/ssh/id_ed25519.pub        0644
    DIR/ssh/authorized_keys       0600  contains id_ed25519.pub (other lines are kept)
    DIR/ssh/ssh_host_ed25519_key  0600  the host key every secondary's sshd presents
    DIR/ssh/ssh_host_ed25519_key.pub 0644
    DIR/ssh/known_hosts           0644  ``* ssh-ed25519 <host key>``: verifies every cluster host

Keys are ed25519, made with ``cryptography`` (a paramiko dependency) in OpenSSH's format, so
``ssh``/``sshd`` read them too. Running it again keeps existing keys, re-adds missing lines,
re-derives missing ``.pub`` files and fixes modes and ownership (as root it gives files back to
the invoking user). Env vars: ``APPLIANCE_SHARED`` (default DIR). Failure modes:
``KeysError`` naming the file (not writable, owned by someone else, unreadable key).
"""
from __future__ import annotations

import dataclasses
import os
import stat

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"


class KeysError(RuntimeError):
    """The SSH material cannot be made or repaired; the message names the file."""


@dataclasses.dataclass
class KeysReport:
    directory: str
    created: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)
    fixed: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    client_public: str = ""
    host_public: str = ""


def _write(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _fix(path: str, mode: int, report: KeysReport) -> None:
    st = os.lstat(path)
    uid, gid = os.getuid(), os.getgid()
    if st.st_uid != uid:
        if uid != 0:
            raise KeysError(f"{path} belongs to uid {st.st_uid}, not to you (uid {uid}): sshd's StrictModes will "
                            "refuse it; remove it or run as its owner")
        os.chown(path, uid, gid)
        report.fixed.append(f"{path}: owner -> uid {uid}")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
        report.fixed.append(f"{path}: mode {stat.S_IMODE(st.st_mode):o} -> {mode:o}")


def _public_line(private_pem: bytes, path: str) -> str:
    try:
        key = serialization.load_ssh_private_key(private_pem, password=None)
    except (ValueError, TypeError) as e:
        raise KeysError(f"{path} is not an unencrypted OpenSSH private key ({e}); move it away to make a new one") from None
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def _key_pair(directory: str, name: str, comment: str, report: KeysReport) -> str:
    """Make or keep DIR/name (+ .pub); returns the public line ``ssh-ed25519 BASE64``."""
    private, public = os.path.join(directory, name), os.path.join(directory, name + ".pub")
    if os.path.exists(private):
        with open(private, "rb") as f:
            pem = f.read()
        report.kept.append(private)
    else:
        pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
        _write(private, pem, 0o600)
        report.created.append(private)
    line = _public_line(pem, private)
    existing = None
    if os.path.exists(public):
        with open(public, encoding="utf-8", errors="replace") as f:
            existing = " ".join(f.read().split()[:2])
    if existing != line:
        _write(public, f"{line} {comment}\n".encode(), 0o644)
        (report.fixed if existing is not None else report.created).append(public)
    _fix(private, 0o600, report)
    _fix(public, 0o644, report)
    return line


def _ensure_line(path: str, line: str, match: str, mode: int, report: KeysReport) -> None:
    """Append ``line`` unless a line containing ``match`` exists; keep every other line."""
    lines: list[str] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    if any(match in ln for ln in lines):
        report.kept.append(path)
    else:
        _write(path, ("\n".join(lines + [line]) + "\n").encode(), mode)
        report.created.append(path) if len(lines) == 0 else report.fixed.append(f"{path}: added the cluster line")
    _fix(path, mode, report)


def _parent_notes(directory: str, report: KeysReport) -> None:
    """sshd checks every directory above an authorized_keys file (up to the home directory)."""
    home = os.path.realpath(os.path.expanduser("~"))
    path = os.path.dirname(os.path.realpath(directory))
    while True:
        if path == home:
            break
        try:
            st = os.stat(path)
        except OSError:
            break
        if st.st_mode & 0o022 or st.st_uid not in (0, os.getuid()):
            report.notes.append(
                f"{path} is writable by others or owned by someone else: an sshd whose AuthorizedKeysFile points "
                f"into {directory} refuses it under StrictModes (the appliance copies the file to ~/.ssh instead)")
            break
        if path == "/":
            break
        path = os.path.dirname(path)


def ensure_keys(shared_dir: str) -> KeysReport:
    directory = os.path.join(os.path.abspath(shared_dir), "ssh")
    report = KeysReport(directory)
    try:
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700, exist_ok=True)
            report.created.append(directory)
        _fix(directory, 0o700, report)
        report.client_public = _key_pair(directory, CLIENT_KEY, "appliance-launcher", report)
        report.host_public = _key_pair(directory, HOST_KEY, "appliance-cluster-host", report)
        _ensure_line(os.path.join(directory, "authorized_keys"), f"{report.client_public} appliance-launcher",
                     report.client_public, 0o600, report)
        _ensure_line(os.path.join(directory, "known_hosts"), f"* {report.host_public}", report.host_public,
                     0o644, report)
    except OSError as e:
        raise KeysError(f"{e.filename or directory}: {e.strerror}") from None
    _parent_notes(directory, report)
    return report
