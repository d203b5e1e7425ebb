"""SSH to other hosts through fabric: who to be, how to connect, and why it failed.

What it owns:
- ``resolve_target()``: the name from ``-H`` -> ``Target``, read through ``fabric.Connection``
  (so ``~/.ssh/config`` and ``/etc/ssh/ssh_config`` apply as OpenSSH applies them: ``HostName``,
  ``Port``, ``User``, ``IdentityFile``, ``ProxyJump``/``ProxyCommand``, ``IdentityAgent``), merged
  with the flags/knobs (which win over the config). Keys: ``-i``/``APPLIANCE_SSH_KEY`` (then
  nothing else, as ``IdentitiesOnly``; in a Kubernetes launcher pod the mounted ``~/.ssh/id_rsa``), else
  ``SHARED/ssh/id_ed25519`` when it exists, else the config's ``IdentityFile``s, else
  ``~/.ssh/id_{ed25519,ecdsa,rsa}``; the first is loaded explicitly whatever its type and name
  (``load_key``); plus the agent's keys
  ($SSH_AUTH_SOCK) unless ``-i`` is given or ``IdentityAgent none``. Like ``ssh -o BatchMode=yes``:
  keys only, never a password or a prompt.
- ``connect()``: TCP first (so "refused" and "timed out" are told apart; through a jump host,
  the jump host's ``direct-tcpip`` channel is that step), then the SSH handshake with the host key
  policy of ``hostkeys.py`` (for the target and every jump host: fabric's own default,
  auto-adding unknown keys, is replaced), then public-key auth, all within one deadline. Every
  failure is an ``SSHFailure`` with the step (``resolve``, ``tcp``, ``ssh``, ``hostkey``,
  ``auth``) and one actionable sentence.
- ``Connection``: one host's ``fabric.Connection``s (a context manager). ``exec(argv, stdin)``
  runs a command built with ``shlex.join`` (never a hand-joined string) and returns (status,
  stdout, stderr); ``open_session()`` hands out session channels of the underlying paramiko
  transport for long-lived remote ranks, opening another connection when one carries
  ``MAX_SESSIONS`` channels (sshd's ``MaxSessions`` defaults to 10). Closing it closes every
  channel and every jump connection, which makes every remote stub stop its rank.

What fabric does not do here, and why: its ``Connection`` trusts unknown host keys
(``AutoAddPolicy``) and does not close jump connections; both are replaced/added below. Its
``run()`` (invoke's runner) feeds stdin from a thread, and when the command exits without reading
all of it (a remote Python that does not exist: exit 127) the whole call fails with a
``ThreadException`` ("Socket is closed") instead of returning the status, so ``exec`` drives the
channel itself and the preflight can say "Python not found there". ``IdentityAgent PATH`` is not
supported (paramiko only reads $SSH_AUTH_SOCK).

Env vars: none read directly (``RemoteConfig`` carries the knobs; ``HOME`` locates ``~/.ssh``,
``SSH_AUTH_SOCK`` the agent). Failure modes: ``SSHFailure`` as above; nothing waits without a
deadline.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import os
import shlex
import socket
import threading
import time
from typing import Sequence

import fabric
import paramiko

from appliance.launcher.config import RemoteConfig
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
    address: str = ""         # resolved (filled by resolve)
    via: str = ""             # jump host(s) (ProxyJump) or "ProxyCommand ...", else ""
    config: fabric.Config | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def shown(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def _fabric_config() -> fabric.Config:
    """fabric's configuration: ``/etc/ssh/ssh_config`` and ``~/.ssh/config`` (read now, from $HOME)."""
    config = fabric.Config(user_ssh_path=os.path.expanduser("~/.ssh/config"))
    # fabric's optional auth strategy (a fabric.yaml may name one) may prompt for passphrases:
    # never in a launcher. Authentication is always the connect kwargs below (keys, agent).
    config.authentication.strategy_class = None
    return config


def _default_keys() -> list[str]:
    return [p for p in (os.path.expanduser(f"~/.ssh/{k}") for k in DEFAULT_KEYS) if os.path.isfile(p)]


def _config_keys(ssh_config) -> list[str]:
    return [os.path.expanduser(k) for k in ssh_config.get("identityfile", []) if os.path.isfile(os.path.expanduser(k))]


def _agent_allowed(ssh_config) -> bool:
    return bool(os.environ.get("SSH_AUTH_SOCK")) and ssh_config.get("identityagent", "").lower() != "none"


def _hops(conn: fabric.Connection) -> list[fabric.Connection]:
    """The jump connections of ``conn``, nearest to the target first."""
    hops, gw = [], conn.gateway
    while isinstance(gw, fabric.Connection):
        hops.append(gw)
        gw = gw.gateway
    return hops


def _fabric_connection_to(host: str, user: str | None, port: int | None, config: fabric.Config) -> fabric.Connection:
    """``fabric.Connection`` with OpenSSH's ``ProxyJump none``/``ProxyCommand none`` meaning "direct"
    (fabric would take ``none`` for a jump host's name)."""
    conn = fabric.Connection(host, user=user, port=port, config=config)
    for c in [conn, *_hops(conn)]:
        if (str(c.ssh_config.get("proxyjump", "")).lower() == "none"
                or (isinstance(c.gateway, str) and c.gateway.lower() == "none")):
            c.gateway = None
    return conn


def _describe_via(conn: fabric.Connection) -> str:
    if isinstance(conn.gateway, str):
        return f"ProxyCommand {(conn.gateway.split() or [''])[0]}"  # the program only: tables stay narrow
    return ",".join(f"{h.user}@{h.original_host}:{h.port}" for h in reversed(_hops(conn)))


def resolve_target(host: str, remote: RemoteConfig) -> Target:
    config = _fabric_config()
    conn = _fabric_connection_to(host, remote.user or None, remote.port or None, config)
    shared_key = os.path.join(remote.shared_dir, "ssh", "id_ed25519")
    if remote.key:
        keys: list[str] = [os.path.expanduser(remote.key)]
    elif os.path.isfile(shared_key):
        keys = [shared_key]
    else:
        keys = _config_keys(conn.ssh_config) or _default_keys()
    return Target(host=host, hostname=conn.host, port=int(conn.port), user=conn.user, keys=tuple(keys),
                  allow_agent=not remote.key and _agent_allowed(conn.ssh_config), via=_describe_via(conn),
                  config=config)


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


def load_key(path: str) -> paramiko.PKey | None:
    """The private key at ``path``, whatever its type and file name (the operators' ECDSA P-521 key is
    named ``id_rsa``, which paramiko's own loading reads as RSA only); None when it cannot be read
    without a passphrase (paramiko then says why, through ``key_filename``)."""
    try:
        return paramiko.PKey.from_path(path)
    except Exception:  # noqa: BLE001 - any failure: left to paramiko's own loading, which names it
        return None


def _connect_kwargs(keys: Sequence[str], allow_agent: bool, remaining: float) -> dict:
    kwargs = dict(look_for_keys=False, allow_agent=allow_agent, timeout=remaining, banner_timeout=remaining,
                  auth_timeout=remaining, channel_timeout=remaining)
    rest = list(keys)
    if rest:
        first = load_key(rest[0])  # loaded explicitly: a refused key is then a plain authentication failure
        if first is not None:
            kwargs["pkey"], rest = first, rest[1:]
    if rest:
        kwargs["key_filename"] = rest
    return kwargs


def _fabric_connection(target: Target, policy: HostKeyPolicy, remaining: float) -> fabric.Connection:
    """A ``fabric.Connection`` to ``target`` (not yet open), with our keys, deadlines and host key policy on
    it and on each of its jump hosts."""
    conn = _fabric_connection_to(target.host, target.user, target.port, target.config or _fabric_config())
    conn.connect_timeout = None  # the deadline goes in connect_kwargs (fabric refuses both)
    conn.connect_kwargs = _connect_kwargs(target.keys, target.allow_agent, remaining)
    conn.client.set_missing_host_key_policy(policy.bound(target.host, target.port, target.address))
    for hop in _hops(conn):
        # A jump host is authenticated as OpenSSH would: its own IdentityFile (or the default keys),
        # and the job's key after them (a bastion of the cluster often accepts it too).
        keys = _config_keys(hop.ssh_config) or _default_keys()
        keys += [k for k in target.keys if k not in keys]
        hop.connect_timeout = None
        hop.connect_kwargs = _connect_kwargs(keys, _agent_allowed(hop.ssh_config), remaining)
        hop.client.set_missing_host_key_policy(policy.bound(hop.original_host, int(hop.port), hop.host))
    return conn


def _close_fabric(conn: fabric.Connection) -> None:
    """Close ``conn`` and its jump connections, also half-open ones (fabric closes only connected ones)."""
    for c in [conn, *_hops(conn)]:
        for close in (c.close, c.client.close, getattr(c.connect_kwargs.get("sock"), "close", None)):
            try:
                if close is not None:
                    close()
            except Exception:  # noqa: BLE001 - closing a broken transport must not mask the real error
                pass


def _classify(e: BaseException, host: str, shown: str, port: int, keys: Sequence[str], allow_agent: bool,
              user: str) -> SSHFailure:
    """An exception of paramiko's handshake/auth with ``host`` -> an ``SSHFailure`` saying what to do."""
    if isinstance(e, HostKeyRejected):
        return SSHFailure(host, "hostkey", str(e))
    if isinstance(e, paramiko.PasswordRequiredException):
        return SSHFailure(host, "auth", (
            f"{shown}: the key {', '.join(keys)} is protected by a passphrase and the launcher cannot "
            "prompt: use an unencrypted key (`appliance keys --shared DIR` makes one) or an agent ($SSH_AUTH_SOCK)"))
    no_key = (f"{shown}: no SSH key to offer: pass -i KEY, or run `appliance keys --shared DIR` and use that "
              "shared directory")
    if isinstance(e, paramiko.AuthenticationException):
        if not keys and not allow_agent:
            return SSHFailure(host, "auth", no_key)
        offered = ", ".join(keys) or "the agent's keys"
        pub = f"{keys[0]}.pub" if keys else "the public key"
        return SSHFailure(host, "auth", (
            f"{shown} did not accept the key {offered}: add {pub} to ~{user}/.ssh/authorized_keys on {host} (the "
            "appliance's secondary reads SHARED/ssh/authorized_keys at start), or pass the right key with -i"))
    if isinstance(e, (socket.timeout, TimeoutError)):
        return SSHFailure(host, "ssh", (
            f"{host}:{port} accepted TCP but the SSH handshake did not finish in time (an overloaded sshd, "
            "MaxStartups, or not an SSH server)"))
    text = str(e) or type(e).__name__
    if "expected" in text and "encountered" in text and keys:  # paramiko trying key classes on a refused key
        return _classify(paramiko.AuthenticationException(text), host, shown, port, keys, allow_agent, user)
    if "no authentication methods" in text.lower():
        return SSHFailure(host, "auth", no_key)
    if "banner" in text.lower():
        text = f"no SSH banner ({text}): is port {port} an SSH server?"
    return SSHFailure(host, "ssh", f"{host}:{port}: SSH failed: {text}")


_HANDSHAKE_ERRORS = (paramiko.SSHException, EOFError, OSError, ValueError)


def _open_jumps(conn: fabric.Connection, target: Target) -> None:
    """Open the jump hosts (fabric opens them too, but then a failure there could not be told apart)."""
    hops = _hops(conn)
    if not hops:
        return
    hop, outer = hops[0], hops[-1]  # opening the nearest hop opens the ones before it (fabric chains them)
    try:
        if not outer.gateway:  # the first hop is reached directly: TCP first, as for any host
            name = outer.original_host
            try:
                address = resolve_address(outer.host, int(outer.port))
            except (socket.gaierror, UnicodeError) as e:
                raise SSHFailure(name, "resolve", f"{name} does not resolve ({getattr(e, 'strerror', None) or e}): "
                                 "fix DNS or /etc/hosts, or its HostName in ~/.ssh/config") from None
            remaining = outer.connect_kwargs.get("timeout") or 10.0
            outer.connect_kwargs["sock"] = _tcp(Target(host=name, hostname=outer.host, port=int(outer.port),
                                                       user=outer.user, keys=(), allow_agent=False, address=address),
                                                remaining)
        hop.open()
    except SSHFailure as e:
        raise SSHFailure(target.host, e.step, f"{target.host}: through the jump host {e.host} ({target.via}): "
                         f"{e}") from None
    except _HANDSHAKE_ERRORS as e:
        shown = f"{hop.user}@{hop.original_host}:{hop.port}"
        f = _classify(e, target.host, shown, int(hop.port), hop.connect_kwargs.get("key_filename") or [],
                      hop.connect_kwargs.get("allow_agent", False), hop.user)
        raise SSHFailure(target.host, f.step, f"{target.host}: through the jump host {hop.original_host} "
                         f"({target.via}): {f}") from None


def _open_client(target: Target, policy: HostKeyPolicy, deadline: float) -> fabric.Connection:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise SSHFailure(target.host, "tcp", f"{target.host}:{target.port}: no time left to connect")
    conn = _fabric_connection(target, policy, remaining)
    try:
        if conn.gateway:
            _open_jumps(conn, target)
        else:
            conn.connect_kwargs["sock"] = _tcp(target, remaining)
        remaining = max(deadline - time.monotonic(), 0.5)
        for key in ("timeout", "banner_timeout", "auth_timeout", "channel_timeout"):
            conn.connect_kwargs[key] = remaining
        try:
            conn.open()  # through the jump host: fabric opens its direct-tcpip channel (bounded by channel_timeout)
        except paramiko.ChannelException as e:
            raise SSHFailure(target.host, "tcp", (
                f"{target.host}:{target.port}: the jump host ({target.via}) could not connect to "
                f"{target.hostname}:{target.port} ({e.text or e.code}): no SSH server listens there, or the host is "
                "down (check it from the jump host)")) from None
        except _HANDSHAKE_ERRORS as e:
            raise _classify(e, target.host, target.shown, target.port, target.keys, target.allow_agent,
                            target.user) from None
    except BaseException:
        _close_fabric(conn)
        raise
    transport = conn.client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_S)
    return conn


def resolve(host: str, remote: RemoteConfig) -> Target:
    """``resolve_target`` plus the address, looked up once (an unknown name fails at once, never
    retried); raises ``SSHFailure`` (step ``resolve``). A host behind a jump host must resolve here
    too: its ranks exchange data with the others directly, not through SSH."""
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
    """The SSH connection(s) to one host, each a ``fabric.Connection``; ``with`` closes them all."""

    def __init__(self, target: Target, policy: HostKeyPolicy, conn: fabric.Connection):
        self.target, self._policy = target, policy
        self._links: list[list] = [[conn, 0]]  # [fabric.Connection, open channels]
        self._lock = threading.Lock()
        self._closed = False

    @property
    def local_address(self) -> str:
        """Our side of the connection: the primary's address as this host sees it (through a jump
        host: this machine's source address of its route to the host)."""
        transport = self._links[0][0].client.get_transport()
        sock = transport.sock if transport is not None else None
        if isinstance(sock, socket.socket):
            return sock.getsockname()[0]
        from .probe import route_get
        return route_get(self.target.address).get("src", "") if self.target.address else ""

    def alive(self) -> bool:
        return not self._closed and any(c.is_connected for c, _ in self._links)

    def open_session(self, timeout: float = 20.0) -> tuple[paramiko.Channel, object]:
        """A new session channel and a token for ``release()``; may open another connection."""
        with self._lock:
            if self._closed:
                raise SSHFailure(self.target.host, "ssh", f"{self.target.host}: the connection is closed")
            entry = next((e for e in self._links if e[1] < MAX_SESSIONS and e[0].is_connected), None)
            if entry is None:
                entry = [_open_client(self.target, self._policy, time.monotonic() + timeout), 0]
                self._links.append(entry)
            entry[1] += 1
        # Long-lived channels come straight from the transport (fabric's own run() is for commands
        # that end; a rank's stub talks a framed protocol both ways for the whole job).
        transport = entry[0].client.get_transport()
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
            links = [c for c, _ in self._links]
        for c in links:
            _close_fabric(c)

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
