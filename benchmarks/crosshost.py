"""Collectives across two simulated hosts: ours, gloo and OpenMPI tcp, one rank on each host.

    sudo python benchmarks/crosshost.py                        # allreduce, 4K..256M
    sudo python benchmarks/crosshost.py --quick                # seconds: 4K and 64K, few samples
    sudo python benchmarks/crosshost.py --ops allreduce,allgather --sizes 4K,64M --json out.json

Measures the cross-host target (64 MiB allreduce busbw of ours >= 1.2 x OpenMPI tcp's). Builds
the same cluster as the SSH tests (tests/fixtures/netns.py: network namespaces on a bridge, each
with its own hostname, NIC name and sshd on port 12345, keys from `appliance keys`), then:
- ours and gloo: `python -m appliance launch -np 2 -H H1:1,H2:1 -p 12345`, each rank running
  collectives.py's worker (both timed in the same ranks, interleaved). The simulated hosts share
  the kernel, IPC namespace and /dev/shm, so our runtime would pick shared memory between them:
  APPLIANCE_SHM=0 keeps every pair on TCP, as between real hosts, and each rank reports its link
  kind (the run stops if it is not "tcp"). gloo binds to the address its hostname resolves to,
  else loopback; the simulated hostnames resolve nowhere, so each rank sets GLOO_SOCKET_IFNAME to
  its host's NIC (the HOROVOD_GLOO_IFACE the launcher hands it: the NICs are named per host);
- OpenMPI tcp: `mpirun --host H1:1,H2:1` starting its daemons over ssh (port 12345, the cluster's
  key), `--mca btl self,tcp` with the TCP BTL and mpirun's out-of-band channel on the hosts'
  subnet (a CIDR: the NIC names differ), collectives.py's `--worker mpi-tcp` in the ranks.
Prints collectives.py's tables (ours, gloo, mpi-tcp, ratios) and the target's ratio. The link is a
veth pair through a bridge between namespaces of one machine: loopback-class bandwidth and the same
cores for both "hosts", not a NIC. Everything is torn down whatever happens.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import benchlib as bl
import collectives as coll

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fixtures import netns  # noqa: E402  (the SSH tests' simulated hosts)

BACKENDS = ("ours", "gloo", "mpi-tcp")
TARGET_SIZE, TARGET_RATIO = 64 << 20, 1.2  # 64 MiB allreduce busbw >= 1.2 x OpenMPI tcp's
LINK = "a veth pair through a bridge between network namespaces of this machine (loopback-class, no NIC)"


def worker(ops, sizes, iters, out) -> None:
    """One rank of the ours/gloo job, on a simulated host: gloo on this host's NIC, the link kinds
    recorded beside the results, then collectives.py's worker (its init() is then a no-op)."""
    iface = os.environ.get("HOROVOD_GLOO_IFACE", "")
    if iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
    import appliance.runtime as rt
    from appliance.runtime import engine

    rt.init()
    seen = {"rank": rt.rank(), "host": socket.gethostname(), "links": engine.link_kinds(),
            "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "data_addr": os.environ.get("APPLIANCE_DATA_ADDR")}
    with open(f"{out}.rank{rt.rank()}", "w") as f:
        json.dump(seen, f)
    coll.worker_ours_and_gloo(ops, sizes, iters, out)


def worker_argv(script: str, kind: str, ops, sizes, iters, out) -> list:
    return [sys.executable, script, "--worker", kind, "--ops", ",".join(ops), "--sizes", ",".join(map(str, sizes)),
            "--iters", str(iters), "--out", out]


def run_ours_and_gloo(hosts: str, env: dict, ops, sizes, iters, out: Path) -> tuple[list, list]:
    """(rows, what each rank saw) of the ours/gloo job across the hosts."""
    argv = worker_argv(os.path.abspath(__file__), "ours", ops, sizes, iters, str(out / "ours.json"))
    cmd = [sys.executable, "-m", "appliance", "launch", "-np", "2", "-H", hosts, "-p", str(netns.PORT), "--", *argv]
    # its own session: on a timeout the launcher goes with its ssh clients (cluster.close() gets the ranks)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output = proc.communicate(timeout=3600)[0]
    except subprocess.TimeoutExpired:
        raise SystemExit("ours/gloo ranks: timed out after 3600 s") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"ours/gloo ranks failed (launch exited {proc.returncode}):\n{output[-4000:]}")
    seen = [json.loads((out / f"ours.json.rank{k}").read_text()) for k in range(2)]
    return json.loads((out / "ours.json").read_text()), seen


def run_mpi_tcp(cluster, key: str, env: dict, ops, sizes, iters, out: Path) -> list:
    """Rows of OpenMPI tcp across the hosts; [] (after a few lines on stderr) when mpirun failed."""
    h1, h2 = cluster.hosts
    ssh = ["ssh", "-p", str(netns.PORT), "-i", key, "-o", "StrictHostKeyChecking=no", "-o",
           "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
    forward = ["-x", "PATH", "-x", "PYTHONPATH"]
    argv = worker_argv(str(Path(__file__).with_name("collectives.py")), "mpi-tcp", ops, sizes, iters,
                       str(out / "mpi-tcp.json"))
    if not bl.run_mpi(2, "tcp", argv, timeout=3600, env=env, hosts=f"{h1.address}:1,{h2.address}:1",
                      iface=f"{cluster.net}.0/24", extra=["--mca", "plm_rsh_agent", shlex.join(ssh), *forward]):
        return []
    return json.loads((out / "mpi-tcp.json").read_text())


def target_line(rows) -> str | None:
    by = {r["backend"]: r for r in rows if r["op"] == "allreduce" and r["bytes"] == TARGET_SIZE}
    if "ours" not in by or "mpi-tcp" not in by:
        return None
    ratio = by["ours"]["busbw_GBps"] / by["mpi-tcp"]["busbw_GBps"]
    return (f"cross-host target, 64M allreduce across two hosts: busbw ours {by['ours']['busbw_GBps']:.2f} GB/s / "
            f"OpenMPI tcp {by['mpi-tcp']['busbw_GBps']:.2f} GB/s = {ratio:.2f} (target >= {TARGET_RATIO}): "
            + ("met" if ratio >= TARGET_RATIO else "NOT met"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="allreduce", help="comma list of " + ", ".join(coll.OPS) + " (default allreduce)")
    p.add_argument("--sizes", default=None,
                   help=f"comma list (4K,1M) or a range of powers of 4 (default {coll.DEFAULT_SIZES})")
    p.add_argument("--iters", type=int, default=None, help="samples per size up to 1 MiB, fewer above (default 60)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke: 4K and 64K, 10 samples")
    p.add_argument("--json", help="write the results here (e.g. benchmarks/results/crosshost.json)")
    p.add_argument("--no-mpi", action="store_true", help="leave out OpenMPI tcp")
    p.add_argument("--worker", choices=["ours"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sizes = bl.parse_sizes(a.sizes or ("4K,64K" if a.quick else coll.DEFAULT_SIZES))
    iters = a.iters or (10 if a.quick else 60)
    ops = [o for o in a.ops.split(",") if o]
    if any(o not in coll.OPS for o in ops):
        p.error(f"unknown op in {a.ops!r}; choose from {', '.join(coll.OPS)}")
    if a.worker:
        worker(ops, sizes, iters, a.out)
        return 0
    why = netns.available()
    if why:
        raise SystemExit(f"cannot build the simulated hosts: {why}")
    skipped = {}
    mpi_why = "left out (--no-mpi)" if a.no_mpi else bl.mpi_missing()
    if mpi_why:
        print(mpi_why, file=sys.stderr)
        skipped["mpi-tcp"] = mpi_why

    machine = bl.machine_line()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still tears the hosts down (finally)
    with netns.keyed_cluster(2, "appliance-crosshost-") as (cluster, base, shared, out):
        h1, h2 = cluster.hosts
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMIX_"))}
        env.update({"APPLIANCE_SHARED": str(shared), "APPLIANCE_STOP_GRACE": "1", "HOME": str(base),
                    "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                    "APPLIANCE_SHM": "0"})  # the simulated hosts share /dev/shm; real ones do not
        rows, seen = run_ours_and_gloo(f"{h1.address}:1,{h2.address}:1", env, ops, sizes, iters, out)
        kinds = {s["rank"]: s["links"][1 - s["rank"]] for s in seen}
        if set(kinds.values()) != {"tcp"} or seen[0]["host"] == seen[1]["host"]:
            raise SystemExit(f"the ranks are not two hosts on TCP: {seen}")
        if "mpi-tcp" not in skipped:
            got = run_mpi_tcp(cluster, str(shared / "ssh" / "id_ed25519"), env, ops, sizes, iters, out)
            rows += got
            if not got:
                skipped["mpi-tcp"] = "mpirun failed"

    coll.add_bandwidth(rows, 2)
    present = [b for b in BACKENDS if b not in skipped]
    print(f"2 ranks, one on each of two simulated hosts ({seen[0]['host']} {seen[0]['data_addr']}, "
          f"{seen[1]['host']} {seen[1]['data_addr']}); machine: {machine}; backends: {', '.join(present)}")
    print(f"link: {LINK}; ours: link kind {kinds[0]} (APPLIANCE_SHM=0); gloo: GLOO_SOCKET_IFNAME "
          f"{seen[0]['gloo_ifname']} / {seen[1]['gloo_ifname']}; OpenMPI: btl self,tcp on {cluster.net}.0/24")
    table = io.StringIO()
    coll.print_tables(rows, ops, 2, present, file=table)
    print(table.getvalue().replace("2 ranks on one host", "2 ranks on two hosts"), end="")
    line = target_line(rows)
    if line:
        print(line)
    result = {"np": 2, "cpus": os.cpu_count(), "machine": machine, "link": LINK, "ops": ops, "backends": present,
              "skipped": skipped, "ranks": seen, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
