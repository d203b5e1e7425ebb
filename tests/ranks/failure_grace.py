"""Worker for tests/launcher/test_lifecycle.py: ``appliance.torch`` ranks where one rank fails.

Usage: failure_grace.py OUT MODE. Every rank does one warm-up allreduce, then rank 1 fails and
rank 0 (and any other) keeps allreducing until the runtime raises ``HorovodInternalError``.
MODE:
- ``exit``: rank 1 exits 3 at once (``os._exit``: no interpreter teardown, so the test's timing
  does not depend on it). Survivors with ``APPLIANCE_TEST_HANDLER=1`` catch the error, sleep 1 s
  (an emergency checkpoint) and write ``OUT/handled.<rank>`` with the error text, then exit 0;
  without it the error is unhandled (exit 1).
- ``stop``: rank 1 stops itself with SIGSTOP: a silent peer, never failing by itself. Rank 0's
  runtime declares it lost after ``APPLIANCE_HEARTBEAT_TIMEOUT`` and the error is unhandled.
``OUT/died_at`` holds the time rank 1 failed.
"""
import os
import signal
import sys
import time

import torch

import appliance.torch as hvd

out, mode = sys.argv[1], sys.argv[2]
hvd.init()
hvd.allreduce(torch.ones(4), name="warm")
if hvd.rank() == 1:
    with open(os.path.join(out, "died_at"), "w") as f:
        f.write(repr(time.time()))
    sys.stdout.flush()
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(3)
try:
    while True:
        hvd.allreduce(torch.ones(4), name="step")
        time.sleep(0.005)
except hvd.HorovodInternalError as e:
    if os.environ.get("APPLIANCE_TEST_HANDLER") != "1":
        raise
    time.sleep(1.0)
    tmp = os.path.join(out, f".handled.{hvd.rank()}.tmp")
    with open(tmp, "w") as f:
        f.write(str(e))
    os.replace(tmp, os.path.join(out, f"handled.{hvd.rank()}"))
    sys.exit(0)
