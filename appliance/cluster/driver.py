"""Inside the primary container: check every host, then run the launcher; ``python -m appliance.cluster.driver JOB_DIR``.

What it owns: the job directory's ``hosts/<host>.json`` (per host: ``local``, ``reachable``,
``address``, ``authenticated``, ``error``), ``exit.json`` (``returncode``, ``ended``) and the
argument list given to ``appliance launch``. ``appliance primary`` (on the host) writes
``job.json`` (hosts and slots, -np, the launcher's flags, the command, SSH port, shared dir,
network; ``create_job()``) and starts this as the primary container's main process. Without a
host side (compose), ``driver new [-p PORT] [launch flags] -- COMMAND`` makes the cluster keys
(idempotent) and the job directory under APPLIANCE_SHARED itself, then goes on the same way. Steps:

1. Every host of -H that is not this container: wait up to ``secondary_wait_s`` for its SSH
   port to accept a TCP connection (a secondary that is still starting is waited for), then log
   in with the cluster key (``SHARED/ssh/id_ed25519``, host key checked against
   ``SHARED/ssh/known_hosts``; the launcher's SSH layer), all hosts in parallel. A host
   that fails stops the job before any rank starts, with one line that says what to run there.
2. ``appliance launch`` with the user's flags, ``-p PORT`` (unless given),
   ``--output-filename JOB_DIR/logs`` unless given, and the command prefixed by ``rankexec``
   (which records each rank's start and pid in ``ranks/``). The launcher prefixes every line
   with its rank, stops every rank on every host at the first failure or on SIGINT/SIGTERM
   (forwarded by the container's init), and its exit code is the container's.

Env vars: APPLIANCE_SHARED (via ``ClusterConfig``; the image sets it). Failure modes: exit 1 with
``appliance primary: HOST: ...`` lines when a host is unreachable or refuses the key; otherwise
the launcher's exit code (130 when interrupted).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import threading
import time
from typing import Any, Sequence

from ..mount import read_json, write_json

SAY = "appliance primary:"


def _say(text: str) -> None:
    print(f"{SAY} {text}", file=sys.stderr, flush=True)


class HostCheck:
    """One host's startup facts, written to ``hosts/<name>.json`` whenever they change."""

    def __init__(self, job_dir: str, name: str, local: bool):
        self.path = os.path.join(job_dir, "hosts", f"{name}.json")
        self.facts: dict[str, Any] = {"host": name, "local": local, "reachable": None, "authenticated": None,
                                      "address": "", "error": ""}

    def update(self, **kw: Any) -> None:
        self.facts.update(kw, updated=time.time())
        write_json(self.path, self.facts)

    @property
    def ok(self) -> bool:
        return bool(self.facts["reachable"] and self.facts["authenticated"])


def _wait_tcp(host: str, port: int, wait_s: float) -> tuple[str, str]:
    """(address, "") once host:port accepts a connection, else ("", reason) after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    reason = ""
    while True:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            address = infos[0][4][0]
            with socket.create_connection((address, port), timeout=min(3.0, max(wait_s, 0.5))):
                return address, ""
        except socket.gaierror as e:
            reason = f"the name does not resolve ({e.strerror})"
        except ConnectionRefusedError:
            reason = "connection refused"
        except OSError as e:
            reason = e.strerror or str(e)
        if time.monotonic() >= deadline:
            return "", reason
        time.sleep(0.25)


def _authenticate(host: str, port: int, shared: str, timeout_s: float) -> str:
    """"" when the cluster key (``SHARED/ssh/id_ed25519``) logs in on host:port and the host key
    matches ``SHARED/ssh/known_hosts`` (the launcher's own SSH layer decides both), else why not."""
    from ..config import RemoteConfig
    from ..launcher.hostkeys import HostKeyPolicy
    from ..launcher.ssh import SSHFailure, connect, resolve

    remote = RemoteConfig.create(port=port, shared=shared)
    try:
        conn = connect(resolve(host, remote), HostKeyPolicy(os.path.join(shared, "ssh", "known_hosts")),
                       time.monotonic() + timeout_s)
    except SSHFailure as e:
        return str(e)
    conn.close()
    return ""


def check_hosts(job: dict, job_dir: str) -> list[str]:
    """Run step 1 for every host in parallel; the failure lines (empty: all ready)."""
    from ..launcher.executors import LaunchError, is_local_host

    port, shared = int(job["ssh_port"]), job["shared"]
    checks: list[HostCheck] = []
    for h in job["hosts"]:
        try:
            local = is_local_host(h["name"])
        except LaunchError:
            local = False  # does not resolve (yet): the TCP wait below reports it
        checks.append(HostCheck(job_dir, h["name"], local))
    failures: list[str] = []
    lock = threading.Lock()
    if not job.get("network"):  # `driver new`: no appliance CLI on the host (compose)
        how = "its secondary container must run `secondary --port {port}` with this share (compose: service HOST)"
        how = how.format(port=port)
    elif job["network"] == "host":
        how = f"appliance secondary --ssh-port {port} --shared {shared}"
    else:
        how = f"appliance secondary --ssh-port {port} --shared {shared} --network {job['network']} --name HOST"

    def one(check: HostCheck) -> None:
        name = check.facts["host"]
        if check.facts["local"]:
            check.update(reachable=True, authenticated=True, address="local")
            return
        address, reason = _wait_tcp(name, port, float(job.get("secondary_wait_s", 20.0)))
        if not address:
            check.update(reachable=False, error=reason)
            with lock:
                failures.append(f"{name}:{port} is not up ({reason}): start its secondary on {name}: "
                                f"{how.replace('HOST', name)}")
            return
        check.update(reachable=True, address=address)
        reason = _authenticate(name, port, shared, 15.0)
        check.update(authenticated=not reason, error=reason)
        if reason:
            with lock:
                failures.append(f"{reason} (its secondary must use this shared directory, {shared}: restart it "
                                f"with {how.replace('HOST', name)})")

    threads = [threading.Thread(target=one, args=(c,), name=f"check {c.facts['host']}", daemon=True) for c in checks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def parse_launch(launch_args: Sequence[str], command: Sequence[str]) -> tuple[Any, list[tuple[str, int]], int]:
    """The launcher's own parser over the flags (so horovodrun's flags mean what they mean to
    ``appliance launch``): (namespace, [(host, slots)], np). Raises SystemExit(2) / ValueError."""
    from ..cli import build_parser
    from ..launcher.hosts import Host, assign_ranks, parse_hosts, read_hostfile

    args = build_parser().parse_args(["launch", *launch_args, "--", *command])
    if args.hosts is not None:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile is not None:
        hosts = read_hostfile(args.hostfile)
    else:
        hosts = [Host("localhost", args.np)]
    assign_ranks(hosts, args.np)  # -np above the slots: HostsError (a ValueError)
    return args, [(h.name, h.slots) for h in hosts], args.np


def create_job(job_dir: str, args: Any, hosts: Sequence[tuple[str, int]], launch_args: Sequence[str],
               command: Sequence[str], *, ssh_port: int, shared: str, network: str, image: str, workdir: str,
               secondary_wait_s: float) -> None:
    """``JOB_DIR/{hosts,ranks,logs}/`` and ``job.json``; a --hostfile is copied into the job
    directory (the primary container sees the share, not the files of the machine it runs on)."""
    for sub in ("hosts", "ranks", "logs"):
        os.makedirs(os.path.join(job_dir, sub), exist_ok=True)
    launch_args = list(launch_args)
    if args.hostfile is not None:
        copy = os.path.join(job_dir, "hostfile")
        shutil.copyfile(args.hostfile, copy)
        for i, a in enumerate(launch_args):
            if a in ("-hostfile", "--hostfile") and i + 1 < len(launch_args):
                launch_args[i + 1] = copy
            elif a.startswith("--hostfile="):
                launch_args[i] = f"--hostfile={copy}"
    write_json(os.path.join(job_dir, "job.json"), {
        "id": os.path.basename(job_dir), "created": time.time(), "primary_host": socket.gethostname(),
        "np": args.np, "hosts": [{"name": n, "slots": s} for n, s in hosts],
        "launch_args": launch_args, "command": list(command), "ssh_port": ssh_port, "shared": shared,
        "network": network, "image": image, "workdir": workdir, "secondary_wait_s": secondary_wait_s})


def new_job(argv: list[str]) -> str:
    """``driver new [--ssh-port P] [launch flags] -- COMMAND`` (compose, or by hand inside a
    container): the cluster keys (idempotent) and a job directory under APPLIANCE_SHARED."""
    from ..config import ClusterConfig
    from .secondary import ensure_cluster_keys
    from ..mount import Layout, new_job_id

    if "--" not in argv:
        raise SystemExit(f"{SAY} usage: python -m appliance.cluster.driver new [-p PORT] [launch flags] -- COMMAND")
    i = argv.index("--")
    flags, command = argv[:i], argv[i + 1:]
    port = None
    for j, f in enumerate(flags):
        if f in ("-p", "--ssh-port") and j + 1 < len(flags):
            port = int(flags[j + 1])
    config = ClusterConfig.create(ssh_port=port)
    layout = Layout(config.shared).ensure()
    ensure_cluster_keys(config.shared)
    args, hosts, _ = parse_launch(flags, command)
    job_dir = layout.job_dir(new_job_id())
    create_job(job_dir, args, hosts, flags, command, ssh_port=config.ssh_port, shared=config.shared,
               network="", image="", workdir=os.getcwd(), secondary_wait_s=config.secondary_wait_s)
    _say(f"job {os.path.basename(job_dir)}: {args.np} ranks on "
         f"{', '.join(f'{n}:{s}' for n, s in hosts)}; job directory {job_dir}")
    return job_dir


def launch_argv(job: dict, job_dir: str) -> list[str]:
    flags = list(job["launch_args"])
    if not any(f in ("-p", "--ssh-port") or f.startswith("--ssh-port=") for f in flags):
        flags += ["-p", str(job["ssh_port"])]
    if not any(f == "--output-filename" or f.startswith("--output-filename=") for f in flags):
        flags += ["--output-filename", os.path.join(job_dir, "logs")]
    wrapped = [sys.executable, "-m", "appliance.cluster.rankexec", job_dir, "--", *job["command"]]
    return ["launch", *flags, "--", *wrapped]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["new"]:
        try:
            job_dir = new_job(argv[1:])
        except ValueError as e:  # bad -H, -np above the slots, bad knob
            _say(f"error: {e}")
            return 2
    elif len(argv) == 1:
        job_dir = argv[0]
    else:
        print("usage: python -m appliance.cluster.driver JOB_DIR | new [-p PORT] [launch flags] -- COMMAND",
              file=sys.stderr)
        return 2
    job = read_json(os.path.join(job_dir, "job.json"))
    if not job:
        _say(f"no readable {job_dir}/job.json (is {job_dir} on the shared mount?)")
        return 2
    code = 1

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _interrupt)  # the launcher installs its own handlers while it runs
    try:
        failures = check_hosts(job, job_dir)
        if failures:
            for line in failures:
                _say(line)
            return code
        from ..cli import main as cli_main

        code = cli_main(launch_argv(job, job_dir))
        return code
    except SystemExit as e:  # the launcher's argument parser
        code = e.code if isinstance(e.code, int) else 2
        return code
    except KeyboardInterrupt:
        code = 130
        return code
    finally:
        write_json(os.path.join(job_dir, "exit.json"), {"returncode": code, "ended": time.time()})


if __name__ == "__main__":
    raise SystemExit(main())
