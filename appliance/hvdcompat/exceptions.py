"""``horovod.common.exceptions``: Horovod's exception classes.

``HorovodInternalError`` is the runtime's own class (``appliance.runtime.errors``), so an
``except horovod.common.exceptions.HorovodInternalError`` catches what ``appliance.torch``
raises. ``HostsUpdatedInterrupt`` (elastic host changes: raised by a
``commit`` after a host-set notification, see ``appliance.hvdcompat.elastic``) and ``HorovodVersionMismatchError`` (an ``ImportError``) are Horovod's.
Owns nothing; reads no environment.
"""
from __future__ import annotations

from appliance.runtime.errors import HorovodInternalError, MismatchError  # noqa: F401


class HostsUpdatedInterrupt(RuntimeError):
    """Elastic mode: the set of hosts changed; ``skip_sync`` says whether to skip the state sync."""

    def __init__(self, skip_sync: bool = False):
        super().__init__(f"hosts updated (skip_sync={skip_sync})")
        self.skip_sync = skip_sync


def get_version_mismatch_message(name: str, version: str, installed_version: str) -> str:
    return (f"Framework {name} installed with version {installed_version} but found version {version}; "
            "this can result in unexpected behavior including runtime errors")


class HorovodVersionMismatchError(ImportError):
    """A framework's version at run time differs from the one the build was made for."""

    def __init__(self, name: str, version: str, installed_version: str):
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name = name
        self.version = version
        self.installed_version = installed_version


__all__ = ["HorovodInternalError", "HorovodVersionMismatchError", "HostsUpdatedInterrupt", "MismatchError",
           "get_version_mismatch_message"]
