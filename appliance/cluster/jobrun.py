"""Inside the primary container, the job runner: a job directory's job, run with the launcher.

``python -m appliance.cluster.jobrun JOB_DIR``, or ``... jobrun new [-p PORT] [flags] -- COMMAND``.

What it owns: the job directory's ``job.json`` format (``create_job()``: hosts and slots (none for
an elastic job that discovers them: ``discover.sh``, the secondaries registered on the share), -np,
the user's launch flags as a ``launcher.flags.LaunchFlags`` under ``launch``, the command, SSH
port, shared dir, network, ``secondary_wait_s``), its ``hosts/<host>.json`` (per host: ``local``,
``reachable``, ``address``, ``authenticated``, ``error``; the startup view ``view.py`` reads
them) and ``exit.json`` (``returncode``, ``ended``), and the ``LaunchConfig`` the job runs with
(``job_config()``): the user's flags, ``-p`` the job's SSH port and ``--output-filename
JOB_DIR/logs`` unless given, the shared directory, the command prefixed by ``rankexec`` (which
records each rank's start and pid in ``ranks/``), ``RemoteConfig.host_wait_s`` =
``secondary_wait_s``, and APPLIANCE_RECORD_DIR = the job directory (the launcher's record of the
job: metrics.jsonl, TensorBoard events, report.png, live.json). ``appliance primary`` (on the host) writes ``job.json`` and starts this as
the primary container's main process. Without a host side (compose), ``jobrun new [-p PORT]
[launch flags] -- COMMAND`` makes the cluster keys (idempotent) and the job directory under
APPLIANCE_SHARED itself, then goes on the same way.

The job is one call, ``appliance.launcher.run(config, on_host_report=...)``: its preflight
checks every host once, in parallel (a secondary that is still starting is waited for up to
``secondary_wait_s``; TCP, SSH login with the cluster key ``SHARED/ssh/id_ed25519``, host key
against ``SHARED/ssh/known_hosts``, Python, share...), and each host's report becomes
``hosts/<host>.json``. A host that fails stops the job before any rank starts: the launcher's
failure lines, then for each host that is not up (or refuses the cluster key) one line saying
what to run there. Then the launcher prefixes every line with its rank, stops every rank on
every host at the first failure or on SIGINT/SIGTERM (forwarded by the container's init), and
its exit code is the container's.

Env vars: APPLIANCE_SHARED (via ``ClusterConfig``; the image sets it). Failure modes: exit 1
with ``appliance primary:`` lines when a host is not usable; exit 2 for flags or hosts the
launcher rejects; otherwise the launcher's exit code (130 when interrupted).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import sys
import threading
import time
from typing import Any, Sequence

from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig
from ..launcher import LaunchError, run
from ..launcher.flags import LaunchFlags, parse_launch_flags, with_defaults
from ..launcher.hosts import assign_ranks, hosts_from
from ..mount import read_json, write_json
from .discover import write_script
from .say import PREFIX, say

def discovers_secondaries(flags: LaunchFlags) -> bool:
    """Whether the job's hosts are the secondaries registered on the share: elastic flags
    (``--min-np``/``--max-np``) and no -H, hostfile or discovery script of the user's."""
    return flags.elastic and flags.hosts is None and flags.hostfile is None and flags.host_discovery_script is None


def job_hosts(flags: LaunchFlags) -> list[tuple[str, int]] | None:
    """[(host, slots)] of -H, the hostfile, else ``localhost:np``; checks that -np fits the slots.
    None for a job that discovers its hosts (a discovery script, or the registered secondaries).
    Raises ``HostsError`` (a ValueError)."""
    if flags.np is None:
        raise ConfigError("-np is required: the number of ranks to start")
    if flags.host_discovery_script is not None or discovers_secondaries(flags):
        return None
    hosts = hosts_from(flags.hosts, flags.hostfile, None, flags.np)
    assign_ranks(hosts, flags.np)  # -np above the slots: HostsError
    return [(h.name, h.slots) for h in hosts]


def create_job(job_dir: str, flags: LaunchFlags, command: Sequence[str], *, ssh_port: int, shared: str,
               network: str, image: str, workdir: str, secondary_wait_s: float) -> list[tuple[str, int]] | None:
    """``JOB_DIR/{hosts,ranks,logs}/`` and ``job.json``; returns the hosts (None: discovered). A
    --hostfile is copied into the job directory (the primary container sees the share, not the
    files of the machine it runs on). An elastic job without hosts gets ``JOB_DIR/discover.sh``
    as its discovery script: the secondaries registered on the share (``discover``)."""
    hosts = job_hosts(flags)
    for sub in ("hosts", "ranks", "logs"):
        os.makedirs(os.path.join(job_dir, sub), exist_ok=True)
    if flags.hostfile is not None:
        copy = os.path.join(job_dir, "hostfile")
        shutil.copyfile(flags.hostfile, copy)
        flags = dataclasses.replace(flags, hostfile=copy)
    if discovers_secondaries(flags):
        script = write_script(job_dir, shared, flags.ssh_port or ssh_port)
        flags = dataclasses.replace(flags, host_discovery_script=script)
    write_json(os.path.join(job_dir, "job.json"), {
        "id": os.path.basename(job_dir), "created": time.time(), "primary_host": socket.gethostname(),
        "np": flags.np, "hosts": [{"name": n, "slots": s} for n, s in hosts or ()],
        "launch": flags.to_json(), "command": list(command), "ssh_port": ssh_port, "shared": shared,
        "network": network, "image": image, "workdir": workdir, "secondary_wait_s": secondary_wait_s})
    return hosts


def new_job(argv: list[str]) -> str:
    """``jobrun new [-p PORT] [launch flags] -- COMMAND`` (compose, or by hand inside a
    container): the cluster keys (idempotent) and a job directory under APPLIANCE_SHARED."""
    from appliance.cluster.config import ClusterConfig
    from .secondary import ensure_cluster_keys
    from ..mount import Layout, new_job_id

    if "--" not in argv:
        raise SystemExit(f"{PREFIX} usage: python -m appliance.cluster.jobrun new [-p PORT] [launch flags] "
                         "-- COMMAND")
    flags, command = parse_launch_flags(argv, prog="python -m appliance.cluster.jobrun new")
    config = ClusterConfig.create(ssh_port=flags.ssh_port)
    layout = Layout(config.shared).ensure()
    ensure_cluster_keys(config.shared)
    job_dir = layout.job_dir(new_job_id())
    hosts = create_job(job_dir, flags, command, ssh_port=config.ssh_port, shared=config.shared, network="",
                       image="", workdir=os.getcwd(), secondary_wait_s=config.secondary_wait_s)
    where = ', '.join(f'{n}:{s}' for n, s in hosts) if hosts is not None else "the hosts it discovers"
    say(f"job {os.path.basename(job_dir)}: {flags.np} ranks on {where}; job directory {job_dir}")
    return job_dir


def job_config(job: dict, job_dir: str, **extra: Any) -> LaunchConfig:
    """The launcher's configuration of the job in ``job_dir`` (see the module docstring)."""
    given = LaunchFlags.from_json(job["launch"])
    flags = with_defaults(given, ssh_port=int(job["ssh_port"]),
                          output_filename=os.path.join(job_dir, "logs"), shared=job["shared"])
    wrapped = [sys.executable, "-m", "appliance.cluster.rankexec", job_dir, "--", *job["command"]]
    environ = extra.get("environ")
    environ = dict(os.environ if environ is None else environ)
    environ.setdefault("APPLIANCE_RECORD_DIR", job_dir)  # the job's record (observe/) goes into its job directory
    extra["environ"] = environ
    config = flags.launch_config(wrapped, host_wait_s=float(job.get("secondary_wait_s", 20.0)), **extra)
    # -p/-i the user gave (the cluster's own port is not one: no "unused" line for a one-host job)
    return dataclasses.replace(config, ssh_flags=tuple(
        f for f, v in (("-p", given.ssh_port), ("-i", given.ssh_identity_file)) if v is not None))


class HostFiles:
    """The launcher's per-host reports -> ``hosts/<host>.json``, and what to run on a host that
    is not usable (``hints()``)."""

    def __init__(self, job: dict, job_dir: str, port: int):
        self.job_dir, self.port, self.shared = job_dir, port, job["shared"]
        network = job.get("network")
        if not network:  # `jobrun new`: no appliance CLI on the host (compose)
            self.how = f"its secondary container must run `secondary --port {port}` with this share (compose: service HOST)"
        elif network == "host":
            self.how = f"appliance secondary --ssh-port {port} --shared {self.shared}"
        else:
            self.how = f"appliance secondary --ssh-port {port} --shared {self.shared} --network {network} --name HOST"
        self._hints: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, report: Any) -> None:
        """``on_host_report``: one ``preflight.HostReport``."""
        tcp, ssh = report.steps.get("tcp"), report.steps.get("ssh")
        reachable = bool(report.local or tcp == "ok")
        facts = {"host": report.host, "local": report.local, "reachable": reachable,
                 "authenticated": bool(report.local or ssh == "ok") if reachable else None,
                 "address": "local" if report.local else (report.target.address if report.target else ""),
                 "error": "; ".join(report.failures), "updated": time.time()}
        write_json(os.path.join(self.job_dir, "hosts", f"{report.host}.json"), facts)
        how = self.how.replace("HOST", report.host)
        hint = ""
        if report.local or not report.failures:
            pass
        elif not reachable:
            hint = f"{report.host}:{self.port} is not up: start its secondary on {report.host}: {how}"
        elif not facts["authenticated"]:
            hint = (f"{report.host} refused the cluster key or host key: its secondary must use this shared "
                    f"directory, {self.shared}: restart it with {how}")
        if hint:
            with self._lock:
                self._hints[report.host] = hint

    def hints(self) -> list[str]:
        with self._lock:
            return list(self._hints.values())


def run_job(job: dict, job_dir: str) -> int:
    """Run the job (one launcher call); its exit code. Prints the launcher's failure and the
    hosts' hints when it cannot start."""
    try:
        config = job_config(job, job_dir)
    except ValueError as e:  # ConfigError: a flag's value the launcher rejects
        say(f"error: {e}")
        return 2
    files = HostFiles(job, job_dir, config.remote.port or int(job["ssh_port"]))
    try:
        return run(config, echo=True, capture=False, on_host_report=files).returncode
    except LaunchError as e:
        say(f"error: {e}")
        for line in files.hints():
            say(line)
        return 1
    except ValueError as e:  # HostsError, ConfigError
        say(f"error: {e}")
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["new"]:
        try:
            job_dir = new_job(argv[1:])
        except ValueError as e:  # bad -H, -np above the slots, bad knob
            say(f"error: {e}")
            return 2
    elif len(argv) == 1:
        job_dir = argv[0]
    else:
        print("usage: python -m appliance.cluster.jobrun JOB_DIR | new [-p PORT] [launch flags] -- COMMAND",
              file=sys.stderr)
        return 2
    job = read_json(os.path.join(job_dir, "job.json"))
    if not job:
        say(f"no readable {job_dir}/job.json (is {job_dir} on the shared mount?)")
        return 2
    code = 1

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, _interrupt)  # until the launcher's own trap is in place
    try:
        code = run_job(job, job_dir)
        return code
    except KeyboardInterrupt:
        code = 130
        return code
    finally:
        signal.signal(signal.SIGTERM, previous)
        write_json(os.path.join(job_dir, "exit.json"), {"returncode": code, "ended": time.time()})


if __name__ == "__main__":
    raise SystemExit(main())
