"""Where the launcher runs: the launcher pod of the MPI Operator or of Kubeflow Trainer.

What it owns: ``detect(environ)``, which reads what those operators give a launcher pod and returns
a ``Kubernetes`` (or None elsewhere), and the defaults that follow from it. It is on when
``K_MPI_JOB_ROLE=launcher`` (the MPI Operator) or a hostfile variable is set
(``OMPI_MCA_orte_default_hostfile``, ``I_MPI_HYDRA_HOST_FILE``, ``HYDRA_HOST_FILE``: the MPI
Operator's OpenMPI/Intel/MPICH launchers and Kubeflow Trainer's). Then:

- the hosts: the hostfile that variable names (else ``APPLIANCE_MPI_CONFIG_DIR/hostfile``, default
  ``/etc/mpi``), both dialects, names as given; a line without slots gets
  ``OMPI_MCA_orte_set_default_slots`` (or a numeric ``I_MPI_PERHOST``), else 1;
- for an elastic job without a discovery script: ``APPLIANCE_MPI_CONFIG_DIR/discover_hosts.sh``
  when it exists (it prints names only: their slots are ``--slots-per-host``, else the default
  slots above, else the hostfile's when every line has the same), else the hostfile's hosts;
- SSH: the key is ``~/.ssh/id_rsa`` (the operators mount their Secret at the user's ``~/.ssh``;
  whatever key type it holds), ``known_hosts`` is never written (the mount is read-only), hosts
  whose sshd does not answer yet are waited for (``host_wait_s``) and, in an elastic job, pending;
- elastic: a crashed host is blacklisted with a cool-down (``COOLDOWN_S``) so that the re-created
  pod of the same name rejoins; a rank ended by SIGTERM (pod deletion) leaves without blacklist.

``line()`` is the one line the launcher prints at start saying what it took.
``key_mode_warning(path)`` names a private key whose mode or owner OpenSSH refuses, with the fix.

Env vars: the operators' own, read as they set them (not knobs: the names are their contract):
K_MPI_JOB_ROLE, OMPI_MCA_orte_default_hostfile, I_MPI_HYDRA_HOST_FILE, HYDRA_HOST_FILE,
OMPI_MCA_orte_set_default_slots, I_MPI_PERHOST; the knob APPLIANCE_MPI_CONFIG_DIR; HOME locates
``~/.ssh``. Failure modes: ``ConfigError`` naming the variable for an unusable slot count.
"""
from __future__ import annotations

import dataclasses
import os
import stat
from typing import Mapping

from appliance.common.knobs import ConfigError, read

HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE")
COOLDOWN_S = (10.0, 300.0)  # a crashed pod's host may rejoin after 10 s, doubling up to 5 min


@dataclasses.dataclass(frozen=True)
class Kubernetes:
    """What the launcher pod was given (see the module docstring)."""

    source: str                 # what switched it on: "K_MPI_JOB_ROLE=launcher" or the hostfile variable
    hostfile: str               # the mounted hostfile (may not exist: Trainer without -H reads it anyway)
    slots: int | None           # OMPI_MCA_orte_set_default_slots / I_MPI_PERHOST
    discovery: str | None       # APPLIANCE_MPI_CONFIG_DIR/discover_hosts.sh when it exists
    key: str | None             # ~/.ssh/id_rsa when it exists

    @property
    def operator(self) -> str:
        return "MPI Operator" if self.source.startswith("K_MPI_JOB_ROLE") else "Kubernetes hostfile"

    def line(self, *, hosts_from: str | None, discovery: str | None, key: str | None,
             cooldown: tuple[float, float] | None) -> str:
        """The one line said at start: what was detected and what the job takes from it."""
        parts = [f"Kubernetes ({self.operator}, {self.source})"]
        if discovery:
            parts.append(f"hosts from {discovery} (discovery)")
        elif hosts_from:
            parts.append(f"hosts from {hosts_from}")
        if self.slots is not None:
            parts.append(f"{self.slots} slot{'s' if self.slots != 1 else ''} per host by default")
        parts.append(f"SSH key {key}" if key else "SSH key: default search")
        if cooldown is not None:
            parts.append(f"blacklist cool-down {cooldown[0]:g}-{cooldown[1]:g} s")
        return "; ".join(parts)


def _slots(env: Mapping[str, str]) -> int | None:
    for name in ("OMPI_MCA_orte_set_default_slots", "I_MPI_PERHOST"):
        raw = (env.get(name) or "").strip()
        if not raw:
            continue
        if not raw.isdigit() or int(raw) < 1:
            if name == "I_MPI_PERHOST":  # Intel's other values (allcores...) say nothing of slots
                continue
            raise ConfigError(f"{name}={raw!r}: expected the slots per host, a whole number >= 1")
        return int(raw)
    return None


def detect(environ: Mapping[str, str]) -> Kubernetes | None:
    """The launcher pod's facts, or None when this is not one (see the module docstring)."""
    role = (environ.get("K_MPI_JOB_ROLE") or "").strip()
    var = next((v for v in HOSTFILE_VARS if environ.get(v)), None)
    if role != "launcher" and var is None:
        return None
    config_dir = read("APPLIANCE_MPI_CONFIG_DIR", environ) or "/etc/mpi"
    hostfile = environ[var] if var else os.path.join(config_dir, "hostfile")
    script = os.path.join(config_dir, "discover_hosts.sh")
    home = environ.get("HOME") or os.path.expanduser("~")
    key = os.path.join(home, ".ssh", "id_rsa")
    return Kubernetes(source="K_MPI_JOB_ROLE=launcher" if role == "launcher" else f"{var}={hostfile}",
                      hostfile=hostfile, slots=_slots(environ),
                      discovery=script if os.path.isfile(script) else None,
                      key=key if os.path.isfile(key) else None)


def uniform_slots(hostfile: str, default_slots: int) -> int | None:
    """The slots every line of ``hostfile`` gives, when they are all the same (else None)."""
    from .hosts import HostsError, read_hostfile

    try:
        counts = {h.slots for h in read_hostfile(hostfile, default_slots)}
    except HostsError:
        return None
    return counts.pop() if len(counts) == 1 else None


def key_mode_warning(path: str) -> str | None:
    """OpenSSH refuses a private key that is readable by others and owned by the user who runs it
    ("UNPROTECTED PRIVATE KEY FILE"); this launcher reads it anyway, but ``ssh``/``mpirun`` would
    not. Returns the line that names the file and the fix, or None when OpenSSH takes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_uid != os.getuid() or not st.st_mode & 0o077:
        return None
    return (f"the SSH key {path} has mode {stat.S_IMODE(st.st_mode):04o} and is owned by you: OpenSSH (ssh, "
            f"mpirun) refuses it as too open; this launcher reads it anyway. Fix: mount it with mode 0600 "
            f"(the MPI Operator does for /root/.ssh), or run as a user other than its owner (runAsUser: 1000 "
            f"with a root-owned Secret), or copy it: install -m 600 {path} ~/id_rsa && pass -i ~/id_rsa")


__all__ = ["Kubernetes", "detect", "uniform_slots", "key_mode_warning", "COOLDOWN_S", "HOSTFILE_VARS"]
