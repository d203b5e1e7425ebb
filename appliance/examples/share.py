"""What the appliance's example jobs share: their data, where a run's files go, and its run lock.

Both jobs (``train``: PyTorch, ``train_keras``: Keras) train on the same split of scikit-learn's
bundled 8x8 digits (``load_digits_arrays``: 1,500 training and 297 test images as numpy arrays,
shuffled by the seed, the same on every rank) and keep a run's files on the shared mount in the
same layout (``appliance.mount.Layout``): ``<shared>/models/<run>/`` for the checkpoint and
``metrics.json``, ``<shared>/locks/run-<run>.lock`` for the run's job lock (``checkpoint_target``,
``run_lock``, ``take_the_run``). ``sync_metrics`` makes ``metrics.json`` agree with the metrics a
checkpoint holds.

Env vars: APPLIANCE_SHARED (the shared directory when ``--shared`` is not given; the working
directory when it does not exist) and APPLIANCE_JOB_ID (the job the run lock belongs to), both read
through ``appliance.common.knobs``. Failure modes: ``appliance.mount.LockHeld`` from
``take_the_run`` when another job holds the run; ``OSError`` from the file system.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Iterable, Optional

METRICS = "metrics.json"
N_TEST = 297


def add_training_args(p: argparse.ArgumentParser) -> None:
    """The training's own arguments, the same for every example job (same model size, data split
    and schedule, so the torch and Keras jobs compare)."""
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (split across ranks)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234)


def add_run_args(p: argparse.ArgumentParser, default_run: str) -> None:
    """The arguments that say where a run's files go (the same for every example job)."""
    p.add_argument("--run", default=default_run,
                   help="run name: checkpoints go to SHARED/models/RUN, under its job lock")
    p.add_argument("--shared", default=None,
                   help="shared directory (default: APPLIANCE_SHARED if it exists, else the working directory)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="write the checkpoint and metrics.json here instead, without the job lock ('' = none)")


def checkpoint_target(args: argparse.Namespace):
    """(directory for checkpoints or '', Layout of the shared directory whose run lock guards it, or None)."""
    from appliance.common.knobs import read
    from appliance.mount import Layout

    if args.checkpoint_dir is not None:
        return args.checkpoint_dir, None
    shared = args.shared or read("APPLIANCE_SHARED")
    layout = Layout(shared if os.path.isdir(shared) else ".")
    return layout.run_dir(args.run), layout


def load_digits_arrays(seed: int):
    """(x_train, y_train, x_test, y_test) as float32 / int64 numpy arrays; the same split on every rank."""
    import numpy as np
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    return x[N_TEST:], y[N_TEST:], x[:N_TEST], y[:N_TEST]


def run_lock(layout, run: str, tag: str):
    """The run's job lock (``appliance.mount.RunLock``), owned by this job (APPLIANCE_JOB_ID); not
    held until ``follow(True)``. Its lines go to stderr prefixed with ``tag``."""
    from appliance.common.knobs import read
    from appliance.mount import RunLock

    job = read("APPLIANCE_JOB_ID")
    return RunLock(layout, run, job, what=f"job {job or os.getpid()}",
                   say=lambda line: print(f"{tag}: {line}", file=sys.stderr, flush=True))


def take_the_run(writer, checkpoint_dir: str, names: Iterable[str]) -> None:
    """Hold the run lock in this process (rank 0 now); when it was just taken (the job's first
    rank 0, or a new one after rank 0 was lost), remove what a killed writer of ``names`` (the
    run's files) left mid-save."""
    from appliance.mount import remove_temporaries

    if writer is not None and writer.follow(True):
        for name in names:
            remove_temporaries(os.path.join(checkpoint_dir, name))


def sync_metrics(directory: str, metrics: Optional[dict], source: str = "") -> str:
    """Make ``metrics.json`` agree with ``metrics`` (a checkpoint's; ``source`` names it): write
    them, or with no metrics remove a stale file. Returns what it did ("" when they already agreed)."""
    from appliance.mount import read_json, write_json

    path = os.path.join(directory, METRICS)
    if metrics is None:
        if os.path.exists(path):
            os.unlink(path)
            return f"removed {path}: there is no checkpoint it belongs to"
        return ""
    if read_json(path) == metrics:
        return ""
    write_json(path, metrics)
    return f"rebuilt {path} from {source}"
