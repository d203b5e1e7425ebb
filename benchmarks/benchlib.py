"""Helpers the benchmark scripts share: sizes, timing, result files, and starting OpenMPI jobs.

Not a package module: the scripts in benchmarks/ import it as a sibling (their directory is on
``sys.path`` when run as ``python benchmarks/X.py``, including the ranks they start).

OpenMPI legs run ``mpirun`` (openmpi-bin) with ``mpi4py`` (pip, the ``bench`` extra) in this
interpreter. ``mpi_missing()`` says in one line why they cannot run (no mpirun, no mpi4py), and
the scripts go on without them. ``mpirun_argv`` builds the command as an argv list: ob1 with the
chosen BTLs (``shm``: self,vader; ``tcp``: self,tcp over loopback, or over a given NIC/subnet with
ranks on other hosts: crosshost.py), the binding of ``APPLIANCE_BIND`` (``bind_mode()``: none by
default, ``--bind-to core`` with ``APPLIANCE_BIND=core``, which our launcher applies to our and gloo's
ranks too), ``--oversubscribe``, and ``--allow-run-as-root`` when running as root.
"""
from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

# OpenMPI transports by name: the BTL list for --mca btl, and extra MCA settings.
MPI_TRANSPORTS = {
    "shm": ["--mca", "btl", "self,vader"],
    "tcp": ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"],
}


def parse_size(s: str) -> int:
    """'4K' -> 4096, '1M', '256MiB', '100' (bytes)."""
    s = s.strip().upper()
    for suffix in ("IB", "B"):
        if s.endswith(suffix) and len(s) > len(suffix):
            s = s[: -len(suffix)]
            break
    return int(float(s[:-1]) * UNITS[s[-1]]) if s[-1] in UNITS else int(s)


def parse_sizes(text: str) -> list:
    """'4K,1M' or a range '4K-256M' (every power of 4 from the first to the last)."""
    if "-" in text and "," not in text:
        lo, hi = (parse_size(x) for x in text.split("-", 1))
        out = [lo]
        while out[-1] * 4 <= hi:
            out.append(out[-1] * 4)
        return out
    return [parse_size(x) for x in text.split(",") if x.strip()]


def human(n: float) -> str:
    """4096 -> '4K'; 1536 -> '1.5K'."""
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m:
            v = n / m
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n:.0f}"


def fmt_us(seconds) -> str:
    """Seconds as microseconds for a table cell; '-' when missing."""
    if seconds is None:
        return "-"
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def fmt_ratio(num, den) -> str:
    return "-" if num is None or den is None or den == 0 else f"{num / den:.2f}"


def iters_for(nbytes: int, base: int) -> int:
    """Samples for a size: ``base`` at 1 MiB and below, fewer for larger sizes (at least 5)."""
    return max(5, min(base, int(base * (1 << 20) / max(nbytes, 1))))


def time_op(fn, iters: int) -> list:
    """Wall time of each of ``iters`` calls of ``fn``, in seconds."""
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


PASSES = 3


def sweep(cells, make, barrier, iters_of, warmup: int = 3) -> dict:
    """Time each cell's callables in ``PASSES`` passes over all the cells, so a burst of other
    work on the machine spoils a pass, not a whole cell. ``make(cell)`` -> {backend: fn} (fresh
    buffers each pass); the backends of a cell run one after another, so they see the same
    machine state. ``barrier()`` lines the ranks up before each cell; ``warmup`` calls (one in
    later passes) are not timed. Returns {(cell, backend): [seconds...]}, ``iters_of(cell)``
    samples in all (at least ``PASSES``)."""
    samples: dict = {}
    for i in range(PASSES):
        for cell in cells:
            fns = make(cell)
            barrier()
            for _ in range(warmup if i == 0 else 1):
                for fn in fns.values():
                    fn()
            k = -(-iters_of(cell) // PASSES)
            for backend, fn in fns.items():
                samples.setdefault((cell, backend), []).extend(time_op(fn, k))
            del fns
    return samples


def median(samples) -> float:
    return statistics.median(samples)


def ranks_output(res, tail: int = 4000) -> str:
    """The end of what a failed ``launch`` result's ranks wrote, stdout and then stderr (where
    a crash says why, e.g. an abort's message)."""
    return "\n".join(f"{stream} (end):\n{res.output(stream=stream)[-tail:]}" for stream in ("stdout", "stderr"))


def result_path(tag: str) -> str:
    """A fresh path in a private temporary directory, for a worker's JSON result."""
    return os.path.join(tempfile.mkdtemp(prefix="appliance-bench-"), f"{tag}.json")


def threads_per_rank(np_: int) -> int:
    """Torch threads per rank so the ranks together use the cores once (at least 1)."""
    return max(1, (os.cpu_count() or 1) // max(1, np_))


def bind_mode() -> str:
    """How every backend's ranks are placed in this run: ``APPLIANCE_BIND`` (none or core). Our
    launcher binds our and gloo's ranks by it; ``mpirun_argv`` gives OpenMPI's the same."""
    from appliance.common.knobs import read

    return read("APPLIANCE_BIND")


def machine_line() -> str:
    """One line about the machine: cores, load (other work here skews every number), binding."""
    load = "/".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    bound = "each rank bound to its cores (APPLIANCE_BIND=core)" if bind_mode() == "core" else "ranks unbound"
    return f"{os.cpu_count()} cores, load average {load} (1/5/15 min) at start; {bound}"


def mpi_missing() -> str | None:
    """Why the OpenMPI legs cannot run here (one line), or None when they can."""
    if not shutil.which("mpirun"):
        return "OpenMPI: mpirun not found (apt-get install openmpi-bin); OpenMPI columns skipped"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "OpenMPI: mpi4py not installed (pip install '.[bench]'); OpenMPI columns skipped"
    return None


def mpirun_argv(np_: int, transport: str, argv: list, hosts: str | None = None, iface: str | None = None,
                extra: list = ()) -> list:
    """The mpirun command running ``argv`` on ``np_`` ranks over ``transport`` (shm/tcp): local ranks,
    or with ``hosts`` (mpirun's ``--host`` list) ranks on those hosts, started as ``extra`` says (e.g.
    ``--mca plm_rsh_agent ...``). ``iface`` (a NIC name or a CIDR) replaces loopback for the tcp BTL
    and also carries mpirun's out-of-band channel to its remote daemons."""
    mca = list(MPI_TRANSPORTS[transport])
    if iface:
        mca = [iface if i and mca[i - 1] == "btl_tcp_if_include" else x for i, x in enumerate(mca)]
        mca += ["--mca", "oob_tcp_if_include", iface]
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", bind_mode(), "--mca", "pml", "ob1", *mca]
    if hosts:
        cmd += ["--host", hosts]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd + list(extra) + list(argv)


def run_mpi(np_: int, transport: str, argv: list, timeout: float, env: dict | None = None, **where) -> bool:
    """Run an OpenMPI job; False (after printing why, in a few lines) when it failed. ``env``: extra
    variables for mpirun; ``where``: ``mpirun_argv``'s hosts, iface and extra."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}, **(env or {})}
    # its own session: on a timeout the whole group goes (ssh clients to remote daemons included)
    proc = subprocess.Popen(mpirun_argv(np_, transport, argv, **where), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        print(f"OpenMPI {transport}: timed out after {timeout:.0f} s; its columns skipped", file=sys.stderr)
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    if proc.returncode != 0:
        print(f"OpenMPI {transport}: mpirun exited {proc.returncode}; its columns skipped:\n" + out[-3000:],
              file=sys.stderr)
        return False
    return True
