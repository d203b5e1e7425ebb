"""PMI-1, the process manager interface of MPICH's and Intel MPI's hydra (``mpiexec.hydra``), as
a client of its text wire protocol over the socket the process inherited.

What it owns: ``exchange``: ``cmd=init pmi_version=1 pmi_subversion=1``, ``cmd=get_maxes``,
``cmd=get_my_kvsname``, ``cmd=put`` of this rank's values, ``cmd=barrier_in`` (every rank),
``cmd=get`` of the values (the key space is the job's: one rank's keys are everyone's),
``cmd=finalize``. Values go hex-encoded (PMI-1 values cannot hold spaces or '=').

Env vars read (set by hydra): PMI_FD (the inherited socket), else PMI_PORT (host:port) with
PMI_ID; PMI_RANK, PMI_SIZE. Failure modes: ``Pmi1Error`` (a ``ConfigError``) naming the
variable or the command that failed and the server's reply; a server silent for ``timeout``
seconds is one such line, not a hang.
"""
from __future__ import annotations

import os
import socket
from typing import Mapping, Sequence

from appliance.common.knobs import ConfigError


class Pmi1Error(ConfigError):
    """The PMI-1 server cannot be reached or refused a command; the message says which."""


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
        except (OSError, ValueError) as e:
            raise Pmi1Error(f"cannot reach the PMI-1 server (PMI_FD={fd!r}, PMI_PORT={env.get('PMI_PORT')!r}): {e}") from None
        self.sock.settimeout(timeout)
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
        self.sock.sendall(line.encode() + b"\n")

    def recv(self) -> dict:
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(4096)
            except socket.timeout:
                self.broken = True
                raise Pmi1Error("the PMI-1 server did not answer in time") from None
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
        self.call("cmd=barrier_in", "barrier_out")

    def get(self, key: str) -> str:
        r = self.call(f"cmd=get kvsname={self.kvsname} key={key}", "get_result")
        return bytes.fromhex(r.get("value", "")).decode()


def exchange(env: Mapping[str, str], publish: Mapping[str, str], keys: Sequence[str]) -> dict[str, str]:
    """Publish ``publish`` (one rank's values), wait for every rank, return the values of ``keys``."""
    with Client(env) as c:
        for key, value in publish.items():
            c.put(key, value)
        c.barrier()
        return {k: c.get(k) for k in keys}
