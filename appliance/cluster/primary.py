"""``appliance primary``: run one training job from a primary container, streaming it here.

What it owns: ``PrimaryJob``: it validates the job on this machine (Docker up, image present,
shared directory present, the host list parses, -np fits the slots; the launch flags arrive
already parsed by the launcher's parser, ``launcher.flags``), creates ``SHARED/jobs/<id>/`` with
``job.json``, starts the primary container (``appliance-primary-<id>``, or ``appliance-<--name>``)
with the flags every appliance container gets (``docker``), running ``appliance.cluster.jobrun``
inside it (one launcher run, whose preflight checks every host), shows the per-host startup view
(``view.StartupView``) until every rank has started (an elastic job that discovers its hosts,
``--min-np`` without ``-H``: the secondaries registered on the share, has none), then on a
terminal the job's live table (``view.JobView``, from the record the launcher writes on the share;
the container's launcher then prints no summary lines of its own), streams the job's output (stdout to stdout,
stderr to stderr; every rank's lines are prefixed by the launcher), and returns the job's exit
code. The container is removed whatever happens (``PrimaryContainer`` is a context manager); a
network it had to create is removed when empty.

Signals (recorded by the launcher's ``SignalTrap``): the first SIGINT/SIGTERM/SIGHUP is forwarded
to the container's init, which passes it to the launcher, which stops every rank on every host;
if the container is still running ``stop_timeout_s`` later, or on a second signal, it is killed
(SIGKILL); remote ranks then end by the runtime's heartbeat and sshd's ClientAlive bound. The
working directory of the ranks is the shared directory (``--workdir`` to change it), so a user's
``train.py`` there is what ``python -m train`` runs; without one, the image's default job runs.

Env vars: APPLIANCE_VIEW and APPLIANCE_VIEW_RANKS (the job view, as the launcher's; the rest
through ``ClusterConfig``). Failure modes: ``ClusterError`` (one line, before
anything starts) for Docker down, missing image, missing share; exit 2 for flags the launcher
rejects; otherwise the launcher's exit code (1 with one line per host that is not up).
"""
from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from typing import IO, Any, Optional, Sequence

from appliance.cluster.config import ClusterConfig
from appliance.common.knobs import read
from ..launcher.flags import LaunchFlags
from ..launcher.signals import SignalTrap
from . import docker
from .docker import ClusterError
from .jobrun import create_job, job_hosts
from .secondary import ensure_cluster_keys
from .locksweep import sweep_dead_container_locks
from .say import say
from ..mount import Layout, new_job_id
from .view import JobView, StartupView
from . import discover
from ..mount.registry import registrations

ROLE = "primary"


class PrimaryContainer:
    """The primary container of one job: created on enter, always removed on exit."""

    def __init__(self, client: Any, config: ClusterConfig, name: str, command: list[str], workdir: str,
                 job_id: str, env: dict[str, str]):
        self.client, self.config, self.name = client, config, name
        self.command, self.workdir, self.job_id, self.env = command, workdir, job_id, env
        self.network = docker.Network(client, config.network)
        self.container: Any = None

    def __enter__(self) -> "PrimaryContainer":
        existing = docker.find_container(self.client, self.name)
        if existing is not None:
            if not docker.is_ours(existing) or existing.status == "running":
                raise ClusterError(f"a container named {self.name} already exists ({existing.status}): "
                                   "choose another --name, or wait for that job")
            existing.remove(force=True)
        self.network.ensure()
        kw = docker.container_kwargs(self.client, self.config, name=self.name, role=ROLE,
                                     extra_labels={"job": self.job_id}, env=self.env)
        try:
            self.container = self.client.containers.create(self.config.image, command=self.command,
                                                           working_dir=self.workdir, **kw)
        except BaseException:
            self.network.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.container is not None:
                self.container.remove(force=True)
        except Exception:  # noqa: BLE001 - already gone (e.g. removed by hand)
            pass
        self.network.release()


class PrimaryJob:
    def __init__(self, config: ClusterConfig, flags: LaunchFlags, command: Sequence[str], *,
                 workdir: Optional[str] = None, client: Any = None, live: Optional[bool] = None,
                 stop_timeout_s: float = 30.0, out: IO[str] | None = None, err: IO[str] | None = None):
        self.config = config
        self.flags, self.command = flags, list(command)
        if self.command and self.command[0] == "--":
            self.command = self.command[1:]
        self.workdir = os.path.abspath(workdir) if workdir else config.shared
        self.client, self.live, self.stop_timeout_s = client, live, stop_timeout_s
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.job_id = new_job_id()
        self.layout = Layout(config.shared)
        self.job_dir = self.layout.job_dir(self.job_id)

    def _say(self, text: str) -> None:
        say(text, self.err)

    def prepare(self) -> list[tuple[str, int]] | None:
        """Everything that can fail before a container exists; writes job.json. Returns the hosts
        (None: the job discovers them)."""
        if not self.command:
            raise ClusterError("no command to run (usage: appliance primary -np N -H HOSTS -- python -m train)")
        job_hosts(self.flags)  # -H, hostfile and -np checked before anything else
        docker.require_shared(self.config.shared)
        self.client = self.client or docker.connect()
        docker.require_image(self.client, self.config.image)
        self.layout.ensure()
        ensure_cluster_keys(self.config.shared)
        self.hosts = create_job(self.job_dir, self.flags, self.command, ssh_port=self.config.ssh_port,
                                shared=self.config.shared, network=self.config.network, image=self.config.image,
                                workdir=self.workdir, secondary_wait_s=self.config.secondary_wait_s)
        self.np = self.flags.np
        return self.hosts

    def run(self) -> int:
        self.prepare()
        name = docker.prefixed(self.config.name) if self.config.name else f"appliance-primary-{self.job_id}"
        cmd = ["primary", "/opt/venv/bin/python", "-m", "appliance.cluster.jobrun", self.job_dir]
        env = {"APPLIANCE_JOB_DIR": os.path.join(self.job_dir, "remote")}
        self.draw_job = self._draws_job()
        if self.draw_job:  # the table is drawn here: the launcher in the container prints no summary lines
            env["APPLIANCE_VIEW"] = "off"
        sweep_dead_container_locks(self.client, self.layout, self._say)
        t0 = time.monotonic()
        with SignalTrap() as trap, PrimaryContainer(self.client, self.config, name, cmd, self.workdir,
                                                     self.job_id, env) as pc:
            self._say(f"job {self.job_id}: {self.np} ranks on {self._where()} "
                      f"from container {name} (image {self.config.image}, network {self.config.network}); "
                      f"job directory {self.job_dir}")
            code = self._stream(pc.container, trap)
            state = pc.container.attrs.get("State", {})
        elapsed = time.monotonic() - t0
        extra = " (the container ran out of memory)" if state.get("OOMKilled") else ""
        verdict = "finished" if code == 0 else f"failed with exit code {code}{extra}"
        self._say(f"job {self.job_id} {verdict} after {elapsed:.1f} s; logs in {self.job_dir}/logs")
        return code

    def _draws_job(self) -> bool:
        """The running job's live table on this terminal (``APPLIANCE_VIEW``, ``--no-view``)."""
        mode = read("APPLIANCE_VIEW")
        if self.flags.no_view or mode in ("off", "lines"):
            return False
        if mode == "live":
            return True
        if self.live is not None:
            return self.live
        return _is_tty(self.out) and _is_tty(self.err)

    def _job_view(self) -> JobView:
        return JobView(self.job_dir, self.job_id, self.out, ranks=read("APPLIANCE_VIEW_RANKS"))

    def _where(self) -> str:
        if self.hosts is not None:
            return ", ".join(f"{n}:{s}" for n, s in self.hosts)
        if self.flags.host_discovery_script is not None:
            return f"the hosts {self.flags.host_discovery_script} finds"
        now = discover.host_lines(registrations(self.layout), time.time(), read("APPLIANCE_SECONDARY_STALE"))
        return (f"the secondaries registered in {self.layout.secondaries} (elastic: now "
                f"{', '.join(now) if now else 'none: it waits for them'})")

    def _stream(self, container: Any, trap: SignalTrap) -> int:
        q: queue.Queue = queue.Queue()
        stream = container.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True)

        def reader() -> None:
            try:
                for out, err in stream:
                    if out:
                        q.put(("stdout", out))
                    if err:
                        q.put(("stderr", err))
            except Exception as e:  # noqa: BLE001 - the daemon closed the stream: wait() decides
                q.put(("note", str(e).encode()))
            finally:
                q.put(None)

        container.start()
        threading.Thread(target=reader, name="primary output", daemon=True).start()
        view: Any = (StartupView(self.job_dir, self.hosts, self.np, live=self.live, out=self.out, err=self.err)
                     if self.hosts is not None else NoView())
        job_view_due = self.draw_job  # once every rank has started (at once: the hosts come and go)
        handled, kill_at, next_poll = 0, None, 0.0
        try:
            while True:
                if job_view_due and view.done:
                    view, job_view_due = self._job_view(), False
                if len(trap.received) > handled:
                    sig = trap.received[handled]
                    handled += 1
                    job_view_due = False
                    if handled == 1:
                        view.close()
                        self._say(f"{signal.Signals(sig).name}: stopping the job on every host "
                                  "(again to kill the primary container at once)")
                        self._signal(container, signal.Signals(sig).name)
                        kill_at = time.monotonic() + self.stop_timeout_s
                    else:
                        self._signal(container, "SIGKILL")
                if kill_at is not None and time.monotonic() > kill_at:
                    self._say(f"the job did not stop within {self.stop_timeout_s:.0f} s: killing the primary container")
                    self._signal(container, "SIGKILL")
                    kill_at = None
                try:
                    item = q.get(timeout=0.1)
                except queue.Empty:
                    item = ()
                if item is None:
                    break
                if item:
                    self._emit(view, *item)
                if not view.done and time.monotonic() >= next_poll:
                    view.poll()
                    next_poll = time.monotonic() + 0.25
        finally:
            view.close()
        try:
            result = container.wait(timeout=max(self.stop_timeout_s, 10))
        except Exception:  # noqa: BLE001 - still running after its output ended: kill it
            self._signal(container, "SIGKILL")
            result = container.wait(timeout=30)
        container.reload()
        return int(result.get("StatusCode", 1))

    def _emit(self, view: Any, stream: str, data: bytes) -> None:
        if stream == "note":
            self._say(f"output stream ended: {data.decode(errors='replace')}")
            return
        if view.active:
            view.write(stream, data)
            return
        target = self.out if stream == "stdout" else self.err
        buf = getattr(target, "buffer", None)
        if buf is not None:
            buf.write(data)
            buf.flush()
        else:
            target.write(data.decode("utf-8", errors="replace"))
            target.flush()

    @staticmethod
    def _signal(container: Any, name: str) -> None:
        try:
            container.kill(signal=name)
        except Exception:  # noqa: BLE001 - it exited meanwhile
            pass


class NoView:
    """No startup view: an elastic job's hosts come and go (its launcher says each change)."""
    done, active = True, False

    def poll(self) -> None:
        pass

    def close(self) -> None:
        pass

    def write(self, stream: str, data: bytes) -> None:
        pass


def _is_tty(f: Any) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def run_primary(config: ClusterConfig, flags: LaunchFlags, command: Sequence[str], **kw: Any) -> int:
    return PrimaryJob(config, flags, command, **kw).run()
