"""The srun step: every rank of a job started by one ``srun`` step inside a Slurm allocation.

What it owns:
- ``launcher_of(config)``: which launcher a job uses. ``--launcher``/APPLIANCE_LAUNCHER ``srun``,
  ``ssh`` or ``local``; ``auto`` (the default) is ``srun`` inside an allocation (SLURM_JOB_ID set)
  when neither -H nor --hostfile is given, else ``ssh`` (the executors: this machine's ranks as
  subprocesses, the others over SSH). ``local`` ignores the allocation and runs every rank on this
  machine. ``srun`` outside an allocation, or with -H/--hostfile (or an elastic job's discovery
  script: its hosts need not be the allocation's), is a ``ConfigError``; ``auto`` uses ``ssh`` then.
- ``step_dir(config)``: the step's private directory (mode 0700) next to the job's default secret
  file, ``~/.appliance/slurm/launch-JOB-ID/`` (``default_secret_file``: the home is the
  mount every node shares), removed at the end (and by the reaper if the launcher dies).
- ``SrunStep``: the running step, shaped like a ``WorkerGroup`` for ``failures.wait_for_end``.
  It runs ``srun --kill-on-bad-exit=1 --label --input=none --ntasks=NP --nodes=K
  --distribution=arbitrary`` (an elastic job's one-rank steps add ``--overlap``: Slurm holds a
  step back while another step uses the node) with ``SLURM_HOSTFILE`` listing each rank's node, so rank r runs on
  the host ``hosts.assign_ranks`` gave it (the same layout as over SSH), and each task is
  ``python -m appliance.launcher.slurm.task DIR GRACE -- COMMAND`` (its docstring: the rank's
  environment, exit records). The job's secret, id and start timeout travel in srun's
  environment, never on its command line. Output (``output.relay``, as for local ranks): srun's
  ``--label`` prefix ``N: `` is turned into the launcher's ``[N]<stdout>:`` lines (and
  ``--output-filename`` files); srun's own lines go to stderr only with --verbose, except errors
  that are not a task's exit status. A rank's exit is seen when its wrapper records it
  (``exit.N.json``); a task whose wrapper left no record (itself killed) is taken from srun's
  ``task N: Killed`` lines once srun ends.
- Stopping (``stop``): ``scancel --signal=TERM JOB.STEP`` (the wrappers pass it to their ranks'
  process groups), up to APPLIANCE_STOP_GRACE seconds, then SIGTERM to srun (Slurm kills the
  step), then, bounded, SIGKILL to srun and ``scancel JOB.STEP``. ``scancel`` of the whole job
  ends srun, so the launcher ends too (slurmstepd's ``*** STEP ... CANCELLED ***`` line is taken
  out of rank 0's output and the summary says "Slurm cancelled the step (scancel)", or the
  reason Slurm gives, e.g. time limit); the reaper signals srun if the launcher is killed.
- The two srun mechanisms (``mechanism.Mechanism``): ``SrunStatic`` (one step for every rank)
  and ``SrunElastic`` (one step per rank, started as the elastic driver asks), sharing
  ``_SrunBase``; their host set is ``SlurmNodes`` (the allocation's nodes: nothing to open).

Env vars: none read directly (``LaunchConfig`` carries APPLIANCE_LAUNCHER, SLURM_JOB_ID and the
allocation). Failure modes: ``ConfigError`` for a launcher choice that cannot work; ``LaunchError``
when srun is not on PATH; srun failing before any task started ends the job with srun's code and
its last error line, blamed on rank 0.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator, Sequence

from appliance.common.slurm import default_secret_file
from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig
from .. import env as envmod
from ..executors import LaunchError
from ..failures import describe_exit
from ..hosts import Slot, used_hosts
from ..output import OutputSink, relay
from ..reaper import Reaper
from ..workers import read_fault, read_json
from .task import exit_file, start_file, write_json

LABEL = re.compile(rb"^\s*(\d+): ?")
CANCELLED = re.compile(rb"slurmstepd(-\S+)?: error: \*\*\* (STEP|JOB) \S+ ON \S+ CANCELLED AT \S+( DUE TO (?P<why>[A-Z ]+?))? \*\*\*")
TASK_STATUS = re.compile(r"^srun: error: (\S+): tasks? ([\d,\-]+): (.*)$")
POLL_S = 0.02
CANCEL_WAIT_S = 3.0  # how long a summary waits for srun's end to learn whether Slurm cancelled a signalled rank
KILL_WAIT_S = 5.0


def launcher_of(config: LaunchConfig) -> str:
    """``srun``, ``ssh`` or ``local`` (see the module docstring)."""
    choice = config.launcher
    in_allocation = bool(config.slurm.job_id and config.slurm.nodelist)
    given = (config.hosts is not None or config.hostfile is not None
             or (config.elastic is not None and config.elastic.discovery_script is not None))
    if choice == "auto":
        return "srun" if in_allocation and not given else "ssh"
    if choice == "srun":
        if not in_allocation:
            raise ConfigError("--launcher srun needs a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are "
                              "not set): run it under salloc or in an sbatch script")
        if given:
            raise ConfigError("--launcher srun takes its hosts from the Slurm allocation: leave out -H/--hostfile "
                              "and --host-discovery-script")
    return choice


def _expand_ranks(spec: str) -> list[int]:
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _status_code(text: str) -> int:
    """srun's words for a task's end -> a return code (negative: a signal)."""
    m = re.match(r"Exited with exit code (\d+)", text)
    if m:
        return int(m.group(1))
    words = {"Killed": signal.SIGKILL, "Terminated": signal.SIGTERM, "Segmentation fault": signal.SIGSEGV, "Aborted": signal.SIGABRT, "Bus error": signal.SIGBUS,
             "Hangup": signal.SIGHUP, "Interrupt": signal.SIGINT}
    for word, sig in words.items():
        if text.startswith(word):
            return -sig
    return -signal.SIGKILL


@contextlib.contextmanager
def step_dir(config: LaunchConfig, job_id: str) -> Iterator[str]:
    """The step's private directory on the shared home, removed at the end."""
    base = os.path.dirname(default_secret_file(int(config.slurm.job_id or 0), config.environ))
    os.makedirs(base, mode=0o700, exist_ok=True)
    d = os.path.join(base, f"launch-{config.slurm.job_id}-{job_id}")
    os.mkdir(d, 0o700)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def plan_step(config: LaunchConfig, d: str, job_id: str) -> envmod.JobPlan:
    """The per-job facts; the addresses are decided on the nodes (``task.py``)."""
    return envmod.JobPlan(job_id=job_id, secret=envmod.new_secret(), store_addr="", master_addr="", master_port=0,
                          data_addrs={}, start_timeout_s=config.start_timeout_s, verbose=config.verbose, fault_dir=d)


def srun_env(config: LaunchConfig, plan: envmod.JobPlan, hostfile: str) -> dict[str, str]:
    """srun's environment (every task inherits it): the launcher's, -x, and the per-job contract."""
    env = dict(config.environ)
    env.update(config.env)
    for name in envmod.CONTRACT_NAMES:
        env.pop(name, None)  # per rank: the wrapper sets them
    env.update({"APPLIANCE_JOB_SECRET": plan.secret, "APPLIANCE_JOB_ID": plan.job_id,
                "HOROVOD_START_TIMEOUT": repr(float(plan.start_timeout_s)), "PYTHONUNBUFFERED": "1",
                "SLURM_HOSTFILE": hostfile})
    if plan.verbose:
        env["APPLIANCE_VERBOSE"] = "1"
    envmod.network_defaults(env, config.remote.network_interface or "")
    return env


def srun_argv(config: LaunchConfig, slots: Sequence[Slot], d: str, srun: str = "srun",
              grace_s: float | None = None, overlap: bool = False) -> list[str]:
    """``overlap``: the step shares the allocation's resources with the job's other steps (an
    elastic job's steps, one per rank: without it a node's second rank waits for the first to end)."""
    hosts = used_hosts(slots)
    python = config.remote.remote_python or sys.executable
    grace = config.failure_grace_s if grace_s is None else grace_s
    return [srun, "--kill-on-bad-exit=1", "--label", "--input=none", f"--ntasks={len(slots)}",
            f"--nodes={len(hosts)}", "--distribution=arbitrary", *(["--overlap"] if overlap else []),
            f"--job-name=appliance-{os.path.basename(d)}",
            python, "-m", "appliance.launcher.slurm.task", d, repr(float(grace)), "--",
            *config.command]


class SrunTask:
    """One rank of the step, as ``failures.wait_for_end`` sees a worker."""

    pid = 0

    def __init__(self, slot: Slot, d: str, step: "SrunStep", index: int, wid: int):
        self.rank, self.host, self._dir, self._step = wid, slot.host, d, step
        self.index = index  # the task's number in its step (SLURM_PROCID); == rank in a static job
        self.returncode: int | None = None
        self._cause: str | None = None

    @property
    def cause(self) -> str | None:
        """Why the rank ended, when its code alone does not say it (Slurm cancelled the step...).
        Read once, for the summary. A rank killed by a signal may have been killed by Slurm's
        cancel, whose slurmstepd line can trail the rank's exit record: srun's end (its output
        drained) is awaited first, at most CANCEL_WAIT_S."""
        if self._cause is None and self.returncode is not None and self.returncode < 0:
            if not self._step.cancelled:
                self._step.wait_ended(CANCEL_WAIT_S)
            if self._step.cancelled:
                return f"{describe_exit(self.returncode)}: Slurm cancelled {self._step.cancelled}"
        return self._cause

    @cause.setter
    def cause(self, value: str | None) -> None:
        self._cause = value

    @property
    def fault(self) -> dict | None:
        return read_fault(envmod.fault_file(self._dir, self.index))

    def signal(self, sig: int) -> None:
        """``sig`` to every task of this rank's step (an elastic job runs one rank per step)."""
        self._step.signal(sig)



def next_exit(exits: queue.Queue, timeout: float):
    """The next ``(task, code)`` off a steps' exit queue (recorded by its step), or None."""
    try:
        worker, code = exits.get(timeout=timeout)
    except queue.Empty:
        return None
    worker._step.record(worker, code)
    return worker, code


class SrunStep:
    """The ranks of one job under one srun step; ``with SrunStep(...) as step: step.start()``."""

    def __init__(self, config: LaunchConfig, slots: Sequence[Slot], plan: envmod.JobPlan, sink: OutputSink,
                 reaper: Reaper | None = None, *, wids: Sequence[int] | None = None,
                 extra_env: dict[str, str] | None = None, exits: queue.Queue | None = None,
                 grace_s: float | None = None, overlap: bool = False):
        """``wids``: each task's worker number (default: its rank); ``extra_env``: more variables for
        every task; ``exits``: a queue shared by several steps (an elastic job's); ``grace_s``: how
        long a failed task holds its step (default APPLIANCE_FAILURE_GRACE); ``overlap``: srun's
        ``--overlap`` (``srun_argv``)."""
        self.config, self.slots, self.plan, self.sink, self.reaper = config, list(slots), plan, sink, reaper
        self.dir = plan.fault_dir
        wids = list(wids) if wids is not None else [s.rank for s in slots]
        self.workers = [SrunTask(s, self.dir, self, i, wids[i]) for i, s in enumerate(slots)]
        self.extra_env = dict(extra_env or {})
        self.grace_s = config.failure_grace_s if grace_s is None else grace_s
        self.overlap = overlap
        self.cancelled = ""  # "the step (scancel)", "the job (time limit)": Slurm's cancel, not the launcher's
        self.returncodes: dict[int, int] = {}
        self.step: str | None = None  # JOB.STEP once a task reported it
        self.proc: subprocess.Popen | None = None
        self._exits: queue.Queue = exits if exits is not None else queue.Queue()
        self._seen: set[int] = set()
        self._srun_status: dict[int, tuple[str, str]] = {}  # rank -> (node, srun's words), from its stderr
        self._errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self._done = threading.Event()

    # --- starting ---------------------------------------------------------------------------
    def start(self) -> None:
        srun = shutil.which("srun", path=self.config.environ.get("PATH"))
        if srun is None:
            raise LaunchError("srun is not on PATH: the srun launcher needs Slurm's client commands "
                              "(or use --launcher ssh)")
        hostfile = os.path.join(self.dir, "hostfile")
        with open(hostfile, "w", encoding="utf-8") as f:
            f.write("".join(s.host + "\n" for s in self.slots))
        for w in self.workers:
            self.sink.open_rank(w.rank)
        argv = srun_argv(self.config, self.slots, self.dir, srun, self.grace_s, self.overlap)
        if self.config.verbose:
            self.sink.message(f"appliance launch: srun: {' '.join(argv)}")
        env = {**srun_env(self.config, self.plan, hostfile), **self.extra_env}
        self.proc = subprocess.Popen(argv, env=env, cwd=self.config.cwd,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, close_fds=True)
        if self.reaper is not None:
            self.reaper.watch(self.proc.pid)  # a killed launcher: the reaper's SIGTERM makes srun end the step
        for target, args, name in (
                (relay, (self.proc.stdout, functools.partial(self._line, "stdout")), "srun-stdout"),
                (relay, (self.proc.stderr, functools.partial(self._line, "stderr")), "srun-stderr"),
                (self._watch, (), "srun-watch")):
            t = threading.Thread(target=target, args=args, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _line(self, name: str, data: bytes) -> None:
        """One line srun printed: ``N: text`` -> rank N's line; Slurm's cancel; srun's own line."""
        m = LABEL.match(data)
        cancel = CANCELLED.search(data)
        if cancel:  # slurmstepd's line, on task 0's stream: the summary says it, --verbose shows it
            if not self._stopped:
                why = (cancel.group("why") or b"").decode().strip().lower()
                self.cancelled = f"the {cancel.group(2).decode().lower()} ({why or 'scancel'})"
            if self.config.verbose:
                self.sink.message(data.rstrip(b"\n").decode("utf-8", errors="replace"))
        elif m and int(m.group(1)) < len(self.slots):
            self.sink.line(self.workers[int(m.group(1))].rank, name, data[m.end():])
        else:
            self._own_line(data.rstrip(b"\n").decode("utf-8", errors="replace"))

    def _own_line(self, text: str) -> None:
        m = TASK_STATUS.match(text)
        if m:
            for rank in _expand_ranks(m.group(2)):
                self._srun_status.setdefault(rank, (m.group(1), m.group(3).strip()))
        elif "error" in text.lower():
            self._errors.append(text)
        if self.config.verbose or (not m and "error" in text.lower() and not self._stopped):
            self.sink.message(text)

    def _scan(self) -> None:
        found = []
        for w in self.workers:
            if self.step is None:
                started = read_json(start_file(self.dir, w.index))
                if started and started.get("step"):
                    self.step = str(started["step"])
            if w.index in self._seen:
                continue
            record = read_json(exit_file(self.dir, w.index))
            if record is not None:
                found.append((float(record.get("at") or 0.0), w.index, w, record))
        for _, _, w, record in sorted(found, key=lambda f: f[:2]):  # exits found together: in the order they happened
            self._seen.add(w.index)
            if record.get("error"):
                w.cause = f"could not start: {record['error']}"
            self._exits.put((w, int(record.get("returncode", 255))))

    def _watch(self) -> None:
        assert self.proc is not None
        while self.proc.poll() is None:
            self._scan()
            time.sleep(POLL_S)
        for t in self._threads[:2]:
            t.join(2.0)  # srun's last lines name the tasks that left no record
        self._scan()
        rc = self.proc.returncode
        started = any(os.path.exists(start_file(self.dir, w.index)) for w in self.workers)
        for w in self.workers:
            if w.index in self._seen:
                continue
            self._seen.add(w.index)
            if w.index in self._srun_status:
                node, words = self._srun_status[w.index]
                code = _status_code(words)
                w.cause = f"{words[:1].lower()}{words[1:]} (srun, no exit status from the task)"
            elif not started and rc != 0:
                code = rc
                last = self._errors[-1] if self._errors else f"srun exited with code {rc}"
                w.cause = f"could not start: {last}"
            else:
                code = 0 if rc == 0 else -signal.SIGKILL
                if code:
                    w.cause = f"ended with the srun step (srun exited with code {rc}; no exit status from the task)"
            self._exits.put((w, code))
        if self.reaper is not None:
            self.reaper.forget(self.proc.pid)
        self._done.set()

    # --- the WorkerGroup side ---------------------------------------------------------------
    def next_exit(self, timeout: float):
        return next_exit(self._exits, timeout)

    def record(self, worker: SrunTask, code: int) -> None:
        self.returncodes[worker.rank] = worker.returncode = code

    def signal(self, sig: int) -> None:
        """``sig`` to every task of the step (``scancel --signal``), or to srun before the step is known."""
        if self.step is not None:
            self._scancel(f"--signal={signal.Signals(sig).name.removeprefix('SIG')}")
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_ended(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until srun has ended and its output is read."""
        return self._done.wait(timeout)

    def running(self) -> list[SrunTask]:
        return [w for w in self.workers if w.rank not in self.returncodes]

    def _scancel(self, *args: str) -> None:
        if self.step is None:
            return
        try:
            subprocess.run(["scancel", *args, self.step], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=10, env=dict(self.config.environ))
        except (OSError, subprocess.TimeoutExpired):
            pass

    def stop(self) -> None:
        """TERM to every rank (through the step), the grace, then Slurm kills the step; bounded."""
        if self._stopped or self.proc is None:
            self._stopped = True
            return
        self._stopped = True
        if not self.running():  # every rank ended: srun is about to, by itself
            self._done.wait(self.config.stop_grace_s)
        if self.proc.poll() is None:
            if self.step is not None:
                self._scancel("--signal=TERM")
            else:
                self.proc.send_signal(signal.SIGTERM)
            if not self._done.wait(self.config.stop_grace_s) and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)  # srun: "forcing job termination"
                if not self._done.wait(KILL_WAIT_S):
                    self._scancel()
                    self.proc.kill()
        self._done.wait(KILL_WAIT_S + 2.0)
        while self.next_exit(0) is not None:
            pass

    def __enter__(self) -> "SrunStep":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SlurmNodes:
    """The host set of the srun mechanisms: the allocation's nodes, where slurmd runs (nothing to
    open or close; each task's wrapper picks its node's address)."""

    executors: dict = {}

    def __init__(self) -> None:
        self._toward: dict[str, str] = {}

    def merge(self, hosts):
        return list(hosts), []  # Slurm node names are distinct nodes: no merging, no preflight

    def open(self, hosts) -> dict[str, str | None]:
        return {h: None for h in hosts}

    def close(self, hosts) -> None:
        pass

    def addresses(self, hosts) -> dict[str, str]:
        return {h: "" for h in hosts}

    def launcher_address(self, host: str) -> str:
        """This machine's source address towards the node (cached): an address, never a name."""
        if host not in self._toward:
            from ..ssh.probe import route_get

            try:
                address = socket.gethostbyname(host)
            except OSError:
                address = ""
            src = route_get(address).get("src", "") if address else ""
            self._toward[host] = src or socket.gethostbyname(socket.gethostname())
        return self._toward[host]


class _SrunBase:
    """What both srun mechanisms (``mechanism.Mechanism``) share: the job's step directory, the
    exits, stopping."""

    name = "srun"

    def __init__(self, config: LaunchConfig):
        self.config = config
        self.hosts = SlurmNodes()
        self._stack = contextlib.ExitStack()

    def _steps(self) -> list[SrunStep]:
        raise NotImplementedError

    def _job_dir(self) -> tuple[str, str]:
        job_id = envmod.new_job_id()
        return job_id, self._stack.enter_context(step_dir(self.config, job_id))

    def signal(self, workers, sig: int) -> None:
        for w in workers:
            w.signal(sig)

    @property
    def workers(self) -> list:
        return [w for st in self._steps() for w in st.workers]

    @property
    def returncodes(self) -> dict:
        return {k: v for st in self._steps() for k, v in st.returncodes.items()}

    def close(self) -> None:
        threads = [threading.Thread(target=st.stop, name="srun-stop", daemon=True) for st in self._steps()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.config.stop_grace_s + KILL_WAIT_S + 5.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            self._stack.close()

class SrunStatic(_SrunBase):
    """A static job: one step for every rank (``--kill-on-bad-exit``: a failed rank ends them all)."""

    def __init__(self, config: LaunchConfig):
        super().__init__(config)
        self.step: SrunStep | None = None

    def prepare(self, slots: Sequence[Slot] | None) -> envmod.JobPlan:
        job_id, d = self._job_dir()
        return plan_step(self.config, d, job_id)

    def start(self, specs, plan: envmod.JobPlan, sink: OutputSink, reaper: Reaper | None,
              cancelled=lambda: False) -> None:
        # one environment for every task: the first rank's additions (the observers' address)
        self.step = SrunStep(self.config, [s.slot for s in specs], plan, sink, reaper,
                             extra_env=dict(specs[0].env) if specs else {})
        if not cancelled():
            self.step.start()

    def _steps(self) -> list[SrunStep]:
        return [self.step] if self.step is not None else []

    def wait(self, timeout: float):
        if self.step is None:
            return None
        return self.step.next_exit(timeout)


class SrunElastic(_SrunBase):
    """An elastic job: each rank a step of its own on its node (a lost node's ranks end alone, and
    new ranks start as new steps in the allocation), with ``--overlap`` so that a node's ranks run
    side by side as a static step's do."""

    def __init__(self, config: LaunchConfig):
        super().__init__(config)
        self.steps: list[SrunStep] = []
        self._dir = ""
        self._exits: queue.Queue = queue.Queue()

    def prepare(self, slots: Sequence[Slot] | None) -> envmod.JobPlan:
        job_id, self._dir = self._job_dir()
        return plan_step(self.config, self._dir, job_id)

    def start(self, specs, plan: envmod.JobPlan, sink: OutputSink, reaper: Reaper | None,
              cancelled=lambda: False) -> None:
        """One more step per rank (their worker numbers and places go to the tasks in
        ``elastic.json`` of the step's own directory)."""
        if not self._dir:
            raise LaunchError("the srun launcher starts an elastic job's ranks after prepare()")
        for spec in specs:
            if cancelled():
                return
            sub = os.path.join(self._dir, f"step{len(self.steps)}")
            os.mkdir(sub, 0o700)
            write_json(os.path.join(sub, "elastic.json"),
                       {"0": {"wid": spec.wid, "slot": dataclasses.asdict(spec.slot)}})
            extra = {k: v for k, v in spec.env.items() if k != "APPLIANCE_ELASTIC_WORKER"}
            step = SrunStep(self.config, [spec.slot], dataclasses.replace(plan, fault_dir=sub), sink, reaper,
                            wids=[spec.wid], extra_env=extra, exits=self._exits, grace_s=0.0, overlap=True)
            self.steps.append(step)
            step.start()

    def _steps(self) -> list[SrunStep]:
        return list(self.steps)

    def wait(self, timeout: float):
        return next_exit(self._exits, timeout)
