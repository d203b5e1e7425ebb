"""The TensorFlow op library (``csrc/``): compiled against the installed TensorFlow, loaded once
per process, and handed the core's C door.

Why it is compiled here, at first use, and not by ``pip install``: its ABI is the installed
TensorFlow's (``tf.sysconfig``'s headers and flags), which pip's isolated build cannot see, and
TensorFlow may be installed or upgraded after the appliance. So ``library()`` compiles it on the
first import of ``appliance.tensorflow`` into ``APPLIANCE_TF_OPS_DIR`` (default
``~/.cache/appliance/tf-ops``), one subfolder per (TensorFlow build, compiler, source) key,
under a file lock, so ranks that start together compile it once; afterwards it loads in
milliseconds. ``python -m appliance.tensorflow.build`` does the same ahead of time (the image,
tests/run.sh). Needs a C++17 compiler (``$CXX``, default ``c++``).

Failure modes: no compiler, or a compile error: RuntimeError naming the command and the
compiler's last lines; a core whose C door is older than the library's: RuntimeError.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import appliance.runtime
from appliance.common import knobs
from appliance.runtime import engine

CSRC = Path(__file__).resolve().parent / "csrc"
CAPI = Path(appliance.runtime.__file__).resolve().parent / "csrc" / "capi"
NAME = "libappliance_tf.so"
_loaded = None  # the tf.load_op_library module, once loaded


def _flags():
    import tensorflow as tf

    return list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags()), tf.__version__


def _sources() -> list:
    return sorted(CSRC.glob("*.cc")) + sorted(CSRC.glob("*.h")) + [CAPI / "appliance_core.h"]


def _key(cxx: str, cflags: list, lflags: list, version: str) -> str:
    h = hashlib.sha256()
    for part in (cxx, version, sys.version, *cflags, *lflags):
        h.update(part.encode() + b"\0")
    for src in _sources():
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    return f"tf{version}-{h.hexdigest()[:16]}"


def _base() -> Path:
    d = knobs.read("APPLIANCE_TF_OPS_DIR")
    return Path(d) if d else Path.home() / ".cache" / "appliance" / "tf-ops"


def _run(cmds: list) -> None:
    """Runs compiler commands in parallel; RuntimeError with the first failure's tail."""
    procs = [(c, subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) for c in cmds]
    failed = None
    for cmd, p in procs:
        out, _ = p.communicate()
        if p.returncode != 0 and failed is None:
            failed = (cmd, out)
    if failed:
        cmd, out = failed
        tail = "\n".join(out.strip().splitlines()[-25:])
        raise RuntimeError(f"compiling the TensorFlow op library failed: {shlex.join(cmd)}\n{tail}")


def build(verbose: bool = False) -> Path:
    """The op library for the installed TensorFlow: its path, compiled first if needed."""
    cxx = os.environ.get("CXX", "c++")
    cflags, lflags, version = _flags()
    out_dir = _base() / _key(cxx, cflags, lflags, version)
    lib = out_dir / NAME
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # ranks starting together: one compiles, the others wait
        if lib.exists():
            return lib
        if verbose:
            print(f"compiling the TensorFlow op library into {out_dir}", file=sys.stderr)
        common = [cxx, "-std=c++17", "-O2", "-DNDEBUG", "-fPIC", "-fvisibility=hidden", "-Wno-deprecated-declarations", f"-I{CAPI}", *cflags]
        objs, cmds = [], []
        for src in sorted(CSRC.glob("*.cc")):
            obj = out_dir / f"{src.stem}.{os.getpid()}.o"
            objs.append(obj)
            cmds.append([*common, "-c", str(src), "-o", str(obj)])
        try:
            _run(cmds)
            tmp = out_dir / f".{NAME}.{os.getpid()}"
            _run([[cxx, "-shared", "-o", str(tmp), *map(str, objs), *lflags]])
            os.replace(tmp, lib)
        finally:
            for o in objs:
                o.unlink(missing_ok=True)
    return lib


def library():
    """The loaded op library (``tf.load_op_library``'s module), built and handed the C door on
    first call."""
    global _loaded
    if _loaded is None:
        import tensorflow as tf

        path = build()
        mod = tf.load_op_library(str(path))
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        table = get(engine.c_api(), b"appliance_core_api")
        setter = ctypes.CDLL(str(path)).appliance_tf_set_core_api  # the same loaded object
        setter.argtypes, setter.restype = [ctypes.c_void_p], ctypes.c_int
        if setter(table) != 0:
            raise RuntimeError("the collective core's C door is older than appliance.tensorflow's op library; "
                               "reinstall the appliance")
        _loaded = mod
    return _loaded
