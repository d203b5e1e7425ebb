"""Run the torch worker as one plain process, without any launcher (test helper)."""
import os
import subprocess
import sys

from fixtures import RANKS, ROOT


def run_single(tmp_path, cases: str, timeout: float = 120, env: dict | None = None) -> dict:
    """``tests/ranks/torch_hvd.py cases`` with no HOROVOD_/APPLIANCE_ variables (a laptop
    script); return its report. Bounded by ``timeout``; the process is killed if it overruns."""
    import json

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_"))}
    clean.update(env or {})
    clean.update(APPLIANCE_TEST_OUT=str(tmp_path), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(RANKS / "torch_hvd.py"), cases], env=clean, timeout=timeout,
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"single rank failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert report["ok"] and report["size"] == 1 and report["cases"] == cases.split(","), report
    return report
