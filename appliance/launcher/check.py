"""``appliance check``: run the preflight on every host and show it as a table.

What it owns: turning a ``CheckConfig`` into hosts (``-H``, hostfile, Slurm, like ``launch``),
running ``ssh.preflight.run_preflight`` (all hosts in parallel, within ``--start-timeout``) and
printing one row per host (``rich`` table: TCP, SSH, Python, appliance, shared directory,
/dev/shm, hostname, chosen address) followed by one line per failure, each saying what to run or
fix. Returns 0 when every check passed, 1 otherwise. The same checks run before every launch
that has remote hosts.

Env vars: those of ``CheckConfig``/``RemoteConfig``. Failure modes: bad host lists raise
``HostsError``; host problems are lines in the output, never exceptions.
"""
from __future__ import annotations

import sys
import time
from typing import IO

from appliance.launcher.config import CheckConfig
from .executors import is_local, merge_same_machines
from .hosts import assign_ranks, hosts_from
from .ssh.preflight import Preflight, run_preflight

COLUMNS = (("tcp", "TCP"), ("ssh", "SSH"), ("python", "Python"), ("appliance", "appliance"),
           ("shared", "shared"), ("shm", "/dev/shm free"), ("hostname", "hostname"), ("network", "address (interface)"))


def _table(pf: Preflight, hosts: list[str], port: str, out: IO[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=None, show_lines=False)
    table.add_column("host")
    for _, title in COLUMNS:
        table.add_column(title)
    table.add_column("result")
    for h in hosts:
        r = pf.reports[h]
        where = "local" if r.local else f"{h}:{r.target.port if r.target else port}"
        if r.target is not None and r.target.via:
            where += f" via {r.target.via}"  # ProxyJump / ProxyCommand of ~/.ssh/config
        cells = [r.steps.get(key, "-") for key, _ in COLUMNS]
        table.add_row(where, *cells, "[red]FAIL[/red]" if r.failures else "[green]ok[/green]")
    console = Console(file=out, highlight=False)
    if not console.is_terminal:
        console = Console(file=out, highlight=False, width=200)  # logs and pipes: no truncated cells
    console.print(table)


def check(config: CheckConfig, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    hosts, merges = merge_same_machines(hosts_from(config.hosts, config.hostfile, config.slurm, config.np,
                                                   config.default_slots))
    for line in merges:
        print(f"appliance check: {line}", file=err)
    if config.np is not None:
        assign_ranks(hosts, config.np)  # -np above the slots is a HostsError, as for launch
    names = [h.name for h in hosts]
    local = {h for h in names if is_local(h)}
    start = time.monotonic()
    with run_preflight(names, local, config.remote, config.start_timeout_s) as pf:
        _table(pf, names, str(config.remote.port or 22), out)
        for line in pf.warnings + pf.notes:
            print(f"appliance check: {line}", file=err)
        for line in pf.failures:
            print(f"appliance check: {line}", file=err)
        failed = sum(1 for r in pf.reports.values() if r.failures)
        elapsed = time.monotonic() - start
        if failed:
            print(f"appliance check: {failed} of {len(names)} host{'s' if len(names) != 1 else ''} failed "
                  f"({elapsed:.1f} s)", file=err)
            return 1
        print(f"appliance check: all {len(names)} host{'s' if len(names) != 1 else ''} ready ({elapsed:.1f} s)",
              file=err)
        return 0
