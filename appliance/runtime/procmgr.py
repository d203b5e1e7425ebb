"""The job's bootstrap under a process manager that is not ours: OpenMPI's ``mpirun`` (PMIx) and
MPICH's or Intel MPI's hydra (PMI-1). Ranks started that way learn from it only what the
rendezvous needs: rank 0's store address and the job's secret; links are ours as always.

What it owns: ``started_by(env)`` (which process manager: the origin table of
``appliance.runtime.config``), and ``bootstrap(env, rank, size)``: rank 0 picks the store's
address (``store_address``) and port and a fresh secret, publishes them through the process manager, every rank reads them back
(``appliance.common.pmix`` / ``appliance.common.pmi1`` carry them). The address: the interface
HOROVOD_GLOO_IFACE names, else the first that OpenMPI's ``btl_tcp_if_include`` admits, else
the first ``btl_tcp_if_exclude`` leaves (``-mca btl_tcp_if_include X`` reaches the ranks as
OMPI_MCA_btl_tcp_if_include), else 127.0.0.1 when every rank is on rank 0's host, else the
default route's address. Each rank listens on its own address on the interface so chosen.

The secret travels as any of the job's PMI data does (mpirun's daemons hold it and hand it to
the job's ranks only); it is never put in a rank's environment. APPLIANCE_JOB_SECRET passed with
``-x`` is used instead, and then nothing secret is published.

The exchange is bounded by HOROVOD_START_TIMEOUT: under mpirun the error names the ranks whose
arrival PMIx never saw; under hydra (PMI-1 cannot tell) it says how many others were awaited,
and the rank, having printed its line, asks hydra to end the job (PMI-1 abort), as it does when
another process claims its rank. A rank that fails before the exchange exits: mpirun ends the
job then; hydra does not, so its peers end at that bound.

Env vars read: the origin's ranks per host (OMPI_COMM_WORLD_LOCAL_SIZE, hydra: MPI_LOCALNRANKS),
OMPI_MCA_btl_tcp_if_include / _exclude, HOROVOD_GLOO_IFACE, HOROVOD_START_TIMEOUT,
APPLIANCE_JOB_SECRET, PMIX_NAMESPACE / PMIX_RANK / PMIX_SERVER_URI* and PMI_FD / PMI_PORT.
Failure modes: ``ConfigError`` with one line naming what is missing (no PMIx server or library,
no interface the lists admit), what failed, the ranks that did not arrive in time, or the two
processes that claim one rank.
"""
from __future__ import annotations

import dataclasses
import secrets
import socket
import sys
from typing import Mapping

from appliance.common import netif, pmi1, pmix
from appliance.common.knobs import ConfigError, read
from appliance.runtime.config import origin
from appliance.runtime.errors import HorovodInternalError

STORE_KEY = "appliance.store"
SECRET_KEY = "appliance.secret"
HOST_KEY = "appliance.host"
WHY_KEY = "appliance.store.why"
INCLUDE, EXCLUDE = "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_btl_tcp_if_exclude"


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    store_addr: str      # host:port of rank 0's store
    secret_hex: str      # the job's secret, hex
    data_addr: str       # this rank's listening address; "" = the interface that routes to the store
    note: str            # where the store's address came from, for messages


def started_by(env: Mapping[str, str]) -> str:
    """"mpirun", "hydra" or "": the process manager that started this process (``ORIGINS``)."""
    return origin(env).manager


def store_address(env: Mapping[str, str], size: int) -> tuple[str, str, str]:
    """``(address, interface, why)`` rank 0's store listens on (see the module text)."""
    iface = read("HOROVOD_GLOO_IFACE", env)
    if iface:
        return netif.interface_address(iface), iface, "HOROVOD_GLOO_IFACE"
    if env.get(INCLUDE) or env.get(EXCLUDE):
        var = INCLUDE if env.get(INCLUDE) else EXCLUDE
        name, addr = netif.select(env.get(INCLUDE, ""), env.get(EXCLUDE, ""), var)
        return addr, name, var.replace("OMPI_MCA_", "")
    local = env.get(origin(env).local_size_var or "-", "").strip()
    if local.isdigit() and int(local) == size:
        return "127.0.0.1", "lo", "every rank on this host"
    addr = netif.route_address()
    if addr:
        return addr, next((n for n, a in netif.interfaces() if a == addr), "?"), "the default route"
    name, addr = netif.select(source="a non-loopback interface")
    return addr, name, "the first interface"


def own_address(env: Mapping[str, str]) -> str:
    """This rank's listening address when the user chose the interface (the lists); "" otherwise
    (HOROVOD_GLOO_IFACE the runtime's config reads itself). A rank where the lists admit nothing
    listens where the route to the store leads."""
    if read("HOROVOD_GLOO_IFACE", env) or not (env.get(INCLUDE) or env.get(EXCLUDE)):
        return ""
    try:
        return netif.select(env.get(INCLUDE, ""), env.get(EXCLUDE, ""), INCLUDE)[1]
    except ConfigError:
        return ""


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


_cache: dict = {}  # a re-init in the same process meets the same store and secret


def bootstrap(env: Mapping[str, str], rank: int, size: int) -> Bootstrap:
    src = origin(env)
    key = (src.name, rank, size)
    if key in _cache:
        return _cache[key]
    given = read("APPLIANCE_JOB_SECRET", env) or ""
    keys = [STORE_KEY, HOST_KEY, WHY_KEY] + ([] if given else [SECRET_KEY])
    publish: dict = {}
    if rank == 0:
        addr, iface, why = store_address(env, size)
        publish = {STORE_KEY: f"{addr}:{_free_port(addr)}", HOST_KEY: socket.gethostname(),
                   WHY_KEY: f"interface {iface}, from {why}", SECRET_KEY: secrets.token_hex(16)}
        publish = {k: v for k, v in publish.items() if k in keys}
    timeout = read("HOROVOD_START_TIMEOUT", env)
    if src.manager == "mpirun":
        _pmix_present(env, src)

        def check(pmix_rank: int, pmix_size: int) -> None:
            if pmix_rank != rank:
                raise ConfigError(
                    f"{src.rank_var}={rank} but PMIx knows this process as rank {pmix_rank} (PMIX_RANK="
                    f"{env.get('PMIX_RANK')}): two processes of the job claim rank {min(rank, pmix_rank)}")
            if pmix_size and pmix_size != size:
                raise ConfigError(f"{src.size_var}={size} but mpirun's job has {pmix_size} ranks (PMIx)")
        try:
            got = pmix.exchange(publish, keys, timeout=timeout, check=check)
        except pmix.PmixTimeout as e:
            raise ConfigError(_late(size, timeout, e.missing, "mpirun's PMIx fence")) from None
    elif src.manager == "hydra":
        def line(e: pmi1.Pmi1Error) -> str:
            if isinstance(e, pmi1.Pmi1Timeout):
                return _late(size, timeout, None, "hydra's PMI-1 barrier")
            return str(e)

        def say(e: pmi1.Pmi1Error) -> None:  # before hydra ends the job (this process too)
            sys.stderr.write(f"appliance: rank {rank} of {size} under {src.label}: {line(e)}; ending the job\n")
            sys.stderr.flush()
        try:
            got = pmi1.exchange(env, publish, keys, timeout=timeout, rank=rank, on_fail=say)
        except pmi1.Pmi1Error as e:
            raise ConfigError(line(e)) from None
    else:
        raise ConfigError("no process manager to bootstrap from")
    out = Bootstrap(store_addr=got[STORE_KEY], secret_hex=given or got[SECRET_KEY], data_addr=own_address(env),
                    note=f"rank 0 on {got[HOST_KEY]} chose {got[STORE_KEY]} ({got[WHY_KEY]})")
    _cache[key] = out
    return out


def _pmix_present(env: Mapping[str, str], src) -> None:
    """ConfigError saying what is missing when no PMIx server left its variables here."""
    missing = pmix.missing_vars(env)
    if not missing:
        return
    if len(missing) == 3:
        raise ConfigError(
            f"started by an mpirun ({src.size_var}={env.get(src.size_var)}) without a PMIx server "
            "(no PMIX_NAMESPACE / PMIX_SERVER_URI*): use OpenMPI 4 or later, or pass "
            "-x APPLIANCE_STORE_ADDR=<rank 0 host>:<port> -x APPLIANCE_JOB_SECRET")
    have = [v for v in ("PMIX_NAMESPACE", "PMIX_RANK", "PMIX_SERVER_URI*") if v not in missing]
    raise ConfigError(
        f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set though mpirun's PMIx server set "
        f"{', '.join(have)}: something between mpirun and this process (a wrapper script, env -u) removed "
        f"{'it' if len(missing) == 1 else 'them'}; keep every PMIX_* variable mpirun sets")


def _late(size: int, limit: float, missing: list | None, where: str) -> str:
    """The line of a rank whose exchange did not complete within HOROVOD_START_TIMEOUT."""
    text = f"{where} did not complete within HOROVOD_START_TIMEOUT={limit:g} s"
    hint = "a rank that failed, stopped or never called hvd.init(); see its own output above"
    if missing:
        return f"{text}: rank(s) {_ranks(missing)} never arrived ({size - len(missing)} of {size} did): {hint}"
    if missing is None:
        return f"{text}: some of the other {size - 1} rank(s) did not arrive (PMI-1 does not say which): {hint}"
    return f"{text}, though every rank arrived"


def _ranks(ranks: list) -> str:
    shown = ", ".join(map(str, ranks[:16]))
    return shown + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


def join_error(e: Exception, cfg) -> Exception:
    """The rendezvous failure of a rank whose store address came from the process manager: a rank
    that could not connect to the store gets one line naming both hosts and the interface."""
    text = str(e)
    if cfg.rank == 0 or "could not connect to the store" not in text:
        return e
    why = text.split("could not connect to the store", 1)[1].strip()
    return HorovodInternalError(
        f"rank {cfg.rank} on {cfg.host} cannot reach rank 0's store: {cfg.store_note}; {why}. Choose an "
        "interface every host can reach rank 0's host on (-mca btl_tcp_if_include IFACE or SUBNET, or "
        "-x HOROVOD_GLOO_IFACE=IFACE)", 0, cfg.host)
