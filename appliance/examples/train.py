"""The default training job: a small real model on a small real dataset, data-parallel, elastic.

An MLP learns to read handwritten digits (scikit-learn's bundled 8x8 digits: 1,797 images,
shipped inside the scikit-learn wheel, never downloaded). Written the way a user adapts a
single-GPU script to Horovod's elastic mode: ``hvd.init()``, a ``hvd.DistributedOptimizer``, the
training state (model, optimizer, an ``ElasticSampler``, the epoch and step counters, the
metrics so far) in a ``hvd.elastic.TorchState``, and the loop in a function wrapped by
``hvd.elastic.run`` that commits the state every ``--commit-every`` steps and at the end of
every epoch; a reset callback runs after every membership change (the sampler re-partitions
itself; the learning rate is set again, unchanged: the global batch is fixed). Under a static
launch it runs once. In an elastic job (``appliance primary
--min-np``, ``appliance launch --min-np``/``--host-discovery-script``) a lost rank makes the
others restore the last commit and go on at the new size, and ranks on new hosts join at the
next commit, taking the state of rank 0; nothing committed is lost.

``--batch-size`` is the global batch, whatever the number of ranks: each step takes the next
``batch_size`` samples of the epoch's shuffled order that are not done yet (the sampler's
remaining indices), and rank r of N takes every N-th of them. The loss is summed and scaled by
N/batch_size, so the ranks' averaged gradient is the mean over the global batch however it is
split: 1 rank, N ranks and a job whose size changes follow the same trajectory (up to float
rounding). That is also why nothing is rescaled when the size changes (Horovod's examples keep
the per-rank batch and scale the learning rate with the size; here the global batch is fixed).

Rank 0 writes ``checkpoint.pt`` atomically (temporary file + rename) after every epoch, into
``<shared>/models/<run>/`` (``--shared``: default ``APPLIANCE_SHARED`` when that directory exists,
else the working directory; ``--run``: default ``digits``) while holding the run's job lock
``<shared>/locks/run-<run>.lock``: a second job on the same run stops at once (exit 3 on every
rank) with a message naming the first one's host, pid and start time; a lock whose holder is
provably dead is taken over with a line saying so. The lock belongs to the job
(``APPLIANCE_JOB_ID``), not to one process: when rank 0 changes in an elastic job, the new rank 0
takes it over at once (``appliance.mount.RunLock``) and cleans what a killed writer left
mid-save. ``--checkpoint-dir DIR`` writes into DIR instead, without the lock.

Checkpoint and metrics always agree: the metrics of every epoch so far live inside the
checkpoint, and ``metrics.json`` is derived from it (written atomically right after the
checkpoint's rename). A crash between the two renames leaves ``metrics.json`` one epoch behind;
the next start rebuilds it from the checkpoint before anything else (and removes a
``metrics.json`` that has no checkpoint). A start with a checkpoint there resumes from it (model,
optimizer, metrics, next epoch; the trajectory is the one an uninterrupted run follows);
``--fresh`` starts over instead.

Device: ``--device auto`` (the default) trains on ``cuda:<local rank>`` when torch sees a GPU
(ranks beyond the GPU count share them round-robin), else on the CPU; ``--device cpu`` forces
the CPU. The first line rank 0 prints (again after every membership change) names every rank's
device and host.

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

from appliance.examples import share


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    share.add_training_args(p)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda:<local rank> when a GPU is visible, else cpu")
    share.add_run_args(p, "digits")
    p.add_argument("--fresh", action="store_true",
                   help="start from scratch even when a checkpoint is there (default: resume from it)")
    p.add_argument("--commit-every", type=int, default=5, metavar="STEPS",
                   help="commit the elastic state every STEPS steps (and at the end of every epoch)")
    p.add_argument("--step-time", type=float, default=0.0, metavar="SECONDS",
                   help="make every step take at least this long: a stand-in for a bigger model, so that a "
                        "demo can change the cluster while it trains (default 0)")
    args = p.parse_args(argv)
    if args.commit_every < 1:
        p.error("--commit-every must be at least 1")
    if args.step_time < 0:
        p.error("--step-time must not be negative")
    return args


checkpoint_target = share.checkpoint_target


def load_digits_split(seed: int):
    """(x_train, y_train, x_test, y_test) as tensors; the same split on every rank."""
    import torch

    return tuple(torch.from_numpy(a) for a in share.load_digits_arrays(seed))


def pick_device(choice: str, hvd, torch):
    """This rank's device and a one-word description of it, pinned as Horovod users pin it."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu"), "cpu"
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device on this host")
    index = hvd.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index), f"cuda:{index} ({torch.cuda.get_device_name(index)})"


CHECKPOINT, METRICS = "checkpoint.pt", share.METRICS


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
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device, described = pick_device(args.device, hvd, torch)
    x_train, y_train, x_test, y_test = (t.to(device) for t in load_digits_split(args.seed))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Wrapped first: the DistributedOptimizer keeps state of its own, which a checkpoint restores.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # The epoch's shuffled order and which samples of it are done: re-partitioned at every size change.
    sampler = hvd.elastic.ElasticSampler(range(len(x_train)), shuffle=True, seed=args.seed)
    checkpoint_dir, layout = checkpoint_target(args)
    config = {"hidden": args.hidden, "lr": args.lr, "batch_size": args.batch_size, "seed": args.seed}

    with contextlib.ExitStack() as stack:
        writer = None
        if layout is not None:
            writer = stack.enter_context(share.run_lock(layout, args.run, "train"))
        # Rank 0 alone reads the run's state; the first sync gives every rank its values. No
        # collective before the elastic function: in an elastic job, workers that join later
        # start with its sync, as the running ones do after a reset.
        stop, first_epoch, history = None, 1, []
        if hvd.rank() == 0:
            from appliance.mount import LockHeld

            try:
                take_the_run(writer, checkpoint_dir)
                if checkpoint_dir:
                    first_epoch, history = resume(args, checkpoint_dir, model, optimizer, torch)
            except LockHeld as e:  # another job writes this run
                stop = (3, str(e))
            except ValueError as e:  # the run's checkpoint is another model's
                stop = (1, str(e))
        sampler.set_epoch(first_epoch)
        state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=first_epoch,
                                       batch=0, loss_sum=0.0, history=history, stop=stop)

        def on_reset() -> None:
            """After every membership change, before the loop runs again at the new size. The
            sampler's partition is recomputed by the state itself (its handler's reset); the
            learning rate stays: the global batch is fixed, so the size does not change the
            step (Horovod's examples, which keep the per-rank batch, scale it here)."""
            for group in optimizer.param_groups:
                group["lr"] = args.lr
            if hvd.rank() == 0:
                print(f"membership changed: {hvd.size()} rank(s) now; going on from epoch {state.epoch}, "
                      f"step {state.batch}", flush=True)

        state.register_reset_callbacks([on_reset])

        @hvd.elastic.run
        def train(state) -> int:
            """The training loop; in an elastic job it runs again after every membership change,
            from the last commit (a rank lost) or from where it stopped (hosts added or removed)."""
            if state.stop:  # rank 0 found the run unusable: every rank stops with its code
                if hvd.rank() == 0:
                    print(f"train: {state.stop[1]}", file=sys.stderr, flush=True)
                return state.stop[0]
            if writer is not None:  # rank 0 holds the run lock: a new rank 0 takes it over
                if hvd.rank() == 0:
                    take_the_run(writer, checkpoint_dir)
                else:
                    writer.follow(False)
            return train_epochs(args, hvd, torch, state, (x_train, y_train, x_test, y_test), described,
                                checkpoint_dir, config)

        code = train(state)
    hvd.shutdown()
    return code


def take_the_run(writer, checkpoint_dir: str) -> None:
    """Hold the run lock in this process (rank 0 now); see ``share.take_the_run``."""
    share.take_the_run(writer, checkpoint_dir, (CHECKPOINT, METRICS))


def resume(args, checkpoint_dir: str, model, optimizer, torch) -> tuple[int, list]:
    """Rank 0: make metrics.json agree with the checkpoint, and load the checkpoint unless
    ``--fresh``. Returns (first epoch to train, metrics of the epochs done); ``ValueError`` when
    the checkpoint is another model's."""
    checkpoint = load_checkpoint(checkpoint_dir, torch)
    note = share.sync_metrics(checkpoint_dir, checkpoint and checkpoint["metrics"],  # before anything else: agree again
                              checkpoint and f"{CHECKPOINT} (epoch {checkpoint['epoch']})")
    if note:
        print(f"train: {note}", flush=True)
    if checkpoint is None or args.fresh:
        return 1, []
    if checkpoint.get("config", {}).get("hidden") != args.hidden:
        raise ValueError(f"{os.path.join(checkpoint_dir, CHECKPOINT)} is from another model "
                         f"({checkpoint.get('config')}): use --fresh, or another --run")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    print(f"resuming from {os.path.join(checkpoint_dir, CHECKPOINT)}: epoch {checkpoint['epoch']} done", flush=True)
    return checkpoint["epoch"] + 1, list(checkpoint["metrics"]["epochs"])


def train_epochs(args, hvd, torch, state, data, described: str, checkpoint_dir: str, config: dict) -> int:
    """From ``state.epoch``/``state.batch`` to the last epoch at the current size."""
    import torch.nn.functional as F

    x_train, y_train, x_test, y_test = data
    rank, size = hvd.rank(), hvd.size()
    device = x_train.device
    where = hvd.allgather_object(f"{described}@{os.uname().nodename}", name="devices")
    batch_size = args.batch_size
    steps_per_epoch = len(x_train) // batch_size
    model, optimizer, sampler = state.model, state.optimizer, state.sampler
    # This rank's share of a global batch: the launcher's view shows samples/s from it.
    hvd.progress(samples_per_step=len(range(rank, batch_size, size)))
    if rank == 0:
        print("devices: " + ", ".join(f"rank {r} {w}" for r, w in enumerate(where)), flush=True)
        if state.epoch > args.epochs:
            print(f"nothing to train: epoch {state.epoch - 1} of {args.epochs} is done (--fresh to start over, "
                  "--epochs N for more)", flush=True)
        else:
            at = f" from epoch {state.epoch}, step {state.batch}" if state.batch or state.history else ""
            print(f"training an MLP on {len(x_train)} digits with {size} rank(s){at}, global batch {batch_size} "
                  f"(rank r takes every {size}-th sample from index r), {steps_per_epoch} steps/epoch", flush=True)
    while state.epoch <= args.epochs:
        started = time.perf_counter()
        model.train()
        # The epoch's samples not yet done (as of the last commit); step after step, the next
        # global batch of them, of which this rank takes every size-th.
        todo, done = list(sampler.remaining_indices), state.batch
        for step in range(done, steps_per_epoch):
            step_started = time.monotonic()
            batch = todo[(step - done) * batch_size:(step - done + 1) * batch_size]
            mine = torch.tensor(batch[rank::size], dtype=torch.long, device=device)
            optimizer.zero_grad()
            # Summed and scaled so that the ranks' average is the mean over the global batch,
            # however it is split: the trajectory does not depend on the number of ranks.
            loss = F.cross_entropy(model(x_train[mine]), y_train[mine], reduction="sum") * (size / batch_size)
            loss.backward()
            optimizer.step()
            state.loss_sum += hvd.allreduce(loss.detach(), name="loss").item()
            sampler.record_indices(batch)
            state.batch = step + 1
            if args.step_time:
                time.sleep(max(0.0, args.step_time - (time.monotonic() - step_started)))
            if state.batch % args.commit_every == 0 and state.batch < steps_per_epoch:
                state.commit()
        model.eval()
        with torch.no_grad():
            # Evaluation is sharded too: each rank scores a slice, the counts are summed.
            xs, ys = x_test[rank::size], y_test[rank::size]
            correct = (model(xs).argmax(dim=1) == ys).sum()
            counts = hvd.allreduce(torch.stack([correct, torch.tensor(len(ys), device=device)]), op=hvd.Sum, name="eval")
        accuracy = counts[0].item() / counts[1].item()
        train_loss = state.loss_sum / steps_per_epoch
        elapsed = time.perf_counter() - started
        state.history = state.history + [{"epoch": state.epoch, "loss": train_loss, "accuracy": accuracy,
                                          "seconds": elapsed, "size": size}]
        if rank == 0:
            print(f"epoch {state.epoch}/{args.epochs}: loss {train_loss:.4f} accuracy {accuracy:.4f} "
                  f"time {elapsed:.3f}s ranks {size}", flush=True)
            if checkpoint_dir:  # before the commit, which may move the job to a new layout
                save_epoch(checkpoint_dir, {"epoch": state.epoch, "model": model.state_dict(),
                                            "optimizer": optimizer.state_dict(), "accuracy": accuracy,
                                            "size": size, "config": config,
                                            "metrics": {"size": size, "epochs": state.history}})
        state.epoch, state.batch, state.loss_sum = state.epoch + 1, 0, 0.0
        sampler.set_epoch(state.epoch)
        state.commit()
    if rank == 0 and state.history:
        where = f"; checkpoint in {checkpoint_dir}" if checkpoint_dir else ""
        print(f"final accuracy {state.history[-1]['accuracy']:.4f} after {len(state.history)} epochs{where}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
