"""PMIx, the process manager interface of OpenMPI's mpirun, as a client: a few string values
published by one rank and read by all, loaded at run time (no MPI at build time).

What it owns: finding ``libpmix.so.2`` (``library_candidates``: ctypes' search, then Debian's and
OpenMPI's usual places) and loading it with ``dlopen`` as the runtime loads NCCL; the few
structures of its C ABI that a client needs (``pmix_proc_t``, ``pmix_value_t``, ``pmix_info_t``,
PMIx 2 to 5 share them); and ``exchange``: PMIx_Init, PMIx_Put of this rank's values (global
scope), PMIx_Commit, PMIx_Fence collecting the data, PMIx_Get of the root's values,
PMIx_Finalize. Nothing of MPI is used: the ranks' own links carry everything else.

Env vars read: PMIX_NAMESPACE, PMIX_RANK and PMIX_SERVER_URI* (set by the PMIx server that
started the process: mpirun's daemons) only to say what is missing; the library reads them itself.
Failure modes: ``PmixError`` (a ``ConfigError``), one line naming what is missing (no PMIx server
in the environment, no libpmix here, a call that failed with PMIx's own status text).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Mapping, Sequence

from appliance.common.knobs import ConfigError

PMIX_SUCCESS = 0
PMIX_BOOL = 1
PMIX_STRING = 3
PMIX_GLOBAL = 3              # pmix_scope_t: every rank of the job, on every host
PMIX_MAX_NSLEN = 255
PMIX_MAX_KEYLEN = 511
PMIX_COLLECT_DATA = b"pmix.collect"
SONAME = "libpmix.so.2"
_PLACES = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
           "/usr/lib/x86_64-linux-gnu/pmix2/lib", "/usr/lib/aarch64-linux-gnu/pmix2/lib",
           "/usr/lib/x86_64-linux-gnu/openmpi/lib", "/usr/lib64/openmpi/lib", "/opt/openmpi/lib",
           "/usr/local/lib")


class PmixError(ConfigError):
    """PMIx cannot be used here; the message names what is missing or what failed."""


class _Proc(ctypes.Structure):
    _fields_ = [("nspace", ctypes.c_char * (PMIX_MAX_NSLEN + 1)), ("rank", ctypes.c_uint32)]


class _Data(ctypes.Union):
    # the union is larger (pmix_envar_t: two pointers and a char); the padding keeps its size
    _fields_ = [("flag", ctypes.c_bool), ("string", ctypes.c_char_p), ("pad", ctypes.c_char * 32)]


class _Value(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint16), ("data", _Data)]


class _Info(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char * (PMIX_MAX_KEYLEN + 1)), ("flags", ctypes.c_uint32), ("value", _Value)]


def server_present(env: Mapping[str, str]) -> bool:
    """Whether a PMIx server started this process (it leaves its namespace and address)."""
    return bool(env.get("PMIX_NAMESPACE")) and any(k.startswith("PMIX_SERVER_URI") for k in env)


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
        for name in ("PMIx_Init", "PMIx_Put", "PMIx_Commit", "PMIx_Fence", "PMIx_Get", "PMIx_Finalize"):
            getattr(lib, name).restype = ctypes.c_int
        lib.PMIx_Error_string.restype = ctypes.c_char_p
        return lib
    raise PmixError(f"no PMIx library ({SONAME}) here: install libpmix2 (Debian) or put OpenMPI's lib "
                    f"directory on LD_LIBRARY_PATH ({errors[-1] if errors else 'not found'})")


def exchange(publish: Mapping[str, str], keys: Sequence[str], root: int = 0) -> dict[str, str]:
    """Publish ``publish`` (this rank's values; empty on the others), wait for every rank of the
    job (a fence that collects the data), and return the ``root`` rank's values of ``keys``."""
    lib = load()
    me = _Proc()
    rc = lib.PMIx_Init(ctypes.byref(me), None, ctypes.c_size_t(0))
    if rc != PMIX_SUCCESS:
        raise PmixError(f"PMIx_Init failed: {_status(lib, rc)} (is this process a rank of mpirun's job?)")
    try:
        values = []  # the library copies what it is given; kept alive until then all the same
        for key, text in publish.items():
            v = _Value(type=PMIX_STRING)
            v.data.string = text.encode()
            values.append(v)
            _check(lib, "PMIx_Put", lib.PMIx_Put(ctypes.c_int(PMIX_GLOBAL), key.encode(), ctypes.byref(v)))
        _check(lib, "PMIx_Commit", lib.PMIx_Commit())
        info = _Info(key=PMIX_COLLECT_DATA)
        info.value.type = PMIX_BOOL
        info.value.data.flag = True
        _check(lib, "PMIx_Fence", lib.PMIx_Fence(None, ctypes.c_size_t(0), ctypes.byref(info), ctypes.c_size_t(1)))
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


def _check(lib, call: str, rc: int) -> None:
    if rc != PMIX_SUCCESS:
        raise PmixError(f"{call} failed: {_status(lib, rc)}")


def _status(lib, rc: int) -> str:
    text = lib.PMIx_Error_string(ctypes.c_int(rc))
    return f"{text.decode() if text else 'status'} ({rc})"
