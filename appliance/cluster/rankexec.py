"""Rank start record: ``python -m appliance.cluster.rankexec JOB_DIR -- COMMAND [ARG...]``.

What it owns: the ``ranks/<rank>.json`` entries of a job directory on the shared mount. The
primary's job runner (``jobrun``) puts this module in front of the user's command, so on whatever host a rank
starts, it first writes ``{rank, host, hostname, pid, started}`` (the launcher's host name from
-H, the machine's own name, its pid) and then *replaces itself* with COMMAND (``exec``: same pid,
same environment, same working directory, so ``python -m train`` resolves exactly as it would
have). ``appliance primary`` reads these files for its "ranks started" column; they are also
the job's pid records. A leading ``python``/``python3`` runs as this interpreter.

Env vars (read through ``appliance/common/knobs.py``): HOROVOD_RANK, HOROVOD_HOSTNAME (set by the
launcher). Failure modes: a command that cannot be executed exits 127 with one line naming it;
a record that cannot be written is reported on stderr and the rank still runs.
"""
from __future__ import annotations

import os
import socket
import sys
import time

from appliance.common.knobs import read
from ..mount import write_json


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m appliance.cluster.rankexec JOB_DIR -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    job_dir, command = argv[0], argv[2:]
    rank = read("HOROVOD_RANK")
    rank = 0 if rank is None else rank
    record = {"rank": rank, "host": read("HOROVOD_HOSTNAME") or socket.gethostname(),
              "hostname": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    try:
        os.makedirs(os.path.join(job_dir, "ranks"), exist_ok=True)
        write_json(os.path.join(job_dir, "ranks", f"{rank}.json"), record)
    except OSError as e:
        print(f"rankexec: rank {rank}: cannot record the start in {job_dir}: {e}", file=sys.stderr)
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"rankexec: rank {rank} on {record['hostname']}: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
