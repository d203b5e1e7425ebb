"""``horovod.torch.elastic.sampler``: ``ElasticSampler``, a data sampler that remembers progress.

What it is: a ``torch.utils.data.Sampler`` that shuffles the dataset's indices with
``random.Random(seed + epoch)`` (the same order on every rank), drops the indices already
recorded as processed this epoch, pads the rest to a multiple of ``hvd.size()`` by repeating
its head, and gives rank r every ``size()``-th index from position r (as
``DistributedSampler``). Progress is recorded with ``record_batch(batch_idx, batch_size)``
(the whole job's batch ``batch_idx``: the indices every rank was given at that position, which
every rank can compute, so the record is the same everywhere) or ``record_indices(indices)``
(this rank's own indices; ``TorchState``'s sync unions every rank's). ``state_dict`` /
``load_state_dict`` carry ``epoch`` and the processed indices, so after a restore the loop
resumes where the last commit left it and skips what was processed; ``set_epoch`` (call it at
the *end* of an epoch) starts a new order and forgets the processed indices. The partition is
recomputed (``reset``) on construction, ``set_epoch``, ``load_state_dict`` and ``TorchState``'s
reset, not when ``record_*`` is called, so the current iteration is never reshuffled under a loop.

Horovod 0.28's ``state_dict`` form (``epoch`` + ``processed_num``: a prefix of the epoch's
shuffled order) is accepted by ``load_state_dict``. Owns nothing but its index lists; reads no
environment. Failure modes: ``ValueError`` from ``hvd.size()`` before ``hvd.init()``.
"""
from __future__ import annotations

import math
import random

import torch.utils.data

from appliance.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Partition ``dataset`` (of constant length) over the ranks, skipping processed samples.

    Args: ``dataset``; ``shuffle`` (default True); ``seed``, the same on every rank (default 0).
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices = []
        self.indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    # --- progress --------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new order, no index processed yet. Call it after an epoch
        ends (not before it starts), so that a restore within an epoch keeps its progress."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def get_indices(self, batch_idx: int, batch_size: int) -> list:
        """This rank's indices of batch ``batch_idx`` (of ``batch_size``) in the current pass."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record batch ``batch_idx`` of the current pass as processed by the whole job (every
        rank's ``get_indices(batch_idx, batch_size)``); every rank should record the same batches."""
        start = batch_idx * batch_size * self.num_replicas
        end = min(start + batch_size * self.num_replicas, self.total_size)
        self.processed_indices.update(self._padded()[start:end])

    def record_indices(self, indices) -> None:
        """Record ``indices`` (dataset indices this rank processed) as processed."""
        self.processed_indices.update(int(i) for i in indices)

    # --- state --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices),
                "processed_num": len(self.processed_indices)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        if "processed_indices" in state_dict:
            self.processed_indices = set(state_dict["processed_indices"])
        else:  # Horovod 0.28's form: the first processed_num indices of the epoch's order
            self.processed_indices = set(self._order()[:int(state_dict.get("processed_num", 0))])
        self.reset()

    # --- partition ------------------------------------------------------------------------
    def _order(self) -> list:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def _padded(self) -> list:
        """The remaining indices padded (by repeating the head) to ``total_size``."""
        rem = self.remaining_indices
        pad = self.total_size - len(rem)
        return rem + (rem * (pad // len(rem) + 1))[:pad] if pad > 0 and rem else list(rem)

    def reset(self) -> None:
        """Recompute this rank's share from the current size, rank and processed indices."""
        self.num_replicas = size()
        self.rank = rank()
        self.remaining_indices = [i for i in self._order() if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._padded()[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["ElasticSampler"]
