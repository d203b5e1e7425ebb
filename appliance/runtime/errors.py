"""Exceptions of the runtime, shared by every framework adapter.

* ``HorovodInternalError`` (a ``RuntimeError``, as in Horovod): the job cannot go on: a peer was
  lost, the wire was corrupt, a handshake failed, or the runtime was shut down. Its message names
  the rank and host where the failure started. Every pending operation on every rank fails with it.
* ``MismatchError`` (a ``RuntimeError``): ranks submitted the same tensor name with different
  dtype, shape, op, root or scale factors. It names the tensor, the ranks and the differing
  values. Only that operation fails; the runtime stays usable.
* ``ValueError``: a bad call on this rank (for example a name already in flight).
"""
from __future__ import annotations


class HorovodInternalError(RuntimeError):
    """The collective job failed; ``origin_rank``/``origin_host`` say where it started."""

    def __init__(self, message: str = "", origin_rank: int = -1, origin_host: str = "", code: str = ""):
        super().__init__(message)
        self.origin_rank = origin_rank
        self.origin_host = origin_host
        self.code = code


class MismatchError(RuntimeError):
    """Ranks disagree on a collective; the message names tensor, ranks and values."""
