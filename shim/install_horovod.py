#!/usr/bin/env python3
"""Install (or remove) the appliance's ``horovod`` compatibility package into a Python environment.

Usage: ``python shim/install_horovod.py [--target SITE_DIR] [--force] [--uninstall]``
(default target: this interpreter's site-packages, i.e. run it with the Python you train with).
It copies ``horovod/`` (next to this file) to ``SITE_DIR/appliance_horovod_shim/horovod`` and writes
``SITE_DIR/appliance-horovod-shim.pth`` naming that directory. Python appends .pth directories
to ``sys.path`` after the site directory itself, so a real Horovod installed in that site-packages
always wins and is never shadowed. The installer also refuses (exit 1, naming it) when a real
Horovod is already importable there or on this interpreter's path, unless ``--force``.
The appliance (``appliance`` and ``torch``) must be installed in the same environment for the
package to import; the ``horovodrun`` command comes with the appliance itself (its console
script, which likewise runs a real Horovod's own horovodrun when one is installed). The
Dockerfile uses this same script. Stdlib only; reads no environment.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig

SHIM_DIR = "appliance_horovod_shim"
PTH = "appliance-horovod-shim.pth"
MARKER = "appliance-horovod-shim"  # in our horovod/__init__.py docstring; appliance.hvdcompat.SHIM_MARKER


def real_horovods(target: str) -> list[str]:
    """Paths of ``horovod`` packages that are not this shim, in ``target`` or on ``sys.path``."""
    found = []
    for d in [target] + [p for p in sys.path if p]:
        init = os.path.join(d, "horovod", "__init__.py")
        if os.path.isfile(init) and SHIM_DIR not in d:
            with open(init, encoding="utf-8", errors="replace") as f:
                if MARKER not in f.read():
                    found.append(os.path.dirname(os.path.abspath(init)))
    return sorted(set(found))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="install_horovod.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=sysconfig.get_paths()["purelib"], help="site-packages directory")
    p.add_argument("--force", action="store_true", help="install even when a real Horovod is present "
                   "(it still takes precedence over the shim)")
    p.add_argument("--uninstall", action="store_true", help="remove the shim from --target")
    a = p.parse_args(argv)
    dest, pth = os.path.join(a.target, SHIM_DIR), os.path.join(a.target, PTH)
    if a.uninstall:
        shutil.rmtree(dest, ignore_errors=True)
        if os.path.exists(pth):
            os.remove(pth)
        print(f"removed the horovod shim from {a.target}")
        return 0
    real = real_horovods(a.target)
    if real and not a.force:
        print(f"install_horovod.py: a real Horovod is installed ({', '.join(real)}); not installing the "
              "appliance's horovod package (--force installs it behind the real one)", file=sys.stderr)
        return 1
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, os.path.join(dest, "horovod"), ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    with open(pth, "w", encoding="utf-8") as f:
        f.write(dest + "\n")
    print(f"installed the horovod shim into {dest} (via {pth})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
