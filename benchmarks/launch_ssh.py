"""Launch latency over SSH: `appliance launch` -> every rank past init(), and kill -> all stopped.

    sudo python benchmarks/launch_ssh.py [--runs 7] [--torch]

Builds the same simulated cluster as the SSH tests (network namespaces, one real sshd per host on
port 12345, keys from `appliance keys`; tests/fixtures/netns.py), then for two layouts with two
hosts (`-H localhost:1,HOST1:1` and `-H HOST1:1,HOST2:1`) measures, over several runs:
- start: wall time from starting `python -m appliance launch` to the last rank returning from
  `appliance.runtime.init()` (includes the launcher's interpreter start, the preflight, SSH
  connections, the remote stubs and the rendezvous);
- stop: wall time from SIGKILL of a remote rank (from outside) to the launcher's exit, all
  ranks on all hosts gone (APPLIANCE_STOP_GRACE=1; the ranks here exit on SIGTERM).
Prints the median and the range. Tears the cluster down whatever happens.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fixtures import netns  # noqa: E402  (the SSH tests' simulated hosts)

WORKER = ROOT / "tests" / "ranks" / "ssh_runtime.py"
SLEEPER = "import os, sys, time; open(os.path.join(sys.argv[1], 'pid.' + os.environ['HOROVOD_RANK']), 'w').write(str(os.getpid())); time.sleep(60)"


def start_time(hosts: str, env: dict, out: Path, case: str = "init") -> float:
    for f in out.glob("rank*.json"):
        f.unlink()
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "appliance", "launch", "-np", "2", "-H", hosts, "-p", str(netns.PORT),
                        "--", sys.executable, str(WORKER), case], env=env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"launch failed: {r.stderr[-2000:]}")
    return max(json.loads((out / f"rank{k}.json").read_text())["init_done"] for k in range(2)) - t0


def stop_time(hosts: str, env: dict, out: Path, cluster) -> float:
    for f in out.glob("pid.*"):
        f.unlink()
    p = subprocess.Popen([sys.executable, "-m", "appliance", "launch", "-np", "2", "-H", hosts, "-p", str(netns.PORT),
                          "--", sys.executable, "-c", SLEEPER, str(out)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 30
        while not (out / "pid.1").exists() or not (out / "pid.0").exists():
            if time.monotonic() > end or p.poll() is not None:
                raise SystemExit("ranks did not start")
            time.sleep(0.02)
        time.sleep(0.2)
        t0 = time.monotonic()
        os.kill(int((out / "pid.1").read_text()), signal.SIGKILL)  # rank 1 is on a remote host in both layouts
        p.wait(30)
        while any(h.pids() for h in cluster.hosts):
            time.sleep(0.01)
        return time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--torch", action="store_true", help="also time `import appliance.torch as hvd; hvd.init()`")
    args = ap.parse_args()
    why = netns.available()
    if why:
        raise SystemExit(f"cannot build the cluster: {why}")
    with netns.keyed_cluster(2, "appliance-ssh-bench-") as (cluster, base, shared, out):
        h1, h2 = cluster.hosts
        env = {**os.environ, "APPLIANCE_SHARED": str(shared), "APPLIANCE_STOP_GRACE": "1", "HOME": str(base),
               "APPLIANCE_TEST_OUT": str(out), "PYTHONPATH": str(ROOT)}
        for name in (f"localhost:1,{h1.address}:1", f"{h1.address}:1,{h2.address}:1"):
            starts = [start_time(name, env, out) for _ in range(args.runs)]
            torch_starts = [start_time(name, env, out, "init-torch") for _ in range(args.runs)] if args.torch else []
            stops = [stop_time(name, env, out, cluster) for _ in range(args.runs)]
            print(f"-H {name}: launch -> all ranks past init(): median {statistics.median(starts):.2f} s "
                  f"(min {min(starts):.2f}, max {max(starts):.2f}); kill remote rank -> everything stopped: "
                  f"median {statistics.median(stops):.2f} s (min {min(stops):.2f}, max {max(stops):.2f}); "
                  f"{args.runs} runs")
            if torch_starts:
                print(f"-H {name}: launch -> all ranks past appliance.torch init(): median "
                      f"{statistics.median(torch_starts):.2f} s (min {min(torch_starts):.2f}, max {max(torch_starts):.2f})")


if __name__ == "__main__":
    main()
