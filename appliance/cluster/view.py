"""What ``appliance primary`` shows on the user's side: the start-up of the hosts, then the job.

What it owns: ``StartupView``, which reads the job directory on the shared mount (the job runner's
``hosts/<host>.json``, each rank's ``ranks/<rank>.json``) and shows it while the cluster starts,
instead of silence. On a terminal (stdout and stderr both TTYs) it is a live ``rich`` table and
the job's output scrolls above it; otherwise it prints one ``appliance primary:`` line on stderr
per change (host reachable, authenticated, its ranks started). It ends when every rank has
started, or when the caller closes it (the job ended first). ``JobView`` follows: on a terminal,
the launcher's live table of the running job (``launcher.observe``: a row per host, its step,
speed, communication share, lateness, the straggler, the last events; key ``r`` for a row per
rank), drawn here from the job's record on the share (``observe.follow``), since the launcher runs
in the primary container without a terminal; the job's output scrolls above it. Env vars: none
(``primary.py`` decides whether the job view is drawn). Failure modes: none raised; unreadable or
half-written files are simply read again at the next poll.
"""
from __future__ import annotations

import os
import sys
import time
from typing import IO, Optional, Sequence

from ..launcher.hosts import Host, assign_ranks
from ..mount import read_json
from .say import say


class _Lines:
    """Job output cut into whole lines, per stream: a line's start is kept until its end comes."""

    def __init__(self):
        self._partial = {"stdout": "", "stderr": ""}

    def feed(self, stream: str, data: bytes) -> str:
        """The whole lines ``data`` completes (with their newlines; "" when none)."""
        text = self._partial[stream] + data.decode("utf-8", errors="replace")
        cut = text.rfind("\n") + 1
        self._partial[stream] = text[cut:]
        return text[:cut]

    def rest(self) -> list[tuple[str, str]]:
        """The unfinished lines, (stream, text), emptied."""
        left = [(stream, text) for stream, text in self._partial.items() if text]
        self._partial = {"stdout": "", "stderr": ""}
        return left


def _mark(value: Optional[bool]) -> str:
    return "[yellow]...[/yellow]" if value is None else "[green]yes[/green]" if value else "[red]no[/red]"


class StartupView:
    def __init__(self, job_dir: str, hosts: Sequence[tuple[str, int]], np: int, *, live: Optional[bool] = None,
                 out: IO[str] | None = None, err: IO[str] | None = None):
        self.job_dir, self.np = job_dir, np
        self.out, self.err = out or sys.stdout, err or sys.stderr
        # Ranks per host as the launcher lays them out.
        self.expected: dict[str, int] = {}
        for slot in assign_ranks([Host(name, slots) for name, slots in hosts], np):
            self.expected[slot.host] = self.expected.get(slot.host, 0) + 1
        self.hosts: dict[str, dict] = {name: {} for name in self.expected}
        self.ranks: dict[int, dict] = {}
        self.started = time.monotonic()
        self.done = False
        self._said: set[str] = set()
        if live is None:
            live = self.out.isatty() and self.err.isatty()
        self._live = None
        self._out_lines = _Lines()
        if live:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.err, highlight=False)
            self._live = Live(self._table(), console=self._console, refresh_per_second=8, transient=False,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()

    # --- state ---------------------------------------------------------------------------------
    def _ranks_on(self, host: str) -> int:
        return sum(1 for r in self.ranks.values() if r.get("host") == host)

    def poll(self) -> bool:
        """Re-read the job directory; True once every rank has started."""
        if self.done:
            return True
        for name in self.hosts:
            facts = read_json(os.path.join(self.job_dir, "hosts", f"{name}.json"))
            if facts:
                self.hosts[name] = facts
        ranks_dir = os.path.join(self.job_dir, "ranks")
        try:
            names = os.listdir(ranks_dir)
        except FileNotFoundError:
            names = []
        for fname in names:
            if fname.endswith(".json") and fname[:-5].isdigit() and int(fname[:-5]) not in self.ranks:
                rec = read_json(os.path.join(ranks_dir, fname))
                if rec:
                    self.ranks[int(fname[:-5])] = rec
        if self._live is not None:
            self._live.update(self._table())
        else:
            self._lines()
        if len(self.ranks) >= self.np:
            self.close(complete=True)
        return self.done

    def _lines(self) -> None:
        for name, f in self.hosts.items():
            if f.get("local"):
                continue
            if f.get("reachable") and f"{name}:r" not in self._said:
                self._say(f"{name}: reachable ({f.get('address', '')})", f"{name}:r")
            if f.get("authenticated") and f"{name}:a" not in self._said:
                self._say(f"{name}: authenticated", f"{name}:a")
        for name, want in self.expected.items():
            if self._ranks_on(name) >= want and f"{name}:s" not in self._said:
                self._say(f"{name}: {want} rank{'s' if want != 1 else ''} started", f"{name}:s")

    def _say(self, text: str, key: str) -> None:
        self._said.add(key)
        say(text, self.err)

    def _table(self):
        from rich.table import Table

        t = Table(title=f"starting {self.np} ranks on {len(self.expected)} hosts "
                        f"({time.monotonic() - self.started:.1f} s)", title_justify="left")
        for col in ("host", "reachable", "authenticated", "ranks started"):
            t.add_column(col)
        for name, want in self.expected.items():
            f = self.hosts.get(name, {})
            local = f.get("local")
            n = self._ranks_on(name)
            color = "green" if n >= want else "yellow"
            t.add_row(name + (" (primary)" if local else ""), "local" if local else _mark(f.get("reachable")),
                      "local" if local else _mark(f.get("authenticated")), f"[{color}]{n}/{want}[/{color}]")
        return t

    # --- output while the view is up ------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._live is not None

    def write(self, stream: str, data: bytes) -> None:
        """Job output while the live table is up: printed above it, line by line."""
        for line in self._out_lines.feed(stream, data).splitlines():
            self._console.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self, complete: bool = False) -> None:
        if self.done:
            return
        self.done = True
        if self._live is not None:
            for _, rest in self._out_lines.rest():  # above the table, as the whole lines were
                self._console.print(rest, markup=False, highlight=False, soft_wrap=True)
            self._live.update(self._table())
            self._live.stop()
            self._live = None
        if complete:
            say(f"all {self.np} ranks started after {time.monotonic() - self.started:.1f} s", self.err)


class JobView:
    """The running job's live table on this terminal, from its record (module docstring)."""

    done = True

    def __init__(self, job_dir: str, job_id: str, out: IO[str], *, ranks: bool = False):
        from ..launcher.observe.follow import RecordFollower
        from ..launcher.observe.view import LiveDisplay

        self.follower = RecordFollower(job_dir, job_id)
        self._display = LiveDisplay(out, self.follower.snapshot, ranks=ranks).start()
        self._out_lines = _Lines()

    def poll(self) -> bool:
        return True

    @property
    def active(self) -> bool:
        """Drawing: output goes through ``write`` (after ``close``, straight to the terminal)."""
        return self._display is not None

    def write(self, stream: str, data: bytes) -> None:
        """Job output: whole lines printed above the table, a line's start kept until its end."""
        lines = self._out_lines.feed(stream, data)
        if lines:
            self._display.write(stream, lines)

    def close(self, complete: bool = False) -> None:
        if self._display is None:
            return
        for stream, rest in self._out_lines.rest():
            self._display.write(stream, rest + "\n")
        self._display.stop()
        self._display = None
