"""CPU binding of ranks (``APPLIANCE_BIND``), as ``mpirun --bind-to core`` does.

What it is: with ``APPLIANCE_BIND=core``, each rank is started bound to its share of the CPUs
its host allows the launcher (or the remote stub): the ranks of one host split them into
contiguous, disjoint slices by local rank (one CPU each when ranks outnumber CPUs, shared
round-robin). A rank's threads (the caller, the collective engine, torch's intra-op pool,
data-loader workers) then stay on its slice, and torch sizes its thread pool to it. Where
the ranks of a host and their engine threads outnumber its cores, this keeps each rank's
hand-offs on its own cores instead of wherever the scheduler puts four spinning threads.
``none`` (the default) leaves placement to the kernel.

How: the spawning thread binds itself to the slice around ``Popen`` and restores its mask
after; the child inherits the mask at fork, before it runs a line. No ``preexec_fn``, no
external tool. Used by every place a rank is spawned (local workers, the remote stub, the
Slurm task).

Failure modes: an unknown value raises ``ConfigError`` (config's knob check); a host whose
kernel refuses the mask (``sched_setaffinity`` failing) starts the rank unbound and says so
on stderr once.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator, Mapping, Optional, Sequence

_warned = False


def rank_cpus(local_rank: int, local_size: int, allowed: Sequence[int]) -> list:
    """The CPUs of ``local_rank`` of ``local_size`` ranks sharing ``allowed``: contiguous
    disjoint slices (the first ``len % size`` ranks get one more), or one CPU each, round-robin,
    when ranks outnumber CPUs. Pure."""
    cpus = sorted(allowed)
    if not cpus or local_size < 1 or not 0 <= local_rank < local_size:
        raise ValueError(f"cannot bind local rank {local_rank} of {local_size} to CPUs {cpus}")
    if local_size >= len(cpus):
        return [cpus[local_rank % len(cpus)]]
    base, extra = divmod(len(cpus), local_size)
    start = local_rank * base + min(local_rank, extra)
    return cpus[start:start + base + (1 if local_rank < extra else 0)]


def cpus_for(env: Mapping[str, str]) -> Optional[list]:
    """The CPUs the rank whose environment is ``env`` is bound to, or None (binding off, or
    the environment lacks the local rank and size)."""
    from appliance.common.knobs import read  # the knob's parsing and validation live with the knob table

    if read("APPLIANCE_BIND", env) != "core":
        return None
    try:
        local_rank, local_size = int(env["HOROVOD_LOCAL_RANK"]), int(env["HOROVOD_LOCAL_SIZE"])
    except (KeyError, ValueError):
        return None
    return rank_cpus(local_rank, local_size, os.sched_getaffinity(0))


@contextlib.contextmanager
def bound(env: Mapping[str, str]) -> Iterator[None]:
    """Around a spawn: the calling thread runs on the rank's CPUs (``cpus_for(env)``), so the
    child starts with them; the thread's own mask is restored after."""
    global _warned
    cpus = cpus_for(env)
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        if not _warned:
            _warned = True
            print(f"appliance: APPLIANCE_BIND=core: cannot bind to CPUs {cpus} ({e.strerror}); ranks run unbound",
                  file=sys.stderr, flush=True)
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
