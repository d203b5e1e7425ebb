"""PMI-1, the process manager interface of MPICH's and Intel MPI's hydra (``mpiexec.hydra``), as
a client of its text wire protocol over the socket the process inherited.

What it owns: ``exchange``: ``cmd=init pmi_version=1 pmi_subversion=1``, ``cmd=get_maxes``,
``cmd=get_my_kvsname``, ``cmd=put`` of this rank's values, ``cmd=barrier_in`` (every rank),
``cmd=get`` of the values (the key space is the job's: one rank's keys are everyone's),
``cmd=finalize``. Values go hex-encoded (PMI-1 values cannot hold spaces or '='). Each rank also
puts a claim on its rank (``appliance.rank.N``: host and pid) and reads it back after the
barrier: a claim that another process overwrote means two processes hold one PMI_RANK.

Env vars read (set by hydra): PMI_FD (the inherited socket), else PMI_PORT (host:port) with
PMI_ID; PMI_RANK, PMI_SIZE. Failure modes: ``Pmi1Error`` (a ``ConfigError``) naming the
variable or the command that failed and the server's reply; a server silent for ``timeout``
seconds is one such line, not a hang; ``Pmi1Timeout`` (a ``Pmi1Error``) when that silence was
the barrier (some rank did not arrive: PMI-1 does not say which).
"""
from __future__ import annotations

import os
import socket
import time
from typing import Callable, Mapping, Sequence

from appliance.common.knobs import ConfigError


ABORT_GRACE_S = 3.0  # how long a rank that asked hydra to abort the job waits to be killed
FORWARD_S = 1.0      # what hydra gets to forward a failing rank's last line before the abort (it lost it at once)


class Pmi1Error(ConfigError):
    """The PMI-1 server cannot be reached or refused a command; the message says which."""


class Pmi1Timeout(Pmi1Error):
    """The barrier did not complete within the client's timeout."""


class Client:
    """One connection to the PMI-1 server (a context manager: closed, after ``finalize``, on exit)."""

    def __init__(self, env: Mapping[str, str], timeout: float = 600.0):
        fd = env.get("PMI_FD")
        if not fd and not env.get("PMI_PORT"):
            raise Pmi1Error("neither PMI_FD nor PMI_PORT is set: not started by a PMI-1 process manager")
        try:
            if fd:
                self.sock = socket.socket(fileno=os.dup(int(fd)))
            else:
                host, _, port = env["PMI_PORT"].rpartition(":")
                self.sock = socket.create_connection((host, int(port)), timeout=timeout)
            if self.sock.type != socket.SOCK_STREAM:
                raise OSError(f"descriptor {fd} is not a stream socket")
        except (OSError, ValueError) as e:
            raise Pmi1Error(f"cannot reach the PMI-1 server (PMI_FD={fd!r}, PMI_PORT={env.get('PMI_PORT')!r}): {e}") from None
        self.timeout = max(timeout, 0.001)
        self.sock.settimeout(self.timeout)
        self.buf = b""
        self.broken = False  # a reply failed to come: no finalize on the way out
        if not fd:
            self.send(f"cmd=initack pmiid={env.get('PMI_ID', '')}")
            self.expect("initack")
            for _ in range(3):  # the server follows with rank, size and debug
                self.recv()
        r = self.call("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init")
        if r.get("rc", "0") != "0":
            raise Pmi1Error(f"the PMI-1 server refused version 1.1: {r}")
        self.maxes = self.call("cmd=get_maxes", "maxes")
        self.kvsname = self.call("cmd=get_my_kvsname", "my_kvsname")["kvsname"]

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None and not self.broken:
                self.call("cmd=finalize", "finalize_ack")
        finally:
            self.sock.close()

    def send(self, line: str) -> None:
        try:
            self.sock.sendall(line.encode() + b"\n")
        except OSError as e:
            self.broken = True
            raise Pmi1Error(f"cannot write to the PMI-1 server: {e}") from None

    def recv(self) -> dict:
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(4096)
            except socket.timeout:
                self.broken = True
                raise Pmi1Error(f"the PMI-1 server did not answer within {self.timeout:g} s") from None
            except OSError as e:
                self.broken = True
                raise Pmi1Error(f"cannot read from the PMI-1 server: {e}") from None
            if not chunk:
                self.broken = True
                raise Pmi1Error("the PMI-1 server closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return dict(f.split("=", 1) for f in line.decode().split() if "=" in f)

    def expect(self, cmd: str) -> dict:
        r = self.recv()
        if r.get("cmd") != cmd:
            raise Pmi1Error(f"the PMI-1 server answered {r} where cmd={cmd} was due")
        return r

    def call(self, line: str, reply: str) -> dict:
        self.send(line)
        r = self.expect(reply)
        if r.get("rc", "0") != "0":
            raise Pmi1Error(f"PMI-1 {line.split()[0]} failed: {r.get('msg', r)}")
        return r

    def put(self, key: str, value: str) -> None:
        self.call(f"cmd=put kvsname={self.kvsname} key={key} value={value.encode().hex()}", "put_result")

    def barrier(self) -> None:
        try:
            self.call("cmd=barrier_in", "barrier_out")
        except Pmi1Error as e:
            if "did not answer within" in str(e):
                raise Pmi1Timeout(str(e)) from None
            raise

    def abort(self, code: int = 1) -> None:
        """Ask hydra to end the whole job (it kills every rank): a rank whose failure its peers
        cannot see (hydra does not end a job when one rank exits with an error)."""
        try:
            self.sock.sendall(f"cmd=abort exitcode={code}\n".encode())
        except OSError:
            pass

    def get(self, key: str) -> str:
        r = self.call(f"cmd=get kvsname={self.kvsname} key={key}", "get_result")
        return bytes.fromhex(r.get("value", "")).decode()


def exchange(env: Mapping[str, str], publish: Mapping[str, str], keys: Sequence[str],
             timeout: float = 600.0, rank: int | None = None,
             on_fail: Callable[[Pmi1Error], None] | None = None) -> dict[str, str]:
    """Publish ``publish`` (one rank's values), wait up to ``timeout`` s for every rank, return the
    values of ``keys``. With ``rank``: Pmi1Error when another process claims the same rank.
    ``on_fail``: called with a failure after the server answered (a barrier that timed out, two
    claims of one rank); the job is then aborted through hydra, and the error raised if this
    process still runs ``ABORT_GRACE_S`` later."""
    with Client(env, timeout) as c:
        try:
            mine = f"{socket.gethostname()} pid {os.getpid()}"
            if rank is not None:
                c.put(f"appliance.rank.{rank}", mine)
            for key, value in publish.items():
                c.put(key, value)
            c.barrier()
            if rank is not None and (other := c.get(f"appliance.rank.{rank}")) != mine:
                c.broken = True
                raise Pmi1Error(f"two processes claim PMI_RANK={rank}: this one ({mine}) and {other}")
            return {k: c.get(k) for k in keys}
        except Pmi1Error as e:
            if on_fail is not None:
                on_fail(e)
                time.sleep(FORWARD_S)  # hydra forwards the line before the abort tears its pipes down
                c.abort(1)
                time.sleep(ABORT_GRACE_S)  # hydra kills the job's processes, this one with them
            raise
