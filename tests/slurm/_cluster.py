"""A real two-node Slurm on this machine, for tests: ``with SlurmCluster() as c: c.run(["srun", ...])``.

What it owns: one private directory (short, under /tmp: munge's socket path must fit in 108
bytes) holding a fresh munge key (1024 random bytes, mode 0400), ``munged`` with its own socket,
a ``slurm.conf`` (the recipe of ARCHITECTURE.md section 7: SlurmUser root, auth/cred munge with
``AuthInfo=socket=...``, proctrack/linuxproc, task/none, select/cons_tres with CR_Core, no
accounting, state and spool inside the directory, ReturnToService=2), ``slurmctld`` and one
``slurmd`` per node (``node1`` at 127.0.0.2, ``node2`` at 127.0.0.3), every daemon in the
foreground (``-D``) as this object's own child. Ports (slurmctld's and each slurmd's) are chosen
free when the cluster starts, and ``FirstJobId`` is random, so two clusters can run on this
machine at once without meeting (a job's derived ports differ too).

Name resolution without touching /etc: the cluster first starts a *holder* process in a new
mount namespace (``unshare -m --propagation private``) that bind-mounts the cluster's own hosts
file (this machine's /etc/hosts plus ``127.0.0.2 node1``, ``127.0.0.3 node2``) over /etc/hosts
and then sleeps. Every daemon, and every client command the tests run through ``run()`` /
``popen()`` / ``argv()``, enters that namespace with ``nsenter --mount=/proc/HOLDER/ns/mnt``, so
tasks, ``srun``, the launcher and the runtime all resolve ``node1``/``node2``; the pytest process
itself stays outside (it needs no node names: tests check files, exit codes and output). Each
slurmd also runs under ``unshare --uts`` with its node's hostname, so a task's ``hostname`` is its
node's name. Clients find the config through ``SLURM_CONF`` in ``env`` (``os.environ`` is never
changed).

Readiness: ``scontrol ping`` answers, then ``sinfo -h -t idle -o %D`` counts every node, within
``start_timeout`` seconds (default 20); otherwise ``SlurmClusterError`` with the tail of every
daemon's log. Teardown (also when the test failed): every process in the cluster's mount
namespace (daemons, slurmstepd, tasks, launchers started through ``popen``) gets SIGTERM, then
SIGKILL after a bound, is waited for, and the directory is removed; it raises if anything of the
cluster is still alive. ``strays()`` lists processes of the cluster other than its daemons
(leftovers of a job), for tests that assert "no leftovers".

Needs (root): munged, slurmctld, slurmd, srun/sinfo/scontrol (Debian's ``munge`` and
``slurm-wlm``), unshare, nsenter, mount. ``MISSING`` lists what is absent, for the conftest.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

TOOLS = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol", "salloc", "sbatch", "scancel", "squeue",
         "unshare", "nsenter", "mount")
NODES = (("node1", "127.0.0.2"), ("node2", "127.0.0.3"))


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]


class SlurmClusterError(RuntimeError):
    """The cluster could not start or stop cleanly; the message carries the daemons' log tails."""


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("0.0.0.0", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _mnt_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _state(pid: int | str) -> str | None:
    """The process's state letter, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def _cmdline(pid: int | str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"--- {path.name}: (none)"
    return f"--- {path.name}:\n" + "\n".join(text[-lines:])


class SlurmCluster:
    """A two-node Slurm cluster (see the module docstring). Use as a context manager."""

    def __init__(self, *, cpus_per_node: int = 4, start_timeout: float = 20.0, stop_timeout: float = 10.0,
                 term_grace: float = 1.0):
        self.cpus_per_node = cpus_per_node
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.term_grace = term_grace  # slurmctld may take seconds on SIGTERM; its state is thrown away anyway
        self.nodes = [name for name, _ in NODES]
        self.addresses = dict(NODES)
        self.dir: Path | None = None
        self.env: dict[str, str] = {}
        self.start_s = self.stop_s = 0.0
        self._holder: subprocess.Popen | None = None
        self._daemons: dict[str, subprocess.Popen] = {}
        self._ns: str | None = None
        self._logs: list[Path] = []

    # --- clients ----------------------------------------------------------------------------
    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the cluster's mount namespace (node names resolve there)."""
        assert self._holder is not None, "the cluster is not running"
        return ["nsenter", f"--mount=/proc/{self._holder.pid}/ns/mnt", "--", *map(str, argv)]

    def client_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(self.env)
        env.update(extra or {})
        return env

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None,
            check: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run a client command in the cluster (text output captured), bounded by ``timeout``."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.argv(argv), env=self.client_env(env), timeout=timeout, check=check,
                              stdin=subprocess.DEVNULL, **kw)

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kw) -> subprocess.Popen:
        """Start a client command in the cluster (the caller waits; teardown kills it if it is left)."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(self.argv(argv), env=self.client_env(env), **kw)

    def in_cluster(self) -> list[int]:
        """Every live process in the cluster's mount namespace (daemons included)."""
        if self._ns is None:
            return []
        me = os.getpid()
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me and _mnt_ns(entry) == self._ns and _state(entry) not in (None, "Z"):
                pids.append(int(entry))
        return pids

    def strays(self) -> dict[int, str]:
        """Processes of the cluster that are not its daemons (pid -> command line): a job's leftovers."""
        daemons = {p.pid for p in self._daemons.values()} | ({self._holder.pid} if self._holder else set())
        found = {pid: _cmdline(pid) for pid in self.in_cluster() if pid not in daemons}
        return {pid: cmd for pid, cmd in found.items() if "slurmscriptd" not in cmd}  # slurmctld's helper

    def wait_no_strays(self, timeout: float = 5.0) -> dict[int, str]:
        """Wait up to ``timeout`` s for the job's processes to be gone; what is left (empty: none)."""
        end = time.monotonic() + timeout
        while True:
            left = self.strays()
            if not left or time.monotonic() >= end:
                return left
            time.sleep(0.05)

    def logs(self) -> str:
        return "\n".join(_tail(p) for p in self._logs)

    def idle_nodes(self) -> int:
        r = self.run(["sinfo", "-h", "-t", "idle", "-o", "%D"], timeout=10)
        return sum(int(x) for x in r.stdout.split() if x.isdigit()) if r.returncode == 0 else -1

    def jobs(self) -> list[str]:
        """``squeue``'s lines (job id and state) of the jobs the cluster still holds."""
        r = self.run(["squeue", "-h", "-o", "%i %T"], timeout=10)
        return r.stdout.split("\n")[:-1] if r.returncode == 0 else ["squeue failed: " + r.stderr.strip()]

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until no job is left and every node is idle again (a finished job's nodes take a
        moment to complete; a job submitted before then may queue for seconds)."""
        end = time.monotonic() + timeout
        while self.jobs() or self.idle_nodes() != len(self.nodes):
            if time.monotonic() >= end:
                raise SlurmClusterError(f"nodes not idle after {timeout:g} s:\n{self.logs()}")
            time.sleep(0.1)

    # --- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> "SlurmCluster":
        start = time.monotonic()
        try:
            self._start()
            self._wait_ready(start + self.start_timeout)
        except BaseException:
            self._stop(raise_on_leftovers=False)
            raise
        self.start_s = time.monotonic() - start
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop(raise_on_leftovers=exc[0] is None)

    def _write_config(self, d: Path) -> Path:
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for sub in ("state", "log", "munge", *(f"spool/{n}" for n in self.nodes)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge").chmod(0o700)
        hosts = Path("/etc/hosts").read_text(errors="replace") if os.path.exists("/etc/hosts") else ""
        (d / "hosts").write_text(hosts.rstrip("\n") + "\n" + "".join(f"{a} {n}\n" for n, a in NODES))
        first_job = 1000 + int.from_bytes(os.urandom(3), "big") % 1_000_000
        lines = [
            f"ClusterName=t{os.getpid()}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={d}/munge/munge.socket", "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "MailProg=/bin/true",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/spool/%n/slurmd.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd.%n.log",
            "ReturnToService=2", f"FirstJobId={first_job}",
            "InactiveLimit=0", "KillWait=2", "MinJobAge=2", "MessageTimeout=5", "SlurmdTimeout=30",
            *(f"NodeName={n} NodeAddr={a} NodeHostname={n} Port={p} CPUs={self.cpus_per_node} State=UNKNOWN"
              for (n, a), p in zip(NODES, node_ports)),
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        conf = d / "slurm.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def _spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        log = self.dir / "log" / f"{name}.out"  # type: ignore[operator]
        self._logs.append(log)
        with open(log, "wb") as f:
            self._daemons[name] = subprocess.Popen(self.argv(argv), env=dict(env), stdin=subprocess.DEVNULL,
                                                   stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def _start(self) -> None:
        self.dir = d = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
        conf = self._write_config(d)
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            self.env.pop(name, None)  # a test run inside an allocation must not confuse this cluster's clients
        # The holder: a private mount namespace with our hosts file over /etc/hosts.
        ready = d / "holder.ready"
        self._holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "--", "sh", "-c",
             'mount --bind "$1" /etc/hosts && : > "$2" && exec sleep 1000000', "holder", str(d / "hosts"), str(ready)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        end = time.monotonic() + 5.0
        while not ready.exists():
            if self._holder.poll() is not None or time.monotonic() > end:
                err = self._holder.stderr.read().decode(errors="replace") if self._holder.poll() is not None else ""
                raise SlurmClusterError(f"cannot make the cluster's mount namespace: {err.strip() or 'timed out'}")
            time.sleep(0.01)
        self._ns = _mnt_ns(self._holder.pid)
        env = self.env
        self._spawn("munged", ["munged", "--force", "-F", f"--socket={d}/munge/munge.socket",
                               f"--key-file={d}/munge.key", f"--pid-file={d}/munge/munged.pid",
                               f"--log-file={d}/log/munged.log", f"--seed-file={d}/munge/munged.seed"], env)
        self._logs.append(d / "log" / "munged.log")
        sock = d / "munge" / "munge.socket"
        end = time.monotonic() + 5.0
        while not sock.exists():
            if self._daemons["munged"].poll() is not None or time.monotonic() > end:
                raise SlurmClusterError(f"munged did not start:\n{self.logs()}")
            time.sleep(0.01)
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(conf)], env)
        self._logs.append(d / "log" / "slurmctld.log")
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", ["unshare", "--uts", "--", "sh", "-c", 'hostname "$1" && shift && exec "$@"',
                                           "slurmd", node, "slurmd", "-D", "-N", node, "-f", str(conf)], env)
            self._logs.append(d / "log" / f"slurmd.{node}.log")

    def _wait_ready(self, deadline: float) -> None:
        def check_daemons():
            dead = [n for n, p in self._daemons.items() if p.poll() is not None]
            if dead:
                raise SlurmClusterError(f"{', '.join(dead)} exited while the cluster started:\n{self.logs()}")

        while True:
            check_daemons()
            if self.run(["scontrol", "ping"], timeout=10).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"scontrol ping: no slurmctld within {self.start_timeout:g} s:\n{self.logs()}")
            time.sleep(0.05)
        while self.idle_nodes() != len(self.nodes):
            check_daemons()
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"nodes not idle within {self.start_timeout:g} s "
                                        f"(sinfo: {self.run(['sinfo'], timeout=10).stdout.strip()}):\n{self.logs()}")
            time.sleep(0.05)

    def _stop(self, raise_on_leftovers: bool = True) -> None:
        start = time.monotonic()
        procs = list(self._daemons.values()) + ([self._holder] if self._holder else [])
        # Everything in the namespace: jobs' processes and slurmstepd first, then the daemons.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            daemons = {p.pid for p in procs}
            for pid in self.in_cluster():
                if pid not in daemons:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for p in reversed(procs):
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            end = time.monotonic() + (self.term_grace if sig == signal.SIGTERM else self.stop_timeout)
            while time.monotonic() < end and (any(p.poll() is None for p in procs) or self.in_cluster()):
                time.sleep(0.02)
            if not any(p.poll() is None for p in procs) and not self.in_cluster():
                break
        left = {pid: _cmdline(pid) for pid in self.in_cluster()}
        left.update({p.pid: " ".join(map(str, p.args)) for p in procs if p.poll() is None})
        if self._holder is not None and self._holder.stderr is not None:
            self._holder.stderr.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.stop_s = time.monotonic() - start
        if left and raise_on_leftovers:
            raise SlurmClusterError(f"processes of the cluster survived its teardown: {left}")
