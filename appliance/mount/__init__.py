"""The shared mount: its layout, atomic files on it, and lock files with dead-holder detection.

Used by the cluster plane (``appliance/cluster``: job directories, host locks, the lock sweep
before a job starts) and by training jobs (``appliance/examples/train.py``: checkpoints and the
run lock), which must not need Docker: this package imports nothing of ``appliance.cluster``,
``appliance.launcher`` or the docker SDK (data flows down).

Modules: ``layout`` (``Layout``: the names under the shared directory; ``new_job_id``),
``atomic`` (``save_atomically``, ``write_json``, ``read_json``, ``remove_temporaries``), ``owner`` (``Owner``: the record
in a lock file, and the rules that prove its holder dead), ``locks`` (``FileLock``, ``LockHeld``,
``run_lock``, ``RunLock``, ``host_lock``, ``sweep``, ``Takeover``), ``registry`` (``Registration``:
the secondaries registered on the share, their heartbeats, which of them are live).
Env vars: none read here. Failure modes: see each module (``ValueError`` for bad names,
``LockHeld`` for a living holder, ``OSError`` from the file system).
"""
from .atomic import read_json, remove_temporaries, save_atomically, write_json  # noqa: F401
from .layout import SUBDIRS, Layout, check_name, new_job_id  # noqa: F401
from .locks import FileLock, LockHeld, RunLock, Takeover, break_lock, host_lock, run_lock, sweep  # noqa: F401
from .registry import Registration  # noqa: F401
from .owner import ContainerState, Owner, container_gone_reason, dead_reason  # noqa: F401
