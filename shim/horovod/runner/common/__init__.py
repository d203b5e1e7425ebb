"""``horovod.runner.common``: only ``util.env`` is provided."""
