"""Host key verification for the SSH launcher: the cluster's known_hosts, else trust on first use.

What it owns: ``KnownHosts`` (an OpenSSH known_hosts file: ``patterns keytype key`` lines with
``*``/``?`` wildcards, ``!`` negation, hashed ``|1|`` names and ``@revoked`` markers; paramiko's
own parser has no wildcards) and ``HostKeyPolicy``, the paramiko policy every connection uses
(``connection.py`` sets it on each ``fabric.Connection``'s client and on its jump hosts' clients, in
place of fabric's default ``AutoAddPolicy``; the clients load no known_hosts of their own, so
every key reaches this policy).

The policy, and why:
- When ``SHARED/ssh/known_hosts`` exists (``appliance keys`` writes it: one line
  ``* ssh-ed25519 KEY`` for the cluster host key that every secondary's sshd presents), checking
  is strict: a host must present a key listed there (or in ``~/.ssh/known_hosts``); anything
  else is refused. This is BatchMode without ``StrictHostKeyChecking=no``: no prompt, and no
  man in the middle, because the trust anchor lives on the share the user controls.
- With ``trusted_key`` (a Kubernetes launcher pod: the mounted ``id_rsa``), a host presenting that
  key pair's public key is trusted: the MPI Operator's images use the job's key as sshd host key.
- With ``record=False`` (a Kubernetes launcher pod: ``~/.ssh`` is the operator's read-only
  Secret mount, and its images set ``StrictHostKeyChecking no`` with ``UserKnownHostsFile
  /dev/null``), an unknown key is accepted and nothing is written; a key that differs from a
  ``~/.ssh/known_hosts`` line is still refused.
- Without it (hosts set up by hand), it is OpenSSH's ``accept-new``: a host already in
  ``~/.ssh/known_hosts`` must match; an unknown one is accepted, appended there, and a warning
  names it with its fingerprint. A *changed* key is always refused with the command that removes
  the stale line. Prompting is impossible in a launcher, refusing unknown hosts would make every
  first launch fail, and accepting changed keys silently would defeat the check.

Env vars: none (``HOME`` locates ``~/.ssh/known_hosts``). Failure modes: ``HostKeyRejected``
(a ``paramiko.SSHException``) whose message names host, port, key fingerprint and the fix.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import threading
from typing import Iterable

import paramiko


class HostKeyRejected(paramiko.SSHException):
    """The host's key is not trusted; the message says why and what to do."""


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def lookup_names(host: str, port: int, address: str | None = None) -> list[str]:
    """The names OpenSSH looks up: ``host`` (port 22) or ``[host]:port``, and the same for the address."""
    names = []
    for n in (host, address):
        if n and (n if port == 22 else f"[{n}]:{port}") not in names:
            names.append(n if port == 22 else f"[{n}]:{port}")
    return names


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            _, _, salt, digest = pattern.split("|")
            mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
            return hmac.compare_digest(mac, base64.b64decode(digest))
        except (ValueError, TypeError):
            return False
    # Only * and ? are special in OpenSSH patterns ("[host]:port" is literal, not a character class).
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(regex, name.lower()) is not None


def patterns_match(patterns: str, name: str) -> bool:
    """OpenSSH's rule: some positive pattern matches and no negated one does."""
    positive = False
    for p in patterns.split(","):
        if p.startswith("!"):
            if _pattern_matches(p[1:], name):
                return False
        elif _pattern_matches(p, name):
            positive = True
    return positive


class KnownHosts:
    """The entries of one known_hosts file (missing file: no entries)."""

    def __init__(self, path: str):
        self.path = path
        self.entries: list[tuple[str | None, str, str, str]] = []  # (marker, patterns, type, base64)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            marker = fields.pop(0) if fields[0].startswith("@") else None
            if len(fields) >= 3:
                self.entries.append((marker, fields[0], fields[1], fields[2]))

    def verdict(self, names: Iterable[str], key: paramiko.PKey) -> str:
        """``"match"``, ``"revoked"``, ``"mismatch"`` (names listed with other keys), ``"not-cluster"``
        (only wildcard lines such as ``* KEY`` apply, with other keys) or ``"unknown"``."""
        names, listed, mine = list(names), "", (key.get_name(), key.get_base64())
        for marker, patterns, ktype, b64 in self.entries:
            if marker == "@revoked":
                if (ktype, b64) == mine:
                    return "revoked"
                continue
            if marker is not None or not any(patterns_match(patterns, n) for n in names):
                continue  # @cert-authority lines are not supported: they never match
            if (ktype, b64) == mine:
                return "match"
            wildcard = any(c in patterns for c in "*?")
            listed = "mismatch" if not wildcard or listed == "mismatch" else "not-cluster"
        return listed or "unknown"


def _public_blob(private_key: str) -> bytes | None:
    """The public key of ``private_key`` (its ``.pub`` file, else the key itself, any type)."""
    try:
        with open(private_key + ".pub", encoding="ascii") as f:
            return base64.b64decode(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        pass
    try:
        return paramiko.PKey.from_path(private_key).asbytes()
    except Exception:  # noqa: BLE001 - unreadable: nothing is trusted by it
        return None


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Decides on every host key (the client has no keys loaded, so paramiko always asks)."""

    def __init__(self, cluster_known_hosts: str, user_known_hosts: str | None = None, record: bool = True,
                 trusted_key: str | None = None):
        self.cluster_path, self.record = cluster_known_hosts, record
        self.trusted = _public_blob(trusted_key) if trusted_key else None
        self.user_path = user_known_hosts or os.path.expanduser("~/.ssh/known_hosts")
        self.warnings: list[str] = []
        self._lock = threading.Lock()

    @property
    def strict(self) -> bool:
        return os.path.isfile(self.cluster_path)

    def check(self, host: str, port: int, address: str | None, key: paramiko.PKey) -> None:
        if self.trusted is not None and key.asbytes() == self.trusted:
            return  # the job's own key pair presented as host key (the MPI Operator's images do so)
        names = lookup_names(host, port, address)
        shown = f"{host}:{port}"
        fp = f"{key.get_name()} {fingerprint(key)}"
        files = [KnownHosts(self.user_path)]
        if self.strict:
            files.insert(0, KnownHosts(self.cluster_path))
        verdicts = [(kh.path, kh.verdict(names, key)) for kh in files]
        for path, v in verdicts:
            if v == "revoked":
                raise HostKeyRejected(f"{shown} presented a revoked host key ({fp}, revoked in {path})")
        if any(v == "match" for _, v in verdicts):
            return
        for path, v in verdicts:
            if v == "mismatch":
                raise HostKeyRejected(
                    f"{shown} presented a host key ({fp}) that differs from the one in {path}: if the host was "
                    f"reinstalled, remove the stale line with `ssh-keygen -f {path} -R '{names[0]}'`; otherwise "
                    "someone may be intercepting the connection")
        if self.strict or any(v == "not-cluster" for _, v in verdicts):
            raise HostKeyRejected(
                f"{shown} presented a host key ({fp}) that is not in the cluster's {self.cluster_path}: start its "
                f"sshd with the cluster host key (`sshd -h {os.path.join(os.path.dirname(self.cluster_path), 'ssh_host_ed25519_key')}`, "
                f"as `appliance secondary` does), or add its key: `ssh-keyscan -p {port} {host} >> {self.cluster_path}`")
        if not self.record:  # a read-only ~/.ssh (a Kubernetes Secret): trusted, nothing written
            return
        self._record(names[0], key)
        with self._lock:
            self.warnings.append(f"warning: {shown} is a new host; trusted its key {fp} on first use and added it "
                                 f"to {self.user_path}")

    def _record(self, name: str, key: paramiko.PKey) -> None:
        with self._lock:
            try:
                os.makedirs(os.path.dirname(self.user_path), mode=0o700, exist_ok=True)
                with open(self.user_path, "a", encoding="utf-8") as f:
                    f.write(f"{name} {key.get_name()} {key.get_base64()}\n")
            except OSError as e:
                self.warnings.append(f"warning: could not record the host key of {name} in {self.user_path}: {e.strerror}")

    def bound(self, host: str, port: int, address: str | None) -> paramiko.MissingHostKeyPolicy:
        """The policy for one connection, knowing the name from -H, the port and the address."""
        policy = self

        class _Bound(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
                policy.check(host, port, address, key)

        return _Bound()
