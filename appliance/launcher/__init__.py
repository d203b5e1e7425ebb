"""The launcher plane: hosts and slots -> ranks -> worker processes, and the one spawn helper.

``appliance launch`` (``appliance/cli.py``) and every test, benchmark and example start N ranks
through the same function::

    from appliance.launcher import launch
    result = launch([sys.executable, "-m", "mymodule"], np=3, timeout=60,
                    env={"HOROVOD_FUSION_THRESHOLD": "0"})
    assert result.returncode == 0, result.reason
    print(result.output(rank=0))              # captured stdout of rank 0

``launch(command, np, hosts=None, env=None, timeout=None, output=None, *, echo=False,
capture=True, cwd=None, **flags) -> LaunchResult``: ``flags`` are the launch flags by the Python
names of their rows in ``flagtable.FLAGS`` (``hostfile``, ``forward``, ``start_timeout``,
``verbose``, ``launcher``, ``min_np``...; an unknown name is a ``TypeError``)

- ``command``: argv list (never a shell string). ``np``: number of ranks.
- ``hosts``: ``-H`` syntax (``"localhost:2"``); default ``localhost:np``. ``hostfile``: path.
- ``env``: variables set for every worker on top of the caller's environment; ``forward``:
  mpirun-style ``-x`` items (``"NAME"`` or ``"NAME=VALUE"``). Neither may set a contract
  variable (``appliance.launcher.env.CONTRACT_NAMES``).
- ``timeout``: seconds for the whole job; when it passes every rank is stopped and the result
  has ``timed_out=True`` and ``returncode=124``.
- ``output``: directory for ``rank.N/stdout`` and ``rank.N/stderr`` (``--output-filename``).
- Other hosts (any name that is not this machine) are reached over SSH: ``ssh_port`` (``-p``),
  ``ssh_key`` (``-i``), ``remote_python``, ``network_interface``, ``shared`` (the directory the
  preflight verifies); each defaults to its knob (``APPLIANCE_SSH_PORT``...). A preflight runs
  first; its failures raise ``LaunchError`` listing one line per problem.
- ``launcher``: ``"srun"``, ``"ssh"``, ``"local"`` or ``"auto"`` (default: ``APPLIANCE_LAUNCHER``,
  else auto: one ``srun`` step inside a Slurm allocation when neither ``hosts`` nor ``hostfile``
  is given, see ``srun``).
- ``echo``: also print prefixed lines (``[rank]<stdout>:``) to this process's stdout/stderr;
  ``capture``: keep them in ``result.lines``.
- Elastic jobs (``docs/elastic.md``): ``min_np``, ``max_np``, ``host_discovery_script`` (any of
  them makes the job elastic), ``slots_per_host``, ``elastic_timeout``, ``reset_limit``,
  ``blacklist_cooldown_range=(MIN, MAX)``, with horovodrun's meanings. Output lines and
  ``result.lines`` then carry the worker's number (its rank when the job started, then counting
  up as workers join) instead of the rank.

``LaunchResult(returncode, failed_rank, failed_host, reason, lines, timed_out, interrupted,
job_id, elapsed_s)``; ``lines`` are ``(rank, "stdout"|"stderr", text)`` in arrival order;
``result.output(rank, stream)`` joins them. ``returncode`` is 0 when every rank exited 0, else the
first failing rank's code (128+N when killed by signal N), 124 on timeout, 127 when the command
does not exist. ``failed_rank``/``failed_host`` name the culprit: the first failing rank, or the
rank its fault report names as the origin (a silent or stopped peer). After the first failure
the other ranks get ``APPLIANCE_FAILURE_GRACE`` seconds to exit by themselves (their error
handlers run) before they are stopped. Bad arguments raise ``ConfigError``/``HostsError`` (both
``ValueError``) and an unusable host ``LaunchError`` before anything starts. Called from the main
thread, a SIGINT stops every rank and is then re-raised as ``KeyboardInterrupt``; SIGTERM/SIGHUP
stop every rank and return ``interrupted`` set. Whatever happens, no worker process outlives the
call (each rank runs in its own session; stopping signals its whole process group: TERM, grace
of ``APPLIANCE_STOP_GRACE`` seconds, KILL), nor, by more than 2 s, a launcher killed outright
(``reaper``).

Other entry points (the CLI, the cluster plane) build a ``LaunchConfig`` from the launch flags
with ``flags`` (one parser for everyone) and call ``run(config, ..., on_host_report=None)``;
``on_host_report`` gets each host's preflight report once, before any rank starts.

Modules: ``config`` (``LaunchConfig``, ``CheckConfig``, ``RemoteConfig``), ``flagtable`` (every
launch flag declared once), ``flags`` (the launch flags -> those configs), ``kubernetes`` (what a
launcher pod of the MPI Operator or Kubeflow Trainer is given), ``hosts`` (parsing, the
allocation's hosts, rank layout), ``env`` (the
worker environment contract), ``output`` (where rank output goes, the one line relay),
``workers`` (processes, ``WorkerGroup``), ``reaper`` (local ranks die with a killed launcher;
process-group liveness), ``mechanism`` (one interface over the ways ranks start: the executors
or the srun step), ``executors`` (local and SSH hosts, one machine named twice), ``hostset`` (the
executors' hosts, opened one way), ``setup`` (``JobSetup``, what every job enters), ``ports``
(free ports), ``binding`` (CPU binding), ``signals`` (the signal trap), ``failures`` (first
failure, survivors' grace, blame), ``run`` (orchestration), ``check`` (``appliance check``).
Rooms: ``ssh/`` (connections, host keys, ``appliance keys``, preflight and probe, address
choice, the SSH worker and its remote stub), ``slurm/`` (the srun step and the per-task
wrapper) and ``elastic/`` (discovery, membership, the driver and its rendezvous).
"""
from __future__ import annotations

import os
import signal
from typing import Mapping, Sequence

from typing import TYPE_CHECKING, Any

from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig
from .hosts import Host, HostsError, Slot, assign_ranks, parse_hostfile, parse_hosts

if TYPE_CHECKING:
    from .executors import LaunchError
    from .run import LaunchResult, run

_LAZY = {"LaunchError": "executors", "LaunchResult": "run", "run": "run"}


def __getattr__(name: str) -> Any:
    """``run``, ``LaunchResult`` and ``LaunchError`` are imported on first use, so that a module run
    on every task of a job (``python -m appliance.launcher.slurm.task``) does not load the whole launcher."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "launch", "run", "LaunchResult", "LaunchConfig", "LaunchError", "HostsError", "ConfigError",
    "Host", "Slot", "assign_ranks", "parse_hosts", "parse_hostfile",
]


def launch(command: Sequence[str], np: int, hosts: str | None = None, env: Mapping[str, str] | None = None,
           timeout: float | None = None, output: str | os.PathLike | None = None, *, echo: bool = False,
           capture: bool = True, cwd: str | os.PathLike | None = None, **flags: Any) -> LaunchResult:
    """Start ``np`` ranks of ``command`` and wait for them; see the module docstring. ``flags``:
    the launch flags by their ``api`` keyword in ``flagtable.FLAGS`` (``hostfile``, ``ssh_key``...)."""
    from .flagtable import api_kwargs
    from .run import run
    given = api_kwargs({"hosts": hosts, "output": output, **flags})
    config = LaunchConfig.create(command, np, timeout=timeout, env=env, cwd=cwd, **given)
    result = run(config, echo=echo, capture=capture)
    if result.interrupted == signal.SIGINT:
        raise KeyboardInterrupt(result.reason)
    return result
