"""PNG of bus bandwidth against message size, one line per backend, from collectives.py's JSON.

    python benchmarks/plot.py results.json busbw.png [--op allreduce]

Needs matplotlib (the ``bench`` extra: pip install '.[bench]'). The memcpy reference (one core's
algbw) is drawn dashed. Both axes are log-scaled.
"""
from __future__ import annotations

import argparse
import json
import textwrap

import benchlib as bl


def plot(result: dict, png: str, op: str = "allreduce") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for backend in result["backends"]:
        pts = sorted((r["bytes"], r["busbw_GBps"]) for r in rows
                     if r["backend"] == backend and (r["op"] == op or backend == "memcpy"))
        if not pts:
            continue
        label = "memcpy (one core, algbw)" if backend == "memcpy" else backend
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, label=label,
                linestyle="--" if backend == "memcpy" else "-")
    sizes = sorted({r["bytes"] for r in rows if r["op"] == op})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [bl.human(s) for s in sizes])
    ax.set_xlabel("message size (nccl-tests convention)")
    ax.set_yscale("log")
    ax.set_ylabel("busbw (GB/s, log scale)")
    ax.set_title(f"{op}, {result.get('dtype', 'float32')}, {result['np']} ranks on one host\n"
                 + "\n".join(textwrap.wrap(result.get("machine", f"{result.get('cpus', '?')} cores"), 90)), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="collectives.py --json output")
    p.add_argument("png")
    p.add_argument("--op", default="allreduce")
    a = p.parse_args(argv)
    with open(a.json) as f:
        plot(json.load(f), a.png, a.op)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
