"""SSH to other hosts with paramiko: who to be, how to connect, and why it failed.

What it owns:
- ``resolve_target()``: the name from ``-H`` -> ``Target`` (address, port, user, key files,
  whether an agent may be used), merging flags/knobs with ``~/.ssh/config`` (``HostName``,
  ``Port``, ``User``, ``IdentityFile``, ``IdentityAgent``). Keys: ``-i``/``APPLIANCE_SSH_KEY``,
  else ``SHARED/ssh/id_ed25519`` when it exists, else the config's ``IdentityFile``s, else
  ``~/.ssh/id_{ed25519,ecdsa,rsa}``. Like ``ssh -o BatchMode=yes``: keys only, never a password
  or a prompt; an agent only when ``~/.ssh/config`` names one with ``IdentityAgent``.
- ``connect()``: TCP first (so "refused" and "timed out" are told apart), then the SSH handshake
  with the host key policy of ``hostkeys.py``, then public-key auth, all within one deadline.
  Every failure is an ``SSHFailure`` with the step (``resolve``, ``tcp``, ``ssh``, ``hostkey``,
  ``auth``) and one actionable sentence.
- ``Connection``: one host's connections (a context manager). ``exec(argv, stdin)`` runs a
  command built with ``shlex.join`` (never a hand-joined string) and returns (status, stdout,
  stderr); ``open_session()`` hands out channels for long-lived remote ranks, opening another
  connection when one carries ``MAX_SESSIONS`` channels (sshd's ``MaxSessions`` defaults to 10).
  Closing it closes every channel, which makes every remote stub stop its rank.

Env vars: none read directly (``RemoteConfig`` carries the knobs; ``HOME`` locates ``~/.ssh``).
Failure modes: ``SSHFailure`` as above; nothing here waits without a deadline.
"""
from __future__ import annotations

import dataclasses
import errno
import getpass
import logging
import os
import shlex
import socket
import threading
import time
from typing import Sequence

import paramiko

from ..config import RemoteConfig
from .hostkeys import HostKeyPolicy, HostKeyRejected

# paramiko logs transport errors (with tracebacks) that we report as one classified line each;
# a NullHandler keeps them off stderr unless the application configures logging itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")
MAX_SESSIONS = 8
KEEPALIVE_S = 10


class SSHFailure(RuntimeError):
    """Reaching a host failed at ``step``; ``str()`` is one actionable sentence naming the host."""

    def __init__(self, host: str, step: str, message: str):
        super().__init__(message)
        self.host, self.step = host, step


@dataclasses.dataclass(frozen=True)
class Target:
    host: str                 # the name from -H
    hostname: str             # what to connect to (~/.ssh/config HostName, else host)
    port: int
    user: str
    keys: tuple[str, ...]     # private key files to offer, in order
    allow_agent: bool
    address: str = ""         # resolved (filled by connect)

    @property
    def shown(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def _ssh_config(host: str) -> dict:
    path = os.path.expanduser("~/.ssh/config")
    if not os.path.isfile(path):
        return {}
    try:
        return dict(paramiko.SSHConfig.from_path(path).lookup(host))
    except (OSError, paramiko.SSHException, ValueError):
        return {}


def resolve_target(host: str, remote: RemoteConfig) -> Target:
    cfg = _ssh_config(host)
    port = remote.port or int(cfg.get("port", 22))
    user = remote.user or cfg.get("user") or getpass.getuser()
    shared_key = os.path.join(remote.shared_dir, "ssh", "id_ed25519")
    if remote.key:
        keys: list[str] = [os.path.expanduser(remote.key)]
    elif os.path.isfile(shared_key):
        keys = [shared_key]
    else:
        keys = [os.path.expanduser(k) for k in cfg.get("identityfile", []) if os.path.isfile(os.path.expanduser(k))]
        keys = keys or [p for p in (os.path.expanduser(f"~/.ssh/{k}") for k in DEFAULT_KEYS) if os.path.isfile(p)]
    # The agent (at $SSH_AUTH_SOCK) only when ~/.ssh/config asks for one for this host.
    agent = cfg.get("identityagent", "none").lower() != "none" and not remote.key
    return Target(host=host, hostname=cfg.get("hostname", host), port=port, user=user, keys=tuple(keys),
                  allow_agent=agent)


def resolve_address(name: str, port: int) -> str:
    """An address of ``name``, IPv4 preferred; raises ``socket.gaierror``."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return infos[0][4][0]


def _tcp(target: Target, timeout: float) -> socket.socket:
    host, port = target.host, target.port
    try:
        return socket.create_connection((target.address, port), timeout=max(timeout, 0.01))
    except ConnectionRefusedError:
        raise SSHFailure(host, "tcp", (
            f"{host}:{port} refused the connection: no SSH server listens on port {port} there (start it: "
            f"`appliance secondary --ssh-port {port}` on {host}, or pass the port its sshd uses with -p)")) from None
    except socket.timeout:
        raise SSHFailure(host, "tcp", (
            f"{host}:{port} ({target.address}) did not answer within {timeout:.1f} s: the host is down or a "
            f"firewall drops port {port} (check `ping {target.address}` and the firewall)")) from None
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
            raise SSHFailure(host, "tcp", (
                f"{host}:{port} ({target.address}) is unreachable ({e.strerror}): the host is down or there is "
                "no route to it (check that it is up and its address)")) from None
        raise SSHFailure(host, "tcp", f"{host}:{port} ({target.address}): cannot connect: {e.strerror}") from None


def _open_client(target: Target, policy: HostKeyPolicy, deadline: float) -> paramiko.SSHClient:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise SSHFailure(target.host, "tcp", f"{target.host}:{target.port}: no time left to connect")
    sock = _tcp(target, remaining)
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(policy.bound(target.host, target.port, target.address))
    remaining = max(deadline - time.monotonic(), 0.5)
    try:
        client.connect(target.hostname, port=target.port, username=target.user, sock=sock,
                       key_filename=list(target.keys) or None, look_for_keys=False, allow_agent=target.allow_agent,
                       timeout=remaining, banner_timeout=remaining, auth_timeout=remaining,
                       channel_timeout=remaining)
    except HostKeyRejected as e:
        client.close()
        raise SSHFailure(target.host, "hostkey", str(e)) from None
    except paramiko.PasswordRequiredException:
        client.close()
        raise SSHFailure(target.host, "auth", (
            f"{target.shown}: the key {', '.join(target.keys)} is protected by a passphrase and the launcher cannot "
            "prompt: use an unencrypted key (`appliance keys --shared DIR` makes one) or an agent named by "
            "IdentityAgent in ~/.ssh/config")) from None
    except paramiko.AuthenticationException:
        client.close()
        if not target.keys and not target.allow_agent:
            msg = (f"{target.shown}: no SSH key to offer: pass -i KEY, or run `appliance keys --shared DIR` and "
                   "use that shared directory")
        else:
            offered = ", ".join(target.keys) or "the agent's keys"
            pub = f"{target.keys[0]}.pub" if target.keys else "the public key"
            msg = (f"{target.shown} did not accept the key {offered}: add {pub} to ~{target.user}/.ssh/authorized_keys "
                   f"on {target.host} (the appliance's secondary reads SHARED/ssh/authorized_keys at start), or "
                   "pass the right key with -i")
        raise SSHFailure(target.host, "auth", msg) from None
    except (socket.timeout, TimeoutError):
        client.close()
        raise SSHFailure(target.host, "ssh", (
            f"{target.host}:{target.port} accepted TCP but the SSH handshake did not finish in time (an overloaded "
            "sshd, MaxStartups, or not an SSH server)")) from None
    except (paramiko.SSHException, EOFError, OSError, ValueError) as e:
        client.close()
        text = str(e) or type(e).__name__
        if "no authentication methods" in text.lower():
            raise SSHFailure(target.host, "auth", (
                f"{target.shown}: no SSH key to offer: pass -i KEY, or run `appliance keys --shared DIR` and use "
                "that shared directory")) from None
        if "banner" in text.lower():
            text = f"no SSH banner ({text}): is port {target.port} an SSH server?"
        raise SSHFailure(target.host, "ssh", f"{target.host}:{target.port}: SSH failed: {text}") from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_S)
    return client


def resolve(host: str, remote: RemoteConfig) -> Target:
    """``resolve_target`` plus the address; raises ``SSHFailure`` (step ``resolve``)."""
    target = resolve_target(host, remote)
    try:
        address = resolve_address(target.hostname, target.port)
    except (socket.gaierror, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise SSHFailure(host, "resolve", (
            f"{host} does not resolve ({reason}): fix DNS or /etc/hosts on this machine, or give its IP "
            "address in -H / the hostfile")) from None
    return dataclasses.replace(target, address=address)


def connect(target: Target, policy: HostKeyPolicy, deadline: float) -> "Connection":
    """Reach a resolved ``target`` by SSH before ``deadline`` (``time.monotonic()``)."""
    for key in target.keys:
        if not os.access(key, os.R_OK):
            raise SSHFailure(target.host, "auth",
                             f"{target.shown}: cannot read the SSH key {key} (give an existing key with -i)")
    return Connection(target, policy, _open_client(target, policy, deadline))


class Connection:
    """The SSH connection(s) to one host; ``with`` closes them all."""

    def __init__(self, target: Target, policy: HostKeyPolicy, client: paramiko.SSHClient):
        self.target, self._policy = target, policy
        self._clients: list[list] = [[client, 0]]  # [client, open channels]
        self._lock = threading.Lock()
        self._closed = False

    @property
    def local_address(self) -> str:
        """Our side of the connection: the primary's address as this host sees it."""
        transport = self._clients[0][0].get_transport()
        return transport.sock.getsockname()[0] if transport is not None else ""

    def alive(self) -> bool:
        return not self._closed and any(
            (t := c.get_transport()) is not None and t.is_active() for c, _ in self._clients)

    def open_session(self, timeout: float = 20.0) -> tuple[paramiko.Channel, object]:
        """A new session channel and a token for ``release()``; may open another connection."""
        with self._lock:
            if self._closed:
                raise SSHFailure(self.target.host, "ssh", f"{self.target.host}: the connection is closed")
            entry = next((e for e in self._clients if e[1] < MAX_SESSIONS
                          and (t := e[0].get_transport()) is not None and t.is_active()), None)
            if entry is None:
                entry = [_open_client(self.target, self._policy, time.monotonic() + timeout), 0]
                self._clients.append(entry)
            entry[1] += 1
        transport = entry[0].get_transport()
        try:
            if transport is None:
                raise paramiko.SSHException("not connected")
            chan = transport.open_session(timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.release(entry)
            raise SSHFailure(self.target.host, "ssh",
                             f"{self.target.host}: cannot open an SSH session: {e or type(e).__name__}") from None
        return chan, entry

    def release(self, token: object) -> None:
        with self._lock:
            token[1] -= 1  # type: ignore[index]

    def exec(self, argv: Sequence[str], stdin: bytes = b"", timeout: float = 20.0) -> tuple[int, bytes, bytes]:
        """Run ``argv`` on the host (through the login shell, quoted with ``shlex``) and collect it all."""
        deadline = time.monotonic() + timeout
        chan, token = self.open_session(timeout)
        try:
            chan.settimeout(max(timeout, 0.1))
            chan.exec_command(shlex.join([str(a) for a in argv]))
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            while True:
                if time.monotonic() > deadline:
                    raise socket.timeout()
                chan.settimeout(max(deadline - time.monotonic(), 0.01))
                data = chan.recv(1 << 16)
                if not data:
                    break
                out += data
            while True:
                chan.settimeout(max(deadline - time.monotonic(), 0.01))
                data = chan.recv_stderr(1 << 16)
                if not data:
                    break
                err += data
            while not chan.exit_status_ready():
                if time.monotonic() > deadline:
                    raise socket.timeout()
                time.sleep(0.005)
            return chan.recv_exit_status(), bytes(out), bytes(err)
        except (socket.timeout, TimeoutError):
            raise SSHFailure(self.target.host, "exec", (
                f"{self.target.host}: `{shlex.join([str(a) for a in argv])[:80]}` did not finish within "
                f"{timeout:.1f} s")) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise SSHFailure(self.target.host, "exec", f"{self.target.host}: SSH command failed: {e}") from None
        finally:
            chan.close()
            self.release(token)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients = [c for c, _ in self._clients]
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing a broken transport must not mask the real error
                pass

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
