"""Start N real ranks of a torch test worker and collect what they did (test helper).

``run_workers(np, worker)`` runs ``python tests/runtime/torch_workers.py <worker>`` on ``np``
ranks through the shared spawn helper ``appliance.launcher.launch`` (each rank in its own
session; the first failure stops all; nothing outlives the call). ``np=0`` means one plain
process started without any launcher variables (a single-rank script on a laptop).

With ``expect_codes`` (a rank is meant to die) the launcher's stop-all-on-first-failure would
hide what the survivors do, so those runs use the small local starter here instead: it gives
each rank the environment a launcher gives (HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*,
APPLIANCE_STORE_ADDR=127.0.0.1:<free port>, APPLIANCE_JOB_SECRET, APPLIANCE_DATA_ADDR), lets
the survivors finish, and kills every process group it started, whatever happens.

Raises ``AssertionError`` with every rank's exit code and output tail when a rank failed or
the run timed out.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "torch_workers.py"
REPO = HERE.parent.parent
_LAUNCHER_VARS = ("HOROVOD_", "APPLIANCE_", "OMPI_COMM_WORLD_")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env(extra: dict | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # two cores shared by many: keep torch from spinning threads
    env.update(extra or {})
    return env


def rank_envs(np_: int, extra: dict | None = None) -> list:
    if np_ == 0:
        return [_base_env(extra)]
    common = {
        "HOROVOD_SIZE": str(np_), "HOROVOD_LOCAL_SIZE": str(np_), "HOROVOD_CROSS_RANK": "0",
        "HOROVOD_CROSS_SIZE": "1", "APPLIANCE_STORE_ADDR": f"127.0.0.1:{free_port()}",
        "APPLIANCE_JOB_SECRET": secrets.token_hex(16), "APPLIANCE_DATA_ADDR": "127.0.0.1",
        "HOROVOD_START_TIMEOUT": "30",
    }
    return [_base_env({**common, "HOROVOD_RANK": str(r), "HOROVOD_LOCAL_RANK": str(r), **(extra or {})})
            for r in range(np_)]


def _tail(path: Path, limit: int = 4000) -> str:
    data = path.read_bytes().decode(errors="replace")
    return data if len(data) <= limit else "..." + data[-limit:]


def run_workers(np_: int, worker: str, *args: str, timeout: float = 120.0, grace: float = 15.0,
                env: dict | None = None, expect_codes: list | None = None, pids: list | None = None) -> list:
    """Run ``worker`` on ``np_`` ranks (0 = no launcher); return each rank's stdout.

    ``expect_codes``: the exit code each rank must end with (default all 0); a rank that
    ends with a code it should not counts as failed. ``pids`` (a list) receives the pids."""
    if np_ >= 1 and expect_codes is None and pids is None:
        return _launch(np_, [worker, *args], timeout, env)
    expected = list(expect_codes) if expect_codes is not None else [0] * max(np_, 1)
    envs = rank_envs(np_, env)
    procs, outs = [], []
    with tempfile.TemporaryDirectory(prefix="torch_workers_") as tmp:
        try:
            for r, e in enumerate(envs):
                out, err = Path(tmp, f"{r}.out"), Path(tmp, f"{r}.err")
                outs.append((out, err))
                with open(out, "wb") as fo, open(err, "wb") as fe:
                    procs.append(subprocess.Popen([sys.executable, str(WORKERS), worker, *args], env=e,
                                                  stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                                  start_new_session=True, cwd=str(REPO)))
                    if pids is not None:
                        pids.append(procs[-1].pid)
            deadline = time.monotonic() + timeout
            failed_at = None
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if failed_at is None and any(p.returncode not in (None, want)
                                             for p, want in zip(procs, expected)):
                    failed_at = now
                if now > deadline or (failed_at is not None and now > failed_at + grace):
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent
                    pass
        codes = [p.returncode for p in procs]
        report = [f"--- rank {r}: exit {c}\n[stdout]\n{_tail(o)}\n[stderr]\n{_tail(e)}"
                  for r, (c, (o, e)) in enumerate(zip(codes, outs))]
        if codes != expected:
            raise AssertionError(f"worker {worker!r} on {np_ or 1} rank(s) failed or timed out "
                                 f"(exit codes {codes}, expected {expected}; negative = killed):\n" + "\n".join(report))
        return [o.read_text() for o, _ in outs]


def _launch(np_: int, args: list, timeout: float, env: dict | None) -> list:
    from appliance.launcher import launch

    extra = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
             "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HOROVOD_START_TIMEOUT": "30", **(env or {})}
    res = launch([sys.executable, str(WORKERS), *args], np=np_, timeout=timeout, env=extra, cwd=str(REPO))
    if res.returncode != 0:
        report = [f"--- rank {r}\n[stdout]\n{res.output(r)[-4000:]}\n[stderr]\n{res.output(r, 'stderr')[-4000:]}"
                  for r in range(np_)]
        raise AssertionError(f"worker {args[0]!r} on {np_} ranks failed (returncode {res.returncode}, "
                             f"timed out {res.timed_out}): {res.reason}\n" + "\n".join(report))
    return [res.output(r) for r in range(np_)]
