"""What a rank publishes about itself to the launcher: one thread, one TCP connection, JSON lines.

Owns the rank side of the metrics wire (docs/runtime.md, "Metrics a rank publishes"): with
APPLIANCE_METRICS_ADDR=HOST:PORT set (the launcher sets it when it collects metrics), ``start``
(called by ``appliance.runtime.engine`` when an engine starts) opens a daemon thread that connects
there, says ``hello`` (the rank, the job, the round, and an HMAC of the job secret), then every
APPLIANCE_METRICS_INTERVAL seconds (default 1) sends one ``sample``: steps, busy/wait/late
seconds and per-kind operation counters read from the core (``Runtime.metrics()``), the
process's RSS and, where torch uses a GPU, its utilisation and memory; ``stop`` (at shutdown or
before a re-init) sends a last sample and ``bye``. Every counter is cumulative since the first init of the process
(an engine's counters are carried over when it stops), so a lost line loses nothing. Unset: no
thread, nothing sent. Steps are counted here from whichever source the script has
(``note_step``): optimizer steps, else elastic commits, else explicit ``step()`` calls.

The hello's HMAC is keyed with the job secret the engine holds, or else APPLIANCE_JOB_SECRET (a
one-rank job, or an elastic one while it has one rank, needs no secret to run but is observed
like any other).

Failure modes: the thread never blocks or fails training. Connects and sends have short
timeouts; on an error the connection is dropped and one new connection is tried at once (a
collector that closed the connection, or that moved, is expected at a membership change: no
line); when that fails too, samples are lost meanwhile, a reconnect is tried at most once per
interval, and one warning line per process goes to stderr. A malformed APPLIANCE_METRICS_ADDR is
that warning, and nothing is sent.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

from appliance.common import knobs

AUTH_MESSAGE = b"appliance-metrics"
SOURCES = ("optimizer", "commit", "explicit")  # in order of precedence
KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")


def auth(secret: bytes) -> Optional[str]:
    """The hello's ``auth``: hex HMAC-SHA256 of ``AUTH_MESSAGE`` keyed with the job secret, or None."""
    return hmac.new(secret, AUTH_MESSAGE, hashlib.sha256).hexdigest() if secret else None


# --- steps (fed by the framework adapters; process-wide, kept across re-inits) ---------------
_steps = dict.fromkeys(SOURCES, 0)
_samples = dict.fromkeys(SOURCES, 0)
_samples_known = dict.fromkeys(SOURCES, False)
_progress: dict = {"total": None, "samples_per_step": None}


def note_step(source: str, samples: Optional[int] = None) -> None:
    """One step of ``source`` ("optimizer", "commit" or "explicit"); ``samples`` processed in it
    (default: ``progress``'s samples_per_step, if given). Cheap: a few dict updates."""
    _steps[source] += 1
    if samples is None:
        samples = _progress["samples_per_step"]
    if samples is not None:
        _samples[source] += int(samples)
        _samples_known[source] = True


def set_progress(total: Optional[int] = None, samples_per_step: Optional[int] = None) -> None:
    """The job's total steps (for an ETA) and the samples one step processes on this rank."""
    if total is not None:
        _progress["total"] = int(total)
    if samples_per_step is not None:
        _progress["samples_per_step"] = int(samples_per_step)


def steps() -> tuple:
    """(steps, source, samples or None): the counted source is the first of ``SOURCES`` that
    has any, so a script with both optimizer steps and commits counts its optimizer steps."""
    for src in SOURCES:
        if _steps[src]:
            return _steps[src], src, (_samples[src] if _samples_known[src] else None)
    return 0, None, None


# --- counters carried across engines --------------------------------------------------------
_carried: dict = {"busy_s": 0.0, "wait_s": 0.0, "late_s": 0.0, "ops": {}}
_first_start: list = []  # monotonic time of the process's first engine start


def _add(total: dict, m: dict) -> dict:
    out = {k: total[k] + m.get(k, 0.0) for k in ("busy_s", "wait_s", "late_s")}
    ops = {k: dict(v) for k, v in total["ops"].items()}
    for kind, c in m.get("ops", {}).items():
        o = ops.setdefault(kind, {"n": 0, "bytes": 0, "s": 0.0})
        o["n"] += c["n"]
        o["bytes"] += c["bytes"]
        o["s"] += c["s"]
    out["ops"] = ops
    return out


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _gpu() -> tuple:
    """(utilisation %, bytes) of this process's current CUDA device when torch uses one, else (None, None).
    torch is only looked at when the script imported it."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None, None
        dev = torch.cuda.current_device()
        mem = int(torch.cuda.memory_reserved(dev))
        try:
            util = float(torch.cuda.utilization(dev))
        except Exception:  # noqa: BLE001  (no NVML here: utilisation unknown)
            util = None
        return util, mem
    except Exception:  # noqa: BLE001  (never fail the publisher over a GPU reading)
        return None, None


def parse_addr(addr: str) -> tuple:
    """("host", port) from HOST:PORT ([v6]:PORT too); ValueError naming the value."""
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"APPLIANCE_METRICS_ADDR={addr!r} is not HOST:PORT")
    return host, int(port)


_warned: list = []  # one warning line per process


def _warn(text: str) -> None:
    if not _warned:
        _warned.append(text)
        print(f"appliance: metrics: {text}; samples are dropped meanwhile (training goes on)",
              file=sys.stderr, flush=True)


class Publisher:
    """The publishing thread of one engine (``start``/``stop`` make and end it)."""

    def __init__(self, addr: tuple, interval: float, hello: dict, read: Callable[[], dict]):
        self.addr, self.interval, self._hello, self._read = addr, interval, hello, read
        self._sock: Optional[socket.socket] = None
        self._next_connect = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="appliance-metrics", daemon=True)
        self.sent = 0  # lines sent (for tests and the cost benchmark)
        self._sent_here = 0  # lines sent on the current connection
        self.cpu_s = 0.0  # the thread's CPU time so far, updated each interval (the cost benchmark)

    def start(self) -> "Publisher":
        self._thread.start()
        return self

    def _timeout(self) -> float:
        return max(0.05, min(1.0, self.interval))

    def _connect(self) -> bool:
        now = time.monotonic()
        if now < self._next_connect:
            return False
        self._next_connect = now + self.interval
        try:
            s = socket.create_connection(self.addr, timeout=self._timeout())
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock, self._sent_here = s, 0
            self._send(self._hello)
            return self._sock is not None
        except OSError as e:
            self._drop(e)
            return False

    def _send(self, obj: dict, again: bool = True) -> None:
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        try:
            self._sock.sendall(line)
            self.sent += 1
            self._sent_here += 1
        except OSError as e:
            # a connection that worked (it carried more than a hello and a sample: not one the
            # collector refused) is tried once more at once, without a word
            if not again or obj is self._hello or self._sent_here < 3:
                self._drop(e)
                return
            self._close()  # once more on a new connection before saying anything
            self._next_connect = 0.0
            if self._connect():
                self._send(obj, again=False)

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def _drop(self, e: BaseException) -> None:
        self._close()
        _warn(f"cannot send to APPLIANCE_METRICS_ADDR={self.addr[0]}:{self.addr[1]} ({e})")

    def _emit(self, obj: dict) -> None:
        if self._sock is None and not self._connect():
            return
        self._send(obj)

    def _run(self) -> None:
        self._connect()  # the hello at once: the collector knows the rank from its init on
        while not self._stop.wait(self.interval):
            try:
                sample = self._read()
            except Exception:  # noqa: BLE001  (the engine went away under us: nothing to report)
                continue
            self._emit(sample)
            self.cpu_s = time.thread_time()

    def stop(self, bye: dict) -> None:
        """End the thread; send a last sample and ``bye`` (best effort, when connected) and close."""
        self._stop.set()
        self._thread.join(timeout=2 * self._timeout() + 1)
        if self._thread.is_alive():  # stuck in a send past its timeout: leave the socket to it
            return
        if self._sock is not None:
            try:
                self._send(self._read())
            except Exception:  # noqa: BLE001  (no last sample: the collector has the previous ones)
                pass
        if self._sock is not None:
            self._send(bye)
        self._close()


_publisher: Optional[Publisher] = None


def publisher() -> Optional[Publisher]:
    """The running engine's publisher, if any."""
    return _publisher


def _env_secret() -> bytes:
    """APPLIANCE_JOB_SECRET's bytes (b"" when unset or not hexadecimal): a one-rank job's engine
    holds no secret (it has no peer to prove it to), yet the launcher's collector asks for it."""
    try:
        return bytes.fromhex(os.environ.get("APPLIANCE_JOB_SECRET", "") or "")
    except ValueError:
        return b""


def _round(cfg) -> int:
    return int(getattr(cfg, "elastic_round", 0) or 0)


def start(engine: Any) -> Optional[Publisher]:
    """The publisher of ``engine`` (an ``appliance.runtime.engine.Engine``) when
    APPLIANCE_METRICS_ADDR is set; None (and nothing runs) otherwise."""
    global _publisher
    if not _first_start:
        _first_start.append(time.monotonic())
    raw = os.environ.get("APPLIANCE_METRICS_ADDR", "")
    if not raw:
        return None
    try:
        addr = parse_addr(raw)
        interval = knobs.read("APPLIANCE_METRICS_INTERVAL")
        total = knobs.read("APPLIANCE_TOTAL_STEPS")
    except (ValueError, knobs.ConfigError) as e:
        _warn(str(e))
        return None
    if total is not None and _progress["total"] is None:
        _progress["total"] = total
    cfg, core = engine.config, engine.core
    rank, rnd = core.rank, _round(cfg)
    hello = {"v": 1, "kind": "hello", "job": cfg.job_id or None, "rank": rank, "size": core.size,
             "local_rank": core.local_rank, "host": cfg.host, "round": rnd, "pid": os.getpid(),
             "auth": auth(cfg.secret or _env_secret())}
    t0 = _first_start[0]

    def read() -> dict:
        m = _add(_carried, core.metrics())
        n, src, samples = steps()
        util, mem = _gpu()
        return {"v": 1, "kind": "sample", "t": time.time(), "rank": rank, "round": rnd,
                "step": n, "step_src": src, "samples": samples, "total_steps": _progress["total"],
                "busy_s": m["busy_s"], "wall_s": time.monotonic() - t0, "ops": m["ops"],
                "wait_s": m["wait_s"], "late_s": m["late_s"], "rss": _rss(), "gpu_util": util, "gpu_mem": mem}

    _publisher = Publisher(addr, interval, hello, read).start()
    return _publisher


def stop(engine: Any, carry: bool = True) -> None:
    """Before ``engine`` shuts down: end its publisher (a last sample, ``bye``) and carry its
    counters over to the next engine (``carry`` False: the engine goes on, as in the cost benchmark)."""
    global _publisher, _carried
    p, _publisher = _publisher, None
    if p is not None:
        p.stop({"v": 1, "kind": "bye", "rank": engine.core.rank, "t": time.time()})
    if not carry:
        return
    try:  # after its last sample: counted once
        _carried = _add(_carried, engine.core.metrics())
    except Exception:  # noqa: BLE001  (a core without counters: nothing to carry)
        pass
