"""The rank side of ``horovod.run``: ``python -m appliance.hvdcompat.runfn PAYLOAD``.

Unpickles ``(func, args, kwargs)`` from the base64 ``PAYLOAD`` (``appliance.hvdcompat.run``),
calls ``func`` and prints its pickled return value on one stdout line after
``appliance.hvdcompat.run.MARKER``. An exception in ``func`` is printed with its traceback and the
process exits 1. Reads no environment itself (``func``'s ``hvd.init()`` reads the job's).
"""
from __future__ import annotations

import sys
import traceback

from appliance.hvdcompat.run import MARKER, dumps, loads


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m appliance.hvdcompat.runfn PAYLOAD", file=sys.stderr)
        return 2
    func, args, kwargs = loads(argv[0])
    try:
        value = func(*args, **kwargs)
    except BaseException:  # noqa: BLE001 - reported, then the rank fails
        traceback.print_exc()
        return 1
    sys.stdout.flush()
    print("\n" + MARKER + dumps(value), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
