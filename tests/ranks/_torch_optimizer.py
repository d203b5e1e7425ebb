"""Worker body: DistributedOptimizer. P ranks with batch B/P each must end where one process
with batch B ends (computed on every rank as the reference), in every variant."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from _torch_common import check, expect_raises

B, STEPS, LR = 24, 20, 0.1


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


class _Bag(torch.nn.Module):
    """Embedding (sparse gradients) + linear head."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(20, 4, sparse=True)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, idx):
        return self.head(self.emb(idx).mean(1))


def _batch(step: int, sparse: bool):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, 20, (B, 5), generator=g) if sparse else torch.randn(B, 6, generator=g)
    return x, torch.randn(B, 3, generator=g)


def _train(model, opt, rows, passes=1, clip=None, sparse=False, dist=None):
    """``STEPS`` steps on ``rows`` of each global batch, in ``passes`` backward passes."""
    for step in range(STEPS):
        x, y = _batch(step, sparse)
        x, y = x[rows], y[rows]
        opt.zero_grad()
        for part in range(passes):
            n = x.shape[0] // passes
            sl = slice(part * n, (part + 1) * n)
            (F.mse_loss(model(x[sl]), y[sl]) / passes).backward()
        if clip is None:
            opt.step()
            continue
        if dist is not None:
            opt.synchronize()  # averaged gradients now, so clipping sees what one process would
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if dist is not None:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    return model


def _make_sgd(model, sparse):
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.0 if sparse else 0.9)


def equivalence(hvd):
    P, r = hvd.size(), hvd.rank()
    mine = slice(r * B // P, (r + 1) * B // P)
    variants = [
        ("plain", {}, {}, 1e-5),
        ("auto names", {"named_parameters": None}, {}, 1e-5),
        ("backward_passes_per_step=2", {"backward_passes_per_step": 2}, {"passes": 2}, 1e-5),
        ("fp16 compression", {"compression": hvd.Compression.fp16}, {}, 1e-3),
        ("groups=2", {"groups": 2}, {}, 1e-5),
        ("gradient_predivide_factor=2", {"gradient_predivide_factor": 2.0}, {}, 1e-5),
        ("skip_synchronize + clipping", {}, {"clip": 0.05}, 1e-5),
        ("sparse", {}, {"sparse": True}, 1e-5),
        ("sparse_as_dense", {"sparse_as_dense": True}, {"sparse": True}, 1e-5),
    ]
    errors = {}
    for label, opt_kw, train_kw, tolerance in variants:
        sparse = train_kw.get("sparse", False)
        make = _Bag if sparse else _mlp
        ref = make(100)  # one process, whole batches, from where rank 0 starts
        _train(ref, _make_sgd(ref, sparse), slice(None), clip=train_kw.get("clip"), sparse=sparse)
        model = make(100 + r)  # every rank starts elsewhere; the broadcast makes rank 0's start everyone's
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        dopt = hvd.DistributedOptimizer(_make_sgd(model, sparse),
                                        **{"named_parameters": model.named_parameters(), **opt_kw})
        assert isinstance(dopt, torch.optim.SGD) and type(dopt).__name__ == "SGD"
        hvd.broadcast_optimizer_state(dopt, root_rank=0)
        _train(model, dopt, mine, dist=dopt, **train_kw)
        errors[label] = 0.0
        for (k, got), want in zip(model.state_dict().items(), ref.state_dict().values()):
            err = (got - want).abs().max().item()
            assert err <= tolerance, (f"{label}: parameter {k} after {STEPS} steps on {P} rank(s) differs from "
                                      f"one process by {err} > {tolerance}")
            errors[label] = max(errors[label], err)
        moved = max((a - b).abs().max().item() for a, b in zip(ref.state_dict().values(),
                                                                 make(100).state_dict().values()))
        assert moved > 10 * tolerance, f"{label}: training barely moved the parameters ({moved})"
    return {"max_abs_error": errors}


def behaviour(hvd):
    P, r = hvd.size(), hvd.rank()
    model = _mlp(3)
    x, y = _batch(0, False)

    # a parameter whose gradient only rank 0 computes still gets the average (zeros elsewhere)
    extra = torch.nn.Linear(6, 3)
    torch.nn.init.constant_(extra.weight, 0.5)
    torch.nn.init.constant_(extra.bias, 0.0)
    params = list(model.named_parameters()) + [("extra." + k, v) for k, v in extra.named_parameters()]
    dopt = hvd.DistributedOptimizer(torch.optim.SGD([v for _, v in params], lr=LR), named_parameters=params)
    out = model(x) + (extra(x) if r == 0 else 0)
    F.mse_loss(out, y).backward()
    dopt.synchronize()
    probe = torch.nn.Linear(6, 3)
    probe.load_state_dict(extra.state_dict())
    F.mse_loss(_mlp(3)(x).detach() + probe(x), y).backward()
    check(extra.weight.grad, probe.weight.grad / P, "gradient computed on rank 0 only", exact=False)
    with dopt.skip_synchronize():
        dopt.step()

    # step() right after synchronize() warns (it synchronizes again), as Horovod
    dopt.zero_grad()
    F.mse_loss(model(x) + extra(x), y).backward()
    dopt.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        dopt.step()
    assert any("skip_synchronize" in str(i.message) for i in w), "step() after synchronize() warns"

    if P > 1:  # hooks exist only with more than one rank, as in Horovod
        dopt.zero_grad()
        F.mse_loss(model(x) + extra(x), y).backward()
        expect_raises(AssertionError, dopt.zero_grad, "zero_grad() between backward and step")
        e = expect_raises(Exception, lambda: F.mse_loss(model(x) + extra(x), y).backward(), "a second backward")
        assert "backward_passes_per_step" in str(e), e
        dopt.synchronize()
        dopt.zero_grad()

    named = list(model.named_parameters())
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), named_parameters=[("same", p) for _, p in named]), "dups")
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), named_parameters=named[:2]), "missing names")
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), named_parameters=[p for _, p in named]), "not tuples")
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), op=hvd.Sum, gradient_predivide_factor=2.0), "predivide+Sum")
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), backward_passes_per_step=0), "bpps=0")


CASES = {"equivalence": equivalence, "optimizer_behaviour": behaviour}
