"""``python -m appliance ...`` is the ``appliance`` command (see ``appliance/cli.py``)."""
import sys

from .cli import main

sys.exit(main())
