"""The ``horovodrun`` command (the package's console script, run as a user types it): the
appliance's where no real Horovod is installed, and a real Horovod's own where one is, never
shadowing it. The real Horovod is a stand-in package on PYTHONPATH with Horovod's layout
(``horovod/runner/launch.py`` with ``run_commandline``, what Horovod's script calls)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from appliance.hvdcompat import SHIM_MARKER
from fixtures import ROOT

SHIM = ROOT / "shim"
HOROVODRUN = Path(sys.executable).parent / "horovodrun"

REAL_LAUNCH = '''
import sys

def run_commandline():
    print("REAL horovodrun", sys.argv[1:], flush=True)
'''


def horovodrun(*args: str, path=()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return subprocess.run([str(HOROVODRUN), *args], env=env, capture_output=True, text=True, timeout=60, cwd="/")


def real_horovod(where: Path, launch: str | None = REAL_LAUNCH) -> Path:
    pkg = where / "horovod"
    (pkg / "runner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (pkg / "runner" / "__init__.py").write_text("")
    if launch is not None:
        (pkg / "runner" / "launch.py").write_text(launch)
    return pkg


def test_horovodrun_is_installed_with_the_package():
    assert HOROVODRUN.is_file() and os.access(HOROVODRUN, os.X_OK), f"no console script at {HOROVODRUN}"
    r = horovodrun("--version")
    assert r.returncode == 0 and r.stdout.strip() == "0.28.1", r.stderr
    r = horovodrun("--check-build")
    assert r.returncode == 0 and "appliance runtime" in r.stdout, r.stderr


def test_the_compatibility_package_is_not_a_real_horovod():
    assert SHIM_MARKER in (SHIM / "horovod" / "__init__.py").read_text()
    r = horovodrun("--check-build", path=[SHIM, ROOT])  # `import horovod` finds the shim: ours runs
    assert r.returncode == 0 and "appliance runtime" in r.stdout, r.stderr


def test_a_real_horovod_keeps_its_horovodrun(tmp_path):
    real_horovod(tmp_path)
    r = horovodrun("-np", "2", "--mpi", "python", "train.py", path=[tmp_path, SHIM])  # the real one first on the path
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "REAL horovodrun ['-np', '2', '--mpi', 'python', 'train.py']"


def test_a_real_horovod_that_does_not_import_is_named_not_replaced(tmp_path):
    pkg = real_horovod(tmp_path, launch="import no_such_module_here\n")
    r = horovodrun("-np", "1", "true", path=[tmp_path])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("horovodrun: error: the Horovod installed at ") and str(pkg) in r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_the_installer_knows_the_shim_by_the_same_marker():
    assert f'MARKER = "{SHIM_MARKER}"' in (SHIM / "install_horovod.py").read_text()
