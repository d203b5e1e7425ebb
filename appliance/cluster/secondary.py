"""``appliance secondary``: the sshd container that makes a host part of the cluster.

What it owns: ``Secondary(config)``, which starts (``start()``), reports on and stops
(``stop()``) one secondary container, and is also a context manager (start on enter, stop on
exit) for tests and scripts. The container runs the image's ``secondary`` mode: sshd on
``--ssh-port``, key-only, logging to ``docker logs``; its login key is the cluster key under
``SHARED/ssh`` (made there on first use with ``appliance keys``' logic), the shared directory is
bound at the same path, and it gets the flags of ``docker.container_kwargs()`` (host network by
default, --init, IPC/shm, memlock, GPUs, labels).

The container registers itself on the share once its sshd answers and keeps the registration
alive (``SHARED/secondaries/<host name>.json`` with ``--slots``, ``appliance.cluster.heartbeat``):
an elastic ``appliance primary --min-np N`` without ``-H`` discovers its hosts there. ``stop()``
first removes the registration, waits (at most ``drain_s``) until no rank runs in the container
any more (the elastic job moves away at its next commit), then stops it.

Idempotent: a second ``start()`` with the same settings reports the running container; a
running one with other settings (port, share, image, network) is an error that says how to stop
it; a stopped one of ours is replaced. Start and stop hold the per-host lock
``SHARED/locks/host-secondary-<name>@<hostname>.lock`` so concurrent calls on one host queue.
The container name is ``appliance-secondary`` or ``appliance-<--name>``.

Env vars: none read here (``ClusterConfig``). Failure modes: ``ClusterError`` (one line) for a
missing image or share, a name taken by a container we did not create, a conflicting running
secondary, a container that exits while starting (its last log lines are quoted).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

from appliance.cluster.config import ClusterConfig
from . import docker
from .docker import ClusterError
from ..mount import Layout, host_lock
from ..mount.registry import registrations, unregister

ROLE = "secondary"
DEFAULT_NAME = "appliance-secondary"


def ensure_cluster_keys(shared: str) -> list[str]:
    """Make (once) or repair the cluster's SSH material under ``shared/ssh`` (``appliance keys``'
    logic: client key, authorized_keys, one host key for every secondary, known_hosts); the
    paths it created."""
    from ..launcher.ssh.keys import KeysError, ensure_keys

    try:
        return list(ensure_keys(shared).created)
    except KeysError as e:
        raise ClusterError(f"cannot prepare the cluster keys: {e}") from None


@dataclasses.dataclass
class SecondaryReport:
    name: str
    state: str          # "started", "running" (was already), "stopped", "absent"
    container_id: str = ""
    health: str = ""
    network: str = ""
    address: str = ""
    ssh_port: int = 0
    keys_created: tuple = ()

    def line(self) -> str:
        where = f"network {self.network}" + (f", address {self.address}" if self.address else "")
        if self.state == "started":
            return f"started {self.name} ({self.container_id[:12]}): sshd on port {self.ssh_port}, {where}, {self.health}"
        if self.state == "running":
            return f"{self.name} is already running ({self.container_id[:12]}): sshd on port {self.ssh_port}, {where}, {self.health}"
        if self.state == "stopped":
            return f"stopped and removed {self.name}"
        return f"no container {self.name} here"


def _address(container: Any, network: str) -> str:
    if network == "host":
        return ""
    nets = container.attrs.get("NetworkSettings", {}).get("Networks") or {}
    return (nets.get(network) or {}).get("IPAddress", "")


class Secondary:
    """One secondary container on this host."""

    def __init__(self, config: ClusterConfig, client: Optional[Any] = None, ready_timeout_s: float = 30.0):
        self.config = config
        self.name = docker.prefixed(config.name) if config.name else DEFAULT_NAME
        self.client = client or docker.connect()
        self.ready_timeout_s = ready_timeout_s
        self.network = docker.Network(self.client, config.network)

    def _lock(self):
        return host_lock(Layout(self.config.shared), f"secondary-{docker.host_alias(self.name)}",
                         what=f"appliance secondary {self.name}", wait_s=60.0)

    def _conflict(self, c: Any) -> Optional[str]:
        want = {"appliance.ssh-port": str(self.config.ssh_port), "appliance.shared": self.config.shared,
                "appliance.image": self.config.image, "appliance.network": self.config.network,
                "appliance.slots": str(self.config.slots)}
        for key, value in want.items():
            have = docker.label(c, key)
            if have != value:
                return f"{key.split('.', 1)[1]} {have} (asked: {value})"
        return None

    def _report(self, c: Any, state: str, keys: tuple = ()) -> SecondaryReport:
        c.reload()
        health = docker.health(c)
        if health == "starting":  # our own probe passed (wait_ready); Docker's first check is 5 s away
            health = "ready"
        return SecondaryReport(name=self.name, state=state, container_id=c.id, health=health,
                               network=self.config.network, address=_address(c, self.config.network),
                               ssh_port=self.config.ssh_port, keys_created=keys)

    def start(self) -> SecondaryReport:
        docker.require_shared(self.config.shared)
        docker.require_image(self.client, self.config.image)
        Layout(self.config.shared).ensure()
        keys = tuple(ensure_cluster_keys(self.config.shared))
        with self._lock():
            existing = docker.find_container(self.client, self.name)
            if existing is not None:
                if not docker.is_ours(existing):
                    raise ClusterError(f"a container named {self.name} exists and was not made by appliance: "
                                       "remove it, or choose another --name")
                if existing.status == "running":
                    conflict = self._conflict(existing)
                    if conflict:
                        stop = "appliance secondary --stop" + (f" --name {self.config.name}" if self.config.name else "")
                        raise ClusterError(f"{self.name} is already running with {conflict}: stop it first ({stop})")
                    docker.wait_ready(existing, self.ready_timeout_s)
                    return self._report(existing, "running", keys)
                existing.remove(force=True)  # ours, stopped: replace it
            self.network.ensure()
            kw = docker.container_kwargs(self.client, self.config, name=self.name, role=ROLE,
                                         extra_labels={"slots": self.config.slots})
            container = self.client.containers.create(
                self.config.image, command=["secondary", "--port", str(self.config.ssh_port),
                                            "--slots", str(self.config.slots)], **kw)
            try:
                container.start()
                docker.wait_ready(container, self.ready_timeout_s)
            except BaseException:
                container.remove(force=True)
                self.network.release()
                raise
            return self._report(container, "started", keys)

    def unregister(self) -> list[str]:
        """Remove the registrations of this container from the share; the host names removed."""
        layout, gone = Layout(self.config.shared), []
        for reg, _ in registrations(layout):
            if reg.container.split("@", 1)[0] == self.name and unregister(layout, reg.name, reg.token):
                gone.append(reg.name)
        return gone

    def drain(self, container: Any, drain_s: float) -> bool:
        """Wait (at most ``drain_s``) until nothing but sshd, the heartbeat and init runs in
        ``container``: whether it drained."""
        deadline = time.monotonic() + drain_s
        while True:
            try:
                top = container.top(ps_args="-eo pid,args")
            except Exception:  # noqa: BLE001 - it stopped meanwhile
                return True
            idx = top.get("Titles", []).index("COMMAND") if "COMMAND" in top.get("Titles", []) else -1
            busy = [p[idx] for p in top.get("Processes") or [] if not idle_process(p[idx])]
            if not busy or time.monotonic() >= deadline:
                return not busy
            time.sleep(0.25)

    def stop(self, timeout_s: int = 10, drain_s: float = 20.0) -> SecondaryReport:
        with self._lock():
            existing = docker.find_container(self.client, self.name)
            if existing is None:
                self.unregister()
                return SecondaryReport(name=self.name, state="absent")
            if not docker.is_ours(existing):
                raise ClusterError(f"{self.name} was not made by appliance; not touching it")
            if self.unregister() and existing.status == "running":
                self.drain(existing, drain_s)
            network = docker.label(existing, "appliance.network") or self.config.network
            existing.stop(timeout=timeout_s)
            existing.remove(force=True)
            docker.Network(self.client, network).release(force=True)
            return SecondaryReport(name=self.name, state="stopped")

    def __enter__(self) -> "Secondary":
        self.report = self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout_s=2, drain_s=0)


def idle_process(command: str) -> bool:
    """Not a rank: init, sshd (its listener and sessions), the heartbeat, and the launcher's stub
    that holds a job's SSH session to this host (the ranks are its children)."""
    return (command.startswith(("/sbin/docker-init", "docker-init", "/usr/sbin/sshd", "sshd:"))
            or "appliance.cluster.heartbeat" in command or "appliance.launcher.ssh.remote_stub" in command)
