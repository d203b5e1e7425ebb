"""A worker's side of an elastic job: its round from the driver, and the driver's host notices.

What it is: in an elastic job (HOROVOD_ELASTIC=1 and APPLIANCE_ELASTIC_ADDR set by the
launcher's driver) ``init()`` does not read its layout from the environment once: it asks the
driver for its round (``next_round_env``: rank, size, local and cross ranks, where the round's
store is, a per-round job id so a stale peer of an older round is refused by every handshake)
and is answered when every member of that round has asked too. A worker that could become the
round's rank 0 sends a port free on its data address with the request: rank 0 hosts the round's
store there. ``failed(error)`` (a ``HorovodInternalError`` of this runtime, from a collective or
from the round's rendezvous) and ``hosts_updated()`` say why the next request is made, so the
driver knows whether state must be synced; a failure because a peer showed no sign of life for
the heartbeat timeout (a stopped process, a frozen host, a cut network) also names that rank in
the request (``lost``), so the driver stops waiting for it; the answer's ``sync`` is what every member of the
round uses (``sync_needed()``), so old and new workers never disagree about it. After each round
the layout variables of ``os.environ`` (HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK...) are
the round's, as Horovod sets them.

Notifications: after the first round a daemon thread keeps a ``watch`` connection to the driver
and calls every listener (``add_listener``: ``hvd.elastic.run`` registers its ``State``) with
``(timestamp, HostUpdateResult flags)`` when hosts change while this worker's round runs; a
notice for an earlier round is dropped. The current round's notices are kept (as one: the newest
timestamp, every change; one for a round whose answer has not reached this worker yet is kept
for that round), a listener added later gets them at once, and ``replay`` hands them again to a
state whose queue a reset emptied: a host found while a round starts (between the driver's answer
and the state's reset, or before ``hvd.elastic.run`` while the model is built) is not lost, or
the job would never grow onto it while the new worker waited for the next round until
``--elastic-timeout``.

Leaving on SIGTERM (APPLIANCE_ELASTIC_LEAVE_ON_TERM, set by the launcher on Kubernetes, where a
pod being deleted gets SIGTERM): after the first round a SIGTERM handler (installed from the
main thread, so Python runs it between bytecodes, never inside a collective) asks the driver to
let this worker leave (``op: leave``) and returns: training goes on to the next commit, where every
member gets the host-update interrupt and the next round forms without this worker, whose join is
answered ``removed`` (exit 0). A second SIGTERM, or a request the driver refuses (it is stopping
this worker itself, the job is ending) or cannot answer, is handed on as if this handler were not
there: to the handler the program had installed before ``init()`` (typically one that exits, which
would defeat the leave if it ran at the first SIGTERM), else the signal ends the process.

The wire protocol is ``appliance.common.rendezvous``. Env vars: HOROVOD_ELASTIC,
APPLIANCE_ELASTIC_ADDR, APPLIANCE_ELASTIC_WORKER, APPLIANCE_JOB_ID, APPLIANCE_JOB_SECRET,
APPLIANCE_DATA_ADDR, APPLIANCE_ELASTIC_LEAVE_ON_TERM. Failure modes: the driver refusing the job or unreachable raises
``HorovodInternalError`` (the job is ending); a worker the driver removed from the job (its
host left) prints one line and exits with status 0 (``SystemExit``).
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from typing import Callable, Mapping

from appliance.common import rendezvous as rdv
from appliance.common.knobs import ConfigError, read
from appliance.runtime.errors import HorovodInternalError
from appliance.runtime.config import origin

LAYOUT = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
_ENV_OF = {k: f"HOROVOD_{k.upper()}" for k in LAYOUT}
SILENCE = "no sign of life"  # the core's words for a peer silent past APPLIANCE_HEARTBEAT_TIMEOUT
LEAVE_TIMEOUT_S = 5.0        # the SIGTERM handler's wait for the driver's answer


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(read("HOROVOD_ELASTIC", env)) and bool(read("APPLIANCE_ELASTIC_ADDR", env))


def fixed_note(env: Mapping[str, str] | None = None) -> str:
    """The line ``hvd.elastic.run`` prints (on the first rank) when mpirun or hydra started the job:
    their ranks are fixed; "" otherwise, and on the other ranks."""
    env = os.environ if env is None else env
    src = origin(env)
    if enabled(env) or not src.manager or env.get(src.rank_var, "").strip() != "0":
        return ""
    return (f"hvd.elastic.run under {src.label}: the ranks are fixed, a lost rank ends the job ({src.label} has no "
            "elastic mode); for elastic training launch with `horovodrun --min-np N --max-np M "
            "--host-discovery-script SCRIPT python train.py`")


class Session:
    """This process's membership of an elastic job (one per process: ``session()``)."""

    def __init__(self, env: Mapping[str, str]):
        self.addr = read("APPLIANCE_ELASTIC_ADDR", env)
        worker = read("APPLIANCE_ELASTIC_WORKER", env)
        if worker is None:
            raise ConfigError("HOROVOD_ELASTIC=1 needs APPLIANCE_ELASTIC_WORKER (set by the launcher's driver)")
        self.worker = int(worker)
        self.job = read("APPLIANCE_JOB_ID", env)
        try:
            self.secret = bytes.fromhex(read("APPLIANCE_JOB_SECRET", env) or "")
        except ValueError:
            raise ConfigError("APPLIANCE_JOB_SECRET must be hexadecimal") from None
        self.data_addr = read("APPLIANCE_DATA_ADDR", env) or ""
        self.round: dict = {}
        self.reason = "start"
        self.lost: list[int] = []  # ranks of the last round found silent (first-hand) by this worker
        self.printed_knobs = False  # --verbose: rank 0's knob table once per process, not every round
        self._listeners: list[Callable[[int, int], None]] = []
        self._note: tuple[int, int, int] | None = None  # the round's notices: (round, newest stamp, results)
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self.leave_on_term = bool(read("APPLIANCE_ELASTIC_LEAVE_ON_TERM", env))
        self.leaving = False          # the driver took this worker's leave request
        self._term_installed = False
        self._prev_term: object = signal.SIG_DFL

    # -- rounds -------------------------------------------------------------------------------
    def failed(self, error: BaseException) -> None:
        """The runtime failed (``HorovodInternalError``): the next round must sync. A peer silent
        past the heartbeat timeout (the core names it as the error's origin) is reported lost."""
        self.reason = "error"
        origin = getattr(error, "origin_rank", -1)
        if isinstance(origin, int) and origin >= 0 and SILENCE in str(error) and origin not in self.lost:
            self.lost.append(origin)

    def hosts_updated(self) -> None:
        """Every rank raised ``HostsUpdatedInterrupt`` at a commit: a planned change."""
        if self.reason != "error":
            self.reason = "hosts"

    def next_round(self) -> dict:
        """Block until the driver releases this worker's next round; returns it."""
        port = _free_port(self.data_addr or "0.0.0.0")
        message = {"op": "join", "last": int(self.round.get("round", 0)), "reason": self.reason or "error",
                   "port": port, "addr": self.data_addr, "lost": list(self.lost)}
        try:
            chan = rdv.connect(self.addr, self.secret, self.job, self.worker)
            try:
                answer = rdv.request(chan, message)
            finally:
                chan.close()
        except rdv.RendezvousError as e:
            raise HorovodInternalError(f"worker {self.worker}: the elastic driver is gone: {e}") from None
        if "removed" in answer:
            print(f"appliance: worker {self.worker} leaves the elastic job: {answer['removed']}", file=sys.stderr,
                  flush=True)
            raise SystemExit(0)
        if "round" not in answer:
            raise HorovodInternalError(f"worker {self.worker}: the elastic driver ended the job: "
                                       f"{answer.get('error', answer)}")
        self.round = answer["round"]
        for key in LAYOUT:
            os.environ[_ENV_OF[key]] = str(self.round[key])
        return self.round

    def round_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with the current round's layout, store and job id, for ``RuntimeConfig.from_env``."""
        r = self.round
        env = dict(base)
        env.update({_ENV_OF[k]: str(r[k]) for k in LAYOUT})
        env.update(HOROVOD_HOSTNAME=str(r["host"]), APPLIANCE_STORE_ADDR=str(r["store"]),
                   APPLIANCE_JOB_ID=str(r["job_id"]))
        if r.get("data_addr"):
            env["APPLIANCE_DATA_ADDR"] = str(r["data_addr"])
        return env

    def started(self) -> None:
        """The round's runtime is up; notices flow from now on. The reason of the next request is
        set by ``failed``/``hosts_updated`` (neither: a re-init by hand, treated as a failure)."""
        self.reason = ""
        self.lost = []
        if self.leave_on_term and not self._term_installed and threading.current_thread() is threading.main_thread():
            self._prev_term = signal.signal(signal.SIGTERM, self._on_term)
            self._term_installed = True
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="elastic-notices", daemon=True)
            self._watcher.start()

    def sync_needed(self) -> bool:
        return bool(self.round.get("sync", True))

    # -- leaving on SIGTERM ---------------------------------------------------------------------
    def _on_term(self, signum: int, frame: object) -> None:
        prev = self._prev_term
        if not self.leaving and self._ask_leave():
            self.leaving = True
            print(f"appliance: worker {self.worker} was sent SIGTERM: it leaves the elastic job at its next commit",
                  file=sys.stderr, flush=True)
            return
        if callable(prev):  # the program's own way to stop (``sys.exit`` in a handler unwinds its code)
            prev(signum, frame)
        elif prev != signal.SIG_IGN:  # as without this handler: the signal ends the process
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def _ask_leave(self) -> bool:
        """Whether the driver takes this worker's leave (False: refused, or no driver to ask)."""
        try:
            chan = rdv.connect(self.addr, self.secret, self.job, self.worker, timeout=LEAVE_TIMEOUT_S)
            try:
                return bool(rdv.request(chan, {"op": "leave"}, LEAVE_TIMEOUT_S).get("leave"))
            finally:
                chan.close()
        except rdv.RendezvousError:
            return False

    # -- notifications ------------------------------------------------------------------------
    def add_listener(self, fn: Callable[[int, int], None]) -> None:
        """Call ``fn(timestamp, result)`` for every notice from now on, and now for the current
        round's notices if some came before (``replay``)."""
        with self._lock:
            self._listeners.append(fn)
        self.replay(fn)

    def replay(self, fn: Callable[[int, int], None]) -> None:
        """Call ``fn(timestamp, result)`` for the current round's notices so far, if any: for a
        listener that was not listening when they came, or whose queue a reset emptied (a repeat is
        harmless: a state acts on a newer timestamp only)."""
        with self._lock:
            note = self._note if self._note and self._note[0] == int(self.round.get("round", 0)) else None
        if note is not None:
            fn(note[1], note[2])

    def remove_listener(self, fn: Callable[[int, int], None]) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def _watch(self) -> None:
        while True:
            try:
                chan = rdv.connect(self.addr, self.secret, self.job, self.worker)
            except rdv.RendezvousError:
                return  # the driver is gone: the job is ending
            try:
                chan.send({"op": "watch"})
                while True:
                    note = chan.recv(rdv.SILENCE_S).get("hosts_updated")
                    # a notice of a later round than this worker has taken in yet (its answer is on
                    # its way) is kept for that round; one of an earlier round is dropped
                    if not note or int(note.get("round", -1)) < int(self.round.get("round", 0)):
                        continue
                    rnd, stamp, result = int(note["round"]), int(note["timestamp"]), int(note["result"])
                    with self._lock:
                        if self._note is None or self._note[0] != rnd:
                            self._note = (rnd, stamp, result)
                        else:  # the round's notices so far, as one: the newest stamp, every change
                            self._note = (rnd, max(stamp, self._note[1]), self._note[2] | result)
                        listeners = list(self._listeners) if rnd == int(self.round.get("round", 0)) else []
                    for fn in listeners:
                        fn(stamp, result)
            except rdv.RendezvousError:
                pass
            finally:
                chan.close()


def _free_port(addr: str) -> int:
    """A TCP port free on ``addr`` now (the store binds it moments later; another round is formed
    in the rare case it was taken meanwhile)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, 0))
        except OSError:
            s.bind(("", 0))
        return s.getsockname()[1]


_session: Session | None = None
_session_lock = threading.Lock()


def session() -> Session:
    """This process's elastic session (created on first use from the environment)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = Session(os.environ)
        return _session


def current() -> Session | None:
    """The session, if this process is an elastic worker that has one."""
    return _session


__all__ = ["LAYOUT", "Session", "current", "enabled", "session"]
