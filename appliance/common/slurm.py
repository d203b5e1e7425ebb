"""Slurm's environment, read: the allocation's and a task's layout (pure functions, no I/O).

What it owns: expanding Slurm's compressed forms (``node[01-03,07]`` host lists, ``2(x3),1``
task counts), ``SlurmAllocation`` (the allocation's nodes and the tasks each may run: what the
launcher makes hosts and slots of, ``nodes()``), ``SlurmTask`` (what ``srun`` tells each task:
its ``appliance.common.ranks.Slot``, with the node as host and the cross rank and size in
Horovod's sense, plus the step's nodes and the job and step ids), the rendezvous port a step
derives from its job and step ids, and where a job's secret file lives by default. It sits
below the launcher and the runtime, which both read Slurm: the launcher's hosts and the
runtime's ``init()`` of a task started by ``srun`` directly.

A process is a Slurm *task* when ``SLURM_STEP_ID`` and ``SLURM_PROCID`` are both set; a batch
script (sbatch) has ``SLURM_PROCID`` but no ``SLURM_STEP_ID``, and is not a task.

Env vars read (all set by Slurm): SLURM_PROCID, SLURM_NTASKS / SLURM_STEP_NUM_TASKS,
SLURM_LOCALID, SLURM_NODEID, SLURMD_NODENAME, SLURM_STEP_NODELIST / SLURM_JOB_NODELIST,
SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE, SLURM_JOB_ID,
SLURM_STEP_ID; HOME for the default secret file. Failure modes: malformed or inconsistent values raise ``SlurmEnvError``
(a ``ConfigError``) naming the variable and its value.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping, Sequence

from appliance.common.knobs import ConfigError, read
from appliance.common.ranks import Slot, cross_of

STORE_PORT_BASE = 20000   # a step's rendezvous port is in [BASE, BASE + SPAN): below Linux's ephemeral range
STORE_PORT_SPAN = 10000


class SlurmEnvError(ConfigError):
    """Slurm's environment cannot be read; the message names the variable and its value."""


def expand_nodelist(spec: str, source: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Slurm's compressed host list -> names: ``"n[01-03,07],x"`` -> ``n01 n02 n03 n07 x``.

    Several bracket groups in one name expand as a product (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1
    r2n2); a range keeps the zero padding of its lower bound (``[08-10]`` -> 08 09 10).
    """
    names: list[str] = []
    for item in _split_top(spec, source):
        parts: list[list[str]] = []  # alternatives per piece, concatenated as a product
        rest = item
        while rest:
            open_ = rest.find("[")
            if open_ < 0:
                if "]" in rest:
                    raise SlurmEnvError(f"{source}={spec!r}: unbalanced ']' in {item!r}")
                parts.append([rest])
                break
            close = rest.find("]", open_)
            if close < 0:
                raise SlurmEnvError(f"{source}={spec!r}: missing ']' in {item!r}")
            if open_:
                parts.append([rest[:open_]])
            parts.append(_expand_ranges(rest[open_ + 1:close], f"{source}={spec!r}: {item!r}"))
            rest = rest[close + 1:]
        expanded = [""]
        for alternatives in parts:
            expanded = [head + tail for head in expanded for tail in alternatives]
        names.extend(expanded)
    if not names:
        raise SlurmEnvError(f"{source}={spec!r}: no hosts")
    return names


def _split_top(spec: str, source: str) -> list[str]:
    items, depth, current = [], 0, ""
    for ch in spec.strip():
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmEnvError(f"{source}={spec!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmEnvError(f"{source}={spec!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise SlurmEnvError(f"{source}={spec!r}: missing ']'")
    items.append(current)
    if any(not i.strip() for i in items):
        raise SlurmEnvError(f"{source}={spec!r}: empty entry")
    return [i.strip() for i in items]


def _expand_ranges(body: str, where: str) -> list[str]:
    out = []
    for r in body.split(","):
        lo, dash, hi = r.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise SlurmEnvError(f"{where}: {r!r} is not a number or a range N-M")
        if not dash:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise SlurmEnvError(f"{where}: range {r!r} runs backwards")
        if int(hi) - int(lo) > 100000:
            raise SlurmEnvError(f"{where}: range {r!r} is too large")
        out.extend(f"{n:0{len(lo)}d}" for n in range(int(lo), int(hi) + 1))
    return out


def expand_tasks_per_node(spec: str, source: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]`` (Slurm's run-length form)."""
    counts: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise SlurmEnvError(f"{source}={spec!r}: {item.strip()!r} is not N or N(xK)")
        n, times = int(m.group(1)), int(m.group(2) or 1)
        if n < 1 or times < 1:
            raise SlurmEnvError(f"{source}={spec!r}: {item.strip()!r} has a zero count")
        counts.extend([n] * times)
    return counts


def tasks_per_node(spec: str, source: str, nodes: Sequence[str], nodes_source: str) -> list[int]:
    """The task count of each of ``nodes`` from ``spec`` (Slurm's run-length form, in ``source``);
    one count alone holds for every node."""
    counts = expand_tasks_per_node(spec, source)
    if len(counts) == 1:
        counts = counts * len(nodes)
    if len(counts) != len(nodes):
        raise SlurmEnvError(f"{source}={spec!r} gives {len(counts)} counts for {len(nodes)} nodes in {nodes_source}")
    return counts


@dataclasses.dataclass(frozen=True)
class SlurmTask(Slot):
    """One task of a Slurm step, as ``srun`` describes it (see ``from_env``): its ``Slot``, whose
    ``host`` is this task's node (SLURMD_NODENAME), and the step around it."""

    node_index: int         # SLURM_NODEID: index of ``host`` in ``nodes``
    nodes: tuple[str, ...]  # the step's nodes, in Slurm's order (the first one hosts rank 0)
    job_id: int
    step_id: int
    secret_file: str = ""   # the job's default secret file (``default_secret_file``)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "SlurmTask | None":
        """The task this process is, or None when it is not a Slurm task (no SLURM_STEP_ID)."""
        env = os.environ if env is None else env
        if not env.get("SLURM_STEP_ID") or not env.get("SLURM_PROCID"):
            return None
        rank = _int(env, "SLURM_PROCID")
        size = _int(env, "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS")
        local_rank, node_index = _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID")
        nodes_var = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
        nodes = expand_nodelist(_str(env, nodes_var), nodes_var)
        tpn_var = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
        counts = tasks_per_node(_str(env, tpn_var), tpn_var, nodes, f"{nodes_var}={env[nodes_var]!r}")
        if not 0 <= rank < size or sum(counts) != size:
            raise SlurmEnvError(f"SLURM_PROCID={rank} with {size} tasks and {tpn_var}={env[tpn_var]!r}: "
                                "the counts do not add up")
        if not 0 <= node_index < len(nodes) or not 0 <= local_rank < counts[node_index]:
            raise SlurmEnvError(f"SLURM_NODEID={node_index}, SLURM_LOCALID={local_rank}: not a task of "
                                f"{nodes_var}={env[nodes_var]!r} with {tpn_var}={env[tpn_var]!r}")
        cross_rank, cross_size = cross_of(counts, node_index, local_rank)
        return cls(rank=rank, size=size, local_rank=local_rank, local_size=counts[node_index],
                   cross_rank=cross_rank, cross_size=cross_size,
                   host=env.get("SLURMD_NODENAME") or nodes[node_index], node_index=node_index,
                   nodes=tuple(nodes), job_id=_int(env, "SLURM_JOB_ID"), step_id=_int(env, "SLURM_STEP_ID"),
                   secret_file=default_secret_file(_int(env, "SLURM_JOB_ID"), env))

    @property
    def node(self) -> str:
        """This task's node (``host``)."""
        return self.host

    @property
    def first_node(self) -> str:
        return self.nodes[0]

    @property
    def store_port(self) -> int:
        return store_port(self.job_id, self.step_id)


def store_port(job_id: int, step_id: int) -> int:
    """The rendezvous port of a step: the same on every task, different for the job's next steps
    and for neighbouring jobs (a pair of concurrent steps meets again only every 10000 ids)."""
    return STORE_PORT_BASE + (job_id * 7 + step_id) % STORE_PORT_SPAN


def default_secret_file(job_id: int, env: Mapping[str, str] | None = None) -> str:
    """Where a job's secret lives unless APPLIANCE_JOB_SECRET is set: under the (shared) home."""
    env = os.environ if env is None else env
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".appliance", "slurm", f"job-{job_id}.secret")


def _str(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value.strip():
        raise SlurmEnvError(f"{name} is not set, though SLURM_STEP_ID is: not a complete Slurm task environment")
    return value


def _int(env: Mapping[str, str], name: str) -> int:
    value = _str(env, name)
    try:
        n = int(value)
    except ValueError:
        raise SlurmEnvError(f"{name}={value!r} is not a whole number") from None
    if n < 0:
        raise SlurmEnvError(f"{name}={value!r} is negative")
    return n


@dataclasses.dataclass(frozen=True)
class SlurmAllocation:
    """Slurm's description of the allocation (all ``None`` outside Slurm)."""

    nodelist: str | None = None
    tasks_per_node: str | None = None
    ntasks_per_node: str | None = None
    job_id: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "SlurmAllocation":
        return cls(read("SLURM_JOB_NODELIST", env) or None, read("SLURM_TASKS_PER_NODE", env) or None,
                   read("SLURM_NTASKS_PER_NODE", env) or None, read("SLURM_JOB_ID", env) or None)

    def nodes(self) -> list[tuple[str, int]]:
        """``(node, tasks)`` of every node in SLURM_JOB_NODELIST; the tasks from SLURM_TASKS_PER_NODE,
        else SLURM_NTASKS_PER_NODE (the same for every node), else 1."""
        nodelist = self.nodelist or ""
        names = expand_nodelist(nodelist, "SLURM_JOB_NODELIST")
        if self.tasks_per_node:
            counts = tasks_per_node(self.tasks_per_node, "SLURM_TASKS_PER_NODE", names,
                                    f"SLURM_JOB_NODELIST={nodelist!r}")
        elif self.ntasks_per_node:
            counts = expand_tasks_per_node(self.ntasks_per_node, "SLURM_NTASKS_PER_NODE")[:1] * len(names)
        else:
            counts = [1] * len(names)
        return list(zip(names, counts))
