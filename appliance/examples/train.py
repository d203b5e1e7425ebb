"""The default training job: a small real model on a small real dataset, data-parallel.

An MLP learns to read handwritten digits (scikit-learn's bundled 8x8 digits: 1,797 images,
shipped inside the scikit-learn wheel, never downloaded). Written the way a user adapts a
single-GPU script with Horovod's few lines: ``hvd.init()``, shard the data by rank, broadcast
the initial state from rank 0, wrap the optimizer in ``hvd.DistributedOptimizer``, and let
rank 0 print and checkpoint.

``--batch-size`` is the global batch; each rank takes ``batch_size / size`` of it, so 1 rank
with batch B and N ranks with B/N each follow the same trajectory. Rank 0 writes
``checkpoint.pt`` atomically (temporary file + rename) after every epoch, into
``<shared>/models/<run>/`` (``--shared``: default ``APPLIANCE_SHARED`` when that directory exists,
else the working directory; ``--run``: default ``digits``) while holding the run's job lock
``<shared>/locks/run-<run>.lock``: a second job on the same run stops at once with a message
naming the first one's host, pid and start time; a lock whose holder is provably dead is taken
over with a line saying so. ``--checkpoint-dir DIR`` writes into DIR instead, without the lock.

Checkpoint and metrics always agree: the metrics of every epoch so far live inside the
checkpoint, and ``metrics.json`` is derived from it (written atomically right after the
checkpoint's rename). A crash between the two renames leaves ``metrics.json`` one epoch behind;
the next start rebuilds it from the checkpoint before anything else (and removes a
``metrics.json`` that has no checkpoint). A start with a checkpoint there resumes from it (model,
optimizer, metrics, next epoch; the trajectory is the one an uninterrupted run follows);
``--fresh`` starts over instead.

Device: ``--device auto`` (the default) trains on ``cuda:<local rank>`` when torch sees a GPU
(ranks beyond the GPU count share them round-robin), else on the CPU; ``--device cpu`` forces
the CPU. The first line rank 0 prints names every rank's device.

Run: ``appliance launch -np 2 -H localhost:2 -- python -m appliance.examples.train``
(or on its own: ``python -m appliance.examples.train``, a single rank).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (split across ranks)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda:<local rank> when a GPU is visible, else cpu")
    p.add_argument("--run", default="digits", help="run name: checkpoints go to SHARED/models/RUN, under its job lock")
    p.add_argument("--shared", default=None,
                   help="shared directory (default: APPLIANCE_SHARED if it exists, else the working directory)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="write checkpoint.pt and metrics.json here instead, without the job lock ('' = none)")
    p.add_argument("--fresh", action="store_true",
                   help="start from scratch even when a checkpoint is there (default: resume from it)")
    return p.parse_args(argv)


def checkpoint_target(args: argparse.Namespace):
    """(directory for checkpoints or '', Layout of the shared directory whose run lock guards it, or None)."""
    from appliance.mount import Layout
    from appliance.common.knobs import read

    if args.checkpoint_dir is not None:
        return args.checkpoint_dir, None
    shared = args.shared or read("APPLIANCE_SHARED")
    layout = Layout(shared if os.path.isdir(shared) else ".")
    return layout.run_dir(args.run), layout


def load_digits_split(seed: int):
    """(x_train, y_train, x_test, y_test) as tensors; the same split on every rank."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = 297
    return (torch.from_numpy(x[n_test:]), torch.from_numpy(y[n_test:]),
            torch.from_numpy(x[:n_test]), torch.from_numpy(y[:n_test]))


def pick_device(choice: str, hvd, torch):
    """This rank's device and a one-word description of it, pinned as Horovod users pin it."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu"), "cpu"
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device on this host")
    index = hvd.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index), f"cuda:{index} ({torch.cuda.get_device_name(index)})"


CHECKPOINT, METRICS = "checkpoint.pt", "metrics.json"


def save_atomically(obj, path: str) -> None:
    """torch.save into a temporary file, fsync, rename over ``path``: never a torn checkpoint."""
    import torch

    from appliance.mount import save_atomically as save

    save(lambda f: torch.save(obj, f), path)


def load_checkpoint(directory: str, torch):
    """The checkpoint in ``directory`` (a dict holding its own ``metrics``), or None when there is
    none, or it is from before metrics lived inside it."""
    path = os.path.join(directory, CHECKPOINT)
    if not directory or not os.path.exists(path):
        return None
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return checkpoint if isinstance(checkpoint.get("metrics"), dict) else None


def sync_metrics(directory: str, checkpoint) -> str:
    """Make ``metrics.json`` agree with the checkpoint (derive it; with no checkpoint, remove a
    stale one). Returns what it did ("" when they already agreed)."""
    from appliance.mount import read_json, write_json

    path = os.path.join(directory, METRICS)
    if checkpoint is None:
        if os.path.exists(path):
            os.unlink(path)
            return f"removed {path}: there is no checkpoint it belongs to"
        return ""
    if read_json(path) == checkpoint["metrics"]:
        return ""
    write_json(path, checkpoint["metrics"])
    return f"rebuilt {path} from {CHECKPOINT} (epoch {checkpoint['epoch']})"


def save_epoch(directory: str, checkpoint) -> None:
    """The checkpoint first (atomic rename), then ``metrics.json`` derived from it (atomic)."""
    from appliance.mount import write_json

    os.makedirs(directory, exist_ok=True)
    save_atomically(checkpoint, os.path.join(directory, CHECKPOINT))
    write_json(os.path.join(directory, METRICS), checkpoint["metrics"])


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    import appliance.torch as hvd

    # SIGTERM (how the launcher stops ranks) unwinds like an exception, so the run lock is
    # released and no temporary checkpoint is left behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    hvd.init()
    checkpoint_dir, layout = checkpoint_target(args)
    with contextlib.ExitStack() as stack:
        if hvd.rank() == 0 and layout is not None:
            from appliance.common.knobs import read
            from appliance.mount import LockHeld, remove_temporaries, run_lock

            def say(line: str) -> None:
                print(f"train: {line}", file=sys.stderr, flush=True)

            try:
                stack.enter_context(run_lock(layout, args.run, what=f"job {read('APPLIANCE_JOB_ID') or os.getpid()}",
                                             say=say))
            except LockHeld as e:
                print(f"train: {e}", file=sys.stderr, flush=True)
                return 3
            for name in (CHECKPOINT, METRICS):  # ours alone now: what a killed writer left goes
                remove_temporaries(os.path.join(checkpoint_dir, name))
        return train(args, hvd, torch, checkpoint_dir)


def train(args, hvd, torch, checkpoint_dir: str) -> int:
    import torch.nn.functional as F

    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    device, described = pick_device(args.device, hvd, torch)
    where = hvd.allgather_object(f"{described}@{os.uname().nodename}", name="devices")
    if rank == 0:
        print("devices: " + ", ".join(f"rank {r} {w}" for r, w in enumerate(where)), flush=True)
    x_train, y_train, x_test, y_test = (t.to(device) for t in load_digits_split(args.seed))
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {size} ranks")
    local_batch = args.batch_size // size
    steps_per_epoch = len(x_train) // args.batch_size

    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Wrapped first: the DistributedOptimizer keeps state of its own, which a checkpoint restores.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    config = {"hidden": args.hidden, "lr": args.lr, "batch_size": args.batch_size, "seed": args.seed}
    metrics = {"size": size, "epochs": []}
    first_epoch = 1
    if rank == 0 and checkpoint_dir:
        checkpoint = load_checkpoint(checkpoint_dir, torch)
        note = sync_metrics(checkpoint_dir, checkpoint)  # before anything else: agree again
        if note:
            print(f"train: {note}", flush=True)
        if checkpoint is not None and not args.fresh:
            if checkpoint.get("config", {}).get("hidden") != args.hidden:
                raise SystemExit(f"train: {os.path.join(checkpoint_dir, CHECKPOINT)} is from another model "
                                 f"({checkpoint.get('config')}): use --fresh, or another --run")
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            metrics = {"size": size, "epochs": list(checkpoint["metrics"]["epochs"])}
            first_epoch = checkpoint["epoch"] + 1
            print(f"resuming from {os.path.join(checkpoint_dir, CHECKPOINT)}: epoch {checkpoint['epoch']} done", flush=True)
    first_epoch = hvd.broadcast_object(first_epoch, root_rank=0, name="first_epoch")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    if rank == 0 and first_epoch > args.epochs:
        print(f"nothing to train: epoch {first_epoch - 1} of {args.epochs} is done (--fresh to start over, "
              "--epochs N for more)", flush=True)
    elif rank == 0:
        print(f"training an MLP on {len(x_train)} digits with {size} rank(s), "
              f"global batch {args.batch_size} ({local_batch} per rank), {steps_per_epoch} steps/epoch", flush=True)
    for epoch in range(first_epoch, args.epochs + 1):
        started = time.perf_counter()
        model.train()
        # The same permutation everywhere; each rank takes its slice of every global batch.
        perm = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(args.seed + epoch)).to(device)
        total_loss = torch.zeros((), device=device)
        for step in range(steps_per_epoch):
            batch = perm[step * args.batch_size:(step + 1) * args.batch_size]
            mine = batch[rank * local_batch:(rank + 1) * local_batch]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[mine]), y_train[mine])
            loss.backward()
            optimizer.step()
            total_loss += loss.detach()
        train_loss = hvd.allreduce(total_loss / steps_per_epoch, name="train_loss").item()
        model.eval()
        with torch.no_grad():
            # Evaluation is sharded too: each rank scores a slice, the counts are summed.
            xs, ys = x_test[rank::size], y_test[rank::size]
            correct = (model(xs).argmax(dim=1) == ys).sum()
            counts = hvd.allreduce(torch.stack([correct, torch.tensor(len(ys), device=device)]), op=hvd.Sum, name="eval")
        accuracy = counts[0].item() / counts[1].item()
        elapsed = time.perf_counter() - started
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}: loss {train_loss:.4f} accuracy {accuracy:.4f} "
                  f"time {elapsed:.3f}s", flush=True)
            metrics["epochs"].append({"epoch": epoch, "loss": train_loss, "accuracy": accuracy, "seconds": elapsed,
                                      "size": size})
            if checkpoint_dir:
                save_epoch(checkpoint_dir, {"epoch": epoch, "model": model.state_dict(),
                                            "optimizer": optimizer.state_dict(), "accuracy": accuracy,
                                            "size": size, "config": config, "metrics": metrics})
    if rank == 0 and metrics["epochs"]:
        where = f"; checkpoint in {checkpoint_dir}" if checkpoint_dir else ""
        print(f"final accuracy {metrics['epochs'][-1]['accuracy']:.4f} after {len(metrics['epochs'])} epochs{where}",
              flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
