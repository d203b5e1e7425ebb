"""What grows with the number of ranks: start-up, store requests, sockets, memory and negotiation.

For each N, N ranks run on this machine as processes of the framework-free API
(``appliance.runtime``, numpy), started by ``appliance.launcher.launch`` and oversubscribed (more
ranks than cores). Each rank measures itself and writes one JSON line; this script gathers them:

- **start-up**: the last rank out of its first 4 KiB allreduce minus the last rank into ``init()``
  (wall clock, comparable between processes of one machine): process start and imports are left
  out; the rendezvous, the links and everything opened on first use are in;
- **store requests**: requests each rank sent to the rendezvous store (mean, max), and all the
  requests rank 0's store server handled;
- **fds / sockets**: open file descriptors (of them, sockets) of each rank after a few allreduces
  (rank 0's, and the largest of any rank);
- **memory**: resident set (RSS) and proportional set (PSS: shared pages split between their
  users) of each rank, and the shared-memory segments it maps (MiB);
- **rank 0 CPU per cached op**: the CPU time rank 0's engine spends negotiating (its turns that
  move control messages or announce work, less the collectives they run), per synchronous cached
  4-byte allreduce (``Runtime.set_profiling``), and the control frames rank 0 sends and receives
  per op;
- **latency**: the slowest rank's median time of one synchronous cached 4-byte allreduce (wall
  clock: with more ranks than cores it measures the scheduler as much as the protocol, see
  benchmarks/README.md).

With more ranks than cores, wall-clock latency and CPU per op measure the scheduler as much as
the protocol. The script therefore also runs (unless ``--no-virtual``) N negotiators of each
protocol (tree, star: APPLIANCE_NEGOTIATION) in this one process, wired in memory (``_core_testing.negotiation_model``:
the engine's own negotiation code, no sockets, no scheduler; a simulator the test build has, APPLIANCE_BUILD_TESTS=ON,
as ``bash tests/run.sh`` installs it), for N = 2 ... 4,096, and reports per
cached op (the best of three runs): rank 0's time in its negotiator (replayed on its own, so the
other negotiators' memory does not evict its caches), the messages rank 0 and the busiest rank
handle, and the hops from the ranks' submissions to the plan (the negotiation's latency, in
one-way messages).

Each metric gets a power-law fit ``a * N^b`` over N >= 8 (b = 1: linear, b = 2: quadratic; log2 N
growth shows as a small b that falls as N grows) and an extrapolation to 4,096 ranks. A size N is
skipped, with a line saying why, when the ranks' memory measured at the previous size (PSS, plus
half of the shared-memory segments each maps: their pages are reserved when made, and each is
shared by two ranks), grown linearly with N per rank, would not fit in 80% of the machine's
available memory.

    python benchmarks/scale.py                         # N = 2, 4, ... 128 (what fits)
    python benchmarks/scale.py --np 8,32,128 --ops 400 --json scale.json --plot scale.png
    python benchmarks/scale.py --quick                 # seconds: N = 2, 4, 8, few ops (virtual: to 64)

Environment variables of the runtime (APPLIANCE_SHM=0, HOROVOD_CACHE_CAPACITY...) pass through to
the ranks.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import benchlib as bl

METRICS = (  # key, column title, unit scale, format
    ("startup_s", "start-up s", 1.0, "{:.3f}"),
    ("store_per_rank", "store req/rank", 1.0, "{:.1f}"),
    ("store_served", "store served", 1.0, "{:.0f}"),
    ("fds_rank0", "fds r0", 1.0, "{:.0f}"),
    ("fds_max", "fds max", 1.0, "{:.0f}"),
    ("sockets_max", "socks max", 1.0, "{:.0f}"),
    ("rss_mib", "RSS MiB", 1.0, "{:.1f}"),
    ("pss_mib", "PSS MiB", 1.0, "{:.1f}"),
    ("shm_mib", "shm MiB", 1.0, "{:.1f}"),
    ("rank0_cpu_us", "r0 CPU/op us", 1.0, "{:.2f}"),
    ("rank0_frames", "r0 frames/op", 1.0, "{:.2f}"),
    ("latency_us", "latency us", 1.0, "{:.1f}"),
)
FIT_FROM = 8
PROTOCOLS = ("tree", "star")
VIRTUAL = (("rank0_ns", "r0 ns/op", "{:.0f}"), ("rank0_msgs", "r0 msgs/op", "{:.2f}"),
           ("max_msgs", "max msgs/op", "{:.2f}"), ("hops", "hops", "{:.0f}"))


# --- one rank ----------------------------------------------------------------------------------
def _fds() -> tuple:
    total = sockets = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        total += 1
        sockets += target.startswith("socket:")
    return total, sockets


def _memory() -> dict:
    kib = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] in ("Rss:", "Pss:"):
                    kib[parts[0][:-1].lower()] = int(parts[1])
    except OSError:
        pass
    shm = maps = 0
    with open("/proc/self/maps") as f:
        for line in f:
            if "/dev/shm/" in line or "memfd:" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                shm += hi - lo
                maps += 1
    return {"rss_kib": kib.get("rss", 0), "pss_kib": kib.get("pss", 0), "shm_kib": shm // 1024, "shm_maps": maps}


def worker(ops: int, out_dir: str) -> None:
    import numpy as np

    import appliance.runtime as rt
    from appliance.runtime import engine

    t_enter = time.time()
    rt.init()
    x = np.ones(1024, np.float32)  # 4 KiB
    rt.allreduce(x, op=rt.Sum, name="scale.first", out=x)
    t_first = time.time()
    for _ in range(3):
        rt.allreduce(x, op=rt.Sum, name="scale.first", out=x)
    fds, sockets = _fds()
    mem = _memory()
    core = engine.current().core
    tiny = np.ones(1, np.float32)  # 4 bytes: the op is its negotiation
    for _ in range(min(20, ops)):
        rt.allreduce(tiny, op=rt.Sum, name="scale.tiny", out=tiny)
    core.set_profiling(True)
    rt.barrier()
    before = core.stats()
    times = []
    for _ in range(ops):
        t0 = time.perf_counter()
        rt.allreduce(tiny, op=rt.Sum, name="scale.tiny", out=tiny)
        times.append(time.perf_counter() - t0)
    after = core.stats()
    core.set_profiling(False)
    diff = {k: after[k] - before[k] for k in ("ctrl_in", "ctrl_out", "negotiation_ns", "negotiation_turns")}
    rec = {"rank": rt.rank(), "size": rt.size(), "t_enter": t_enter, "t_first": t_first, "fds": fds,
           "sockets": sockets, **mem, "store_requests": after["store_requests"], "store_served": after["store_served"],
           "latency_s": bl.median(times), "ops": ops, **diff}
    rt.barrier()
    with open(os.path.join(out_dir, f"rank{rt.rank()}.json"), "w") as f:
        json.dump(rec, f)
    rt.shutdown()


# --- the driver --------------------------------------------------------------------------------
def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def summarize(recs: list) -> dict:
    n = len(recs)
    r0 = next(r for r in recs if r["rank"] == 0)
    mean = lambda k: sum(r[k] for r in recs) / n  # noqa: E731
    ops = r0["ops"]
    return {
        "np": n,
        "startup_s": max(r["t_first"] for r in recs) - max(r["t_enter"] for r in recs),
        "store_per_rank": mean("store_requests"),
        "store_max": max(r["store_requests"] for r in recs),
        "store_served": r0["store_served"],
        "fds_rank0": r0["fds"], "fds_max": max(r["fds"] for r in recs), "fds_mean": mean("fds"),
        "sockets_rank0": r0["sockets"], "sockets_max": max(r["sockets"] for r in recs),
        "rss_mib": mean("rss_kib") / 1024, "pss_mib": mean("pss_kib") / 1024, "shm_mib": mean("shm_kib") / 1024,
        "rank0_cpu_us": r0["negotiation_ns"] / ops / 1000,
        "rank0_frames": (r0["ctrl_in"] + r0["ctrl_out"]) / ops,
        "latency_us": max(r["latency_s"] for r in recs) * 1e6,
    }


def run_size(n: int, ops: int, timeout: float) -> dict:
    from appliance.launcher import launch

    out_dir = os.path.dirname(bl.result_path(f"scale{n}"))
    res = launch([sys.executable, os.path.abspath(__file__), "--worker", "--ops", str(ops), "--out", out_dir], np=n,
                 timeout=timeout, start_timeout=timeout)
    if res.returncode != 0:
        raise SystemExit(f"{n} ranks failed (rc={res.returncode}):\n{bl.ranks_output(res)}")
    recs = []
    for r in range(n):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            recs.append(json.load(f))
    return summarize(recs)


def fit(rows: list, key: str) -> dict | None:
    """Least-squares power law y = a * N^b over N >= FIT_FROM (all N when fewer than 2 are)."""
    pts = [(r["np"], r[key]) for r in rows if r.get(key) and r[key] > 0]
    big = [p for p in pts if p[0] >= FIT_FROM]
    pts = big if len(big) >= 2 else pts
    if len(pts) < 2:
        return None
    xs = [math.log(p[0]) for p in pts]
    ys = [math.log(p[1]) for p in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = math.exp(my - b * mx)
    last_n, last_y = pts[-1]
    return {"b": b, "a": a, "from": pts[0][0], "to": last_n, "at_4096": last_y * (4096 / last_n) ** b}


def virtual_model():
    """The simulator's entry point (the test build's), or None."""
    try:
        from appliance.runtime import _core_testing
    except ImportError:
        return None
    return _core_testing.negotiation_model


def run_virtual(sizes: list, ops: int) -> list:
    model = virtual_model()
    rows = []
    for n in sizes:
        row = {"np": n}
        for proto in PROTOCOLS:  # the best of three: a page fault or a preemption spoils one
            runs = [model(proto, n, ops) for _ in range(3)]
            for k in runs[0]:
                row[f"{proto}_{k}"] = min(r[k] for r in runs)
        rows.append(row)
    return rows


def print_virtual(rows: list, fits: dict, file=sys.stdout) -> None:
    print("\nvirtual ranks (N negotiators in one process, wired in memory; per synchronous cached op): "
          "r0 ns = time in rank 0's negotiator; msgs = control messages handled (sent + received); "
          "hops = one-way messages from the submissions to the plan", file=file)
    cols = [(f"{p}_{k}", f"{p} {t}", fmt) for p in PROTOCOLS for k, t, fmt in VIRTUAL]
    print(f"{'N':>5} " + " ".join(f"{t:>{max(9, len(t))}}" for _, t, _ in cols), file=file)
    for r in rows:
        print(f"{r['np']:>5} " + " ".join(f"{fmt.format(r[k]):>{max(9, len(t))}}" for k, t, fmt in cols), file=file)
    print(f"{'metric':>22} {'b':>6} {'over N':>10} {'at 4096':>12}", file=file)
    for k, t, fmt in cols:
        f = fits.get(k)
        if f:
            print(f"{t:>22} {f['b']:>6.2f} {str(f['from']) + '-' + str(f['to']):>10} {fmt.format(f['at_4096']):>12}", file=file)


def print_tables(rows: list, fits: dict, file=sys.stdout) -> None:
    cols = [(k, t, fmt) for k, t, _, fmt in METRICS]
    width = {k: max(len(t), 9) for k, t, _ in cols}
    print("\nper N (ranks on one host, oversubscribed): start-up = last rank out of its first 4 KiB allreduce - "
          "last rank into init(); fds/sockets after a few allreduces; memory per rank (mean); "
          "r0 = rank 0, per synchronous cached 4-byte allreduce; latency = slowest rank's median", file=file)
    print(f"{'N':>5} " + " ".join(f"{t:>{width[k]}}" for k, t, _ in cols), file=file)
    for r in rows:
        print(f"{r['np']:>5} " + " ".join(f"{fmt.format(r[k]):>{width[k]}}" for k, _, fmt in cols), file=file)
    print(f"\ngrowth: power-law fit y = a * N^b over N >= {FIT_FROM} (b=1 linear, b=2 quadratic), "
          "and the fit extrapolated to 4,096 ranks from the largest N measured", file=file)
    print(f"{'metric':>15} {'b':>6} {'over N':>10} {'at 4096':>12}", file=file)
    for k, t, _, fmt in METRICS:
        f = fits.get(k)
        if f:
            print(f"{t:>15} {f['b']:>6.2f} {str(f['from']) + '-' + str(f['to']):>10} {fmt.format(f['at_4096']):>12}",
                  file=file)


def plot(rows: list, fits: dict, png: str, title: str, virtual: list = (), vfits: dict = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [m for m in METRICS if any(r.get(m[0]) for r in rows)]
    if virtual:  # one panel per virtual metric, both protocols in it
        rows = [dict(r) for r in rows]
        by_n = {r["np"]: r for r in rows}
        for v in virtual:
            by_n.setdefault(v["np"], {"np": v["np"]}).update(v)
        rows = [by_n[n] for n in sorted(by_n)]
        fits = {**fits, **(vfits or {})}
        keys += [(f"{p}_{k}", f"virtual {p}: {t}", 1.0, fmt) for k, t, fmt in VIRTUAL for p in PROTOCOLS]
    cols = 4
    fig, axes = plt.subplots(math.ceil(len(keys) / cols), cols, figsize=(4 * cols, 3 * math.ceil(len(keys) / cols)),
                             dpi=90, squeeze=False)
    for ax, (k, t, _, _) in zip(axes.flat, keys):
        pts = [(r["np"], r[k]) for r in rows if r.get(k)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
        f = fits.get(k)
        if f:
            xs = [f["from"], 4096]
            ax.plot(xs, [f["a"] * x ** f["b"] for x in xs], linestyle="--", alpha=0.6, label=f"N^{f['b']:.2f}")
            ax.legend(fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ys = [p[1] for p in pts]
        if ys and max(ys) <= 1.5 * min(ys):  # flat: a log axis this narrow has no ticks to show
            ax.set_ylim(min(ys) / 2, max(ys) * 2)
        ax.set_title(t, fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default=None, help="comma list of rank counts (default 2,4,...,128)")
    p.add_argument("--max", type=int, default=128, help="largest N of the default list (powers of 2)")
    p.add_argument("--ops", type=int, default=None, help="timed cached ops per rank (default 200)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke: N = 2, 4, 8 and 20 ops")
    p.add_argument("--timeout", type=float, default=600, help="seconds for each N (default 600)")
    p.add_argument("--virtual-max", type=int, default=4096, help="largest N of the virtual ranks (default 4096)")
    p.add_argument("--no-virtual", action="store_true", help="leave the virtual ranks out")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--plot", help="write a PNG of every metric against N")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    ops = a.ops or (20 if a.quick else 200)
    if a.worker:
        worker(ops, a.out)
        return 0
    if not a.no_virtual and virtual_model() is None:
        print("scale.py: the virtual ranks need the test build's simulator (appliance.runtime._core_testing: "
              "install with APPLIANCE_BUILD_TESTS=ON, as tests/run.sh does); pass --no-virtual to leave them out",
              file=sys.stderr)
        return 2
    if a.np:
        sizes = [int(x) for x in a.np.split(",") if x]
    elif a.quick:
        sizes = [2, 4, 8]
    else:
        sizes = [1 << k for k in range(1, 32) if (1 << k) <= a.max]
    machine = bl.machine_line()
    print(f"ranks on one host, processes of the numpy API; {machine}", flush=True)
    rows, skipped = [], []
    for n in sizes:
        if rows:
            last = rows[-1]
            per_rank = last["pss_mib"] + last["shm_mib"] / 2  # a segment's pages are reserved, and shared by two
            need_kib = n * (per_rank * 1024) * (n / last["np"])
            if need_kib > 0.8 * mem_available_kib():
                why = (f"N={n} skipped: {last['np']} ranks used {per_rank:.0f} MiB each (PSS + half the shared memory "
                       f"they map); grown linearly, "
                       f"{n} ranks would need ~{need_kib / 2**20:.1f} GiB of the {mem_available_kib() / 2**20:.1f} GiB "
                       "available")
                print(why, file=sys.stderr, flush=True)
                skipped.append(why)
                continue
        t0 = time.time()
        row = run_size(n, ops, a.timeout)
        row["load"] = os.getloadavg()[0]
        rows.append(row)
        print(f"N={n}: start-up {row['startup_s']:.3f} s, fds max {row['fds_max']}, latency {row['latency_us']:.1f} us "
              f"({time.time() - t0:.0f} s, load {row['load']:.1f})", file=sys.stderr, flush=True)
    fits = {k: f for k, *_ in METRICS if (f := fit(rows, k))}
    print_tables(rows, fits)
    virtual, vfits = [], {}
    if not a.no_virtual:
        vmax = 64 if a.quick else a.virtual_max
        virtual = run_virtual([1 << k for k in range(1, 31) if (1 << k) <= vmax], 5 if a.quick else 20)
        vfits = {f"{p}_{k}": f for p in PROTOCOLS for k, *_ in VIRTUAL if (f := fit(virtual, f"{p}_{k}"))}
        print_virtual(virtual, vfits)
    if a.plot:
        plot(rows, fits, a.plot, f"ranks on one host; {machine}", virtual, vfits)
        print(f"plot: {a.plot}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine, "cpus": os.cpu_count(), "ops": ops, "rows": rows, "fits": fits,
                       "skipped": skipped, "virtual": virtual, "virtual_fits": vfits}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
