"""The torch path on P real ranks, one process each, under torchrun:

    torchrun --nproc-per-node P -m pytest -q examples/pytorch/tests/lowbit_torch/test_ranks.py

(skipped elsewhere). Where the machine has a GPU per rank the group is NCCL's and lowbit
borrows its communicator; where it has fewer (one GPU, P = 2, 3, 4, 8: rank r on
cuda:r % device_count) the group is gloo and lowbit runs its node backend (CUDA IPC
between the processes; NCCL refuses two ranks on one GPU). LOWBIT_TEST_BACKEND=gloo or
nccl forces the choice.

- The all_reduce equals a reference built from the codec functions (the same kernels,
  one-shot's data flow: every rank's whole tensor encoded with key (seed, step, rank), the
  frames decoded and summed in rank order in fp32, times 1/P, rounded to the element
  type), identical on every rank; residual feedback's state after several steps equals
  the reference's.
- DDP with the hook (bucket rebuild, static_graph=True, find_unused_parameters=True,
  no_sync gradient accumulation, autocast): every rank ends with identical parameters,
  and the first step's gradients are the ranks' mean within the codec's error (far from
  any one rank's own, so a hook that exchanged nothing fails).
- A DDPState's state_dict() resumes a run bit-identically (and a fresh state does not).
- DDP with a QSync plan's widths (4, 8 and 32 bits on different layers): each bucket at
  the widest planned bits of its parameters, identical parameters on every rank.
- The hook's collectives run on the hook's stream, never the caller's, and the caller's
  stream is not made to wait for them.
- FSDP2 with lowbit's collectives: identical parameters on every rank; the reduce-scatter's
  feedback (none, shard, residual) equal to a codec reference, the default's state the
  size of the shard, and a run resumed from fsdp_state_dict() bit-identical."""

import functools
import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import lowbit_torch  # noqa: E402

WORLD = int(os.environ.get("WORLD_SIZE", "1"))

pytestmark = pytest.mark.skipif(WORLD < 2, reason="needs torchrun --nproc-per-node P, P >= 2")


@pytest.fixture(scope="module")
def group(ext):
    local = int(os.environ["LOCAL_RANK"])
    ngpu = torch.cuda.device_count()
    device = torch.device("cuda", local % ngpu)
    torch.cuda.set_device(device)
    backend = os.environ.get("LOWBIT_TEST_BACKEND") or ("nccl" if ngpu >= WORLD else "gloo")
    if not dist.is_initialized():
        if backend == "nccl":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    want = "nccl" if backend == "nccl" else "node"
    assert lowbit_torch.backend_of() == want
    if dist.get_rank() == 0:
        print(f"\n[test_ranks] P={WORLD} group={backend} lowbit backend={want} GPUs={ngpu}")
    yield dist.group.WORLD


def _gathered(t):
    """Every rank's copy of t, in rank order (through the host: gloo or NCCL alike)."""
    host = t.detach().contiguous().cpu()
    parts = [torch.empty_like(host) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, host)
    return [p.to(t.device) for p in parts]


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


def _all_same(t):
    parts = _gathered(t)
    return all(torch.equal(parts[0], p) for p in parts[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits,rounding", [(4, "nearest"), (2, "stochastic"), (8, "nearest")])
def test_all_reduce_equals_the_codec_reference_on_every_rank(ext, group, dtype, bits, rounding):
    rank, n, seed = dist.get_rank(), 128 * 97 + 61, 5
    h = ext.AllReduce(lowbit_torch.communicator(), dtype, n, "zero", rounding, "none", True,
                      seed, 0, "one_shot")
    for step in range(3):
        x = _inputs(n, dtype, rank, seed=step)
        out = torch.empty_like(x)
        h.run(x, out, bits)
        ref = _reference(_gathered(x), bits, rounding, seed, step, dtype)
        assert torch.equal(out, ref)
        assert _all_same(out)


def test_residual_state_equals_the_reference_after_several_steps(ext, group):
    rank, n, seed = dist.get_rank(), 128 * 40 + 3, 9
    h = ext.AllReduce(lowbit_torch.communicator(), torch.float32, n, "zero", "nearest",
                      "residual", True, seed, 0, "one_shot")
    residuals = [torch.zeros(n, device="cuda") for _ in range(WORLD)]
    for step in range(4):
        x = _inputs(n, torch.float32, rank, seed=10 + step)
        out = torch.empty_like(x)
        h.run(x, out, 4)
        ref = _reference(_gathered(x), 4, "nearest", seed, step, torch.float32, residuals)
        assert torch.equal(out, ref)
        assert torch.equal(h.worker_state(n), residuals[rank])


@pytest.mark.skipif(WORLD < 3, reason="two_phase's second quantization needs P >= 3")
@pytest.mark.parametrize("feedback", ["none", "residual_stage2"])
def test_two_phase_is_near_the_mean_and_identical_on_every_rank(ext, group, feedback):
    rank, n = dist.get_rank(), 128 * 64 * WORLD + 77
    h = ext.AllReduce(lowbit_torch.communicator(), torch.float32, n, "zero", "nearest", feedback,
                      True, 3, 0, "two_phase")
    assert h.algorithm == "two_phase"
    for step in range(3):
        x = _inputs(n, torch.float32, rank, seed=20 + step)
        out = torch.empty_like(x)
        h.run(x, out, 8)
        mean = torch.stack(_gathered(x)).mean(0)
        assert (out - mean).norm() < 0.02 * mean.norm()
        assert _all_same(out)


@pytest.mark.skipif(WORLD < 3, reason="two_phase's second quantization needs P >= 3")
@pytest.mark.parametrize("feedback", ["residual_stage2", "ef21"])
def test_a_copied_second_stage_residual_continues_bit_identically(ext, group, feedback):
    """Two steps, then a fresh collective loaded with the first's worker, replicated and
    second-stage state takes the third step: the same bits as the first collective. The
    second stage alone left at zero gives other bits: that state is in the result."""
    if feedback == "ef21" and lowbit_torch.backend_of() == "node":
        pytest.skip("the node backend's extension compiles no ef21 (DDPState's docstring)")
    rank, n = dist.get_rank(), 128 * 64 * WORLD + 77

    def make():
        return ext.AllReduce(lowbit_torch.communicator(), torch.float32, n, "zero", "nearest",
                             feedback, True, 3, 0, "two_phase")

    h = make()
    for step in range(2):
        h.run(_inputs(n, torch.float32, rank, seed=30 + step), torch.empty(n, device="cuda"), 2)
    begin, end = h.reduced_shard(n, 2)
    mine = h.stage2_state()
    assert 0 <= begin < end <= n and mine.numel() >= end - begin and mine.abs().sum() > 0
    x = _inputs(n, torch.float32, rank, seed=32)
    outs = []
    for with_stage2 in (True, False):
        c = make()
        replicated = h.replicated_state(n)
        c.load_state(h.worker_state(n),
                     torch.empty(0, device="cuda") if replicated is None else replicated, h.step)
        if with_stage2:
            c.load_stage2_state(mine)
        outs.append(torch.empty(n, device="cuda"))
        c.run(x, outs[-1], 2)
    expected = torch.empty(n, device="cuda")
    h.run(x, expected, 2)
    assert torch.equal(outs[0], expected)
    assert not torch.equal(outs[1], expected)
    with pytest.raises(ValueError, match="second-stage residual"):
        ext.AllReduce(lowbit_torch.communicator(), torch.float32, n, "zero", "nearest",
                      "residual", True, 3, 0, "two_phase").load_stage2_state(mine)


# ----------------------------------------------------------------------------- DDP

class _Net(nn.Module):
    """Four linear layers (several buckets at bucket_cap_mb=0.25) and, with unused=True,
    a branch that forward never takes (find_unused_parameters)."""

    def __init__(self, unused=False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(96, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                                  nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
        self.unused = nn.Linear(256, 10) if unused else None

    def forward(self, x):
        return self.body(x)


def _batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + 10 * step + micro)  # own data
    return torch.randn(32, 96, generator=g).cuda(), torch.randint(0, 10, (32,), generator=g).cuda()


def _loss(model, step, micro=0, autocast=False):
    x, y = _batch(step, micro)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        return nn.functional.cross_entropy(model(x), y)


def _local_grads(net, autocast, accumulate):
    """This rank's own first-step gradients (no DDP), flattened."""
    net.zero_grad()
    for micro in range(accumulate):
        (_loss(net, 0, micro, autocast) / accumulate).backward()
    return torch.cat([p.grad.reshape(-1) for p in net.parameters() if p.grad is not None])


DDP_CASES = {
    "rebuild": {},  # DDP rebuilds its buckets after the first iteration
    "static_graph": {"static_graph": True},
    "find_unused": {"find_unused_parameters": True, "unused": True},
    "no_sync": {"accumulate": 3},
    "autocast": {"autocast": True},
}


@pytest.mark.parametrize("case", list(DDP_CASES))
def test_ddp_with_the_hook_trains_identically_on_every_rank(ext, group, case):
    opts = dict(DDP_CASES[case])
    accumulate = opts.pop("accumulate", 1)
    autocast = opts.pop("autocast", False)
    unused = opts.pop("unused", False)
    torch.manual_seed(0)
    net = _Net(unused).cuda()
    local = _local_grads(net, autocast, accumulate)
    mean = torch.stack(_gathered(local)).mean(0)
    net.zero_grad()
    ddp = nn.parallel.DistributedDataParallel(net, device_ids=[torch.cuda.current_device()],
                                              bucket_cap_mb=0.25, **opts)
    state = lowbit_torch.DDPState(bits=8, feedback="residual", crossover=0)
    ddp.register_comm_hook(state, lowbit_torch.ddp_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    steps = 5
    for step in range(steps):
        opt.zero_grad()
        for micro in range(accumulate - 1):
            with ddp.no_sync():
                (_loss(ddp, step, micro, autocast) / accumulate).backward()
        (_loss(ddp, step, accumulate - 1, autocast) / accumulate).backward()
        if step == 0:  # the averaged gradients: the mean within 8-bit error, not the own
            got = torch.cat([p.grad.reshape(-1) for p in net.parameters()
                             if p.grad is not None])
            assert got.shape == mean.shape
            assert (got - mean).norm() < 0.05 * mean.norm(), case
            assert (local - mean).norm() > 0.2 * mean.norm()  # the ranks' data do differ
            assert _all_same(got)
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    assert torch.isfinite(flat).all()
    assert _all_same(flat), case
    s = state.stats()
    assert s["lowbit_calls"] >= steps and s.get("nccl_calls", 0) == 0
    assert s["wire_bytes"] > 0 and s["wire_ratio"] > 0
    if dist.get_rank() == 0:
        print(f"[test_ranks] P={WORLD} ddp {case}: {s['lowbit_calls']} lowbit calls, "
              f"{s.get('rebuilds', 0)} rebuilds, wire ratio {s['wire_ratio']:.3f}")


@pytest.mark.parametrize("feedback", ["residual", "residual_stage2"])
@pytest.mark.parametrize("unused", [True, False], ids=["no_rebuild", "rebuild"])
def test_a_resumed_ddp_state_continues_bit_identically(ext, group, unused, feedback):
    """Three steps, a checkpoint (parameters, optimizer, DDPState), two more steps; then a
    fresh model, optimizer, DDP and DDPState loaded from the checkpoint run the same two
    steps. With find_unused_parameters DDP never rebuilds its buckets, so the resumed run
    buckets as the saved one did: the same bits. By default DDP's first iteration after the
    resume buckets by construction order, which may put other parameters under an index
    than at the checkpoint: the state of such a bucket is dropped (counted), never added
    to other gradients, and the ranks stay identical. With "residual_stage2" on more than
    two ranks each rank's second-stage residual (its reduced shard's) is saved and loaded
    too."""
    import copy

    def run(params, opt_state, lowbit_state, first, steps):
        torch.manual_seed(0)
        net = _Net().cuda()
        if params is not None:
            with torch.no_grad():
                for p, q in zip(net.parameters(), params):
                    p.copy_(q)
        ddp = nn.parallel.DistributedDataParallel(net, device_ids=[torch.cuda.current_device()],
                                                  bucket_cap_mb=0.25,
                                                  find_unused_parameters=unused)
        state = lowbit_torch.DDPState(bits=4, feedback=feedback, crossover=0)
        if lowbit_state is not None:
            state.load_state_dict(lowbit_state)
        ddp.register_comm_hook(state, lowbit_torch.ddp_hook)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        if opt_state is not None:
            # A copy: the optimizer keeps the tensors it loads and updates them in place,
            # which would give the fresh-feedback run below another start.
            opt.load_state_dict(copy.deepcopy(opt_state))
        saved = None
        for step in range(first, first + steps):
            if step == first + 3 and params is None:  # the checkpoint, after three steps
                saved = ([p.detach().clone() for p in net.parameters()],
                         copy.deepcopy(opt.state_dict()), state.state_dict())
            opt.zero_grad()
            _loss(ddp, step).backward()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        return flat, saved, state

    straight, saved, _ = run(None, None, None, 0, 5)
    params, opt_state, lowbit_state = saved
    assert any(b["worker"] is not None and b["worker"].abs().sum() > 0
               for b in lowbit_state["buckets"].values())  # there is feedback state to keep
    assert all(b["layout"] for b in lowbit_state["buckets"].values())
    resumed, _, state = run(params, opt_state, lowbit_state, 3, 2)
    dropped = state.stats().get("feedback_dropped_on_load", 0)
    if unused:
        assert dropped == 0
        assert torch.equal(resumed, straight)
    else:
        assert torch.equal(resumed, straight) or dropped > 0
    assert _all_same(resumed)
    # Fresh feedback instead of the checkpoint's changes the result: the state mattered.
    fresh, _, _ = run(params, opt_state, None, 3, 2)
    if unused:
        assert not torch.equal(fresh, straight)


def test_the_hooks_collectives_run_on_its_own_stream(ext, group):
    ddp = nn.parallel.DistributedDataParallel(_Net().cuda(),
                                              device_ids=[torch.cuda.current_device()],
                                              bucket_cap_mb=0.25)
    state = lowbit_torch.DDPState(bits=4, crossover=0)
    ddp.register_comm_hook(state, lowbit_torch.ddp_hook)
    for step in range(3):  # past DDP's bucket rebuild
        ddp.zero_grad()
        _loss(ddp, step).backward()
    torch.cuda.synchronize()
    caller, hook = state.last_streams
    assert caller == torch.cuda.current_stream().cuda_stream
    assert hook == state.stream().cuda_stream != caller
    assert state._buckets
    for index in state._buckets:
        assert state.handle(index).last_stream == hook, index


def test_ddp_with_a_plans_widths_trains_identically_on_every_rank(ext, group):
    """A QSync plan puts the last two linear layers at 4 bits, the second at 8 and the
    first at 32: every DDP bucket runs at the widest planned bits of its parameters (the
    first layer's exactly, through the full-precision path), and the ranks end identical."""
    plan = {"buckets": [{"bits": 4, "ops": ["body.6", "body.4", "body.5"]},
                        {"bits": 8, "ops": ["body.2", "body.3"]},
                        {"bits": 32, "ops": ["body.0", "body.1"]}]}
    planned = {"body.6": 4, "body.4": 4, "body.2": 8, "body.0": 32}
    torch.manual_seed(0)
    net = _Net().cuda()
    local = _local_grads(net, False, 1)
    mean = torch.stack(_gathered(local)).mean(0)
    net.zero_grad()
    # find_unused_parameters: DDP buckets by the cap from the first step (no rebuild), so
    # the first step's gradients already come through the planned widths.
    ddp = nn.parallel.DistributedDataParallel(net, device_ids=[torch.cuda.current_device()],
                                              bucket_cap_mb=0.25, find_unused_parameters=True)
    state = lowbit_torch.DDPState(bits=plan, model=ddp, feedback="residual", crossover=0)
    seen = {}

    def hook(s, bucket):
        seen[bucket.index()] = list(bucket.parameters())
        return lowbit_torch.ddp_hook(s, bucket)

    ddp.register_comm_hook(state, hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    names = {id(p): n.rsplit(".", 1)[0] for n, p in net.named_parameters()}
    for step in range(5):
        opt.zero_grad()
        _loss(ddp, step).backward()
        if step == 0:
            offset = 0
            for n, p in net.named_parameters():
                got, want = p.grad.reshape(-1), mean[offset:offset + p.numel()]
                offset += p.numel()
                if planned[n.rsplit(".", 1)[0]] == 32:  # full precision: the mean itself
                    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), n
                else:
                    assert (got - want).norm() < 0.25 * want.norm(), n
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    assert torch.isfinite(flat).all()
    assert _all_same(flat)
    bits = state.stats()["bucket_bits"]
    assert set(bits) == set(seen)
    for index, params in seen.items():
        assert bits[index] == max(planned[names[id(p)]] for p in params), index
    assert len(set(bits.values())) >= 2
    s = state.stats()
    assert s["lowbit_calls"] >= 5 and s["full_precision_calls"] >= 5
    assert s["unplanned_parameters"] == []
    assert state.state_dict()["bucket_bits"] == bits
    if dist.get_rank() == 0:
        print(f"[test_ranks] P={WORLD} ddp plan: bucket bits {bits}, "
              f"wire ratio {s['wire_ratio']:.3f}")


class _Bucket:
    """What ddp_hook reads of DDP's GradBucket: one parameter filling the buffer."""

    def __init__(self, index, tensor):
        self._index, self._tensor = index, tensor

    def index(self):
        return self._index

    def buffer(self):
        return self._tensor

    def parameters(self):
        return [self._tensor]


def test_the_callers_stream_is_not_made_to_wait_for_the_collective(ext, group):
    rank, n = dist.get_rank(), 128 * 1024
    state = lowbit_torch.DDPState(bits=4, feedback="none", crossover=0)
    # A first call builds the bucket's collective (which may synchronise the device).
    lowbit_torch.ddp_hook(state, _Bucket(0, _inputs(n, torch.float32, rank, seed=29))).wait()
    x = _inputs(n, torch.float32, rank, seed=30)
    mean = torch.stack(_gathered(x)).mean(0)
    torch.cuda.synchronize()
    dist.barrier()
    with torch.cuda.stream(state.stream()):
        torch.cuda._sleep(int(1e9))  # the hook's stream is busy for about half a second
    fut = lowbit_torch.ddp_hook(state, _Bucket(0, x))
    caller = torch.cuda.current_stream()
    done = torch.cuda.Event()
    done.record(caller)
    done.synchronize()  # the caller's stream has reached past the hook...
    assert not state.stream().query()  # ...while the collective still waits its turn
    out = fut.wait()  # the caller's stream now waits for it (as DDP's finalize does)
    torch.cuda.synchronize()
    assert out is x
    assert (x - mean).norm() < 0.2 * mean.norm()
    assert _all_same(x)


# ---------------------------------------------------------------------------- FSDP2

def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(96, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                         nn.Linear(512, 10)).cuda()


def _train(model, steps=10):
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


@pytest.mark.skipif(WORLD not in (2, 4), reason="FSDP2 runs at P = 2 and 4")
def test_fsdp_with_lowbit_collectives_keeps_every_rank_identical(ext, group,
                                                                fully_shard_with_lowbit):
    model = _model()
    assert fully_shard_with_lowbit(model) == 4
    losses = _train(model)
    assert all(torch.isfinite(torch.tensor(losses)))
    # Every rank's forward all-gathers the parameters through lowbit: the same input must
    # give the same output on every rank (a rank that kept its own shard undecoded would
    # not). The comparison goes through the host (gloo has no CUDA all-gather).
    x = torch.randn(32, 96, generator=torch.Generator().manual_seed(7)).cuda()
    with torch.no_grad():
        out = model(x)
    assert torch.isfinite(out).all()
    assert _all_same(out)


def _codec_nearest(x, bits=4, grid="zero"):
    """x through the codec at nearest rounding (no key), as fp32."""
    f = lowbit_torch.encode(x.contiguous(), bits, grid, "nearest")
    return lowbit_torch.decode(f, x.numel(), bits, grid, torch.float32)


@pytest.mark.parametrize("feedback", ["none", "shard", "residual"])
@pytest.mark.parametrize("dtype,chunk", [(torch.float32, 1024), (torch.bfloat16, 1000)])
def test_fsdp_reduce_scatter_feedback_equals_the_codec_reference(ext, group, feedback, dtype,
                                                                 chunk):
    """Four steps of ReduceScatter against the feedback rule written out with the codec
    functions: every rank's chunks zero-padded to whole blocks, c = x + e on the own chunk
    (shard) or on all (residual), each chunk decoded, the own chunk's P frames summed in
    rank order in fp32, times 1/P, rounded once. "shard" sends c rounded to the gradient's
    dtype (torch applies it around the collective); "residual" is lowbit's reduce_scatter's
    own rule, which quantizes c in fp32. The output and this rank's state equal the
    reference's; the state is the padded shard (shard) or P of them (residual); FSDP's
    input is left as it came."""
    rank, P = dist.get_rank(), WORLD
    padded = lowbit_torch.whole_blocks(chunk)
    rs = lowbit_torch.ReduceScatter(bits=4, feedback=feedback)
    e = [torch.zeros(P * padded, device="cuda") for _ in range(P)]  # every rank's, reference
    mine = slice(rank * padded, (rank + 1) * padded)
    for step in range(4):
        x = _inputs(P * chunk, dtype, rank, seed=40 + step)
        kept = x.clone()
        out = torch.empty(chunk, dtype=dtype, device="cuda")
        rs(out, x, dist.group.WORLD, dist.ReduceOp.AVG)
        acc = torch.zeros(padded, device="cuda")
        for r, xr in enumerate(_gathered(x)):
            c = torch.zeros(P, padded, dtype=dtype, device="cuda")
            c[:, :chunk] = xr.view(P, chunk)
            c = c.view(-1).float()
            part = slice(None) if feedback == "residual" else slice(r * padded, (r + 1) * padded)
            if feedback != "none":
                c[part] += e[r][part]
            d = _codec_nearest(c if feedback == "residual" else c.to(dtype))
            if feedback != "none":
                e[r][part] = (c - d)[part]
            acc += d[mine]
        want = (acc * (1.0 / P)).to(dtype)[:chunk]
        assert torch.equal(out, want), (feedback, step)
        assert torch.equal(x, kept)
    (buf,) = rs._buffers.values()
    if feedback == "none":
        assert buf.state() is None
    elif feedback == "shard":
        assert buf.residual.numel() == padded
        assert torch.equal(buf.state(), e[rank][mine])
    else:  # the collective's own state
        assert buf.residual is None and buf.in_collective
        assert buf.state().numel() == P * padded
        assert torch.equal(buf.state(), e[rank])
    assert buf.step == 4
    assert rs.stats()["feedback_bytes"] == lowbit_torch.feedback_bytes(feedback, P, chunk)


@pytest.mark.skipif(WORLD not in (2, 4), reason="FSDP2 runs at P = 2 and 4")
def test_fsdp_default_feedback_holds_a_shard_not_the_unsharded_buffer(ext, group,
                                                                      fully_shard_with_lowbit):
    """After training, every module's feedback bytes are its padded shard x 4: within a
    block and FSDP's dim-0 padding of (its parameters' numel / P) x 4, and P times less
    than feedback="residual" holds for the same modules."""
    P = WORLD
    held, models = {}, {}
    for feedback in ("shard", "residual"):
        model = models[feedback] = _model()
        fully_shard_with_lowbit(model, feedback=feedback)
        _train(model, steps=3)
        held[feedback] = dict(lowbit_torch.fsdp.reduce_scatters(model))
    modules = 0
    for name, rs in held["shard"].items():
        if not rs._buffers:
            continue  # the root: every parameter is in a child module
        modules += 1
        (buf,) = rs._buffers.values()
        world, padded, _, _ = buf.key
        assert world == P
        got = rs.stats()["feedback_bytes"]
        assert got == 4 * padded == buf.residual.numel() * 4
        params = list(models["shard"].get_submodule(name).parameters())  # global shapes
        numel = sum(p.numel() for p in params)
        rows = max(p.numel() // p.shape[0] for p in params)
        assert got <= 4 * (numel // P + 128 + (P - 1) * rows), name
        assert held["residual"][name].stats()["feedback_bytes"] == P * got, name
        assert buf.residual.abs().sum() > 0
    assert modules == 3


def _fsdp_batch(step):
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + step)  # each rank its own
    return torch.randn(64, 96, generator=g).cuda(), torch.randint(0, 10, (64,), generator=g).cuda()


def _fsdp_run(shard, saved, first, steps, load_lowbit=True, **reduce_scatter):
    """FSDP2 training steps [first, first + steps) with lowbit's collectives, set by
    ``shard`` (the fully_shard_with_lowbit fixture; ``reduce_scatter``: ReduceScatter's
    options). From scratch (saved None) it takes a checkpoint before step 3: this rank's
    parameter shards, the optimizer, every ReduceScatter's state; else it starts from
    ``saved``, loading lowbit's state unless load_lowbit is False. Returns (this rank's
    parameters, the checkpoint, the model)."""
    import copy

    model = _model()
    shard(model, **reduce_scatter)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if saved is not None:
        # A copy: the optimizer keeps the tensors it loads and updates them in place,
        # which would leave a later run from the same checkpoint another start.
        params, opt_state, lowbit_state = copy.deepcopy(saved)
        with torch.no_grad():
            for p, q in zip(model.parameters(), params):
                p.to_local().copy_(q)
        opt.load_state_dict(opt_state)
        if load_lowbit:
            lowbit_torch.load_fsdp_state_dict(model, lowbit_state)
    checkpoint = None
    for step in range(first, first + steps):
        if step == 3 and saved is None:
            checkpoint = ([p.detach().to_local().clone() for p in model.parameters()],
                          copy.deepcopy(opt.state_dict()),
                          lowbit_torch.fsdp_state_dict(model))
        x, y = _fsdp_batch(step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    local = torch.cat([p.detach().to_local().reshape(-1) for p in model.parameters()])
    return local, checkpoint, model


@pytest.mark.skipif(WORLD not in (2, 4), reason="FSDP2 runs at P = 2 and 4")
def test_a_resumed_fsdp_run_continues_bit_identically(ext, group, fully_shard_with_lowbit):
    """Three steps, a checkpoint (this rank's parameter shards, the optimizer, every
    ReduceScatter's state), two more steps; then a fresh model, FSDP, optimizer and
    collectives loaded from the checkpoint run the same two steps: the same bits on every
    rank. Fresh feedback instead of the checkpoint's gives other bits: the state mattered."""
    run = functools.partial(_fsdp_run, fully_shard_with_lowbit)  # the default feedback, "shard"
    straight, saved, _ = run(None, 0, 5)
    lowbit_state = saved[2]
    buffers = [b for s in lowbit_state.values() for b in s["buffers"]]
    assert len(buffers) == 3 and all(b["step"] == 3 for b in buffers)
    assert all(b["residual"].abs().sum() > 0 for b in buffers)  # feedback state to keep
    resumed, _, model = run(saved, 3, 2)
    for _, rs in lowbit_torch.fsdp.reduce_scatters(model):
        s = rs.stats()
        assert s.get("feedback_dropped_on_load", 0) == 0
    assert sum(rs.stats().get("feedback_loaded", 0)
               for _, rs in lowbit_torch.fsdp.reduce_scatters(model)) == 3
    assert torch.equal(resumed, straight)
    fresh, _, _ = run(saved, 3, 2, load_lowbit=False)
    assert not torch.equal(fresh, straight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fsdp_residual_feedback_with_stochastic_rounding_equals_the_codec_reference(ext, group,
                                                                                   dtype):
    """"residual" is lowbit's reduce_scatter with feedback::residual: four steps against
    its rule written out with the codec functions at stochastic rounding, keyed as the
    collective keys its stage-0 frames (seed, the call's step, the sender's rank, the
    value's index in the padded buffer): c = x + e in fp32, frame Q(c), e = c - D(Q(c)).
    The output, the collective's state (read through ShardCollective.worker_state) and its
    step equal the reference's; no torch-side state is kept."""
    rank, P, chunk, seed, bits = dist.get_rank(), WORLD, 1000, 11, 2
    padded = lowbit_torch.whole_blocks(chunk)
    rs = lowbit_torch.ReduceScatter(bits=bits, grid="zero", rounding="stochastic",
                                    feedback="residual", seed=seed)
    e = [torch.zeros(P * padded, device="cuda") for _ in range(P)]
    mine = slice(rank * padded, (rank + 1) * padded)
    for step in range(4):
        x = _inputs(P * chunk, dtype, rank, seed=60 + step)
        kept = x.clone()
        out = torch.empty(chunk, dtype=dtype, device="cuda")
        rs(out, x, dist.group.WORLD, dist.ReduceOp.AVG)
        acc = torch.zeros(padded, device="cuda")
        for r, xr in enumerate(_gathered(x)):
            c = torch.zeros(P, padded, dtype=dtype, device="cuda")
            c[:, :chunk] = xr.view(P, chunk)
            c = c.view(-1).float() + e[r]
            f = lowbit_torch.encode(c, bits, "zero", "stochastic", seed=seed, step=step, rank=r)
            d = lowbit_torch.decode(f, c.numel(), bits, "zero", torch.float32)
            e[r] = c - d
            acc += d[mine]
        want = (acc * (1.0 / P)).to(dtype)[:chunk]
        assert torch.equal(out, want), step
        assert torch.equal(x, kept)
    (buf,) = rs._buffers.values()
    assert buf.residual is None and buf.in_collective and buf.handle.step == 4
    assert torch.equal(buf.handle.worker_state(P * padded), e[rank])
    assert rs.stats()["feedback_bytes"] == lowbit_torch.feedback_bytes("residual", P, chunk)


@pytest.mark.skipif(WORLD not in (2, 4), reason="FSDP2 runs at P = 2 and 4")
def test_a_resumed_fsdp_run_with_residual_and_stochastic_rounding_is_bit_identical(
        ext, group, fully_shard_with_lowbit):
    """The resume of test_a_resumed_fsdp_run_continues_bit_identically with
    feedback="residual" and stochastic rounding: the collective's own state and its step
    are saved and go back into the fresh collectives (no warning), so the resumed run's
    draws and feedback are the saved run's: the same bits. Fresh feedback, or the step
    left at 0, gives other bits: both mattered."""
    import warnings

    options = {"feedback": "residual", "rounding": "stochastic", "seed": 3}
    run = functools.partial(_fsdp_run, fully_shard_with_lowbit)
    straight, saved, _ = run(None, 0, 5, **options)
    buffers = [b for s in saved[2].values() for b in s["buffers"]]
    assert len(buffers) == 3 and all(b["step"] == 3 for b in buffers)
    assert all(b["residual"].numel() == b["world"] * b["padded"] for b in buffers)
    assert all(b["residual"].abs().sum() > 0 for b in buffers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, _, model = run(saved, 3, 2, **options)
    assert not [w for w in caught if "lowbit_torch" in str(w.message)]
    for _, rs in lowbit_torch.fsdp.reduce_scatters(model):
        for buf in rs._buffers.values():
            assert buf.in_collective and buf.handle.step == 5
        assert rs.stats().get("feedback_dropped_on_load", 0) == 0
    assert torch.equal(resumed, straight)
    fresh, _, _ = run(saved, 3, 2, load_lowbit=False, **options)
    assert not torch.equal(fresh, straight)
    step0 = (saved[0], saved[1],
             {name: dict(s, buffers=[dict(b, step=0) for b in s["buffers"]])
              for name, s in saved[2].items()})
    restarted, _, _ = run(step0, 3, 2, **options)
    assert not torch.equal(restarted, straight)


# ------------------------------------------------------- last: a call that fails

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
        h.run(x, out, 4)  # the next call raises, on every rank
