"""``horovod.common.elastic``: the framework-free half of Horovod's elastic training.

What it is: ``State`` (commit = save + ``check_host_updates``; ``on_reset`` runs ``reset`` and the
registered callbacks), ``ObjectState`` (plain attributes given as keyword arguments; ``save`` and
``restore`` deep-copy them, ``sync`` takes rank 0's through the ``bcast_object`` it was given),
``HostUpdateResult`` (what a host-set notification says), and ``run_fn(func, reset)``, the loop
behind ``hvd.elastic.run``: sync the state, call ``func(state, ...)``; on ``HorovodInternalError``
(a peer lost) restore the last commit; on ``HostsUpdatedInterrupt`` keep the state as it is; then
reset the runtime (``reset()``: ``shutdown()`` + ``init()``, which in an elastic job takes the next
round from the driver, ``appliance.runtime.elastic``), call ``state.on_reset()`` and go round
again, syncing from the new rank 0 when the round says so. The surviving processes are never
restarted; new workers start in the first ``sync``.

Outside an elastic job (no driver: the hosts are fixed) a lost peer cannot be replaced:
``run_fn`` restores the last commit and re-raises ``HorovodInternalError``, so a
``finally``/``except`` in the script can checkpoint the last committed state.

Host-set notifications: ``State.on_hosts_updated(timestamp, result)`` queues one; in an elastic
job ``run_fn`` registers the state with the runtime's notification thread on entry (and removes
it on exit), as Horovod's worker notification service does. ``check_host_updates`` (called by
every ``commit``) broadcasts rank 0's view of the newest notification with the state's
``bcast_object`` so that every rank raises ``HostsUpdatedInterrupt`` at the same commit, or none
does. It is a collective: every rank must commit the same number of times.

Whether to sync after a reset is the round's decision (every member gets the same answer from the
driver: any new worker, or a failure, means everyone syncs), not each rank's own: a rank that
skipped the sync while another broadcast would deadlock.

Owns nothing beyond each state's saved copy and notification queue; reads no environment itself
(``appliance.runtime.elastic`` does); does not import torch.
"""
from __future__ import annotations

import copy
import enum
import functools
import queue
import sys

from appliance.hvdcompat.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from appliance.runtime import elastic as _runtime_elastic


class HostUpdateResult(enum.IntFlag):
    """What changed in the set of hosts (``horovod.runner.elastic.worker.HostUpdateResult``)."""
    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class State:
    """Training state kept consistent across the workers of an elastic job.

    ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank; ``get_rank()`` this rank.
    Subclasses implement ``save``, ``restore`` and ``sync`` (and may override ``reset``).
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions (no arguments) to call after every reset, e.g. to rescale the learning rate
        by the new ``hvd.size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``run`` after the runtime was reset: drops queued notifications (but those
        of the new round, which may have come during the reset), calls ``reset()`` then the
        registered callbacks in order."""
        self._host_messages = queue.Queue()
        session = _runtime_elastic.current()
        if session is not None:
            session.replay(self.on_hosts_updated)
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res) -> None:
        """Queue a host-set notification (``timestamp`` increases; ``update_res`` a HostUpdateResult)."""
        self._host_messages.put((timestamp, HostUpdateResult(int(update_res))))

    def commit(self) -> None:
        """Save the state as the point ``restore`` returns to, then ``check_host_updates``.
        Commits copy the state (possibly from the GPU): commit every few batches, not every one."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank when rank 0 has seen a notification newer
        than the last one acted on (``skip_sync`` when hosts were only removed). A collective."""
        prev = newest = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, res = self._host_messages.get()
            if timestamp > newest:
                newest = timestamp
                update |= res
        prev, newest, update = self._bcast_object((prev, newest, int(update)))
        self._last_updated_timestamp = newest
        if newest > prev:
            raise HostsUpdatedInterrupt(HostUpdateResult(update) == HostUpdateResult.removed)

    def save(self) -> None:
        """Keep a copy of the state in host memory."""
        raise NotImplementedError(f"{type(self).__name__}.save")

    def restore(self) -> None:
        """Return to the last saved copy, undoing every change made since."""
        raise NotImplementedError(f"{type(self).__name__}.restore")

    def sync(self) -> None:
        """Make every rank's state equal to rank 0's."""
        raise NotImplementedError(f"{type(self).__name__}.sync")

    def reset(self) -> None:
        """Adjust to a new set of workers (before the next sync). Nothing by default."""


class ObjectState(State):
    """State made of plain picklable objects, given as keyword arguments and kept as attributes
    (``state.epoch``...). ``save`` deep-copies the current attribute values, ``restore`` sets
    them back to (copies of) the saved ones, ``sync`` takes rank 0's saved values."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)
        self._set_attrs()

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


_said_fixed: list = []  # the note of ``fixed_note``, said once per process


def run_fn(func, reset):
    """Wrap ``func(state, *args, **kwargs)`` in the elastic loop described in the module
    docstring; ``reset()`` re-initialises the runtime after a failure or a host-set change."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        session = _runtime_elastic.session() if _runtime_elastic.enabled() else None
        note = _runtime_elastic.fixed_note()
        if note and not _said_fixed:
            _said_fixed.append(note)
            print(note, file=sys.stderr, flush=True)
        if session is not None:
            session.add_listener(state.on_hosts_updated)
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError as e:
                    state.restore()
                    if session is None:
                        raise
                    session.failed(e)
                    skip_sync = False
                except HostsUpdatedInterrupt as e:
                    skip_sync = e.skip_sync
                    if session is not None:
                        session.hosts_updated()
                reset()
                if session is not None:
                    skip_sync = not session.sync_needed()
                state.on_reset()
        finally:
            if session is not None:
                session.remove_listener(state.on_hosts_updated)
    return wrapper


__all__ = ["HostUpdateResult", "ObjectState", "State", "run_fn"]
