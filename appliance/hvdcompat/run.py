"""``horovod.run``: run a Python function on N ranks through ``appliance.launcher.launch``.

``run(func, args=(), kwargs=None, num_proc=1, hosts=None, hostfile=None, ...)`` pickles
``(func, args, kwargs)`` (with cloudpickle when it is installed, else pickle, so ``func`` must then
be importable by the workers: a module-level function of a module on their path), starts
``num_proc`` ranks of ``python -m appliance.hvdcompat.runfn`` (the payload travels on the command
line, so it reaches other hosts over SSH too; at most ``MAX_PAYLOAD`` bytes) and returns the list of
``func``'s return values ordered by rank. ``func`` calls ``hvd.init()`` itself, as under Horovod.

Horovod's arguments map onto the launch flags by the ``horovod`` names of their rows in
``appliance.launcher.flagtable.FLAGS``: ``hosts``/``hostfile``, ``start_timeout``,
``ssh_port``, ``ssh_identity_file`` (-> ``-i``), ``output_filename`` (-> ``--output-filename``),
``verbose``, ``network_interface(s)`` (one interface), ``executable`` (the workers' Python),
``np`` (deprecated alias of ``num_proc``); ``use_gloo`` and ``disable_cache`` are accepted (this
runtime is the only controller; there is no cache). The elastic arguments (``min_num_proc``/
``min_np``, ``max_num_proc``/``max_np``, ``slots``, ``reset_limit``, ``cooldown_range``,
``host_discovery_script``, ``elastic_timeout``) make an elastic job, as horovodrun's flags do:
``func`` then runs under the driver (use ``hvd.elastic.run`` inside it), and the results are those
of the workers that finished, ordered by their final rank. ``use_mpi``/``mpi_args`` raise
``NotImplementedError`` naming the argument.
Failure modes: a rank that fails makes ``run`` raise ``RuntimeError`` naming the rank, host and
reason (the launcher's); launcher argument errors are its ``ValueError``/``LaunchError``.
Environment: none read here beyond what ``launch`` reads; workers inherit the caller's.
"""
from __future__ import annotations

import base64
import pickle
import signal
import sys

MARKER = "@@appliance-horovod-run-result@@"
MAX_PAYLOAD = 96 * 1024  # Linux limits one argv string to 128 KiB

_UNSUPPORTED = ("use_mpi", "mpi_args")


def dumps(obj) -> str:
    """``obj`` pickled (cloudpickle when available) and base64-encoded, for a command line."""
    try:
        import cloudpickle as pickler
    except ImportError:
        pickler = pickle
    return base64.b64encode(pickler.dumps(obj)).decode("ascii")


def loads(text: str):
    return pickle.loads(base64.b64decode(text))


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None, slots=None,
        reset_limit=None, cooldown_range=None, hosts=None, hostfile=None, host_discovery_script=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None, output_filename=None,
        verbose=None, use_gloo=None, use_mpi=None, mpi_args=None, network_interface=None,
        network_interfaces=None, executable=None, np=None, min_np=None, max_np=None,
        elastic_timeout=None) -> list:
    """Run ``func(*args, **kwargs)`` on every rank; return the results ordered by rank."""
    given = dict(use_mpi=use_mpi or None, mpi_args=mpi_args)
    for name in _UNSUPPORTED:
        if given[name] is not None:
            raise NotImplementedError(f"horovod.run({name}=...): mpirun is not used by this launcher")
    if np is not None:
        num_proc = np
    iface = network_interface
    if network_interfaces:
        names = [network_interfaces] if isinstance(network_interfaces, str) else list(network_interfaces)
        if len(names) > 1:
            raise ValueError(f"horovod.run(network_interfaces={names!r}): this launcher uses one interface")
        iface = names[0]
    payload = dumps((func, tuple(args), dict(kwargs or {})))
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"horovod.run: the pickled function and arguments take {len(payload)} bytes; at most "
                         f"{MAX_PAYLOAD} fit on a command line (pass large data through files)")
    from appliance.launcher import LaunchConfig
    from appliance.launcher.flagtable import api_kwargs
    from appliance.launcher.run import run as run_job
    # Horovod's keywords -> the launch flags (flagtable.FLAGS' ``horovod`` names); the first name wins
    given = api_kwargs(dict(min_num_proc=min_num_proc, min_np=min_np, max_num_proc=max_num_proc, max_np=max_np,
                            slots=slots, reset_limit=reset_limit, cooldown_range=cooldown_range, hosts=hosts,
                            hostfile=hostfile, host_discovery_script=host_discovery_script,
                            start_timeout=start_timeout, ssh_port=ssh_port, ssh_identity_file=ssh_identity_file,
                            output_filename=output_filename, verbose=verbose, network_interface=iface,
                            executable=executable, elastic_timeout=elastic_timeout), horovod=True)
    python = executable or sys.executable
    config = LaunchConfig.create([python, "-m", "appliance.hvdcompat.runfn", payload], int(num_proc), **given)
    result = run_job(config, echo=bool(verbose), capture=True)
    if result.interrupted == signal.SIGINT:
        raise KeyboardInterrupt(result.reason)
    if result.returncode != 0:
        raise RuntimeError(f"horovod.run: rank {result.failed_rank} on {result.failed_host} failed "
                           f"(exit {result.returncode}): {result.reason}")
    found: dict[int, object] = {}
    for _, stream, text in result.lines:
        if stream == "stdout" and text.startswith(MARKER):
            rank, _, value = text[len(MARKER):].strip().partition(" ")
            found[int(rank)] = loads(value)
    elastic = config.elastic is not None
    size = (max(found) + 1 if found else 0) if elastic else int(num_proc)
    missing = [r for r in range(size) if r not in found]
    if missing or not found:
        raise RuntimeError(f"horovod.run: rank {missing[0] if missing else 0} exited 0 without returning a result")
    return [found[r] for r in range(size)]


__all__ = ["run"]
