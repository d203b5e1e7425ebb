"""What the metrics a rank publishes cost: the default job's training loop with them on and off.

The loop is the default job's (appliance/examples/train.py: its MLP on the bundled digits, global
batch 64, SGD + ``DistributedOptimizer``, the loss allreduced every step, an elastic
``TorchState`` commit every 5 steps), run by N real ranks started directly (no launcher, so
nothing but this script decides whether APPLIANCE_METRICS_ADDR is set). A stand-in collector
(tests/fixtures/metrics_listener.py) listens in both settings; "on" sets APPLIANCE_METRICS_ADDR
(interval: APPLIANCE_METRICS_INTERVAL, default 1 s), "off" leaves it unset. Settings alternate
within each round (``--rounds``, default 3), so a slow minute of a shared machine spoils one run
of both; every row is the median over the rounds of rank 0's mean step time (timed steps between
barriers, after warm-up). Printed: per rank count, the median step time off and on, their ratio
(the cost; the target is <= 1.01), the lines per second per rank the collector received, and
rank 0's process CPU time per step off and on, and the share of a core rank 0's publishing thread used (its CPU time over its time since init:
the cost measured directly, which a busy machine's noise in step times does not hide).

    python benchmarks/metrics_cost.py [--job default|lm] [--ranks 2,32] [--rounds 3] [--steps N] [--quick] [--json out.json]
    python benchmarks/metrics_cost.py --paired 10 [--interval 1] [--ranks 2,32] [--steps N]

``--job lm``: benchmarks/train.py's job instead (its TransformerLM, AdamW, 16 sequences per rank).
``--paired PAIRS``: one job per rank count instead, the publisher started and stopped between
blocks of ``--steps`` steps, PAIRS times (``--interval`` sets its interval): the median of the
per-pair ratios (wall and process CPU of rank 0) is the least noisy measure on a busy machine.
``--steps``: timed steps per run (default max(100, 3000 / ranks); lm: 10). ``--quick``: 2 ranks, one
round, 30 steps (a smoke). Failure modes: a rank that fails ends the script with its stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import benchlib as bl  # noqa: E402


def paired_blocks(hvd, metrics, step, first: int, steps: int, pairs: int, out: str) -> None:
    """One job, the publisher started and stopped between blocks of ``steps`` steps (off/on, then
    on/off, ``pairs`` times): each on-block is compared with its neighbour, so start-up, placement
    and a slow minute of the machine spoil both alike. Rank 0 writes the per-pair ratios."""
    from appliance.runtime import engine

    eng, i = engine.current(), first
    metrics.stop(eng, carry=False)  # the one init started: from here on, only the blocks' own
    blocks = {"off": [], "on": []}
    for k in range(pairs):
        for setting in (("off", "on") if k % 2 == 0 else ("on", "off")):
            if setting == "on":  # connected and hello sent before the block: its steady state is timed
                pub, deadline = metrics.start(eng), time.monotonic() + 5
                while pub is not None and pub.sent < 1 and time.monotonic() < deadline:
                    time.sleep(0.001)
            hvd.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                step(i)
                i += 1
            hvd.barrier()
            blocks[setting].append((time.perf_counter() - t0, time.process_time() - c0))
            if setting == "on":
                metrics.stop(eng, carry=False)
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump({"wall_ratios": [a[0] / b[0] for a, b in zip(blocks["on"], blocks["off"])],
                       "cpu_ratios": [a[1] / b[1] for a, b in zip(blocks["on"], blocks["off"])],
                       "off_ms": statistics.median(b[0] for b in blocks["off"]) / steps * 1e3,
                       "on_ms": statistics.median(b[0] for b in blocks["on"]) / steps * 1e3}, f)
    hvd.shutdown()


def worker(job: str, steps: int, warmup: int, out: str, paired: int = 0) -> None:
    import torch
    import torch.nn.functional as F

    import appliance.torch as hvd
    from appliance.runtime import metrics

    started = time.monotonic()
    hvd.init()
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    gen = torch.Generator().manual_seed(rank)
    if job == "lm":  # benchmarks/train.py's job: its TransformerLM, AdamW, 16 sequences per rank
        import bench_models as bm

        cfg = dict(vocab=2048, d=256, layers=4, heads=4, seq=128)
        model = bm.TransformerLM(**cfg)
        tokens = bm.synthetic_tokens(65536, cfg["vocab"], seed=0)
        opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                       named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

        def step(i: int) -> None:
            starts = torch.randint(0, len(tokens) - cfg["seq"] - 1, (16,), generator=gen)
            xb = torch.stack([tokens[s:s + cfg["seq"]] for s in starts])
            yb = torch.stack([tokens[s + 1:s + cfg["seq"] + 1] for s in starts])
            opt.zero_grad()
            F.cross_entropy(model(xb).reshape(-1, cfg["vocab"]), yb.reshape(-1)).backward()
            opt.step()
    else:  # the default job's loop (appliance/examples/train.py)
        from appliance.examples.train import load_digits_split

        x, y, _, _ = load_digits_split(1234)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        state = hvd.elastic.TorchState(model=model, optimizer=opt, batch=0)
        batch = 64

        def step(i: int) -> None:
            idx = torch.randint(0, len(x), (batch,), generator=gen)[rank::size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum") * (size / batch)
            loss.backward()
            opt.step()
            hvd.allreduce(loss.detach(), name="loss")
            state.batch = i + 1
            if state.batch % 5 == 0:
                state.commit()

    for i in range(warmup):
        step(i)
    if paired:
        return paired_blocks(hvd, metrics, step, warmup, steps, paired, out)
    hvd.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(warmup + i)
    hvd.barrier()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    pub = metrics.publisher()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"seconds": elapsed, "step_ms": elapsed / steps * 1e3, "cpu_ms": cpu / steps * 1e3,
                       "publisher_cpu_s": pub.cpu_s if pub else None, "since_init_s": time.monotonic() - started}, f)
    hvd.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(job: str, ranks: int, steps: int, warmup: int, metrics_addr: str | None, timeout: float,
            paired: int = 0) -> dict:
    """One job of ``ranks`` ranks on this machine; rank 0's timing and the job's wall time."""
    out = tempfile.NamedTemporaryFile(prefix="metrics-cost-", suffix=".json", delete=False).name
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_", "OMPI_"))}
    base.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", HOROVOD_SIZE=str(ranks), HOROVOD_LOCAL_SIZE=str(ranks),
                APPLIANCE_STORE_ADDR=f"127.0.0.1:{port}", APPLIANCE_JOB_SECRET=secrets.token_hex(16),
                APPLIANCE_JOB_ID=f"metrics-cost-{port}", APPLIANCE_DATA_ADDR="127.0.0.1",
                HOROVOD_START_TIMEOUT=str(timeout))
    if metrics_addr:
        base["APPLIANCE_METRICS_ADDR"] = metrics_addr
        if paired:
            base["APPLIANCE_METRICS_INTERVAL"] = str(paired_interval)
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--job", job, "--steps", str(steps),
            "--warmup", str(warmup), "--out", out, "--paired", str(paired)]
    procs, errs = [], []
    started = time.monotonic()
    try:
        for r in range(ranks):
            err = tempfile.TemporaryFile()
            errs.append(err)
            procs.append(subprocess.Popen(argv, env=dict(base, HOROVOD_RANK=str(r), HOROVOD_LOCAL_RANK=str(r)),
                                          stdout=subprocess.DEVNULL, stderr=err, start_new_session=True))
        deadline = started + timeout
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        bad = [r for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            errs[bad[0]].seek(0)
            raise SystemExit(f"rank {bad[0]} of {ranks} failed (rc={procs[bad[0]].returncode}):\n"
                             + errs[bad[0]].read().decode(errors="replace")[-3000:])
        with open(out) as f:
            res = json.load(f)
        res["wall_s"] = time.monotonic() - started
        return res
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for e in errs:
            e.close()
        try:
            os.unlink(out)
        except OSError:
            pass


paired_interval = 1.0  # --paired's APPLIANCE_METRICS_INTERVAL (--interval)


def measure_paired(job: str, ranks: int, steps: int, warmup: int, pairs: int, timeout: float) -> dict:
    from fixtures.metrics_listener import Listener

    with Listener() as lst:
        res = run_job(job, ranks, steps, warmup, lst.addr, timeout, paired=pairs)
        res["lines_per_s_per_rank"] = len(lst.lines) / ranks / res["wall_s"]
    return {"job": job, "ranks": ranks, "steps": steps, "pairs": pairs, "interval": paired_interval,
            "off_ms": res["off_ms"], "on_ms": res["on_ms"], "wall_ratio": statistics.median(res["wall_ratios"]),
            "cpu_ratio": statistics.median(res["cpu_ratios"]), "lines_per_s_per_rank": res["lines_per_s_per_rank"]}


def print_paired(rows, file=sys.stdout) -> None:
    print(f"metrics cost, paired within one job: {JOBS[rows[0]['job']]}; the publisher started and stopped "
          "between blocks of steps, each on-block against its neighbour", file=file)
    print(f"{'ranks':>5} {'steps':>6} {'pairs':>5} {'interval':>8} {'off ms':>8} {'on ms':>8} {'wall on/off':>11} "
          f"{'cpu on/off':>10} {'lines/s/rank':>13}", file=file)
    for r in rows:
        print(f"{r['ranks']:>5} {r['steps']:>6} {r['pairs']:>5} {r['interval']:>7.2f}s {r['off_ms']:>8.3f} "
              f"{r['on_ms']:>8.3f} {r['wall_ratio']:>11.3f} {r['cpu_ratio']:>10.3f} {r['lines_per_s_per_rank']:>13.2f}",
              file=file)
    print("wall/cpu on/off: median over the pairs of (block with the publisher) / (its neighbour without); "
          "cpu: rank 0's process CPU time", file=file)


def measure(job: str, ranks: int, steps: int, warmup: int, rounds: int, timeout: float) -> dict:
    from fixtures.metrics_listener import Listener

    runs = {"off": [], "on": []}
    cpus = {"off": [], "on": []}
    rates, cpu = [], []
    for k in range(rounds):
        order = ("off", "on") if k % 2 == 0 else ("on", "off")
        for setting in order:
            with Listener() as lst:
                res = run_job(job, ranks, steps, warmup, lst.addr if setting == "on" else None, timeout)
                if setting == "on":
                    lines = len(lst.lines)
                    rates.append(lines / ranks / res["wall_s"])
                    cpu.append(res["publisher_cpu_s"] / res["since_init_s"])
                else:
                    assert not lst.lines, "metrics sent with APPLIANCE_METRICS_ADDR unset"
            runs[setting].append(res["step_ms"])
            cpus[setting].append(res["cpu_ms"])
    off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
    return {"job": job, "ranks": ranks, "steps": steps, "off_ms": off, "on_ms": on, "ratio": on / off,
            "off_cpu_ms": statistics.median(cpus["off"]), "on_cpu_ms": statistics.median(cpus["on"]),
            "lines_per_s_per_rank": statistics.median(rates), "publisher_cpu_share": statistics.median(cpu),
            "off_runs": runs["off"], "on_runs": runs["on"]}


JOBS = {"default": "the default job's loop (MLP on digits, global batch 64, DistributedOptimizer, a commit every "
                   "5 steps)",
        "lm": "benchmarks/train.py's job (TransformerLM d=256, 4 layers, AdamW, batch 16 per rank)"}


def print_table(rows, file=sys.stdout) -> None:
    print(f"metrics cost: {JOBS[rows[0]['job']]}, metrics off vs on (collector listening in both)", file=file)
    print(f"{'ranks':>5} {'steps':>6} {'off ms':>8} {'on ms':>8} {'on/off':>7} {'cpu off':>8} {'cpu on':>8} "
          f"{'lines/s/rank':>13} {'thread cpu':>10}  step ms of each run (off | on)", file=file)
    for r in rows:
        print(f"{r['ranks']:>5} {r['steps']:>6} {r['off_ms']:>8.3f} {r['on_ms']:>8.3f} {r['ratio']:>7.3f} "
              f"{r['off_cpu_ms']:>8.3f} {r['on_cpu_ms']:>8.3f} "
              f"{r['lines_per_s_per_rank']:>13.2f} {100 * r['publisher_cpu_share']:>9.3f}%  " + " ".join(f"{x:.3f}" for x in r["off_runs"]) + " | "
              + " ".join(f"{x:.3f}" for x in r["on_runs"]), file=file)
    print("cpu off/on: rank 0's process CPU ms per timed step (median); "
          "thread cpu: CPU time of rank 0's publishing thread / its time since init (median of the runs with "
          "metrics on); the counters in the core run in both settings", file=file)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", choices=sorted(JOBS), default="default",
                   help="default: the default job's loop; lm: benchmarks/train.py's model")
    p.add_argument("--ranks", default="2,32", help="comma list of rank counts (default 2,32)")
    p.add_argument("--rounds", type=int, default=None, help="runs of each setting (default 3; 1 with --quick)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default max(100, 3000 / ranks))")
    p.add_argument("--quick", action="store_true", help="a smoke: 2 ranks, one round, 30 steps")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--timeout", type=float, default=900, help="seconds one job may take")
    p.add_argument("--paired", type=int, default=0, metavar="PAIRS",
                   help="instead: one job per rank count, the publisher toggled between blocks of --steps steps, "
                        "PAIRS times (the least noisy measure on a busy machine)")
    p.add_argument("--interval", type=float, default=1.0, help="APPLIANCE_METRICS_INTERVAL for --paired (default 1)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.job, a.steps, a.warmup, a.out, a.paired)
        return 0
    counts = [2] if a.quick else [int(x) for x in a.ranks.split(",") if x]
    rounds = max(1, a.rounds or (1 if a.quick else 3))
    machine = bl.machine_line()
    default_steps = (lambda n: 30) if a.quick else (lambda n: max(100, 3000 // n)) if a.job == "default" else (lambda n: 10)
    warmup = a.warmup or (3 if a.quick else 10 if a.job == "default" else 2)
    global paired_interval
    paired_interval = a.interval
    if a.paired:
        rows = [measure_paired(a.job, n, a.steps or default_steps(n), warmup, a.paired, a.timeout) for n in counts]
    else:
        rows = [measure(a.job, n, a.steps or default_steps(n), warmup, rounds, a.timeout) for n in counts]
    print(machine)
    (print_paired if a.paired else print_table)(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
