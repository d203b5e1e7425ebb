"""What the launcher's view costs the launcher: CPU of the observer at N ranks.

    python benchmarks/observe_cost.py [--ranks 32] [--hosts 4] [--seconds 30] [--interval 1.0] [--mode live|lines|off]

What it owns: one measurement. This process runs the launcher's ``Observer`` (collector, state,
straggler rule, the display, the record with TensorBoard events in a temporary directory) exactly
as ``appliance launch`` does; a child process plays N ranks, each with its own TCP connection
speaking the metrics wire (hello with the secret's HMAC, then one sample per interval). The live
display draws into a pseudo-terminal nobody reads (``--mode live``). Printed: the observer
process's CPU seconds (user + system, ``resource.getrusage``) over the measured wall seconds, as a
share of one core, with the idle process (no ranks) measured the same way first.

Env vars: none. Failure modes: none of its own (a socket error in the child ends the run).
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import pty
import resource
import socket
import subprocess
import sys
import tempfile
import time

SECRET = "00112233445566778899aabbccddeeff"


def ranks_child(port: int, n: int, hosts: int, seconds: float, interval: float) -> None:
    auth = hmac.new(bytes.fromhex(SECRET), b"appliance-metrics", hashlib.sha256).hexdigest()
    socks = []
    for r in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(json.dumps({"v": 1, "kind": "hello", "job": "bench", "rank": r, "size": n, "local_rank": r % (n // hosts),
                              "host": f"node{r // (n // hosts)}", "round": 0, "pid": 1000 + r,
                              "auth": auth}).encode() + b"\n")
        socks.append(s)
    t0 = time.time()
    k = 0
    while time.time() - t0 < seconds:
        k += 1
        for r, s in enumerate(socks):
            step = k * 10
            s.sendall(json.dumps({
                "v": 1, "kind": "sample", "t": time.time(), "rank": r, "round": 0, "step": step,
                "step_src": "optimizer", "samples": step * 32, "total_steps": 100000, "busy_s": k * 0.2,
                "wall_s": k * interval, "ops": {"allreduce": {"n": step, "bytes": step * 4e6, "s": step * 0.004},
                                                "broadcast": {"n": 3, "bytes": 1e6, "s": 0.01}},
                "wait_s": k * 0.05, "late_s": k * (0.3 if r == 5 else 0.001), "rss": 800 << 20,
                "gpu_util": None, "gpu_mem": None}).encode() + b"\n")
        time.sleep(max(0.0, t0 + k * interval - time.time()))
    for s in socks:
        s.close()


def cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def measure(args, ranks: int) -> tuple[float, float]:
    from appliance.launcher.observe import Observer
    from appliance.launcher.output import OutputSink

    master, slave = pty.openpty()
    term = os.fdopen(slave, "w")
    drain = subprocess.Popen(["cat"], stdin=os.fdopen(master, "rb"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    env = {"APPLIANCE_VIEW": args.mode, "APPLIANCE_VIEW_INTERVAL": "5"}
    with tempfile.TemporaryDirectory() as rec, OutputSink(ranks, stdout=term, stderr=term) as sink:
        env["APPLIANCE_RECORD_DIR"] = rec
        with Observer("bench", SECRET, ranks, say=sink.message, sink=sink, out=term, err=term, environ=env) as obs:
            child = None
            if ranks:
                child = subprocess.Popen([sys.executable, __file__, "--child", str(obs.port), str(ranks),
                                          str(args.hosts), str(args.seconds), str(args.interval)])
            time.sleep(2.0)  # connections made, first samples in
            c0, t0 = cpu(), time.monotonic()
            time.sleep(args.seconds - 4.0)
            c1, t1 = cpu(), time.monotonic()
            if child is not None:
                child.wait(60)
    term.close()
    drain.wait(10)
    return c1 - c0, t1 - t0


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        port, n, hosts, seconds, interval = sys.argv[2:7]
        ranks_child(int(port), int(n), int(hosts), float(seconds), float(interval))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=32)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--mode", default="live", choices=("live", "lines", "off"))
    args = p.parse_args()
    idle_cpu, idle_wall = measure(args, 0)
    busy_cpu, busy_wall = measure(args, args.ranks)
    print(f"observer, {args.mode}, idle: {idle_cpu:.2f} CPU s in {idle_wall:.1f} s = {100 * idle_cpu / idle_wall:.2f}% "
          f"of a core")
    print(f"observer, {args.mode}, {args.ranks} ranks on {args.hosts} hosts, a sample per {args.interval:g} s: "
          f"{busy_cpu:.2f} CPU s in {busy_wall:.1f} s = {100 * busy_cpu / busy_wall:.2f}% of a core")


if __name__ == "__main__":
    main()
