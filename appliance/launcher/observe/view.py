"""What a person sees of a running job: the live table on a terminal, summary lines elsewhere.

What it owns: ``render(snapshot, ranks=False)`` (a rich renderable: a header with the job's
step, throughput, communication share, elapsed time and ETA; one row per host, its ranks folded,
or one row per rank under its host; the straggler marked; the last events), ``summary_line``
(the same in one line), ``closing_line`` (the job's last word), and the two displays:
``LiveDisplay``, a ``rich.live.Live`` region at the bottom of the terminal with the job's own
output printed above it (the launcher's output sink diverts its lines here; they are printed in
order, in batches, never lost), whose key ``r`` toggles the rows between hosts and ranks (stdin
in cbreak mode while it runs; restored on exit), and ``LinesDisplay``, one summary line every
``APPLIANCE_VIEW_INTERVAL`` seconds for logs, CI and ``nohup``.

Env vars: none read here (``session.py`` reads the knobs). Failure modes: none raised; a closed
terminal stops the display, not the job.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
from typing import IO, Any, Callable, Optional

from .state import Snapshot

MAX_EVENTS_SHOWN = 3


def fmt_duration(s: Optional[float]) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_rate(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def fmt_bytes(v: Optional[float], per_s: bool = False) -> str:
    if v is None:
        return "-"
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if v >= scale:
            return f"{v / scale:.1f}{unit}{'/s' if per_s else ''}"
    return f"{v:.0f}B{'/s' if per_s else ''}"


def fmt_pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def fmt_ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def fmt_step(snap: Snapshot) -> str:
    step = "-" if snap.step is None else f"{snap.step:.0f}"
    return f"{step}/{snap.total_steps}" if snap.total_steps else step


def header(snap: Snapshot) -> str:
    hosts = len(snap.hosts)
    parts = [f"job {snap.job_id}", f"{snap.reporting}/{snap.size} ranks on {hosts} host{'s' if hosts != 1 else ''}"]
    if snap.round:
        parts.append(f"round {snap.round}")
    parts += [f"step {fmt_step(snap)}", f"{fmt_rate(snap.steps_per_s)} steps/s"]
    if snap.samples_per_s is not None:
        parts.append(f"{fmt_rate(snap.samples_per_s)} samples/s")
    parts += [f"comm {fmt_pct(snap.comm_share)}", f"elapsed {fmt_duration(snap.elapsed_s)}"]
    if snap.eta_s is not None:
        parts.append(f"ETA {fmt_duration(snap.eta_s)}")
    return " · ".join(parts)


def summary_line(snap: Snapshot) -> str:
    line = header(snap)
    if snap.straggler is not None:
        s = snap.straggler
        line += f" · straggler rank {s.rank} on {s.host} ({s.late_per_step_s * 1e3:.0f} ms/step)"
    return line


def closing_line(snap: Snapshot) -> str:
    """The job's summary at its end, from every rank's last cumulative counters: steps (the job's,
    as the snapshot counts them), overall steps/s, communication share of the whole run, and the
    rank the others waited for most (when it stands out)."""
    last = [r for r in snap.ranks if r.last is not None]
    steps = snap.step if snap.step is not None else min((r.last.step for r in last), default=None)
    total = f"/{snap.total_steps}" if snap.total_steps else ""
    parts = [f"{'-' if steps is None else f'{steps:.0f}'}{total} steps in {fmt_duration(snap.elapsed_s)}"]
    if steps and snap.elapsed_s > 0:
        parts.append(f"{fmt_rate(steps / snap.elapsed_s)} steps/s")
    samples = [r.last.samples for r in last if r.last.samples is not None]
    if samples and snap.elapsed_s > 0:
        parts.append(f"{fmt_rate(sum(samples) / snap.elapsed_s)} samples/s")
    shares = [r.last.busy_s / r.last.wall_s for r in last if r.last.wall_s > 0]
    if shares:
        parts.append(f"communication {fmt_pct(sum(shares) / len(shares))} of the time")
    lates = sorted(last, key=lambda r: r.last.late_s, reverse=True)
    top = lates[0] if len(lates) > 1 else None
    # named only when it stands out: twice the next rank's, and 5% of the job's time
    if top is not None and top.last.late_s >= max(2 * lates[1].last.late_s, 0.05 * snap.elapsed_s, 1e-3):
        parts.append(f"top straggler rank {top.rank} on {top.host} (the others waited {top.last.late_s:.1f} s for it)")
    return "summary: " + ", ".join(parts)


COLUMNS = ("host", "ranks", "step", "steps/s", "samples/s", "comm", "late ms/step", "wait ms/step", "busbw", "mem",
           "gpu", "round")


def _row_cells(name: str, ranks: str, step, sps, smp, comm, late, wait, bw, mem, gpu, rnd) -> list[str]:
    return [name, ranks, "-" if step is None else f"{step:.0f}", fmt_rate(sps), fmt_rate(smp), fmt_pct(comm),
            fmt_ms(late), fmt_ms(wait), fmt_bytes(bw, per_s=True), fmt_bytes(mem),
            "-" if gpu is None else f"{gpu:.0f}%", str(rnd)]


def _ranks_text(ranks: tuple, alive: int) -> str:
    if not ranks:
        return "-"
    lo, hi = min(ranks), max(ranks)
    span = f"{lo}" if lo == hi else f"{lo}-{hi}" if hi - lo + 1 == len(ranks) else f"{len(ranks)} ranks"
    return span if alive == len(ranks) else f"{span} ({alive} up)"


def render(snap: Snapshot, ranks: bool = False) -> Any:
    """The view of ``snap`` (a rich renderable; ``ranks``: a row per rank)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for i, col in enumerate(COLUMNS):
        table.add_column(col, justify="left" if i < 2 else "right", no_wrap=True)
    by_rank = {r.rank: r for r in snap.ranks}
    for h in snap.hosts:
        style = "bold red" if h.straggler else None
        if not ranks:
            name = h.host + (" ◀ straggler" if h.straggler else "")
            table.add_row(*_row_cells(name, _ranks_text(h.ranks, h.alive), h.step, h.steps_per_s, h.samples_per_s,
                                      h.comm_share, h.late_ms, h.wait_ms, h.busbw, h.rss, h.gpu_util, h.round),
                          style=style)
            continue
        table.add_row(h.host, _ranks_text(h.ranks, h.alive), *[""] * (len(COLUMNS) - 2), style="bold")
        for rank in h.ranks:
            r = by_rank[rank]
            bw = max(r.rates.busbw.values()) if r.rates.busbw else None
            late = None if r.rates.late_per_step_s is None else r.rates.late_per_step_s * 1e3
            wait = None if r.rates.wait_per_step_s is None else r.rates.wait_per_step_s * 1e3
            name = "  rank" + (" ◀ straggler" if r.straggler else "" if r.alive else " (gone)")
            table.add_row(*_row_cells(name, str(rank), r.step, r.rates.steps_per_s, r.rates.samples_per_s,
                                      r.rates.comm_share, late, wait, bw, r.rss, r.gpu_util, r.round),
                          style="bold red" if r.straggler else "dim" if not r.alive else None)
    parts: list[Any] = [Text(header(snap), style="bold"), table]
    if snap.straggler is not None:
        parts.append(Text(snap.straggler.line(), style="bold red"))
    for ev in snap.events[-MAX_EVENTS_SHOWN:]:
        parts.append(Text(f"· {ev.text}", style="dim"))
    parts.append(Text(f"[r] {'hosts' if ranks else 'ranks'}", style="dim"))
    return Group(*parts)


def render_text(snap: Snapshot, ranks: bool = False, width: int = 120) -> str:
    """``render`` as plain text (what a terminal ``width`` columns wide shows)."""
    from rich.console import Console

    console = Console(record=True, width=width, file=open(os.devnull, "w"), color_system=None)
    console.print(render(snap, ranks))
    text = console.export_text()
    console.file.close()
    return text


class LiveDisplay:
    """The live region on a terminal, the job's lines printed above it (module docstring)."""

    FLUSH_S = 0.1

    def __init__(self, out: IO[str], snapshot: Callable[[], Snapshot], *, ranks: bool = False,
                 refresh_s: float = 0.5, keys: bool = True):
        from rich.console import Console

        self.console = Console(file=out, highlight=False, soft_wrap=True)
        self.snapshot, self.ranks, self.refresh_s = snapshot, ranks, refresh_s
        self._pending: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._live: Any = None
        self._thread: Optional[threading.Thread] = None
        self._keys = keys
        self._tty_state: Any = None

    def write(self, stream: str, text: str) -> None:
        """A line of output (with its newline) to print above the region."""
        self._pending.append(text)

    def message(self, text: str) -> None:
        self._pending.append(text if text.endswith("\n") else text + "\n")

    def start(self) -> "LiveDisplay":
        from rich.live import Live

        self._live = Live(console=self.console, auto_refresh=False, transient=False,
                          redirect_stdout=False, redirect_stderr=False, vertical_overflow="crop")
        self._live.start()
        self._cbreak()
        self._thread = threading.Thread(target=self._loop, name="observe-live", daemon=True)
        self._thread.start()
        return self

    def _cbreak(self) -> None:
        if not self._keys:
            return
        try:
            import termios
            import tty

            fd = sys.stdin.fileno()
            if os.isatty(fd):
                self._tty_state = (fd, termios.tcgetattr(fd))
                tty.setcbreak(fd)
        except (OSError, ValueError, ImportError, AttributeError):
            self._tty_state = None

    def _read_keys(self) -> None:
        if self._tty_state is None:
            return
        import select

        fd = self._tty_state[0]
        try:
            while select.select([fd], [], [], 0)[0]:
                data = os.read(fd, 32)
                if not data:
                    break
                if b"r" in data.lower():
                    self.ranks = not self.ranks
        except OSError:
            pass

    def _flush(self) -> None:
        from rich.text import Text

        lines = []
        while self._pending:
            lines.append(self._pending.popleft())
        if lines:
            text = "".join(lines)
            self.console.print(Text(text[:-1] if text.endswith("\n") else text), highlight=False, markup=False,
                               emoji=False, soft_wrap=True)

    def _draw(self) -> None:
        self._live.update(render(self.snapshot(), self.ranks), refresh=True)

    def _loop(self) -> None:
        import time

        next_draw = 0.0
        while not self._stop.wait(self.FLUSH_S):
            try:
                with self._lock:
                    self._read_keys()
                    self._flush()
                    if time.monotonic() >= next_draw:
                        next_draw = time.monotonic() + self.refresh_s
                        self._draw()
            except Exception:  # noqa: BLE001 - a broken terminal must not end the job
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            with self._lock:
                self._flush()
                snap = self.snapshot()
                if any(r.last is not None for r in snap.ranks):
                    self._live.update(render(snap, self.ranks), refresh=True)
                else:  # nothing was ever reported: leave no empty table behind
                    from rich.text import Text

                    self._live.update(Text(""), refresh=True)
                self._live.stop()
        except Exception:  # noqa: BLE001
            pass
        if self._tty_state is not None:
            import termios

            try:
                termios.tcsetattr(self._tty_state[0], termios.TCSADRAIN, self._tty_state[1])
            except (OSError, termios.error):
                pass
            self._tty_state = None


class LinesDisplay:
    """One summary line every ``interval_s`` through ``say`` (off a terminal)."""

    def __init__(self, say: Callable[[str], None], snapshot: Callable[[], Snapshot], interval_s: float):
        self.say, self.snapshot, self.interval_s = say, snapshot, interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_step: Any = object()

    def start(self) -> "LinesDisplay":
        self._thread = threading.Thread(target=self._loop, name="observe-lines", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            snap = self.snapshot()
            if snap.step is None:
                continue  # nothing reported yet: no line
            self.say(summary_line(snap))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


__all__ = ["LinesDisplay", "LiveDisplay", "closing_line", "fmt_duration", "header", "render", "render_text",
           "summary_line"]
