"""``horovod.torch.sync_batch_norm``: the ``SyncBatchNorm`` name, not implemented yet.

What it is: Horovod's ``hvd.SyncBatchNorm`` (batch normalisation whose statistics are reduced
over every rank) exists here as a name so that scripts and ``isinstance`` checks import; building
one raises ``NotImplementedError`` naming the feature and issue 9 (it is a later item of that
issue), never a silently local batch norm. Owns nothing; reads no environment.
"""
from __future__ import annotations

import torch


class SyncBatchNorm(torch.nn.Module):
    """Horovod's cross-rank batch normalisation; constructing it raises NotImplementedError."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        raise NotImplementedError("hvd.SyncBatchNorm is not implemented by this runtime yet (issue 9); "
                                  "use torch.nn.BatchNorm* (per-rank statistics) meanwhile")
