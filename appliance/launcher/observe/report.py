"""``report.png``: a job's record drawn as one picture, and its closing summary.

What it owns: ``series(record)`` (each rank's rates between consecutive rows of ``metrics.jsonl``:
steps/s, communication share, lateness per step, on the launcher's time axis from the job's
start), ``summarize(record)`` (the closing line's numbers), and ``draw(job_dir)``: three panels,
steps/s per host over time, communication share per host over time, and a rank x time heatmap
of lateness (ms the others waited per step for that rank), elastic rounds marked as vertical
lines on each; the summary as its title. Each host's line has its own marker on its own points
and the first hosts are drawn wider, so hosts at the same speed all show; the heatmap's ticks are
whole ranks. Matplotlib (Agg, no display needed). ``appliance report
JOB_ID`` calls ``draw`` on a finished or running job's directory.

Env vars: none. Failure modes: ``FileNotFoundError`` when the directory has no record;
``ReportError`` (an ``OSError``) naming the file when the record cannot be read (no permission,
not a regular file) or the picture cannot be written (with ``-o`` as the way out; nothing is
left behind); ``ValueError`` when the record has no samples to draw; ``ImportError`` (with the
package to install named) without matplotlib. Rows of the wrong types are left out
(``clean``), and counted, not fatal.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
import stat
import statistics
from typing import Any, Optional

from ...mount.atomic import save_atomically
from .record import RECORD, read_record
from .state import Sample, rates

REPORT = "report.png"
BIN_S = 5.0  # seconds per time bin (the record has a row per rank every 2 s)
MAX_T = 1e11  # a row's time is time.time() on the launcher: a later one is not a time
COUNTERS = ("step", "busy_s", "wall_s", "wait_s", "late_s")    # cumulative: a missing one is 0
OPTIONAL = ("samples", "rss", "gpu_util", "gpu_mem", "total_steps", "job_step")


class ReportError(OSError):
    """A file the report cannot read or write; the message names it and says what to do."""


def _num(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _time(v: Any) -> bool:
    return _num(v) and 0 <= v < MAX_T


def _rank_row(r: dict) -> bool:
    return (type(r.get("rank")) is int and r["rank"] >= 0 and _time(r.get("t"))  # noqa: E721 - not a bool
            and isinstance(r.get("host", ""), str) and all(r.get(k) is None or _num(r[k]) for k in COUNTERS + OPTIONAL)
            and (r.get("round") is None or type(r["round"]) is int)  # noqa: E721
            and (r.get("ops") is None or isinstance(r["ops"], dict)))


def clean(record: dict) -> tuple[dict, int]:
    """``record`` (``read_record``'s) without the rows the report cannot use, and how many rows
    were left out: a rank row whose ``rank`` is not a whole number, whose ``t`` is not a time,
    whose counters are not numbers (a missing one is 0) or whose ``ops`` is not an object; a
    round row alike. A job or
    end row keeps only the fields of the right type (an end's summary is text)."""
    ranks = [{**r, **{k: 0 for k in COUNTERS if r.get(k) is None}} for r in record["ranks"] if _rank_row(r)]
    rounds = [r for r in record["rounds"] if _time(r.get("t")) and type(r.get("round")) is int]  # noqa: E721
    job = {k: v for k, v in (record.get("job") or {}).items()
           if (k != "t" or _time(v)) and (k != "job" or isinstance(v, str))}
    end = record.get("end")
    if end is not None:
        end = {k: v for k, v in end.items() if (k != "t" or _time(v)) and (k != "summary" or isinstance(v, str))}
    skipped = len(record["ranks"]) - len(ranks) + len(record["rounds"]) - len(rounds)
    return {**record, "ranks": ranks, "rounds": rounds, "job": job or None, "end": end}, skipped


def load(job_dir: str) -> tuple[dict, int]:
    """``job_dir``'s record, ``clean``ed, and how many rows were left out; ``ReportError`` when
    its ``metrics.jsonl`` cannot be read (no permission, not a regular file: never blocks on a FIFO)."""
    path = os.path.join(job_dir, RECORD)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ReportError(f"cannot read {path}: not a regular file")
        return clean(read_record(job_dir))
    except ReportError:
        raise
    except OSError as e:
        raise ReportError(f"cannot read {path}: {e.strerror or e}") from None


@dataclasses.dataclass(frozen=True)
class Point:
    t: float            # seconds since the job started (middle of the interval)
    rank: int
    host: str
    steps_per_s: float
    comm_share: Optional[float]
    late_ms: Optional[float]


def series(record: dict) -> list[Point]:
    """Each rank's rates between its consecutive rows (``state.rates``); a rank's first row, or
    the first of a restarted process, from where its counters began (``Sample.origin``), so a
    job that reported once per rank still has an interval to draw."""
    t0 = start_of(record)
    last: dict[int, Sample] = {}
    out = []
    for r in record["ranks"]:
        rank = int(r.get("rank", -1))
        cur = Sample.of(r)
        prev = last.get(rank)
        last[rank] = cur
        if prev is None or cur.step < prev.step or cur.wall_s < prev.wall_s:
            prev = cur.origin()
            if prev is None:
                continue
        if cur.t <= prev.t:
            continue
        x = rates(prev, cur, size=1)
        out.append(Point(t=(cur.t + prev.t) / 2 - t0, rank=rank, host=str(r.get("host", "?")),
                         steps_per_s=x.steps_per_s, comm_share=x.comm_share,
                         late_ms=None if x.late_per_step_s is None else x.late_per_step_s * 1e3))
    return out


def summarize(record: dict) -> dict:
    """Steps, elapsed seconds, mean steps/s, mean communication share, the top straggler."""
    rows = record["ranks"]
    if not rows:
        return {}
    t0 = start_of(record)
    newest: dict[int, dict] = {}
    for r in rows:
        newest[int(r["rank"])] = r
    end_t = (record.get("end") or {}).get("t") or max(r["t"] for r in rows)
    steps = job_steps(newest.values())
    shares = [float(r["busy_s"]) / float(r["wall_s"]) for r in newest.values() if float(r.get("wall_s", 0)) > 0]
    top = max(newest.values(), key=lambda r: float(r.get("late_s", 0)))
    return {"steps": steps, "elapsed_s": end_t - t0, "steps_per_s": steps / (end_t - t0) if end_t > t0 else None,
            "comm_share": statistics.mean(shares) if shares else None,
            "top": (int(top["rank"]), str(top.get("host", "?")), float(top.get("late_s", 0))),
            "ranks": len(newest), "hosts": len({r.get("host") for r in newest.values()})}


def job_steps(newest) -> float:
    """The job's step as the script counts it: the least ``job_step`` among the ranks of the newest
    round (an elastic job's ranks count from their own start, so their ``step`` undercounts a job
    that grew; ranks that left in an earlier round stopped counting). Rows without ``job_step``
    (an older record) give the least ``step``."""
    rows = list(newest)
    last = max(int(r.get("round") or 0) for r in rows)
    current = [r for r in rows if int(r.get("round") or 0) == last]
    return min(float(r["job_step"]) if _num(r.get("job_step")) else float(r["step"]) for r in current)


def start_of(record: dict) -> float:
    """The time axis' zero: when the first rank began counting (the ranks' clocks), else the record's start."""
    return min((float(r["t"]) - max(0.0, float(r.get("wall_s", 0) or 0)) for r in record["ranks"]),
               default=(record.get("job") or {}).get("t") or 0.0)


def _round_times(record: dict) -> list[tuple[float, int]]:
    t0 = start_of(record)
    return [(float(r["t"]) - t0, int(r["round"])) for r in record["rounds"]]


def warm() -> None:
    """Import matplotlib now (the observer's ticker does, while the job runs), so the drawing at
    the job's end does not wait for the import."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except ImportError:
        pass


def draw(job_dir: str, path: Optional[str] = None, record: Optional[dict] = None) -> str:
    """Draw ``job_dir``'s record (or ``record``, ``load``'s) into ``path`` (default
    ``job_dir/report.png``; a directory: ``report.png`` in it); returns the path. Written
    atomically: a failed write leaves nothing behind and ``ReportError`` says where it could not
    write."""
    import matplotlib.pyplot as plt

    fig = figure(job_dir, record)
    path = path or os.path.join(job_dir, REPORT)
    if os.path.isdir(path):
        path = os.path.join(path, REPORT)
    try:
        save_atomically(lambda f: fig.savefig(f, format="png", dpi=90), path)
    except OSError as e:
        raise ReportError(f"cannot write {path}: {e.strerror or e} (appliance report -o FILE writes the picture elsewhere)") from None
    finally:
        plt.close(fig)
    return path


MARKERS = "osD^vP*Xph"


def _host_style(i: int, n: int, npoints: int) -> dict:
    """Host ``i`` of ``n``'s line: the first hosts drawn wider, each with its own marker on its own
    points (host 0 on points 0, n, 2n...; host 1 on 1, n+1...), so a host whose line lies under
    another's (hosts at the same speed) still shows. A line of one or two points is its markers."""
    every = max(min(n, npoints), npoints // 8, 1)
    return {"linewidth": 1.2 + (2.8 * (n - 1 - i) / (n - 1) if n > 1 else 0.0),
            "marker": MARKERS[i % len(MARKERS)], "markersize": 6,
            "markevery": (i % every, every) if npoints >= 3 else None}


def figure(job_dir: str, record: Optional[dict] = None) -> Any:
    """The report of ``job_dir``'s record (or ``record``, ``load``'s) as a matplotlib figure (its
    first three axes: the panels)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(f"the report needs matplotlib (pip install 'appliance[view]'): {e}") from None
    import numpy as np
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    record = record if record is not None else load(job_dir)[0]
    points = series(record)
    if not points:
        raise ValueError(f"{job_dir}: the record has no sample of any rank to draw")
    hosts = list(dict.fromkeys(p.host for p in points))
    ranks = sorted({p.rank for p in points})
    s = summarize(record)
    span = max(max(p.t for p in points), s["elapsed_s"])  # the axis spans the job, start to end
    nbins = max(1, min(150, int(span / BIN_S) + 1))  # a few record rows per bin: no gaps, no aliasing
    width = (span + 1e-9) / nbins

    def binned(select, combine) -> dict:
        acc: dict = collections.defaultdict(lambda: collections.defaultdict(list))
        for p in points:
            v = select(p)
            if v is not None:
                acc[p.host][min(nbins - 1, int(p.t / width))].append(v)
        return {h: sorted((b * width + width / 2, combine(vs)) for b, vs in bins.items()) for h, bins in acc.items()}

    speed = binned(lambda p: p.steps_per_s, statistics.mean)
    comm = binned(lambda p: p.comm_share, statistics.mean)
    heat = np.full((len(ranks), nbins), np.nan)
    cells: dict = collections.defaultdict(list)
    for p in points:
        if p.late_ms is not None:
            cells[(ranks.index(p.rank), min(nbins - 1, int(p.t / width)))].append(p.late_ms)
    for (i, b), vs in cells.items():
        heat[i, b] = statistics.mean(vs)
    for i in range(len(ranks)):  # a bin without a row of this rank: its previous value
        for b in range(1, nbins):
            if np.isnan(heat[i, b]):
                heat[i, b] = heat[i, b - 1]

    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True,
                             gridspec_kw={"height_ratios": [1, 1, max(1.0, min(2.5, len(ranks) / 16))]})
    for i, h in enumerate(hosts):
        xs, ys = zip(*speed.get(h, [(0, 0)]))
        axes[0].plot(xs, ys, label=h, **_host_style(i, len(hosts), len(xs)))
        if h in comm:
            xs, ys = zip(*comm[h])
            axes[1].plot(xs, [y * 100 for y in ys], label=h, **_host_style(i, len(hosts), len(xs)))
    axes[0].set_ylabel("steps/s")
    axes[0].set_ylim(0, max((y for h in speed.values() for _, y in h), default=1.0) * 1.15 or 1.0)
    axes[0].set_title("steps/s per host")
    axes[1].set_ylabel("% of wall time")
    axes[1].set_title("communication share per host (time blocked in collectives)")
    axes[1].set_ylim(0, 100)
    if len(hosts) <= 16:
        axes[0].legend(loc="lower left", fontsize="small", ncol=min(4, len(hosts)))
    im = axes[2].imshow(heat, aspect="auto", origin="lower", interpolation="nearest", cmap="magma",
                        extent=(0, nbins * width, -0.5, len(ranks) - 0.5))
    axes[2].set_ylabel("rank")
    # the heatmap's rows are the ranks that reported, in order: ticks on whole rows, labelled with their rank
    axes[2].yaxis.set_major_locator(MaxNLocator(nbins=min(len(ranks), 16), integer=True, min_n_ticks=1))
    axes[2].yaxis.set_major_formatter(FuncFormatter(
        lambda y, _: str(ranks[int(round(y))]) if abs(y - round(y)) < 1e-6 and 0 <= round(y) < len(ranks) else ""))
    axes[2].set_xlabel("seconds since the job started")
    axes[2].set_title("lateness: ms the others waited per step for each rank")
    fig.colorbar(im, ax=axes[2], orientation="horizontal", fraction=0.05, pad=0.12, label="ms per step")
    for t, rnd in _round_times(record):
        for ax in axes:
            ax.axvline(t, color="tab:red", linestyle="--", linewidth=0.9)
        axes[0].annotate(f"round {rnd}", (t, 1.0), xycoords=("data", "axes fraction"), fontsize="small",
                         color="tab:red", va="top", ha="left", rotation=90)
    job = (record.get("job") or {}).get("job", os.path.basename(job_dir.rstrip("/")))
    title = f"job {job}: {s['ranks']} ranks on {s['hosts']} hosts, {s['steps']:.0f} steps in {s['elapsed_s']:.0f} s"
    if s.get("comm_share") is not None:
        title += f", communication {s['comm_share'] * 100:.0f}%"
    top = s.get("top")
    if top and top[2] > 0:
        title += f"\ntop straggler: rank {top[0]} on {top[1]} (the others waited {top[2]:.1f} s for it)"
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def job_dir_of(job: str, shared: str) -> str:
    """``appliance report JOB``: JOB is a job id under ``SHARED/jobs`` or a job directory."""
    from ...mount import Layout

    if os.sep in job or job in (".", ".."):
        path = job
    else:
        try:
            path = Layout(shared).job_dir(job)
        except ValueError as e:
            raise FileNotFoundError(str(e)) from None
    try:
        os.stat(os.path.join(path, RECORD))
    except (FileNotFoundError, NotADirectoryError):
        where = path if os.sep in job else f"{Layout(shared).jobs} (--shared or APPLIANCE_SHARED to look elsewhere)"
        raise FileNotFoundError(f"no record of job {job} in {where}") from None
    except OSError as e:
        raise ReportError(f"cannot read {os.path.join(path, RECORD)}: {e.strerror or e}") from None
    return path


def summary_text(job_dir: str, record: Optional[dict] = None) -> str:
    """One line: the record's (or ``record``'s, ``load``'s) summary, as the launcher said it at the end."""
    record = record if record is not None else load(job_dir)[0]
    end = record.get("end") or {}
    if end.get("summary"):
        return str(end["summary"])
    s = summarize(record)
    if not s:
        return "summary: no samples in the record"
    text = f"summary: {s['steps']:.0f} steps in {s['elapsed_s']:.0f} s"
    if s.get("comm_share") is not None:
        text += f", communication {s['comm_share'] * 100:.0f}% of step time"
    if s["top"][2] > 0:
        text += f", top straggler rank {s['top'][0]} on {s['top'][1]} (the others waited {s['top'][2]:.1f} s for it)"
    return text + ("" if record.get("end") else " (the job is running or was killed: the record has no end)")


__all__ = ["Point", "REPORT", "ReportError", "clean", "draw", "figure", "warm", "job_dir_of", "load", "series",
           "summarize", "summary_text"]
