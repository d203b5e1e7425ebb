"""Worker for the SSH tier: join the job, time ``init()``, then run the engine's every-op check
(``ops``), or only report (``init``; ``init-torch`` goes through ``appliance.torch``).

Reports (through ``_report``) the engine's results plus where the rank ran (hostname, the
launcher's HOROVOD_HOSTNAME and APPLIANCE_DATA_ADDR) and ``init_done``, the wall-clock time right
after ``init()`` returned, so a test can measure launch -> all ranks initialized.
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import _report  # noqa: E402
import engine  # noqa: E402

if sys.argv[1:] == ["init-torch"]:  # the user's path: `import appliance.torch as hvd; hvd.init()`
    import appliance.torch as hvd
    hvd.init()

import appliance.runtime as rt  # noqa: E402

rt.init()
extra = {"init_done": time.time(), "hostname": socket.gethostname(), "launcher_host": os.environ["HOROVOD_HOSTNAME"],
         "data_addr": os.environ["APPLIANCE_DATA_ADDR"], "rank": rt.rank()}
if sys.argv[1] in ("init", "init-torch"):
    rt.barrier()
    _report.report(extra)
else:
    engine.report = lambda data: _report.report({**data, **extra})
    engine.case_ops()
rt.shutdown()
