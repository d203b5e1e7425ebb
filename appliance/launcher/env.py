"""The worker environment contract: what every rank finds in its environment.

What it owns: ``JobPlan`` (the per-job facts the launcher decides once: job id, secret, the
rendezvous store's address, torch.distributed's master address and port, the address each host's
ranks listen on) and ``worker_env()``, the pure function that turns a rank's ``Slot`` and the plan
into its environment. The runtime reads these names through ``appliance/common/knobs.py``; they are a
contract, so renaming one breaks the runtime.

Per rank: HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK,
HOROVOD_CROSS_SIZE, HOROVOD_HOSTNAME (the name given in -H), RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, APPLIANCE_DATA_ADDR, APPLIANCE_FAULT_FILE (where the rank's runtime writes its
fault report, once, when it fails the job: ``FAULT_DIR/rank.N.json`` in a launcher-private
directory; on another host the remote stub replaces it with a path of its own). Per job: MASTER_ADDR, MASTER_PORT, APPLIANCE_STORE_ADDR
(host:port, rank 0 listens there), APPLIANCE_JOB_SECRET (hex; only ever in an environment, never
on a command line or in a log), APPLIANCE_JOB_ID, HOROVOD_START_TIMEOUT, PYTHONUNBUFFERED=1 and,
with --verbose, APPLIANCE_VERBOSE=1. Layering: base environment (from the executor), then the
explicit variables (-x, API ``env``), then the contract, which always wins. In the base, however
the rank starts (locally, over SSH, as a Slurm task), HOROVOD_GLOO_IFACE and NCCL_SOCKET_IFNAME
default to the interface of the host's chosen address (``network_defaults``).

Failure modes: an explicit variable that would override a contract name raises ``ConfigError``.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
from typing import Mapping

from appliance.common.knobs import ConfigError
from appliance.common.ranks import Slot

# Defaulted to the interface of the host's chosen address, unless the base or -x sets them.
NETWORK_VARS = ("HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME")
# Names the launcher sets for each worker; -x/env may not override them.
CONTRACT_NAMES = (
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "APPLIANCE_STORE_ADDR", "APPLIANCE_JOB_SECRET", "APPLIANCE_JOB_ID", "APPLIANCE_DATA_ADDR",
    "APPLIANCE_FAULT_FILE",
)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    job_id: str
    secret: str = dataclasses.field(repr=False)
    store_addr: str            # host:port of the rendezvous store (rank 0 listens)
    master_addr: str           # torch.distributed's MASTER_ADDR
    master_port: int           # a different free port than the store's
    data_addrs: Mapping[str, str]  # host name from -H -> address its ranks listen on
    start_timeout_s: float
    verbose: bool = False
    fault_dir: str = ""        # launcher-private directory of the ranks' fault reports ("" : none)


def new_job_id() -> str:
    return secrets.token_hex(4)


def new_secret() -> str:
    return secrets.token_hex(16)


def network_defaults(env: dict[str, str], iface: str) -> dict[str, str]:
    """``env`` with each of ``NETWORK_VARS`` set to ``iface`` where it is not set (nothing without ``iface``)."""
    if iface:
        for name in NETWORK_VARS:
            env.setdefault(name, iface)
    return env


def check_explicit(env: Mapping[str, str]) -> None:
    """Refuse explicit variables (-x, API env) that the launcher sets per rank or per job."""
    clash = sorted(set(env) & set(CONTRACT_NAMES))
    if clash:
        raise ConfigError(f"-x/env {clash[0]}: the launcher sets {clash[0]} for every worker; it cannot be overridden")


def worker_env(slot: Slot, plan: JobPlan, base: Mapping[str, str], explicit: Mapping[str, str]) -> dict[str, str]:
    """The complete environment of rank ``slot.rank``."""
    env = dict(base)
    env.update(explicit)
    env.update({
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_HOSTNAME": slot.host,
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(slot.size),
        "LOCAL_RANK": str(slot.local_rank),
        "LOCAL_WORLD_SIZE": str(slot.local_size),
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.master_port),
        "APPLIANCE_STORE_ADDR": plan.store_addr,
        "APPLIANCE_JOB_SECRET": plan.secret,
        "APPLIANCE_JOB_ID": plan.job_id,
        "APPLIANCE_DATA_ADDR": plan.data_addrs[slot.host],
        "HOROVOD_START_TIMEOUT": repr(float(plan.start_timeout_s)),
        "PYTHONUNBUFFERED": "1",
    })
    env["APPLIANCE_FAULT_FILE"] = fault_file(plan.fault_dir, slot.rank) if plan.fault_dir else ""
    if plan.verbose:
        env["APPLIANCE_VERBOSE"] = "1"
    return env


def fault_file(fault_dir: str, rank: int) -> str:
    """Where rank ``rank`` reports its fault (the contract's ``APPLIANCE_FAULT_FILE``)."""
    return os.path.join(fault_dir, f"rank.{rank}.json")
