"""The rank side of ``horovod.run``: ``python -m appliance.hvdcompat.runfn PAYLOAD``.

Unpickles ``(func, args, kwargs)`` from the base64 ``PAYLOAD`` (``appliance.hvdcompat.run``),
calls ``func`` and prints, on one stdout line after ``appliance.hvdcompat.run.MARKER``, its
rank (HOROVOD_RANK when ``func`` returns: in an elastic job, the rank of its last round) and its
pickled return value. An exception in ``func`` is printed with its traceback and the process
exits 1; ``SystemExit`` passes (an elastic worker that leaves the job exits 0 without a result).
Reads HOROVOD_RANK after ``func`` (whose ``hvd.init()`` reads the job's).
"""
from __future__ import annotations

import os
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
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - reported, then the rank fails
        traceback.print_exc()
        return 1
    sys.stdout.flush()
    print("\n" + MARKER + os.environ.get("HOROVOD_RANK", "0") + " " + dumps(value), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
