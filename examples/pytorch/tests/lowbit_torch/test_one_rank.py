"""The torch path on one GPU (a 1-rank NCCL process group): lowbit's 1-rank collectives
are exact copies, so DDP with the hook and FSDP2 with the custom collectives must train
bit-identically to torch's own path; bad input raises."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import lowbit_torch  # noqa: E402
from lowbit_torch import _build  # noqa: E402

# A 1-rank NCCL group is how these tests reach the torch path on one GPU; a build of the
# node backend only (LOWBIT_TORCH_BACKENDS=node) is tested by test_ranks.py instead.
pytestmark = pytest.mark.skipif("nccl" not in _build.chosen_backends(),
                                reason="the build compiles no NCCL backend "
                                       "(LOWBIT_TORCH_BACKENDS): test_ranks.py tests it")

# What the table compiles: every instance is tested.
ALL_REDUCE_DTYPES = [getattr(torch, name) for name in _build.dtypes("all_reduce")]
FSDP_DTYPES = [getattr(torch, name) for name in _build.dtypes("reduce_scatter")]


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(96, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 10))


def _batches(device, n=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 96, generator=g).to(device),
             torch.randint(0, 10, (32,), generator=g).to(device)) for _ in range(n)]


def _train(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype", ALL_REDUCE_DTYPES)
@pytest.mark.parametrize("feedback", lowbit_torch.ddp.FEEDBACK)
def test_all_reduce_on_one_rank_is_a_copy(ext, one_rank_group, dtype, feedback):
    comm = lowbit_torch.communicator()
    assert (comm.rank, comm.size) == (0, 1)
    h = ext.AllReduce(comm, dtype, 5000, "zero", "nearest", feedback, True, 0, 0, "automatic")
    x = torch.randn(5000, device="cuda").to(dtype)
    out = torch.empty_like(x)
    for bits in (1, 2, 4, 8):
        h.run(x, out, bits)
        assert torch.equal(out, x)
    y = x.clone()
    h.run(y, y, 4)  # in place
    assert torch.equal(y, x)


def test_the_gradient_grid_follows_the_width(ext, one_rank_group):
    # the measured default (docs/training.md): the full grid at 2 bits, the zero grid above
    assert lowbit_torch.DDPState(bits=2).grid == "full"
    assert lowbit_torch.DDPState(bits=4).grid == "zero"
    assert lowbit_torch.DDPState(bits=8).grid == "zero"
    assert lowbit_torch.DDPState(bits=2, grid="zero").grid == "zero"
    assert lowbit_torch.ReduceScatter(bits=2).grid == "full"
    assert lowbit_torch.ReduceScatter(bits=4).grid == "zero"


def test_ddp_hook_trains_exactly_as_ddp_on_one_rank(ext, one_rank_group):
    batches = _batches("cuda")
    reference = _train(_model().cuda(), batches)
    ddp = nn.parallel.DistributedDataParallel(_model().cuda(), bucket_cap_mb=0.25)
    state = lowbit_torch.DDPState(bits=4, feedback="residual")
    buckets = []

    def hook(s, bucket):
        buckets.append(bucket.index())
        return lowbit_torch.ddp_hook(s, bucket)

    ddp.register_comm_hook(state, hook)
    hooked = _train(ddp, batches)
    for a, b in zip(reference, hooked):
        assert torch.equal(a, b)
    stats = state.stats()
    # DDP rebuilds its buckets after the first step (one 1 MiB first bucket, then
    # 0.25 MiB ones): bucket 0 holds other parameters, and later steps have several
    # buckets; the feedback state follows the parameters (one rebuild seen).
    assert max(buckets) >= 1
    assert stats["lowbit_calls"] == len(buckets)
    assert stats.get("nccl_calls", 0) == 0
    assert stats["layout_rebuilds"] == 1


@pytest.mark.parametrize("dtype", FSDP_DTYPES)
@pytest.mark.parametrize("count", [1024, 1000])  # whole blocks, and the padded path
def test_fsdp_collectives_follow_torchs_contract(ext, one_rank_group, dtype, count):
    # FSDP2 itself skips its collectives on one rank; the classes are called directly.
    group = dist.group.WORLD
    rs = lowbit_torch.ReduceScatter(bits=4, feedback="residual")
    x = rs.allocate((count,), dtype=dtype, device=torch.device("cuda"))
    x.copy_(torch.randn(count, device="cuda"))
    out = rs.allocate((count,), dtype=dtype, device=torch.device("cuda"))
    for op in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
        out.zero_()
        assert rs(out, x, group, op) is None
        assert torch.equal(out, x)
    with pytest.raises(ValueError, match="not supported"):
        rs(out, x, group, dist.ReduceOp.MAX)
    ag = lowbit_torch.AllGather(bits=8)
    gathered = torch.zeros_like(x)
    assert ag(gathered, x, group) is None
    assert torch.equal(gathered, x)
    with pytest.raises(ValueError, match="expected 1 x"):
        ag(gathered[:-1], x, group)
    assert rs.calls == 2 and ag.calls == 1


def test_shard_collective_exposes_its_step_and_feedback_state(ext, one_rank_group):
    """ShardCollective's step (readable, settable) and feedback state, as AllReduce's: a
    reduce_scatter with the residual rule keeps max_count fp32 values (zero on one rank,
    whose call copies), loaded and zeroed through the handle; without feedback, and for
    all_gather, there is none. Not yet run on a GPU."""
    comm, n = lowbit_torch.communicator(), 1024
    empty = torch.empty(0, device="cuda")
    h = ext.ShardCollective.reduce_scatter(comm, torch.float32, n, 4, "zero", "stochastic",
                                           "residual", True, 0)
    assert h.step == 0
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    h.run(x, out)
    assert h.step == 1 and torch.equal(out, x)
    h.step = 41
    assert h.step == 41
    e = h.worker_state(n)
    assert e.dtype == torch.float32 and e.numel() == n and torch.count_nonzero(e) == 0
    assert h.replicated_state(n) is None
    want = torch.randn(n, device="cuda")
    h.load_state(want, empty, 7)
    assert torch.equal(h.worker_state(n), want) and h.step == 7
    h.reset_feedback()
    assert torch.count_nonzero(h.worker_state(n)) == 0
    with pytest.raises(ValueError, match="outside"):
        h.step = -1
    with pytest.raises(ValueError, match="max_count"):
        h.load_state(torch.zeros(n + 1, device="cuda"), empty, 0)
    none = ext.ShardCollective.reduce_scatter(comm, torch.float32, n, 4, "zero", "nearest",
                                              "none", True, 0)
    assert none.worker_state(n) is None
    with pytest.raises(ValueError, match="no such state"):
        none.load_state(want, empty, 0)
    ag = ext.ShardCollective.all_gather(comm, torch.float32, n, 8, "full", "nearest", 0)
    assert ag.worker_state(n) is None and ag.step == 0


def test_apply_fsdp_sets_every_module(ext, one_rank_group, fully_shard_with_lowbit):
    batches = _batches("cuda")
    reference = _train(_model().cuda(), batches)
    model = _model().cuda()
    assert fully_shard_with_lowbit(model) == 4
    trained = _train(model, batches)
    for a, b in zip(reference, trained):
        assert torch.equal(a, b.full_tensor())


def test_errors_are_clear(ext, one_rank_group):
    comm = lowbit_torch.communicator()
    h = ext.AllReduce(comm, torch.float32, 1000, "zero", "nearest", "none", True, 0, 0,
                      "automatic")
    x = torch.randn(1000, device="cuda")
    with pytest.raises(ValueError, match="CUDA tensor"):
        h.run(x.cpu(), x.cpu(), 4)
    with pytest.raises(TypeError, match="dtype"):
        h.run(x.half(), x.half(), 4)
    with pytest.raises(ValueError, match="max_count"):
        big = torch.randn(2000, device="cuda")
        h.run(big, big, 4)
    with pytest.raises(ValueError, match="contiguous"):
        m = torch.randn(50, 40, device="cuda").t()
        h.run(m, m, 4)
    with pytest.raises(ValueError, match="bits"):
        h.run(x, x, 3)
    with pytest.raises(ValueError, match="feedback"):
        lowbit_torch.DDPState(feedback="momentum")
    with pytest.raises(TypeError, match="float32 and bfloat16"):
        ext.ShardCollective.reduce_scatter(comm, torch.float16, 1024, 4, "zero", "nearest",
                                           "none", True, 0)
    assert issubclass(lowbit_torch.AgreementError, RuntimeError)
    # A gloo group takes the node backend (CUDA IPC between the ranks' processes): here
    # one rank, bootstrapped over the group's Store.
    gloo = dist.new_group(backend="gloo")
    assert lowbit_torch.backend_of(gloo) == "node"
    assert lowbit_torch.backend_of() == "nccl"
    node = lowbit_torch.communicator(gloo)
    assert (node.backend, node.rank, node.size) == ("node", 0, 1)
    with pytest.raises(ValueError, match="feedback on the node backend"):
        lowbit_torch.DDPState(gloo, feedback="ef21")
    h = ext.AllReduce(node, torch.float32, 1000, "zero", "nearest", "residual", True, 0, 0,
                      "automatic")
    assert h.backend == "node" and h.crossover_bytes == 0
    x = torch.randn(1000, device="cuda")
    out = torch.empty_like(x)
    h.run(x, out, 4)
    torch.cuda.synchronize()
    assert torch.equal(out, x)  # one rank: an exact copy
    assert h.last_stream == torch.cuda.current_stream().cuda_stream
