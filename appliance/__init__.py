"""The appliance: take a single-GPU PyTorch script to many processes on many hosts.

Planes (see README.md): ``appliance.runtime`` (the collective engine, C++ core in
``runtime/csrc``), ``appliance.torch`` (Horovod's PyTorch API over it), ``appliance.launcher``
(ranks, SSH, process lifecycle) and ``appliance.cluster`` (Docker containers). Data flows
downward only: the runtime knows nothing of SSH or Docker.
"""

__version__ = "0.1.0"
