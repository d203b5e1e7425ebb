"""Docker SDK access for the appliance plane: names, labels and the flags every container gets.

What it owns:
- ``connect()``: a docker SDK client, or one ``ClusterError`` line saying how to start Docker.
- Naming: every container and network this package creates is called ``appliance-...``
  (``prefixed()``); a user-given name such as ``node2`` becomes container ``appliance-node2``
  with host name and network alias ``node2``, so the launcher can say ``-H node2:1``.
- Labels: ``appliance.managed=1`` plus role, shared directory, SSH port, job. Only containers and
  networks that carry ``appliance.managed`` are ever stopped or removed (``is_ours()``).
- ``container_kwargs()``: what secondary and primary containers share: the environment
  (``APPLIANCE_SHARED``, ``APPLIANCE_SSH_PORT``, and ``APPLIANCE_CONTAINER`` = ``<name>@<engine
  id>``, the container's identity, which lock owners record so that a lock held from a container
  that is gone can be taken over at once: ``locksweep``), the shared directory
  bound at the same path, ``--init``, ``--ipc host`` or a private /dev/shm of the configured
  size, an unlimited memlock ulimit (or the engine's maximum when it may not raise it), GPUs through a device request when Docker has an nvidia
  runtime (``--gpus`` auto), the network (host, or a user-defined one with the host name as alias).
- ``Network``: a context manager over a user-defined network: created (labelled) when missing and
  named ``appliance-*``, removed on ``release()`` only when we created it and it is empty.
- ``require_image()``, ``require_shared()``, ``wait_ready()``, ``last_log_line()``,
  ``engine_id()``, ``container_state()`` (status and last start time of a container, or None).

Env vars: none read here (``ClusterConfig``); the docker SDK itself honours DOCKER_HOST.
Failure modes: every user-facing problem is a ``ClusterError`` whose message is one line saying
what to run (build the image, create the share, start Docker, choose another name).
"""
from __future__ import annotations

import datetime
import os
import time
from typing import Any, Optional

from .. import __version__
from appliance.cluster.config import ClusterConfig

PREFIX = "appliance-"
MANAGED = "appliance.managed"
ROLE = "appliance.role"


class ClusterError(RuntimeError):
    """A problem the user fixes by running something; the message is one line that says what."""


def _docker():
    try:
        import docker
    except ImportError:  # pragma: no cover - a dependency of the package
        raise ClusterError("the docker Python package is missing: pip install 'docker>=6'") from None
    return docker


def connect():
    """A client for the local engine (DOCKER_HOST honoured), checked with a ping."""
    docker = _docker()
    try:
        client = docker.from_env(timeout=60)
        client.ping()
        return client
    except docker.errors.DockerException as e:
        reason = str(e).splitlines()[0][:160]
        raise ClusterError(f"cannot reach the Docker engine ({reason}): start it (bash .ci/docker-up.sh, or "
                           "systemctl start docker) and make sure you may use it (root or the docker group)") from None


def prefixed(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


def host_alias(name: str) -> str:
    """The host name a container stands for: its name without the prefix."""
    return name[len(PREFIX):] if name.startswith(PREFIX) and len(name) > len(PREFIX) else name


def labels(role: str, config: ClusterConfig, **extra: Any) -> dict[str, str]:
    out = {MANAGED: "1", ROLE: role, "appliance.shared": config.shared, "appliance.ssh-port": str(config.ssh_port),
           "appliance.image": config.image, "appliance.network": config.network, "appliance.version": __version__}
    out.update({f"appliance.{k.replace('_', '-')}": str(v) for k, v in extra.items()})
    return out


def is_ours(obj: Any) -> bool:
    return (obj.attrs.get("Config", {}).get("Labels") or obj.attrs.get("Labels") or {}).get(MANAGED) == "1"


def label(container: Any, key: str, default: str = "") -> str:
    return (container.attrs.get("Config", {}).get("Labels") or {}).get(key, default)


def find_container(client: Any, name: str) -> Optional[Any]:
    docker = _docker()
    try:
        return client.containers.get(name)
    except docker.errors.NotFound:
        return None


def engine_id(client: Any) -> str:
    """The engine's ID (``docker info``): with a container name it identifies one container."""
    return str(client.info().get("ID") or "")


def _docker_time(text: str) -> float:
    """Unix time of a Docker timestamp (RFC 3339 with nanoseconds); 0.0 for the zero time."""
    if not text or text.startswith("0001-"):
        return 0.0
    head, _, frac = text.rstrip("Z").partition(".")
    frac = (frac.split("+")[0].split("-")[0] + "000000")[:6]
    stamp = datetime.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp() + int(frac) / 1e6


def container_state(client: Any, name: str) -> Optional[tuple[str, float]]:
    """(status, unix time of its last start) of container ``name``, or None when there is none."""
    c = find_container(client, name)
    if c is None:
        return None
    state = c.attrs.get("State") or {}
    return str(state.get("Status") or c.status), _docker_time(str(state.get("StartedAt") or ""))


def require_image(client: Any, image: str) -> Any:
    docker = _docker()
    try:
        return client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ClusterError(f"image {image} not found here: build it with `bash build.sh` (GPU) or `bash build.sh --cpu`, "
                           "or pass --image NAME (env APPLIANCE_IMAGE)") from None


def require_shared(path: str) -> None:
    if not os.path.isdir(path):
        raise ClusterError(f"shared directory {path} does not exist: mount your share there on every host "
                           f"(or mkdir -p {path} on a single machine), or pass --shared DIR (env APPLIANCE_SHARED)")


def gpu_requests(client: Any, gpus: str) -> list:
    """Device requests for ``--gpus``: auto = all GPUs when Docker has an nvidia runtime, else none."""
    docker = _docker()
    if gpus == "none":
        return []
    if gpus == "auto":
        runtimes = (client.info().get("Runtimes") or {})
        if "nvidia" not in runtimes:
            return []
        gpus = "all"
    count = -1 if gpus == "all" else int(gpus)
    return [docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])]


CAP_SYS_RESOURCE = 24


def _local_dockerd_memlock() -> Optional[int]:
    """The hard memlock limit containers are held to when this machine's dockerd may not raise it
    (no CAP_SYS_RESOURCE, e.g. an engine inside a container); None when it may, or cannot be told."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "dockerd":
                    continue
            with open(f"/proc/{pid}/status") as f:
                cap = next((int(line.split()[1], 16) for line in f if line.startswith("CapEff:")), None)
            if cap is None or cap & (1 << CAP_SYS_RESOURCE):
                return None
            with open(f"/proc/{pid}/limits") as f:
                for line in f:
                    if line.startswith("Max locked memory"):
                        hard = line.split()[4]
                        return None if hard == "unlimited" else int(hard)
        except (OSError, ValueError, IndexError):
            continue
    return None


def memlock_ulimit(client: Any):
    """memlock unlimited (RDMA/NCCL pin memory), or the most this engine allows (see above)."""
    docker = _docker()
    base_url = str(getattr(client.api, "base_url", ""))
    limit = _local_dockerd_memlock() if ("unix" in base_url or "localhost" in base_url) else None
    value = -1 if limit is None else limit
    return docker.types.Ulimit(name="memlock", soft=value, hard=value)


def container_kwargs(client: Any, config: ClusterConfig, *, name: str, role: str,
                     extra_labels: Optional[dict] = None, env: Optional[dict] = None) -> dict[str, Any]:
    """Keyword arguments for ``client.containers.create`` common to secondaries and primaries."""
    docker = _docker()
    kw: dict[str, Any] = dict(
        name=name, detach=True, init=True,
        labels=labels(role, config, **(extra_labels or {})),
        volumes={config.shared: {"bind": config.shared, "mode": "rw"}},
        environment={"APPLIANCE_SHARED": config.shared, "APPLIANCE_SSH_PORT": str(config.ssh_port),
                     "APPLIANCE_CONTAINER": f"{name}@{engine_id(client)}", **(env or {})},
        ulimits=[memlock_ulimit(client)],
        device_requests=gpu_requests(client, config.gpus),
    )
    if config.shm == "host":
        kw["ipc_mode"] = "host"
    else:
        kw["shm_size"] = config.shm
    if config.network == "host":
        kw["network_mode"] = "host"
    else:
        alias = host_alias(name)
        kw["hostname"] = alias
        kw["network"] = config.network
        kw["networking_config"] = {config.network: client.api.create_endpoint_config(aliases=[alias])}
    return kw


class Network:
    """A user-defined network for the containers (``host`` is passed through untouched)."""

    def __init__(self, client: Any, name: str):
        self.client, self.name, self.created = client, name, False

    def ensure(self) -> "Network":
        docker = _docker()
        if self.name == "host":
            return self
        try:
            self.client.networks.get(self.name)
            return self
        except docker.errors.NotFound:
            pass
        if not self.name.startswith(PREFIX):
            raise ClusterError(f"network {self.name} does not exist: create it (docker network create {self.name}), "
                               f"or give a name starting with {PREFIX} and appliance creates it")
        try:
            self.client.networks.create(self.name, driver="bridge", labels={MANAGED: "1"}, check_duplicate=True)
            self.created = True
        except docker.errors.APIError as e:
            if getattr(e, "status_code", None) != 409:  # 409: a concurrent call just made it
                raise ClusterError(f"cannot create network {self.name}: {e.explanation or e}") from None
        return self

    def release(self, force: bool = False) -> bool:
        """Remove the network if appliance made it (this call, or ``force`` for any labelled one)
        and no container uses it any more. Returns whether it was removed."""
        docker = _docker()
        if self.name == "host" or not (self.created or force):
            return False
        try:
            net = self.client.networks.get(self.name)
            net.reload()
            if not is_ours(net) or net.attrs.get("Containers"):
                return False
            net.remove()
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError:
            return False  # still in use by a container that is just starting: leave it

    def __enter__(self) -> "Network":
        return self.ensure()

    def __exit__(self, *exc: object) -> None:
        self.release()


def last_log_lines(container: Any, n: int = 3) -> str:
    try:
        text = container.logs(tail=n).decode(errors="replace").strip()
    except Exception:  # noqa: BLE001 - a log we cannot read must not hide the real error
        return ""
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def health(container: Any) -> str:
    state = container.attrs.get("State", {})
    h = (state.get("Health") or {}).get("Status")
    return h or state.get("Status", "?")


def wait_ready(container: Any, timeout_s: float = 30.0) -> None:
    """Until the image's health check passes inside ``container`` (polled with exec, so we need not
    wait for Docker's own 5 s interval); ``ClusterError`` with its last log lines if it exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        container.reload()
        if container.status in ("exited", "dead"):
            code = container.attrs.get("State", {}).get("ExitCode")
            raise ClusterError(f"container {container.name} exited (code {code}) while starting: "
                               f"{last_log_lines(container) or 'no output'}")
        if container.status == "running":
            try:
                rc, _ = container.exec_run(["/usr/local/bin/appliance-healthcheck"], demux=False)
                if rc == 0:
                    return
            except Exception:  # noqa: BLE001 - exec races with a container that is exiting
                pass
        if time.monotonic() >= deadline:
            raise ClusterError(f"container {container.name} is not ready after {timeout_s:.0f} s: "
                               f"{last_log_lines(container) or 'no output'}")
        time.sleep(0.2)
