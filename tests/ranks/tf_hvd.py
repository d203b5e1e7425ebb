"""Rank-agnostic worker for tests/tensorflow: ``appliance.tensorflow`` on real ranks.

Usage: tf_hvd.py <case>[,<case>...]. Initialises ``appliance.tensorflow`` (except the case
``before_init``, which must come first), runs the cases (from the ``_tf_*`` modules beside this
file) in order and reports ``{"ok": true, "rank", "size", "cases", ...}`` through ``_report`` (a
case may add entries by returning a dict), then shuts down. A failed check raises: the traceback
goes to stderr and the process exits non-zero. Inputs are reproducible from (rank, salt), so
every rank computes every other rank's input and checks results against numpy.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _tf_collectives  # noqa: E402
import _tf_eager  # noqa: E402
import _tf_features  # noqa: E402
import _tf_suite  # noqa: E402
import _tf_training  # noqa: E402
from _report import report  # noqa: E402

import appliance.tensorflow as hvd  # noqa: E402

CASES = {}
for _mod in (_tf_collectives, _tf_eager, _tf_training, _tf_features, _tf_suite):
    CASES.update(_mod.CASES)


def main(names: str) -> None:
    names = names.split(",")
    data = {"ok": False, "cases": []}
    try:
        if names[0] == "before_init":
            data.update(CASES["before_init"](hvd) or {})
            data["cases"].append(names.pop(0))
        hvd.init()
        data.update(rank=hvd.rank(), size=hvd.size())
        for name in names:
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
