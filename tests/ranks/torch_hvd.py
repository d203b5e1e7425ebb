"""Rank-agnostic worker for tests/torch/test_torch_*.py: ``appliance.torch`` on real ranks.

Usage: torch_hvd.py <case>[,<case>...]. Initialises ``appliance.torch``, runs the cases (from
the ``_torch_*`` modules beside this file) in order and reports ``{"ok": true, "rank", "size",
"cases", ...}`` through ``_report`` (a case may add entries by returning a dict), then shuts
down. A failed check raises: the traceback goes to stderr and the process exits non-zero.
Inputs are reproducible from (case, rank), so every rank computes every other rank's input
and checks results against torch references.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _torch_autograd  # noqa: E402
import _torch_collectives  # noqa: E402
import _torch_functions  # noqa: E402
import _torch_optimizer  # noqa: E402
from _report import report  # noqa: E402

import appliance.torch as hvd  # noqa: E402

CASES = {}
for _mod in (_torch_autograd, _torch_collectives, _torch_functions, _torch_optimizer):
    CASES.update(_mod.CASES)


def main(names: str) -> None:
    hvd.init()
    data = {"ok": False, "rank": hvd.rank(), "size": hvd.size(), "cases": []}
    try:
        for name in names.split(","):
            extra = CASES[name](hvd)
            data["cases"].append(name)
            data.update(extra or {})
        data["ok"] = True
    finally:
        if os.environ.get("APPLIANCE_TEST_OUT"):
            report(data)
        hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
