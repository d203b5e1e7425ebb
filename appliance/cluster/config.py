"""The appliance plane's config: one ``appliance secondary|primary|status``.

What it owns: ``ClusterConfig`` (image, shared directory, Docker network, container name, SSH
port, /dev/shm, GPUs, how long the primary waits for a secondary, a secondary's slots),
validated from flags and the environment (``APPLIANCE_*`` knobs of ``appliance.common.knobs``). Precedence: flag, then the
environment, then the default. Failure mode: ``ConfigError`` naming the flag.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping

from appliance.common.knobs import ConfigError, parse_size, read


DEFAULT_SSH_PORT = 12345
_DOCKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """One ``appliance secondary|primary|status``: which image, which share, which network.

    Precedence: flag, then the environment (``APPLIANCE_*``), then the default. ``shm`` is
    ``"host"`` (share the host's IPC namespace and /dev/shm) or a size for a private /dev/shm;
    by default ``host`` on the host network (real hosts) and ``1g`` on a user-defined network,
    where containers stand for separate hosts and must not share /dev/shm.
    """

    shared: str = "/mnt/share"
    image: str = "appliance:latest"
    network: str = "host"
    name: str | None = None
    ssh_port: int = DEFAULT_SSH_PORT
    shm: str = "host"
    gpus: str = "auto"
    secondary_wait_s: float = 20.0
    slots: int = 1          # a secondary's slots, as it registers them for elastic discovery

    @classmethod
    def create(cls, *, shared: str | os.PathLike | None = None, image: str | None = None, network: str | None = None,
               name: str | None = None, ssh_port: int | None = None, shm_size: str | None = None,
               gpus: str | None = None, slots: int | None = None,
               environ: Mapping[str, str] | None = None) -> "ClusterConfig":
        env = os.environ if environ is None else environ
        shared = os.path.abspath(os.fspath(shared) if shared else read("APPLIANCE_SHARED", env))
        network = network or read("APPLIANCE_NETWORK", env)
        if not _DOCKER_NAME.match(network):
            raise ConfigError(f"--network {network!r} is not a Docker network name")
        if name is not None and not _DOCKER_NAME.match(name):
            raise ConfigError(f"--name {name!r}: use letters, digits, '_', '.', '-' (a host name for simulated hosts)")
        if ssh_port is None:
            ssh_port = read("APPLIANCE_SSH_PORT", env) or DEFAULT_SSH_PORT
        elif not 0 < int(ssh_port) < 65536:
            raise ConfigError(f"--ssh-port {ssh_port}: expected a TCP port (1-65535)")
        shm = (shm_size or read("APPLIANCE_SHM_SIZE", env) or ("host" if network == "host" else "1g")).strip().lower()
        if shm != "host":
            try:
                if parse_size(shm) < (64 << 20):
                    raise ValueError("at least 64m")
            except ValueError as e:
                raise ConfigError(f"--shm-size {shm!r}: expected 'host' or a size such as 2g ({e})") from None
        gpus = (gpus or read("APPLIANCE_GPUS", env)).strip().lower()
        if gpus not in ("auto", "all", "none") and not (gpus.isdigit() and int(gpus) > 0):
            raise ConfigError(f"--gpus {gpus!r}: expected auto, all, none or a positive count")
        if slots is not None and not 0 < int(slots) < 10000:
            raise ConfigError(f"--slots {slots}: expected a positive number of ranks for this host")
        return cls(shared=shared, image=image or read("APPLIANCE_IMAGE", env), network=network, name=name,
                   ssh_port=int(ssh_port), shm=shm, gpus=gpus,
                   secondary_wait_s=read("APPLIANCE_SECONDARY_WAIT", env), slots=int(slots or 1))


