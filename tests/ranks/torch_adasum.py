"""Rank-agnostic worker for tests/torch/test_torch_adasum.py: ``op=hvd.Adasum`` on real ranks.

Usage: torch_adasum.py. Checks ``hvd.allreduce(op=hvd.Adasum)`` (sync, async, in place,
grouped, scale factors, float16) against a torch reference of the recursive Adasum (ranks past
the largest power of 2 folded into rank r - Q first, as collectives/adasum.cc does), its two
properties (orthogonal inputs add up, equal inputs give the input), the refusals (integer
tensors, reducescatter) with the runtime usable afterwards, a joined rank (zeros), and
``DistributedOptimizer(op=hvd.Adasum)``: one step equals start + Adasum(local deltas) computed
here for every rank, parameters stay identical on all ranks, and a small regression trains.
Reports ``{"ok": true, "rank", "size", "losses": [...]}`` through ``_report``; a failed check
raises (traceback on stderr, non-zero exit).
"""
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _report import report  # noqa: E402

import appliance.torch as hvd  # noqa: E402


def rand(case: str, r: int, *shape, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{r}".encode()))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def adasum_ref(xs) -> torch.Tensor:
    xs = [x.double().flatten() for x in xs]
    P = len(xs)
    Q = 1 << (P.bit_length() - 1)
    vs = [xs[r] if r + Q >= P else pair(xs[r], xs[r + Q]) for r in range(Q)]
    while len(vs) > 1:
        vs = [pair(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0]


def close(got, want, what, tol=1e-5):
    got = got.double().flatten()
    want = want.double().flatten()
    assert torch.allclose(got, want, rtol=tol, atol=tol), f"{what}: max diff {(got - want).abs().max()}"


def collectives(P, r):
    for dt, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        for n in (0, 1, 17, 100_003):
            xs = [rand(f"ar{n}", q, n, dtype=dt) for q in range(P)]
            want = adasum_ref(xs)
            close(hvd.allreduce(xs[r], op=hvd.Adasum, name=f"ada.{dt}.{n}"), want, f"allreduce {dt} n={n}", tol)
            t = xs[r].clone()
            hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Adasum, name=f"ada_.{dt}.{n}"))
            close(t, want, f"allreduce_async_ {dt} n={n}", tol)
    # shapes are flattened; scale factors apply around Adasum as around Sum
    xs = [rand("shape", q, 3, 4) for q in range(P)]
    got = hvd.allreduce(xs[r], op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.25, name="scaled")
    assert got.shape == (3, 4)
    close(got, adasum_ref([2.0 * x for x in xs]) * 0.25, "prescale/postscale", 1e-12)
    # grouped: each tensor gets its own dot products
    groups = [[rand(f"grp{i}", q, n) for q in range(P)] for i, n in enumerate((5, 1, 300))]
    outs = hvd.grouped_allreduce([g[r] for g in groups], op=hvd.Adasum, name="grouped")
    for i, (o, g) in enumerate(zip(outs, groups)):
        close(o, adasum_ref(g), f"grouped member {i}", 1e-12)
    # float16 accumulates in float
    xs = [rand("half", q, 257, dtype=torch.float16) for q in range(P)]
    close(hvd.allreduce(xs[r], op=hvd.Adasum, name="half"), adasum_ref(xs), "float16", 5e-3)
    # properties
    n = 4 * P
    ortho = [torch.zeros(n, dtype=torch.float64) for _ in range(P)]
    for q in range(P):
        ortho[q][4 * q:4 * q + 4] = q + 1.0
    close(hvd.allreduce(ortho[r], op=hvd.Adasum, name="ortho"), sum(ortho), "orthogonal inputs add up", 1e-12)
    v = torch.linspace(-1, 2, 9, dtype=torch.float64)
    close(hvd.allreduce(v.clone(), op=hvd.Adasum, name="equal"), v, "equal inputs give the input", 1e-12)


def refusals(P, r):
    for fn, exc, what in (
            (lambda: hvd.allreduce(torch.arange(4), op=hvd.Adasum, name="int"), ValueError, "integer Adasum"),
            (lambda: hvd.reducescatter(torch.ones(2 * P), op=hvd.Adasum), hvd.HorovodInternalError,
             "reducescatter Adasum"),
            (lambda: hvd.grouped_reducescatter([torch.ones(2 * P)], op=hvd.Adasum), RuntimeError,
             "grouped reducescatter Adasum")):
        try:
            fn()
        except exc as e:
            assert "Adasum" in str(e), e
        else:
            raise AssertionError(f"{what} did not raise {exc.__name__}")
    s = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after_refusals")
    assert torch.equal(s, torch.full((3,), float(P))), s


def joined(P, r):
    # a rank that has joined contributes zeros, which Adasum leaves out (Adasum(a, 0) = a)
    xs = [rand("join", q, 33) for q in range(P)]
    if r == P - 1:
        last = hvd.join()
    else:
        got = hvd.allreduce(xs[r], op=hvd.Adasum, name="join.adasum")
        close(got, adasum_ref(xs[:-1] + [torch.zeros(33, dtype=torch.float64)]), "Adasum with a joined rank", 1e-12)
        last = hvd.join()
    assert 0 <= last < P, last


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()


def batch(step, q):
    x = rand(f"x{step}", q, 16, 6)
    w = torch.arange(1.0, 7.0, dtype=torch.float64)
    return x, (x @ w / 6.0).unsqueeze(1)


def optimizer_one_step(P, r):
    # what every rank's local SGD step would change, combined with Adasum per parameter
    lr = 0.1
    deltas = []
    for q in range(P):
        m = model()
        x, y = batch(0, q)
        torch.nn.functional.mse_loss(m(x), y).backward()
        deltas.append([-lr * p.grad for p in m.parameters()])
    m = model()
    start = [p.detach().clone() for p in m.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=lr), named_parameters=m.named_parameters(),
                                   op=hvd.Adasum)
    assert isinstance(opt, torch.optim.SGD)
    x, y = batch(0, r)
    torch.nn.functional.mse_loss(m(x), y).backward()
    try:
        opt.zero_grad()
    except AssertionError:
        pass
    else:
        raise AssertionError("zero_grad between backward and step did not raise")
    opt.step()
    for i, (p, s) in enumerate(zip(m.parameters(), start)):
        want = s.flatten() + adasum_ref([d[i] for d in deltas])
        close(p.detach(), want, f"parameter {i} after one Adasum step", 1e-10)
    try:
        with opt.skip_synchronize():
            pass
    except AssertionError:
        pass
    else:
        raise AssertionError("skip_synchronize did not raise")


def optimizer_trains(P, r):
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=0.02), named_parameters=m.named_parameters(),
                                   op=hvd.Adasum, backward_passes_per_step=2)
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    losses = []
    for step in range(40):
        opt.zero_grad()
        total = 0.0
        for half in range(2):
            x, y = batch(step * 2 + half, r)
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            total += float(loss)
        opt.step()
        losses.append(total / 2)
    flat = torch.cat([p.detach().flatten() for p in m.parameters()])
    every = hvd.allgather(flat.unsqueeze(0))
    for q in range(P):
        assert torch.equal(every[q], flat), f"parameters differ between rank {r} and rank {q}"
    assert losses[-1] < 0.5 * losses[0], losses
    return losses


def main() -> None:
    hvd.init()
    P, r = hvd.size(), hvd.rank()
    data = {"ok": False, "rank": r, "size": P}
    try:
        collectives(P, r)
        refusals(P, r)
        joined(P, r)
        optimizer_one_step(P, r)
        data["losses"] = optimizer_trains(P, r)
        data["ok"] = True
    finally:
        if os.environ.get("APPLIANCE_TEST_OUT"):
            report(data)
        hvd.shutdown()


if __name__ == "__main__":
    main()
