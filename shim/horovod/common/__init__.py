"""``horovod.common``: framework-independent parts (``exceptions``, ``util``, ``basics``,
``elastic``, ``process_sets``), re-exported from ``appliance.hvdcompat`` and ``appliance.torch``."""
