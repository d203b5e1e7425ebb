"""A rank's place in a job: the one rank-layout type and Horovod's rule for its cross numbers.

What it owns: ``Slot``, the seven facts Horovod gives every rank (rank, size, local rank and
size, cross rank and size, host; horovodrun calls it ``SlotInfo``). The launcher lays one out
for every rank of a job (``launcher.hosts.assign_ranks``); a task that ``srun`` started reads
its own from Slurm's environment (``appliance.common.slurm.SlurmTask`` is a ``Slot``), and
both hand it to the same worker environment. ``cross_of()`` is Horovod's definition of the
cross communicator: the hosts that hold a given local rank, in host order (for the usual
layout with equal ranks per host, simply the host's index and the number of hosts).

Pure: reads no environment, raises nothing of its own.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Slot:
    """One rank's place in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host: str  # the name the launcher was given (-H, hostfile, Slurm node name)


def cross_of(ranks_per_host: Sequence[int], host_index: int, local_rank: int) -> tuple[int, int]:
    """``(cross_rank, cross_size)`` of local rank ``local_rank`` on host ``host_index``, where
    host ``i`` holds ``ranks_per_host[i]`` ranks: its position among the hosts that hold that
    local rank, and their number."""
    holders = [i for i, n in enumerate(ranks_per_host) if n > local_rank]
    return holders.index(host_index), len(holders)
