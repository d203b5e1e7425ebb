"""Inside the primary container: check every host, then run the launcher; ``python -m appliance.cluster.driver JOB_DIR``.

What it owns: the job directory's ``hosts/<host>.json`` (per host: ``local``, ``reachable``,
``address``, ``authenticated``, ``error``), ``exit.json`` (``returncode``, ``ended``) and the
argument list given to ``appliance launch``. ``appliance primary`` (on the host) writes
``job.json`` (hosts and slots, -np, the launcher's flags, the command, SSH port, shared dir,
network) and starts this as the primary container's main process. Steps:

1. Every host of -H that is not this container: wait up to ``secondary_wait_s`` for its SSH
   port to accept a TCP connection (a secondary that is still starting is waited for), then
   authenticate with the cluster key (``SHARED/ssh/id_ed25519``), all hosts in parallel. A host
   that fails stops the job before any rank starts, with one line that says what to run there.
2. ``appliance launch`` with the user's flags, ``-p PORT`` when there are other hosts,
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
import signal
import socket
import sys
import threading
import time
from typing import Any

from .shared import read_json, write_json

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


def _authenticate(host: str, address: str, port: int, key: str, timeout_s: float) -> str:
    """"" when the cluster key logs in as root on host:port, else the reason."""
    import paramiko

    class _Accept(paramiko.MissingHostKeyPolicy):  # the launcher verifies host keys; this only probes auth
        def missing_host_key(self, client, hostname, key):  # noqa: D401
            return None

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_Accept())
    try:
        client.connect(address, port=port, username="root", key_filename=key, look_for_keys=False,
                       allow_agent=False, timeout=timeout_s, banner_timeout=timeout_s, auth_timeout=timeout_s)
        return ""
    except paramiko.AuthenticationException:
        return "the cluster key was refused"
    except (paramiko.SSHException, OSError) as e:
        return f"SSH failed: {e}"
    finally:
        client.close()


def check_hosts(job: dict, job_dir: str) -> list[str]:
    """Run step 1 for every host in parallel; the failure lines (empty: all ready)."""
    from ..launcher.executors import LaunchError, is_local_host

    port, shared = int(job["ssh_port"]), job["shared"]
    key = os.path.join(shared, "ssh", "id_ed25519")
    checks: list[HostCheck] = []
    for h in job["hosts"]:
        try:
            local = is_local_host(h["name"])
        except LaunchError:
            local = False  # does not resolve (yet): the TCP wait below reports it
        checks.append(HostCheck(job_dir, h["name"], local))
    failures: list[str] = []
    lock = threading.Lock()
    if job.get("network", "host") == "host":
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
        reason = _authenticate(name, address, port, key, 10.0)
        check.update(authenticated=not reason, error=reason)
        if reason:
            with lock:
                failures.append(f"{name}:{port}: {reason}: its secondary must use the same shared directory "
                                f"({shared}, whose ssh/authorized_keys holds ssh/id_ed25519.pub); restart it with: "
                                f"{how.replace('HOST', name)}")

    threads = [threading.Thread(target=one, args=(c,), name=f"check {c.facts['host']}", daemon=True) for c in checks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def launch_argv(job: dict, job_dir: str, remote: bool) -> list[str]:
    flags = list(job["launch_args"])
    if remote and not any(f in ("-p", "--ssh-port") or f.startswith("--ssh-port=") for f in flags):
        flags += ["-p", str(job["ssh_port"])]
    if not any(f == "--output-filename" or f.startswith("--output-filename=") for f in flags):
        flags += ["--output-filename", os.path.join(job_dir, "logs")]
    wrapped = [sys.executable, "-m", "appliance.cluster.rankexec", job_dir, "--", *job["command"]]
    return ["launch", *flags, "--", *wrapped]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m appliance.cluster.driver JOB_DIR", file=sys.stderr)
        return 2
    job_dir = argv[0]
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
        remote = any(not (read_json(os.path.join(job_dir, "hosts", f"{h['name']}.json")) or {}).get("local")
                     for h in job["hosts"])
        from ..cli import main as cli_main

        code = cli_main(launch_argv(job, job_dir, remote))
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
