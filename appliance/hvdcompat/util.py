"""``horovod.common.util``: the helpers Horovod scripts and test helpers import.

``env(**kw)`` (a context manager that sets environment variables and restores them),
``get_average_backwards_compatibility_fun(reduce_ops)``, ``num_rank_is_power_2``, ``split_list``,
``is_iterable``, ``is_version_greater_equal_than``, the build probes (``extension_available``,
``gpu_available``, ``mpi_built``, ``gloo_built``, ``nccl_built``, ``ddl_built``, ``ccl_built``:
what this runtime is, i.e. torch only, neither MPI nor Gloo), and ``check_extension`` /
``check_installed_version`` (no-ops: there is no separately compiled framework extension).
Does not import torch unless a torch probe is asked. Reads and writes only the environment
variables given to ``env``.
"""
from __future__ import annotations

import contextlib
import os
import warnings

EXTENSIONS = ["tensorflow", "torch", "mxnet"]


@contextlib.contextmanager
def env(**kwargs):
    """Set the given environment variables (None values are ignored) for the ``with`` body."""
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    saved = {k: os.environ.get(k) for k in kwargs}
    os.environ.update(kwargs)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def get_average_backwards_compatibility_fun(reduce_ops):
    """``impl(op, average)``: ``op`` if given, else ``reduce_ops.Average``/``Sum`` from the
    deprecated ``average`` flag (a DeprecationWarning); both given is a ValueError."""
    def impl(op, average):
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only one of them.")
            return op
        if average is not None:
            warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                          DeprecationWarning, stacklevel=3)  # the caller of the collective
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average
    return impl


def num_rank_is_power_2(num_rank: int) -> bool:
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def split_list(items, n: int) -> list:
    """``items`` in ``n`` contiguous chunks whose lengths differ by at most one."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def is_iterable(x) -> bool:
    try:
        iter(x)
    except TypeError:
        return False
    return True


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    if not (isinstance(ver, str) and isinstance(target, str)):
        raise ValueError(f"This function only accepts string arguments, got {ver!r} and {target!r}")
    from packaging import version
    return version.parse(ver) >= version.parse(target)


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Only the torch framework is provided (``horovod.torch``); true when torch imports."""
    if ext_base_name.split(".")[-1] != "torch":
        return False
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    if not extension_available(ext_base_name):
        return False
    import torch
    return bool(torch.cuda.is_available())


def mpi_built(verbose: bool = False) -> bool:
    return False  # the collectives run on the appliance's own runtime, not MPI


def gloo_built(verbose: bool = False) -> bool:
    return False  # nor Gloo


def nccl_built(verbose: bool = False) -> bool:
    return gpu_available("torch")


def ddl_built(verbose: bool = False) -> bool:
    return False


def ccl_built(verbose: bool = False) -> bool:
    return False


def check_extension(ext_name, ext_env_var, pkg_path, *args) -> None:
    """Horovod checks its compiled framework library here; there is none to check."""
    if ext_name.split(".")[-1] not in ("torch", "common"):
        raise ImportError(f"{ext_name} is not provided by the appliance's Horovod compatibility layer "
                          "(torch only)")


def check_installed_version(name, version, exception=None) -> None:
    """Horovod compares against its build metadata; nothing here is built per framework version."""


__all__ = ["EXTENSIONS", "ccl_built", "check_extension", "check_installed_version", "ddl_built", "env",
           "extension_available", "get_average_backwards_compatibility_fun", "gloo_built", "gpu_available",
           "is_iterable", "is_version_greater_equal_than", "mpi_built", "nccl_built", "num_rank_is_power_2",
           "split_list"]
