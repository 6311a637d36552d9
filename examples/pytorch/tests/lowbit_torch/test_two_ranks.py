"""The torch path on two GPUs, one process each:

    torchrun --nproc-per-node 2 -m pytest -q examples/pytorch/tests/lowbit_torch/test_two_ranks.py

(skipped elsewhere). The hook's all_reduce equals a reference built from the codec
functions (the same kernels, one-shot's data flow: every rank's whole tensor encoded
with key (seed, step, rank), the frames decoded and summed in rank order in fp32, times
1/P, rounded to the element type), identical on both ranks; residual feedback's state
after several steps equals the reference's; DDP and FSDP2 train with identical
parameters on both ranks."""

import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import lowbit_torch  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("WORLD_SIZE") != "2",
                                reason="needs torchrun --nproc-per-node 2")


@pytest.fixture(scope="module")
def group(ext):
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=device)
    yield dist.group.WORLD


def _gathered(t):
    """Every rank's copy of t, in rank order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def _inputs(n, dtype, rank, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(n, generator=g) * (1.0 + 0.1 * rank)
    x[::53] = 0.0
    return x.to(dtype).cuda()


def _reference(xs, bits, rounding, seed, step, dtype, residuals=None):
    """One-shot all_reduce (avg) of the ranks' inputs xs through the codec functions;
    with residuals (fp32, one per rank) the residual feedback rule, updating them."""
    acc = torch.zeros(xs[0].numel(), device=xs[0].device)
    for r, x in enumerate(xs):
        c = x if residuals is None else x.float() + residuals[r]
        f = lowbit_torch.encode(c, bits, "zero", rounding, seed=seed, step=step, rank=r)
        d = lowbit_torch.decode(f, x.numel(), bits, "zero", torch.float32)
        if residuals is not None:
            residuals[r] = c - d
        acc += d
    return (acc * (1.0 / len(xs))).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits,rounding", [(4, "nearest"), (2, "stochastic"), (8, "nearest")])
def test_all_reduce_equals_the_codec_reference_on_both_ranks(ext, group, dtype, bits, rounding):
    rank, n, seed = dist.get_rank(), 128 * 97 + 61, 5
    h = ext.AllReduce(lowbit_torch.communicator(), dtype, n, "zero", rounding, "none", True,
                      seed, 0, "one_shot")
    for step in range(3):
        x = _inputs(n, dtype, rank, seed=step)
        out = torch.empty_like(x)
        h.run(x, out, bits)
        ref = _reference(_gathered(x), bits, rounding, seed, step, dtype)
        assert torch.equal(out, ref)
        a, b = _gathered(out)
        assert torch.equal(a, b)


def test_ranks_that_disagree_get_agreement_error_and_nothing_written(ext, group):
    rank = dist.get_rank()
    h = ext.AllReduce(lowbit_torch.communicator(), torch.float32, 4096, "zero", "nearest", "none",
                      True, 0, 0, "automatic")
    n = 1000 if rank == 0 else 1020  # the same blocks, so every frame has the same size
    x = _inputs(n, torch.float32, rank)
    out = torch.full_like(x, -7.0)
    h.run(x, out, 4)  # asynchronous: the kernels find the disagreement in the headers
    torch.cuda.synchronize()
    assert torch.all(out == -7.0)
    with pytest.raises(lowbit_torch.AgreementError, match="count"):
        h.run(x, out, 4)  # the next call raises, on both ranks


def test_residual_state_equals_the_reference_after_several_steps(ext, group):
    rank, n, seed = dist.get_rank(), 128 * 40 + 3, 9
    h = ext.AllReduce(lowbit_torch.communicator(), torch.float32, n, "zero", "nearest",
                      "residual", True, seed, 0, "one_shot")
    residuals = [torch.zeros(n, device="cuda") for _ in range(2)]
    for step in range(4):
        x = _inputs(n, torch.float32, rank, seed=10 + step)
        out = torch.empty_like(x)
        h.run(x, out, 4)
        ref = _reference(_gathered(x), 4, "nearest", seed, step, torch.float32, residuals)
        assert torch.equal(out, ref)
        assert torch.equal(h.worker_state(n), residuals[rank])


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(96, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                         nn.Linear(512, 10)).cuda()


def _train(model, steps=20):
    g = torch.Generator().manual_seed(dist.get_rank())  # each rank its own data
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 96, generator=g).cuda()
        y = torch.randint(0, 10, (64,), generator=g).cuda()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_ddp_with_the_hook_keeps_both_ranks_identical(ext, group):
    ddp = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.5)
    state = lowbit_torch.DDPState(bits=4, feedback="residual", crossover=0)
    ddp.register_comm_hook(state, lowbit_torch.ddp_hook)
    losses = _train(ddp)
    assert all(torch.isfinite(torch.tensor(losses)))
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    a, b = _gathered(flat)
    assert torch.equal(a, b)
    s = state.stats()
    assert s["lowbit_calls"] >= 20 and s.get("nccl_calls", 0) == 0


def test_fsdp_with_lowbit_collectives_keeps_both_ranks_identical(ext, group,
                                                                 fully_shard_with_lowbit):
    model = _model()
    assert fully_shard_with_lowbit(model) == 4
    losses = _train(model)
    assert all(torch.isfinite(torch.tensor(losses)))
    flat = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    a, b = _gathered(flat)
    assert torch.equal(a, b)
