"""build-tf-ops.py SRC: compile appliance.tensorflow's op library in the image build (Dockerfile
stage ``tfops``) from the C++ inputs alone, into ``APPLIANCE_TF_OPS_DIR``.

What it owns: nothing but that one compile. SRC is a partial checkout holding
``appliance/tensorflow/_library.py``, ``appliance/tensorflow/csrc/`` and
``appliance/runtime/csrc/capi/appliance_core.h``. It loads ``_library.py`` by path with its three
imports stood in: ``appliance.runtime`` only for its place (where the C door's header lies),
``appliance.common.knobs`` reading the environment, ``appliance.runtime.engine`` unused by
``build()``. So the stage needs neither our wheel nor its compiled core, its layer is keyed on
those files only (a .py change elsewhere does not recompile, ~1-2 min on 2 cores), and the
library lands under ``_library``'s own key. The runtime stage then runs ``python -m
appliance.tensorflow.build`` with the installed wheel and no compiler: it finds the library or the
build fails there.

Env: APPLIANCE_TF_OPS_DIR (required), CXX (default c++). Failure modes: a compile error or a
``_library.py`` that imports more than these stand-ins: its message on stderr, exit 1.
"""
import importlib.util
import os
import sys
import types
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 2 or not os.environ.get("APPLIANCE_TF_OPS_DIR"):
        print("usage: APPLIANCE_TF_OPS_DIR=DIR build-tf-ops.py SRC", file=sys.stderr)
        return 2
    src = Path(sys.argv[1]).resolve() / "appliance"
    pkg = types.ModuleType("appliance")
    pkg.__path__ = [str(src)]
    runtime = types.ModuleType("appliance.runtime")
    runtime.__file__ = str(src / "runtime" / "__init__.py")
    runtime.__path__ = [str(src / "runtime")]
    runtime.engine = types.ModuleType("appliance.runtime.engine")
    common = types.ModuleType("appliance.common")
    common.__path__ = []
    common.knobs = types.ModuleType("appliance.common.knobs")
    common.knobs.read = lambda name: os.environ.get(name, "")
    tf_pkg = types.ModuleType("appliance.tensorflow")
    tf_pkg.__path__ = [str(src / "tensorflow")]
    for m in (pkg, runtime, runtime.engine, common, common.knobs, tf_pkg):
        sys.modules[m.__name__] = m
    pkg.runtime, pkg.common, pkg.tensorflow = runtime, common, tf_pkg
    spec = importlib.util.spec_from_file_location("appliance.tensorflow._library", src / "tensorflow" / "_library.py")
    lib = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = lib
    try:
        spec.loader.exec_module(lib)
        print(lib.build(verbose=True))
    except (ImportError, AttributeError) as e:
        print(f"build-tf-ops: appliance/tensorflow/_library.py needs more than this script stands in for: {e}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError) as e:
        print(f"build-tf-ops: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
