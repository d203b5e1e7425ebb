"""``horovod.runner.util``: only ``threads`` is provided."""
