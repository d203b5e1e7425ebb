"""PMIx, the process manager interface of OpenMPI's mpirun, as a client: a few string values
published by one rank and read by all, loaded at run time (no MPI at build time).

What it owns: finding ``libpmix.so.2`` (``library_candidates``: ctypes' search, then Debian's and
OpenMPI's usual places) and loading it with ``dlopen`` as the runtime loads NCCL; the few
structures of its C ABI that a client needs (``pmix_proc_t``, ``pmix_value_t``, ``pmix_info_t``,
PMIx 2 to 5 share them); and ``exchange``: PMIx_Init, PMIx_Put of this rank's values and of its
arrival mark (global scope), PMIx_Commit, PMIx_Fence_nb collecting the data, waited for at most
``timeout`` seconds, PMIx_Get of the root's values, PMIx_Finalize. mpirun's server ignores a
fence's PMIX_TIMEOUT, so the wait is ours; when it runs out, a PMIx_Get_nb of every rank's
arrival mark (each with PMIX_TIMEOUT) tells which ranks never committed: the error names them.
Nothing of MPI is used: the ranks' own links carry everything else.

Env vars read: PMIX_NAMESPACE, PMIX_RANK and PMIX_SERVER_URI* (set by the PMIx server that
started the process: mpirun's daemons) only to say what is missing; the library reads them itself.
Failure modes: ``PmixError`` (a ``ConfigError``), one line naming what is missing (no PMIx server
in the environment, no libpmix here, a call that failed with PMIx's own status text);
``PmixTimeout`` (a ``PmixError``) when the fence did not complete in time, with ``missing``, the
ranks whose arrival mark never came (empty when every mark came but the fence still did not).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Callable, Mapping, Sequence

from appliance.common.knobs import ConfigError

PMIX_SUCCESS = 0
PMIX_BOOL = 1
PMIX_STRING = 3
PMIX_INT = 6
PMIX_UINT32 = 14
PMIX_ERR_TIMEOUT = -24
PMIX_RANK_WILDCARD = 0xFFFFFFFE
PMIX_GLOBAL = 3              # pmix_scope_t: every rank of the job, on every host
PMIX_MAX_NSLEN = 255
PMIX_MAX_KEYLEN = 511
PMIX_COLLECT_DATA = b"pmix.collect"
PMIX_TIMEOUT = b"pmix.timeout"
PMIX_JOB_SIZE = b"pmix.job.size"
ARRIVED_KEY = "appliance.arrived"
PROBE_S = 2  # each rank's arrival mark is asked for this long once the fence's time ran out
SONAME = "libpmix.so.2"
_PLACES = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
           "/usr/lib/x86_64-linux-gnu/pmix2/lib", "/usr/lib/aarch64-linux-gnu/pmix2/lib",
           "/usr/lib/x86_64-linux-gnu/openmpi/lib", "/usr/lib64/openmpi/lib", "/opt/openmpi/lib",
           "/usr/local/lib")


class PmixError(ConfigError):
    """PMIx cannot be used here; the message names what is missing or what failed."""


class PmixTimeout(PmixError):
    """The fence did not complete in time; ``missing``: the ranks that never arrived."""

    def __init__(self, text: str, missing: list[int]):
        super().__init__(text)
        self.missing = missing


class _Proc(ctypes.Structure):
    _fields_ = [("nspace", ctypes.c_char * (PMIX_MAX_NSLEN + 1)), ("rank", ctypes.c_uint32)]


class _Data(ctypes.Union):
    # the union is larger (pmix_envar_t: two pointers and a char); the padding keeps its size
    _fields_ = [("flag", ctypes.c_bool), ("integer", ctypes.c_int), ("uint32", ctypes.c_uint32),
                ("string", ctypes.c_char_p), ("pad", ctypes.c_char * 32)]


class _Value(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint16), ("data", _Data)]


class _Info(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char * (PMIX_MAX_KEYLEN + 1)), ("flags", ctypes.c_uint32), ("value", _Value)]


_FENCE_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)
_VALUE_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_kept: list = []  # callbacks and their arguments the library may still call after a wait gave up


def server_present(env: Mapping[str, str]) -> bool:
    """Whether a PMIx server started this process (it leaves its namespace and address)."""
    return not missing_vars(env)


def missing_vars(env: Mapping[str, str]) -> list[str]:
    """The variables a PMIx server leaves in its processes' environment that are not set here."""
    need = {"PMIX_NAMESPACE": bool(env.get("PMIX_NAMESPACE")), "PMIX_RANK": bool(env.get("PMIX_RANK")),
            "PMIX_SERVER_URI*": any(k.startswith("PMIX_SERVER_URI") and env[k] for k in env)}
    return [k for k, ok in need.items() if not ok]


def library_candidates() -> list[str]:
    found = ctypes.util.find_library("pmix")
    places = [os.path.join(d, SONAME) for d in _PLACES if os.path.exists(os.path.join(d, SONAME))]
    return ([found] if found else []) + places + [SONAME]


def load(candidates: Sequence[str] | None = None) -> ctypes.CDLL:
    """libpmix (the first of ``candidates`` that loads; default ``library_candidates()``), or
    PmixError saying how to get it."""
    errors = []
    for path in dict.fromkeys(library_candidates() if candidates is None else candidates):
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # its plugins resolve symbols against it
        except OSError as e:
            errors.append(str(e))
            continue
        for name in ("PMIx_Init", "PMIx_Put", "PMIx_Commit", "PMIx_Fence_nb", "PMIx_Get", "PMIx_Get_nb",
                     "PMIx_Finalize"):
            getattr(lib, name).restype = ctypes.c_int
        lib.PMIx_Error_string.restype = ctypes.c_char_p
        return lib
    raise PmixError(f"no PMIx library ({SONAME}) here: install libpmix2 (Debian) or put OpenMPI's lib "
                    f"directory on LD_LIBRARY_PATH ({errors[-1] if errors else 'not found'})")


def exchange(publish: Mapping[str, str], keys: Sequence[str], root: int = 0, timeout: float = 60.0,
             check: Callable[[int, int], None] | None = None) -> dict[str, str]:
    """Publish ``publish`` (this rank's values; empty on the others), wait up to ``timeout`` s for
    every rank of the job (a fence that collects the data), and return the ``root`` rank's values
    of ``keys``. ``check(pmix_rank, job_size)`` (job_size 0 when PMIx does not say) runs before
    anything is published and may raise. PmixTimeout when the fence did not complete in time."""
    lib = load()
    me = _Proc()
    rc = lib.PMIx_Init(ctypes.byref(me), None, ctypes.c_size_t(0))
    if rc != PMIX_SUCCESS:
        raise PmixError(f"PMIx_Init failed: {_status(lib, rc)} (is this process a rank of mpirun's job?)")
    try:
        size = _job_size(lib, me)
        if check is not None:
            check(me.rank, size)
        values = []  # the library copies what it is given; kept alive until then all the same
        for key, text in {**publish, ARRIVED_KEY: "1"}.items():
            v = _Value(type=PMIX_STRING)
            v.data.string = text.encode()
            values.append(v)
            _check(lib, "PMIx_Put", lib.PMIx_Put(ctypes.c_int(PMIX_GLOBAL), key.encode(), ctypes.byref(v)))
        _check(lib, "PMIx_Commit", lib.PMIx_Commit())
        _fence(lib, me, size, timeout)
        src = _Proc(nspace=me.nspace, rank=root)
        got = {}
        for key in keys:
            out = ctypes.POINTER(_Value)()
            rc = lib.PMIx_Get(ctypes.byref(src), key.encode(), None, ctypes.c_size_t(0), ctypes.byref(out))
            if rc != PMIX_SUCCESS or not out or out.contents.type != PMIX_STRING:
                raise PmixError(f"rank {root} published no {key!r} through PMIx"
                                + (f" ({_status(lib, rc)})" if rc != PMIX_SUCCESS else ""))
            got[key] = out.contents.data.string.decode()
        return got
    finally:
        lib.PMIx_Finalize(None, ctypes.c_size_t(0))


def _fence(lib, me: _Proc, size: int, timeout: float) -> None:
    info = (_Info * 1)()
    info[0].key = PMIX_COLLECT_DATA
    info[0].value.type = PMIX_BOOL
    info[0].value.data.flag = True
    done, status = threading.Event(), []
    cb = _FENCE_CB(lambda rc, _data: (status.append(rc), done.set()))
    _kept.append((cb, info))
    _check(lib, "PMIx_Fence_nb", lib.PMIx_Fence_nb(None, ctypes.c_size_t(0), info, ctypes.c_size_t(1), cb, None))
    if done.wait(max(timeout, 0.001)):
        _check(lib, "PMIx_Fence", status[0])
        return
    raise PmixTimeout(f"PMIx_Fence did not complete within {timeout:g} s", _not_arrived(lib, me, size))


def _not_arrived(lib, me: _Proc, size: int) -> list[int]:
    """The ranks whose arrival mark PMIx cannot give within PROBE_S (asked all at once)."""
    if size <= 0:
        return []
    info = (_Info * 1)()
    info[0].key = PMIX_TIMEOUT
    info[0].value.type = PMIX_INT
    info[0].value.data.integer = PROBE_S
    lock, answered, all_in = threading.Lock(), {}, threading.Event()

    def got(rc, _value, data):
        with lock:
            answered[int(data or 0)] = rc
            if len(answered) == size:
                all_in.set()
    cb = _VALUE_CB(got)
    procs = [_Proc(nspace=me.nspace, rank=r) for r in range(size)]
    _kept.append((cb, info, procs))
    for r, proc in enumerate(procs):
        rc = lib.PMIx_Get_nb(ctypes.byref(proc), ARRIVED_KEY.encode(), info, ctypes.c_size_t(1), cb,
                             ctypes.c_void_p(r))
        if rc != PMIX_SUCCESS:
            got(rc, None, r)
    all_in.wait(PROBE_S + 1.0)
    with lock:
        return [r for r in range(size) if answered.get(r, PMIX_ERR_TIMEOUT) != PMIX_SUCCESS]


def _job_size(lib, me: _Proc) -> int:
    """The job's number of ranks as PMIx knows it; 0 when it does not say."""
    out = ctypes.POINTER(_Value)()
    job = _Proc(nspace=me.nspace, rank=PMIX_RANK_WILDCARD)
    rc = lib.PMIx_Get(ctypes.byref(job), PMIX_JOB_SIZE, None, ctypes.c_size_t(0), ctypes.byref(out))
    if rc != PMIX_SUCCESS or not out or out.contents.type != PMIX_UINT32:
        return 0
    return int(out.contents.data.uint32)


def _check(lib, call: str, rc: int) -> None:
    if rc != PMIX_SUCCESS:
        raise PmixError(f"{call} failed: {_status(lib, rc)}")


def _status(lib, rc: int) -> str:
    text = lib.PMIx_Error_string(ctypes.c_int(rc))
    return f"{text.decode() if text else 'status'} ({rc})"
