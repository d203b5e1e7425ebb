"""Process sets: collectives among a subset of the job's ranks, with Horovod's API and semantics.

What it is: ``ProcessSet`` (a sorted list of job ranks; ``process_set_id`` once registered),
``global_process_set`` (id 0, every rank), static sets (``setup(process_sets)``, from
``hvd.init(process_sets=[...])``) and dynamic ones (``add_process_set``/``remove_process_set``,
allowed with ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or ``hvd.init(process_sets="dynamic")``), and
``resolve``, which turns the ``process_set=`` argument of an operation into the id the core
negotiates with (``root_of`` does the same for a broadcast root, a job rank).

What it owns: the table of registered sets of the current runtime (emptied by ``setup``). Each
set has its own negotiation in the core (names, automatic names and groups are per set) and its
own communicator (a view over the job's links; CUDA tensors of a set go through host memory).

Adding and removing are collective: every rank of the job calls them in the same order with the
same ranks (non-members too, as in Horovod). A disagreement raises ``ValueError`` on every rank,
naming what each rank asked for; the ids are the smallest unused ones, so they agree everywhere.

Environment: ``HOROVOD_DYNAMIC_PROCESS_SETS`` (through ``appliance.common.knobs``).
Failure modes: ``ValueError`` for a set that is not registered (or was removed), an operation on
a set that does not hold this rank, a root outside the set, a duplicate set (one with every rank of
the job duplicates the global set, as in Horovod), or dynamic changes
without dynamic process sets enabled.
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence

import numpy as np

from appliance.common import knobs
from appliance.runtime import api, engine

_table: dict = {}          # id -> ProcessSet, for the current runtime
_dynamic = False           # add/remove allowed after init


class ProcessSet:
    """A set of job ranks that runs collectives together. Pass it to ``hvd.init(process_sets=...)``
    or ``hvd.add_process_set``; then ``process_set=`` of any operation. ``size()``/``rank()`` are
    None until it is registered; ``rank()`` is this process's index in the set (-1 outside it)."""

    def __init__(self, ranks_or_comm=None):
        self.mpi_comm = None
        self.ranks = None
        self.process_set_id = None
        self._removed = False  # removed sets stay unusable, even one of every rank
        if ranks_or_comm is None:
            return
        if hasattr(ranks_or_comm, "Get_size"):
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = [operator.index(r) for r in ranks_or_comm]
        except TypeError:
            raise ValueError("ProcessSet takes a list of ranks (ints) or an mpi4py communicator, "
                             f"got {ranks_or_comm!r}") from None
        self.ranks = sorted(ranks)

    def size(self) -> Optional[int]:
        if self.process_set_id is None:
            return None
        return api.size() if self.process_set_id == 0 else len(self.ranks)

    def rank(self) -> Optional[int]:
        if self.process_set_id is None:
            return None
        me = api.rank()
        if self.process_set_id == 0:
            return me
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> Optional[bool]:
        if self.process_set_id == 0:
            return True
        if self.ranks is None:
            return None
        return api.rank() in self.ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __str__ = __repr__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _ranks_of(ps) -> list:
    if not isinstance(ps, ProcessSet):
        ps = ProcessSet(ps)
    if ps.ranks is None and ps.mpi_comm is not None:
        raise NotImplementedError("process sets from an MPI communicator need Horovod's MPI controller; "
                                  "this runtime does not use MPI: build the set from a list of ranks")
    return ps.ranks


def _agree(what: str, ranks: list) -> None:
    """Every rank of the job asks for the same ranks, or ValueError everywhere naming who asked what."""
    mine = np.asarray(ranks, dtype=np.int64)
    lengths = api.allgather(np.asarray([mine.size], dtype=np.int64))
    flat = api.allgather(mine) if lengths.sum() else np.zeros(0, dtype=np.int64)
    asked, start = [], 0
    for n in lengths.tolist():
        asked.append(flat[start:start + n].tolist())
        start += n
    if any(a != asked[0] for a in asked):
        detail = "; ".join(f"rank {r}: {a}" for r, a in enumerate(asked))
        raise ValueError(f"{what}: the ranks of the job asked for different process sets ({detail}); "
                         "every rank must call it in the same order with the same ranks")


def _register(ps: ProcessSet) -> None:
    ranks = ps.ranks
    n = api.size()
    if ranks and (ranks[0] < 0 or ranks[-1] >= n or len(set(ranks)) != len(ranks)):
        raise ValueError(f"process set {ranks}: needs distinct ranks from 0 to {n - 1}")
    if ranks == list(range(n)):  # Horovod refuses it as a duplicate of set 0 too
        raise ValueError(f"a process set with ranks {ranks} exists already: the global process set (id 0, "
                         "every rank of the job); use hvd.global_process_set")
    for other in _table.values():
        if other.ranks == ranks:
            raise ValueError(f"a process set with ranks {ranks} exists already (id {other.process_set_id})")
    set_id = 1
    while set_id in _table:
        set_id += 1
    if ranks:  # an empty set (e.g. the odd ranks of a one-rank job) has no operations to run
        engine.current().add_process_set(set_id, ranks)
    ps.process_set_id = set_id
    ps._removed = False
    _table[set_id] = ps


def check_comm(comm) -> None:
    """``hvd.init(comm=...)``: a list of ranks or an MPI communicator naming every rank is
    accepted; anything narrower raises NotImplementedError (use process sets)."""
    n = api.size()
    if comm is None:
        return
    if hasattr(comm, "Get_size"):
        ok = int(comm.Get_size()) == n
    else:
        ok = len(comm) == 0 or sorted(int(r) for r in comm) == list(range(n))
    if not ok:
        raise NotImplementedError(f"hvd.init(comm={comm!r}): this runtime always uses all {n} ranks "
                                  "of the job; use process sets (hvd.init(process_sets=[...])) for subsets")


def setup(process_sets=None) -> None:
    """At init: forget earlier sets, then register the static ones (every rank passes the same list,
    in the same order; an entry that repeats an earlier set is left unregistered, as in Horovod).
    ``process_sets="dynamic"`` only enables add/remove."""
    global _dynamic
    for ps in _table.values():
        ps._invalidate()
    _table.clear()
    global_process_set.ranks = list(range(api.size()))
    global_process_set.process_set_id = 0
    _dynamic = bool(knobs.read("HOROVOD_DYNAMIC_PROCESS_SETS"))
    if process_sets is None:
        return
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"hvd.init(process_sets={process_sets!r}): give a list of process sets or 'dynamic'")
        _dynamic = True
        return
    sets = [ps if isinstance(ps, ProcessSet) else ProcessSet(ps) for ps in process_sets]
    wanted = [global_process_set.ranks if ps is global_process_set else _ranks_of(ps) for ps in sets]
    _agree("hvd.init(process_sets=...)", [x for r in wanted for x in [-1, *r]])
    for ps in sets:
        if ps is global_process_set:
            continue
        if ps.ranks == global_process_set.ranks or any(o.ranks == ps.ranks for o in _table.values()):
            ps._invalidate()
            continue
        _register(ps)
    if _table:
        api.barrier()  # every rank registered them before anyone runs an operation on one


def add_process_set(process_set) -> ProcessSet:
    """Register a new set on every rank (collective); returns it with its id."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    ranks = _ranks_of(ps)
    if not _dynamic:
        raise ValueError(f"add_process_set({ranks}): dynamic process sets are off; set "
                         "HOROVOD_DYNAMIC_PROCESS_SETS=1 or call hvd.init(process_sets='dynamic'), "
                         "or pass the set to hvd.init(process_sets=[...])")
    _agree(f"add_process_set({ranks})", ranks)
    _register(ps)
    api.barrier()  # every rank registered it before anyone runs an operation on it
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set on every rank (collective); False for the global set or an unregistered one."""
    set_id = getattr(process_set, "process_set_id", None)
    if set_id is None or set_id == 0:
        return False
    if not _dynamic:
        raise ValueError("remove_process_set: dynamic process sets are off; set HOROVOD_DYNAMIC_PROCESS_SETS=1 "
                         "or call hvd.init(process_sets='dynamic')")
    if _table.get(set_id) is not process_set:
        return False
    _agree(f"remove_process_set(id {set_id})", [set_id])
    if process_set.ranks:
        engine.current().remove_process_set(set_id)
    del _table[set_id]
    process_set._invalidate()
    process_set._removed = True
    api.barrier()
    return True


def require_registered(process_set) -> None:
    """ValueError unless ``process_set`` is the global set or a registered one (this rank need
    not be in it: e.g. a DistributedOptimizer built on every rank for one set)."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return
    if (getattr(process_set, "process_set_id", 0) is None and not process_set._removed
            and process_set.ranks == list(range(api.size()))):
        return  # a never registered set of every rank is the global set
    if not isinstance(process_set, ProcessSet) or _table.get(process_set.process_set_id) is not process_set:
        raise ValueError(f"{process_set!r} is not a registered process set (hvd.add_process_set or "
                         "hvd.init(process_sets=...))")


def resolve(process_set) -> int:
    """The core id for ``process_set=`` (None, the global set or an unregistered set of every
    rank: 0); ValueError when it is not registered or does not hold this rank."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set= takes a ProcessSet (hvd.add_process_set), got {process_set!r}")
    set_id = process_set.process_set_id
    if set_id == 0 or (set_id is None and not process_set._removed and process_set.ranks == list(range(api.size()))):
        return 0  # a never registered set of every rank is the global set
    if set_id is None or _table.get(set_id) is not process_set:
        raise ValueError(f"{process_set!r} is not registered (add it with hvd.add_process_set or "
                         "hvd.init(process_sets=...); removed sets cannot be used)")
    if api.rank() not in process_set.ranks:
        raise ValueError(f"rank {api.rank()} is not in {process_set!r}: only its members may run its operations")
    return set_id


def ids_and_ranks() -> dict:
    """``{id: ranks}`` of every registered set, the global set (0) first (Horovod's
    ``_get_process_set_ids_and_ranks``)."""
    return {0: list(global_process_set.ranks), **{i: list(ps.ranks) for i, ps in sorted(_table.items())}}


def by_id(set_id: int) -> ProcessSet:
    """The registered set with core id ``set_id`` (0: the global set); ValueError for none (a
    framework's op carries the id, and its gradient needs the set back)."""
    if set_id == 0:
        return global_process_set
    ps = _table.get(set_id)
    if ps is None:
        raise ValueError(f"process set id {set_id} is not registered")
    return ps


def size_of(process_set) -> int:
    """Number of ranks an operation on ``process_set`` runs on."""
    set_id = resolve(process_set)
    return api.size() if set_id == 0 else len(_table[set_id].ranks)


def rank_in(process_set) -> int:
    """This rank's index among the ranks of ``process_set``."""
    set_id = resolve(process_set)
    return api.rank() if set_id == 0 else _table[set_id].ranks.index(api.rank())


def root_of(process_set, root_rank) -> int:
    """A broadcast root (a job rank, as in Horovod) as an index in the set; ValueError outside it."""
    try:
        root = operator.index(root_rank)
    except TypeError:
        root = -1
    set_id = resolve(process_set)
    ranks: Sequence[int] = range(api.size()) if set_id == 0 else _table[set_id].ranks
    if root not in ranks:
        where = f"this job (size {api.size()})" if set_id == 0 else f"{process_set!r}"
        raise ValueError(f"root_rank={root_rank!r} is not a rank of {where}")
    return list(ranks).index(root)
