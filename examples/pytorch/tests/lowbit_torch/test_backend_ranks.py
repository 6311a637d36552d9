"""The ``lowbit`` torch.distributed backend on P real ranks, one process each, under torchrun:

    torchrun --nproc-per-node P -m pytest -q \
        examples/pytorch/tests/lowbit_torch/test_backend_ranks.py

(skipped elsewhere). The world group is ``init_process_group("cpu:gloo,cuda:lowbit")``
after ``lowbit_torch.init(bits=8, crossover=4096)``. With a GPU per rank the backend's
inner group is NCCL's and lowbit borrows its communicator; with fewer GPUs (one GPU: rank r
on cuda:r % device_count) the inner group is gloo and lowbit runs its node backend.

- Calls the backend forwards (small tensors, MAX/MIN, integer and float64 dtypes,
  broadcast, list all-gathers, barrier, and what the inner backend may or may not
  support: the same result, or the same error, as a plain group of the inner's kind) are
  exact, and none of them takes the lowbit path.
- all_reduce (SUM, AVG), reduce_scatter_tensor and all_gather_into_tensor through lowbit
  equal references built from the codec functions (all_reduce: at P = 2, where lowbit's
  automatic algorithm is one_shot; on more ranks it is two_phase, checked near the exact
  result), identical on every rank where every rank gets the same values.
- Work: wait() orders the caller's stream after the collective; the future holds the output.
- A DDP model with no comm hook: the first step's gradient equals the codec reference
  (P = 2), parameters stay identical on every rank.
- Residual feedback on a group of its own (pg_options): per tensor, equal to the reference."""

import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import lowbit_torch  # noqa: E402
from lowbit_torch import backend  # noqa: E402
from lowbit_torch.codec import whole_blocks  # noqa: E402

WORLD = int(os.environ.get("WORLD_SIZE", "1"))
CROSSOVER = 4096  # bytes: the world group's; smaller tensors are forwarded
BITS = 8

pytestmark = pytest.mark.skipif(WORLD < 2, reason="needs torchrun --nproc-per-node P, P >= 2")


@pytest.fixture(scope="module")
def world(ext):
    """The world group on the lowbit backend; yields the inner backend's kind."""
    local = int(os.environ["LOCAL_RANK"])
    ngpu = torch.cuda.device_count()
    torch.cuda.set_device(torch.device("cuda", local % ngpu))
    lowbit_torch.init(bits=BITS, crossover=CROSSOVER)
    if not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:lowbit")
    kind = "gloo" if ngpu < WORLD else "nccl"
    assert backend.stats()["lowbit_backend"] == ("node" if kind == "gloo" else "nccl")
    if dist.get_rank() == 0:
        print(f"\n[test_backend_ranks] P={WORLD} inner={kind} GPUs={ngpu}")
    yield kind


@pytest.fixture(scope="module")
def reference(world):
    """A plain group of the inner backend's kind: what a forwarded call must match."""
    return dist.new_group(backend=world)


def _gathered(t):
    """Every rank's copy of t, in rank order (through the CPU gloo half)."""
    host = t.detach().contiguous().cpu()
    parts = [torch.empty_like(host) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, host)
    return [p.to(t.device) for p in parts]


def _all_same(t):
    parts = _gathered(t)
    return all(torch.equal(parts[0], p) for p in parts[1:])


def _ints(n, dtype, seed=0):
    """Integer values (sums are exact in any order), this rank's own."""
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    return torch.randint(-50, 50, (n,), generator=g).to(dtype).cuda()


def _normal(n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    x = torch.randn(n, generator=g) * (1.0 + 0.1 * dist.get_rank())
    x[::53] = 0.0
    return x.to(dtype).cuda()


def _codec(x, grid, bits=BITS):
    """x through the codec (nearest rounding: no key), as fp32."""
    f = lowbit_torch.encode(x.contiguous(), bits, grid, "nearest")
    return lowbit_torch.decode(f, x.numel(), bits, grid, torch.float32)


def _sum_reference(xs, average, dtype, grid="zero"):
    """One-shot all-reduce of xs: every rank's tensor through the codec, summed in rank
    order in fp32, times 1/P for avg, rounded once."""
    acc = torch.zeros(xs[0].numel(), device=xs[0].device)
    for x in xs:
        acc += _codec(x, grid)
    return (acc * (1.0 / len(xs)) if average else acc).to(dtype)


def _delta(before, key):
    return backend.stats()[key] - before[key]


def _like_reference(reference, call, make):
    """call(tensor, group) on the world group and on `reference`: the same tensor after,
    or the same exception type. Returns the world group's tensor (None if it raised)."""
    def run(group):
        t = make()
        try:
            call(t, group)
            torch.cuda.synchronize()
            return t, None
        except (RuntimeError, ValueError, NotImplementedError) as e:
            return None, type(e)

    got, got_error = run(None)
    want, want_error = run(reference)
    assert got_error == want_error, (got_error, want_error)
    if got is not None:
        flat = (lambda x: torch.cat([t.reshape(-1) for t in x]) if isinstance(x, list) else x)
        assert torch.equal(flat(got), flat(want))
    return got


# ----------------------------------------------------------------------- forwarded

def test_forwarded_calls_are_exact_and_leave_the_lowbit_path_alone(world, reference):
    rank, P = dist.get_rank(), WORLD
    before = backend.stats()
    small = _ints(1000, torch.float32)  # 4000 bytes: under the crossover
    y = small.clone()
    dist.all_reduce(y)
    assert torch.equal(y, torch.stack(_gathered(small)).sum(0))
    big = _ints(20000, torch.float32, seed=1)
    stacked = torch.stack(_gathered(big))
    for op, want in ((dist.ReduceOp.MAX, stacked.max(0).values),
                     (dist.ReduceOp.MIN, stacked.min(0).values)):
        y = big.clone()
        dist.all_reduce(y, op=op)
        assert torch.equal(y, want), op
    for dtype in (torch.int64, torch.float64, torch.int32):  # dtypes lowbit does not take
        x = _ints(20000, dtype, seed=2)
        y = x.clone()
        dist.all_reduce(y)
        assert torch.equal(y, torch.stack(_gathered(x)).sum(0).to(dtype)), dtype
    y = big.clone()
    dist.broadcast(y, src=P - 1)
    assert torch.equal(y, _gathered(big)[P - 1])
    parts = [torch.empty_like(big) for _ in range(P)]
    dist.all_gather(parts, big)
    assert all(torch.equal(p, q) for p, q in zip(parts, _gathered(big)))
    dist.barrier()
    # What the inner backend may not take for CUDA tensors (gloo): as a plain group does.
    chunk = 100  # 400 bytes per rank: under the crossover
    _like_reference(reference, lambda t, g: dist.all_gather_into_tensor(
        t, _ints(chunk, torch.float32, seed=3), group=g), lambda: torch.empty(chunk * P).cuda())
    _like_reference(reference, lambda t, g: dist.reduce_scatter_tensor(
        t, _ints(chunk * P, torch.float32, seed=4), group=g), lambda: torch.empty(chunk).cuda())
    _like_reference(reference, lambda t, g: dist.all_to_all_single(
        t, _ints(chunk * P, torch.float32, seed=5), group=g), lambda: torch.empty(chunk * P).cuda())
    _like_reference(reference, lambda t, g: (dist.reduce(t, dst=0, group=g),
                                             rank != 0 and t.zero_()),  # the root's alone
                    lambda: _ints(chunk, torch.float32, seed=6))
    _like_reference(reference, lambda t, g: dist.all_reduce(
        t, op=dist.ReduceOp.PRODUCT, group=g), lambda: _ints(chunk, torch.float32, seed=7) % 3)
    # an all-gather into a tensor whose slice is the input: forwarded whatever its size
    mine = slice(20000 * rank, 20000 * (rank + 1))

    def aliased():
        out = torch.zeros(20000 * P, device="cuda")
        out[mine] = big
        return out

    out = _like_reference(reference, lambda t, g: dist.all_gather_into_tensor(t, t[mine], group=g),
                          aliased)
    if out is not None:
        assert torch.equal(out, torch.cat(_gathered(big)))
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert _delta(before, f"lowbit_{op}") == 0, op
    assert _delta(before, "forwarded_all_reduce") >= 6
    assert _delta(before, "forwarded_other") >= 2  # broadcast, all_gather


# ------------------------------------------------------------------- the lowbit path

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_all_reduce_through_lowbit_equals_the_codec_reference(world, dtype, op):
    reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.AVG
    n = 128 * 97 + 61
    before = backend.stats()
    for step in range(3):
        x = _normal(n, dtype, seed=10 + step)
        y = x.clone()
        dist.all_reduce(y, op=reduce_op)
        xs = _gathered(x)
        assert _all_same(y)
        if WORLD == 2:
            assert torch.equal(y, _sum_reference(xs, op == "avg", dtype))
        else:
            exact = torch.stack([t.float() for t in xs]).sum(0) / (WORLD if op == "avg" else 1)
            assert (y.float() - exact).norm() < 0.03 * exact.norm()
    assert _delta(before, "lowbit_all_reduce") == 3
    assert _delta(before, "forwarded_all_reduce") == 0


def test_an_async_all_reduce_orders_the_callers_stream_and_its_future_holds_the_output(world):
    n = 1 << 22
    x = _normal(n, seed=20)
    y = x.clone()
    work = dist.all_reduce(y, async_op=True)
    work.wait()  # the caller's stream waits for the collective: no host wait
    z = y * 1.0  # enqueued on the caller's stream after the wait
    out = work.get_future().wait()
    torch.cuda.synchronize()
    assert work.is_completed()
    assert torch.equal(z, y) and not torch.equal(y, x)
    assert out[0].data_ptr() == y.data_ptr() and torch.equal(out[0], y)
    assert _all_same(y)


@pytest.mark.parametrize("chunk", [1024, 1000])  # whole blocks, and padded
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce_scatter_through_lowbit_equals_the_codec_reference(world, chunk, op):
    rank, P = dist.get_rank(), WORLD
    before = backend.stats()
    x = _normal(chunk * P, seed=30)
    out = torch.empty(chunk, device="cuda")
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.AVG)
    padded = whole_blocks(chunk)
    acc = torch.zeros(padded, device="cuda")
    for xr in _gathered(x):  # each rank's chunks, zero-padded to whole blocks
        p = torch.zeros(P, padded, device="cuda")
        p[:, :chunk] = xr.view(P, chunk)
        acc += _codec(p.view(-1), "zero").view(P, padded)[rank]
    want = (acc * (1.0 / P) if op == "avg" else acc)[:chunk]
    assert torch.equal(out, want)
    assert _delta(before, "lowbit_reduce_scatter") == 1


@pytest.mark.parametrize("chunk", [1024, 1000])
def test_all_gather_through_lowbit_equals_the_codec_reference(world, chunk):
    P = WORLD
    before = backend.stats()
    x = _normal(chunk, seed=40)
    out = torch.empty(chunk * P, device="cuda")
    dist.all_gather_into_tensor(out, x)
    padded = whole_blocks(chunk)
    want = []
    for xr in _gathered(x):
        p = torch.zeros(padded, device="cuda")
        p[:chunk] = xr
        want.append(_codec(p, "full")[:chunk])
    assert torch.equal(out, torch.cat(want))
    assert _all_same(out)
    assert _delta(before, "lowbit_all_gather") == 1


# ---------------------------------------------------------------------------- DDP

class _OneParam(nn.Module):
    """One weight: DDP's one bucket is exactly its gradient."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(40, 96) * 0.1)

    def forward(self, x):
        return x @ self.w.t()


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(96, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                                  nn.Linear(256, 10))

    def forward(self, x):
        return self.body(x)


def _batch(step, classes):
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + step)  # each rank its own
    return (torch.randn(32, 96, generator=g).cuda(),
            torch.randint(0, classes, (32,), generator=g).cuda())


def test_ddp_without_a_hook_averages_through_lowbit(world):
    """DDP scales each bucket by 1/P, then all-reduces it (SUM) through the backend."""
    torch.manual_seed(0)
    net = _OneParam().cuda()
    x, y = _batch(0, 40)
    nn.functional.cross_entropy(net(x), y).backward()
    local = net.w.grad.detach().clone().reshape(-1)
    net.zero_grad()
    before = backend.stats()
    ddp = nn.parallel.DistributedDataParallel(net, device_ids=[torch.cuda.current_device()])
    nn.functional.cross_entropy(ddp(x), y).backward()
    got = net.w.grad.detach().reshape(-1)
    scaled = [g * (1.0 / WORLD) for g in _gathered(local)]
    mean = torch.stack(scaled).sum(0)
    assert _all_same(got)
    assert (local - mean).norm() > 0.2 * mean.norm()  # the ranks' gradients do differ
    if WORLD == 2:
        assert torch.equal(got, _sum_reference(scaled, False, torch.float32))
    else:
        assert (got - mean).norm() < 0.03 * mean.norm()
    assert _delta(before, "lowbit_all_reduce") >= 1


def test_ddp_without_a_hook_trains_identically_on_every_rank(world):
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(_Net().cuda(),
                                              device_ids=[torch.cuda.current_device()],
                                              bucket_cap_mb=0.25)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    before = backend.stats()
    steps = 5
    for step in range(steps):
        opt.zero_grad()
        x, y = _batch(step, 10)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    assert torch.isfinite(flat).all()
    assert _all_same(flat)
    assert _delta(before, "lowbit_all_reduce") >= steps


# ---------------------------------------------------- feedback, on a group of its own

def test_residual_feedback_is_kept_per_tensor(world):
    opts = lowbit_torch.BackendOptions(bits=4, feedback="residual", crossover=0)
    group = dist.new_group(backend="lowbit", pg_options=opts)
    n = 128 * 40 + 3
    a = torch.empty(n, device="cuda")  # one tensor, reused step after step (as DDP's buckets)
    residuals = [torch.zeros(n, device="cuda") for _ in range(WORLD)]
    for step in range(4):
        x = _normal(n, seed=50 + step)
        a.copy_(x)
        dist.all_reduce(a, group=group)
        xs = _gathered(x)
        assert _all_same(a)
        if WORLD == 2:  # one_shot: c = x + e; send Q(c); e = c - D(Q(c))
            acc = torch.zeros(n, device="cuda")
            for r, xr in enumerate(xs):
                c = xr + residuals[r]
                d = _codec(c, "zero", bits=4)
                residuals[r] = c - d
                acc += d
            assert torch.equal(a, acc), step
    b = torch.empty(2 * n, device="cuda")
    b.copy_(_normal(2 * n, seed=60))
    dist.all_reduce(b, group=group)
    s = backend.stats(group)
    assert s["feedback_tensors"] == 2 and s["built_all_reduce"] == 2
    assert s["lowbit_all_reduce"] == 5
