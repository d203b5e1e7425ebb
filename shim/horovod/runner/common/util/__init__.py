"""``horovod.runner.common.util``: only ``env`` is provided."""
