"""Rank-agnostic bodies of the ``appliance.torch`` tests (run by ``torch_spawn.run_workers``).

``python torch_workers.py <name>[,<name>...]`` initialises the runtime, runs the workers from
the ``torch_w_*`` modules beside this file, prints ``OK <rank>/<size>`` and shuts down. Any
failed check raises, so the process exits non-zero with the traceback on stderr. Inputs are
reproducible from (case, rank), so every rank computes the reference of every other rank.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv) -> int:
    if argv[1] == "sleep":  # for the spawn helper's own test: a rank that never ends
        import time
        time.sleep(3600)
    import appliance.torch as hvd
    import torch_w_autograd
    import torch_w_collectives
    import torch_w_functions
    import torch_w_optimizer

    workers = {}
    for mod in (torch_w_autograd, torch_w_collectives, torch_w_functions, torch_w_optimizer):
        workers.update(mod.WORKERS)
    hvd.init()
    try:
        for name in argv[1].split(","):
            workers[name](hvd, *argv[2:])
        print(f"OK {hvd.rank()}/{hvd.size()}", flush=True)
    finally:
        hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
