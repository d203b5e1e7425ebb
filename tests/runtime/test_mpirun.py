"""The runtime under OpenMPI's mpirun: ranks from OMPI_COMM_WORLD_*, the rendezvous address
and the secret passed with -x (the secret by name only, so it is not on the command line)."""
import json
import os
import secrets
import socket
import subprocess
import sys

from fixtures import RANKS, ROOT


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runtime_under_mpirun(tmp_path, require_tool):
    require_tool("mpirun", "OpenMPI (openmpi-bin)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_"))}
    env.update(APPLIANCE_JOB_SECRET=secrets.token_hex(16), APPLIANCE_TEST_OUT=str(tmp_path), PYTHONPATH=str(ROOT))
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "3",
           "--mca", "btl", "self,tcp", "-x", f"APPLIANCE_STORE_ADDR=127.0.0.1:{free_port()}",
           "-x", "APPLIANCE_JOB_SECRET", "-x", "APPLIANCE_TEST_OUT", "-x", "PYTHONPATH",
           sys.executable, str(RANKS / "engine.py"), "order"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert all(r["ok"] for r in reports)
