"""Rank program of the elastic fault soak (``benchmarks/elastic_soak.py``): a small PyTorch model
trained the elastic way (``hvd.elastic.run``, ``TorchState`` with the model, a momentum optimizer
under ``DistributedOptimizer``, the step and the sizes every committed step ran at), logging every
step with a checksum of its state, so the soak can tell whether a recovery resumed from a commit.

Step s of rank r trains on a batch drawn from seed 1000·s + r, so the committed training is a pure
function of the sizes the steps ran at: ``replay(sizes)`` recomputes it in one process. The
checksum (``digest``) is a SHA-1 of the parameters' and momentum buffers' bytes: every rank of a
round holds the same bytes after a step, and a restored state has the bytes of the commit it
came from.

Usage: elastic_soak.py OUT STEP_S COMMIT. Runs until ``OUT/stop`` names a step (the job ends after
it, every worker at the same step). Each worker W (APPLIANCE_ELASTIC_WORKER) appends JSON lines
to ``OUT/log.W``, each with the driver's round number: ``born`` (pid, hostname, its own start:
process start to imports done), ``start`` (each entry into the training function after a sync:
rank, size, step, digest), ``step`` (rank, size, step, digest, ``commit`` true when it committed
after this step) and ``done``; rank 0 of the last round writes ``OUT/result.json`` (sizes, parameters).
"""
import hashlib
import json
import os
import socket
import sys
import time

T_IMPORT = time.time()
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by file (the soak's checks)
from elastic_torch import batch, model_and_optimizer, replay  # noqa: E402,F401  (the same model, data and replay)


def digest(model, opt) -> str:
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
        buf = opt.state.get(p, {}).get("momentum_buffer")
        h.update(b"-" if buf is None else buf.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def own_start() -> float:
    """Seconds from this process's start (the kernel's start time) to now."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


def main():
    out, step_s, commit = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    wid = int(os.environ.get("APPLIANCE_ELASTIC_WORKER", "0"))
    log = open(os.path.join(out, f"log.{wid}"), "a", buffering=1)

    import appliance.torch as hvd
    from appliance.runtime import elastic as session_of

    def round_no():
        s = session_of.current()
        return int(s.round.get("round", -1)) if s is not None and s.round else -1

    def emit(ev, **kw):
        log.write(json.dumps({"ev": ev, "w": wid, "t": time.time(), "round": round_no(), **kw}) + "\n")

    emit("born", pid=os.getpid(), host=socket.gethostname(), own_start=own_start())
    hvd.init()
    model, opt = model_and_optimizer()
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0, sizes=[])
    stop_file = os.path.join(out, "stop")

    def stop_at():
        try:
            with open(stop_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    @hvd.elastic.run
    def train(state):
        emit("start", rank=hvd.rank(), size=hvd.size(), step=state.step, sum=digest(model, opt))
        while True:
            end = stop_at()
            if end is not None and state.step >= end:
                return
            step = state.step + 1
            x, y = batch(step, hvd.rank())
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            state.sizes = state.sizes + [hvd.size()]
            state.step = step
            committing = step % commit == 0
            emit("step", rank=hvd.rank(), size=hvd.size(), step=step, sum=digest(model, opt), commit=committing)
            if committing:
                state.commit()
            time.sleep(step_s)

    train(state)
    emit("done", rank=hvd.rank(), size=hvd.size(), step=state.step)
    if hvd.rank() == 0:
        tmp = os.path.join(out, ".result.json.tmp")
        with open(tmp, "w") as f:
            json.dump({"sizes": state.sizes, "step": state.step,
                       "params": [p.detach().flatten().tolist() for p in model.parameters()]}, f)
        os.replace(tmp, os.path.join(out, "result.json"))
    hvd.shutdown()


if __name__ == "__main__":
    main()
