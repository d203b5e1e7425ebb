"""``appliance status``: the appliance containers on this Docker engine and their health.

What it owns: ``list_containers()`` (every container labelled ``appliance.managed``, running or
not, as ``ContainerInfo`` rows) and ``render()`` (a rich table: name, role, state, health,
network and address, SSH port, shared directory, job, image, age). Containers of other tools
are never listed. Env vars: none. Failure modes: ``ClusterError`` when Docker is unreachable.
"""
from __future__ import annotations

import dataclasses
import datetime
from typing import IO, Any, Optional

from . import docker


@dataclasses.dataclass(frozen=True)
class ContainerInfo:
    name: str
    role: str
    state: str
    health: str
    network: str
    address: str
    ssh_port: str
    shared: str
    job: str
    image: str
    created: str

    @property
    def healthy(self) -> bool:
        return self.state == "running" and self.health in ("healthy", "running")


def _age(created: str) -> str:
    try:
        t = datetime.datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00" if "." in created[:26]
                                            else created.replace("Z", "+00:00"))
    except ValueError:
        return "?"
    s = int((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds())
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def list_containers(client: Optional[Any] = None) -> list[ContainerInfo]:
    client = client or docker.connect()
    rows = []
    for c in client.containers.list(all=True, filters={"label": f"{docker.MANAGED}=1"}):
        network = docker.label(c, "appliance.network", "?")
        nets = c.attrs.get("NetworkSettings", {}).get("Networks") or {}
        address = "" if network == "host" else (nets.get(network) or {}).get("IPAddress", "")
        rows.append(ContainerInfo(
            name=c.name, role=docker.label(c, docker.ROLE, "?"), state=c.status, health=docker.health(c),
            network=network, address=address, ssh_port=docker.label(c, "appliance.ssh-port"),
            shared=docker.label(c, "appliance.shared"), job=docker.label(c, "appliance.job"),
            image=docker.label(c, "appliance.image") or (c.attrs.get("Config", {}).get("Image", "")),
            created=_age(c.attrs.get("Created", ""))))
    return sorted(rows, key=lambda r: (r.role != "secondary", r.name))


def render(rows: list[ContainerInfo], out: IO[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    probe = Console(file=out)
    console = Console(file=out, highlight=False, width=probe.width if probe.is_terminal else 220)
    if not rows:
        console.print("no appliance containers here (start one with: appliance secondary --ssh-port 12345)")
        return
    table = Table(show_lines=False)
    for col in ("name", "role", "state", "health", "network", "ssh port", "shared", "job", "image", "age"):
        table.add_column(col)
    for r in rows:
        color = "green" if r.healthy else "red" if r.state != "running" or r.health == "unhealthy" else "yellow"
        net = r.network + (f" {r.address}" if r.address else "")
        table.add_row(r.name, r.role, r.state, f"[{color}]{r.health}[/{color}]", net, r.ssh_port, r.shared,
                      r.job or "-", r.image, r.created)
    console.print(table)
