"""DDPState's per-bucket widths from a QSync plan, on the CPU: no extension, no GPU.

A small module with named submodules, a plan naming its ops (as lowbit-plan writes
one), a stand-in GradBucket (index, buffer, parameters) and a stand-in communicator.
What they check: each parameter takes its op's bucket's bits, a DDP bucket the widest of
its parameters', 16 and 32 go through the full-precision path (torch.distributed's
all-reduce) and 1..8 through lowbit's, the widths in stats() and state_dict(),
parameters the plan does not name at 32, and the errors for bad input. One test runs
real DDP buckets (a one-rank gloo group) through the same calls."""

import json
import os
import socket
import types

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from lowbit_torch import ddp  # noqa: E402
from lowbit_torch.plan_bits import PlanBits, read_plan  # noqa: E402


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    """embed -> two blocks -> head, and a parameter of the root's own (a layer scale,
    op "model" in a plan)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.scale = nn.Parameter(torch.ones(8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h * self.scale)


def plan_for(net_bits=None):
    """A plan as lowbit-plan writes it (with fields the hook ignores)."""
    return {
        "model": "net", "target_ms": 1.0,
        "groups": [{"device": "H100", "ops": {"embed": "bf16"}}],
        "buckets": [
            {"bits": 4, "numel": 27, "ops": ["head", "model"]},
            {"bits": 8, "numel": 544, "ops": ["blocks.1.fc2", "blocks.1.fc1", "blocks.1.act"]},
            {"bits": 2, "numel": 272, "ops": ["blocks.0.fc2"]},
            {"bits": 32, "numel": 144, "ops": ["blocks.0.fc1", "embed", "blocks.0.fc1#2"]},
        ],
    }


EXPECTED = {"head.weight": 4, "head.bias": 4, "scale": 4, "blocks.1.fc2.weight": 8,
            "blocks.1.fc2.bias": 8, "blocks.1.fc1.weight": 8, "blocks.1.fc1.bias": 8,
            "blocks.0.fc2.weight": 2, "blocks.0.fc2.bias": 2, "blocks.0.fc1.weight": 32,
            "blocks.0.fc1.bias": 32, "embed.weight": 32, "embed.bias": 32}


class Bucket:
    """What ddp_hook reads of DDP's GradBucket: its index, flat buffer and parameters."""

    def __init__(self, index, params):
        self._index, self._params = index, list(params)
        self._buffer = torch.cat([torch.randn(p.numel()) for p in self._params])

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params


@pytest.fixture
def net():
    torch.manual_seed(0)
    return Net()


@pytest.fixture
def state_of(monkeypatch):
    """DDPState(...) on a stand-in communicator of P ranks (no process group, no
    extension); lowbit's path records (index, bits) instead of running, torch.distributed's
    all-reduce is a stand-in of P identical ranks (a sum: P times the input)."""
    calls = {"lowbit": [], "full": 0}

    def make(P=2, **kw):
        monkeypatch.setattr(ddp, "communicator",
                            lambda group: types.SimpleNamespace(backend="nccl", size=P, rank=0))

        def fake_all_reduce(t, group=None, async_op=False):
            calls["full"] += 1
            t.mul_(P)
            return types.SimpleNamespace(wait=lambda: True)

        monkeypatch.setattr(ddp.dist, "all_reduce", fake_all_reduce)
        monkeypatch.setattr(ddp.DDPState, "_lowbit_",
                            lambda self, index, t, bits: calls["lowbit"].append((index, bits)) or t)
        s = ddp.DDPState(crossover=0, **kw)
        s.calls = calls
        return s

    return make


def test_each_parameter_takes_its_ops_bucket_bits(net):
    pb = PlanBits(plan_for(), net)
    got = {n: pb.bits_of([p]) for n, p in net.named_parameters()}
    assert got == EXPECTED
    assert pb.unplanned == []
    assert pb.op_bits["blocks.0.fc1#2"] == 32 and pb.op_bits["head"] == 4


def test_a_bucket_takes_the_widest_bits_of_its_parameters(net):
    pb = PlanBits(plan_for(), net)
    p = dict(net.named_parameters())
    assert pb.bits_of([p["head.weight"], p["blocks.0.fc2.weight"]]) == 4
    assert pb.bits_of([p["blocks.0.fc2.bias"], p["head.bias"], p["blocks.1.fc1.weight"]]) == 8
    assert pb.bits_of([p["scale"], p["embed.bias"], p["blocks.1.fc2.bias"]]) == 32
    assert pb.bits_of([p["blocks.0.fc2.weight"], p["blocks.0.fc2.bias"]]) == 2


def test_an_op_in_two_buckets_gives_its_parameters_the_wider_bits(net):
    plan = plan_for()
    plan["buckets"][2]["ops"].append("head")  # head at 4 and at 2: 4
    plan["buckets"][1]["ops"].append("blocks.0.fc2")  # blocks.0.fc2 at 2 and at 8: 8
    pb = PlanBits(plan, net)
    assert pb.bits_of([net.head.weight]) == 4
    assert pb.bits_of([net.blocks[0].fc2.weight]) == 8


def test_the_state_picks_each_buckets_bits_and_its_path(net, state_of):
    state = state_of(bits=plan_for(), model=net)
    assert state.plan is not None and state.grid is None
    p = dict(net.named_parameters())
    buckets = [Bucket(0, [p["head.weight"], p["head.bias"], p["scale"]]),
               Bucket(1, [p["blocks.1.fc2.weight"], p["blocks.0.fc2.bias"]]),
               Bucket(2, [p["blocks.0.fc2.weight"]]),
               Bucket(3, [p["blocks.0.fc1.weight"], p["head.bias"]])]
    before = [b.buffer().clone() for b in buckets]
    for b in buckets:
        bits = state.bucket_bits(b.index(), b.parameters())
        state.all_reduce_(b.index(), b.buffer(), bits)
    assert state.calls["lowbit"] == [(0, 4), (1, 8), (2, 2)]
    assert state.calls["full"] == 1  # bucket 3 only, through torch.distributed
    assert torch.allclose(buckets[3].buffer(), before[3])  # (x / P) summed over P ranks
    s = state.stats()
    assert s["bucket_bits"] == {0: 4, 1: 8, 2: 2, 3: 32}
    assert s["full_precision_calls"] == 1
    assert s["full_precision_bytes"] == buckets[3].buffer().numel() * 4
    assert s["unplanned_parameters"] == []
    sd = state.state_dict()
    assert sd["bucket_bits"] == {0: 4, 1: 8, 2: 2, 3: 32}
    assert sd["bits"]["buckets"][1] == {"bits": 8, "ops": plan_for()["buckets"][1]["ops"]}
    assert PlanBits(sd["bits"], net).bits_of([p["scale"]]) == 4  # the saved plan reads back
    # The bits given on the call win; None takes the bucket's.
    state.all_reduce_(2, buckets[2].buffer())
    assert state.calls["lowbit"][-1] == (2, 2)


def test_one_width_for_every_bucket_and_switching_between_steps(net, state_of):
    state = state_of(bits=8)
    assert state.plan is None and state.grid == "zero"
    b = Bucket(0, [net.head.weight])
    assert state.bucket_bits(0, b.parameters()) == 8
    state.all_reduce_(0, b.buffer())
    assert state.calls["lowbit"] == [(0, 8)]
    state.bits = 32
    state.all_reduce_(0, b.buffer(), state.bucket_bits(0, b.parameters()))
    assert state.calls["full"] == 1 and state.stats()["bucket_bits"] == {0: 32}
    with pytest.raises(ValueError, match="needs the model"):
        state.bits = plan_for()
    state.model = net
    state.bits = plan_for()
    assert state.bucket_bits(0, b.parameters()) == 4
    with pytest.raises(ValueError, match=r"bits must be 1, 2, 4, 8 .* got 3"):
        state.bits = 3
    assert state.bucket_bits(0, b.parameters()) == 4  # the failed assignment changed nothing


def test_bucket_bits_replaces_the_widths_in_order(net):
    plan = plan_for()
    plan["bucket_bits"] = [8, 8, 16, 4]
    pb = PlanBits(plan, net)
    assert pb.bits_of([net.blocks[0].fc2.weight]) == 16
    assert pb.bits_of([net.embed.weight]) == 4
    assert read_plan(plan)[3] == (4, ["blocks.0.fc1", "embed", "blocks.0.fc1#2"])


def test_a_plan_from_a_file_and_a_ddp_or_compiled_wrapper(net, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_for()))
    for source in (path, str(path)):
        assert PlanBits(source, net).bits_of([net.blocks[1].fc1.bias]) == 8
    class Compiled(nn.Module):
        def __init__(self, inner):  # as torch.compile's OptimizedModule keeps it
            super().__init__()
            self._orig_mod = inner

    wrapper = Compiled(net)
    assert PlanBits(plan_for(), wrapper).bits_of([net.head.weight]) == 4


def test_parameters_the_plan_does_not_name_go_at_full_precision(net):
    plan = plan_for()
    plan["buckets"][0]["ops"] = ["head"]  # "scale" (the root's own) is no longer named
    net.blocks[0].fc2.bias.requires_grad_(False)  # frozen: in no DDP bucket, not listed
    plan["buckets"][2]["ops"] = []
    with pytest.warns(UserWarning, match=r"2 parameter\(s\).*full precision: "
                      r"scale, blocks.0.fc2.weight$"):
        pb = PlanBits(plan, net)
    assert pb.unplanned == ["scale", "blocks.0.fc2.weight"]
    assert pb.bits_of([net.scale]) == 32
    assert pb.bits_of([net.head.weight, net.blocks[1].fc1.weight]) == 8


def test_bad_plans_are_refused_naming_what_is_wrong(net, tmp_path, state_of):
    def bad(plan, match):
        with pytest.raises(ValueError, match=match):
            PlanBits(plan, net)

    plan = plan_for()
    plan["buckets"][2]["bits"] = 3
    bad(plan, r"bucket 2 \(blocks.0.fc2\): bits must be 1, 2, 4, 8 \(low-bit\) or 16, 32 "
              r"\(full precision\), got 3")
    plan = plan_for()
    plan["buckets"][1]["bits"] = True
    bad(plan, "bucket 1.*got True")
    plan = plan_for()
    del plan["buckets"][0]["bits"]
    bad(plan, 'bucket 0 has no "bits"')
    bad({"buckets": [{"bits": 4, "ops": ["encoder.layer.0", "decoder"]}]},
        r"names no op of the model \(first: encoder.layer.0, decoder; the model's modules: "
        r"embed, blocks, blocks.0")
    plan = plan_for()
    plan["buckets"][1]["ops"].append("blocks.2.fc1")
    bad(plan, r"1 op\(s\) are no module of the model: blocks.2.fc1")
    bad({"buckets": [{"bits": 4, "ops": ["blocks.0.act"]}]}, "hold no parameters")
    bad([plan_for()], "expected a JSON object, got list")
    bad({"groups": []}, 'no "buckets" list')
    bad({"buckets": []}, 'no "buckets" list')
    bad({"bucket_bits": [4, 8]}, '"bucket_bits" alone does not say which ops')
    bad(dict(plan_for(), bucket_bits=[4, 8]), '"bucket_bits" has 2 widths, "buckets" 4')
    bad({"buckets": [{"bits": 4}]}, 'bucket 0 has no "ops"')
    bad({"buckets": [{"bits": 4, "ops": "head"}]}, '"ops" must be a list of op names')
    path = tmp_path / "broken.json"
    path.write_text('{"buckets": [')
    bad(path, r"broken.json': not JSON")
    with pytest.raises(FileNotFoundError):
        PlanBits(tmp_path / "missing.json", net)
    # DDPState says the same before it touches any process group
    with pytest.raises(ValueError, match="needs the model"):
        ddp.DDPState(bits=plan_for())
    with pytest.raises(ValueError, match="got 3"):
        ddp.DDPState(bits=3)
    state = state_of(bits=plan_for(), model=net)
    stranger = nn.Parameter(torch.zeros(5))
    with pytest.raises(ValueError, match=r"bucket 7 holds a parameter \(shape \(5,\)\) that is "
                       "not the model's"):
        state.bucket_bits(7, [net.head.weight, stranger])
    with pytest.raises(ValueError, match="bucket 9 has no bits yet"):
        state.all_reduce_(9, torch.zeros(4))


def test_a_parameter_replaced_after_the_state_is_found_again(net):
    pb = PlanBits(plan_for(), net)
    net.head.weight = nn.Parameter(torch.zeros(3, 8))  # e.g. re-initialised by the user
    assert pb.bits_of([net.head.weight, net.embed.bias]) == 32
    assert pb.bits_of([net.head.weight]) == 4


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cpu_group():
    """A one-rank gloo group: the world's when one exists, else a world made here."""
    made = not dist.is_initialized()
    if made:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
    elif dist.get_world_size() != 1:
        pytest.skip("needs a one-rank world")
    yield dist.new_group(backend="gloo")
    if made:
        dist.destroy_process_group()


def test_real_ddp_buckets_take_the_widest_planned_bits(net, cpu_group, state_of):
    """DDP's own buckets (a tiny cap: several per step; find_unused_parameters buckets by
    the cap from the start) through bucket_bits and all_reduce_, as ddp_hook calls them."""
    ddp_net = nn.parallel.DistributedDataParallel(net, process_group=cpu_group,
                                                  bucket_cap_mb=0.0005,
                                                  find_unused_parameters=True)
    state = state_of(P=1, bits=plan_for(), model=ddp_net)
    seen = {}

    def hook(s, bucket):
        params = list(bucket.parameters())
        seen[bucket.index()] = params
        bits = s.bucket_bits(bucket.index(), params)
        fut = torch.futures.Future()
        fut.set_result(s.all_reduce_(bucket.index(), bucket.buffer(), bits))
        return fut

    ddp_net.register_comm_hook(state, hook)
    names = {id(p): n for n, p in net.named_parameters()}
    for step in range(3):
        ddp_net.zero_grad()
        ddp_net(torch.randn(5, 4)).sum().backward()
        bits = state.stats()["bucket_bits"]
        assert set(bits) == set(seen) and len(seen) >= 3
        for index, params in seen.items():
            assert bits[index] == max(EXPECTED[names[id(p)]] for p in params), index
    assert len(set(bits.values())) >= 2
    assert all(b < 16 for _, b in state.calls["lowbit"])
    assert state.stats()["full_precision_calls"] >= 3  # embed's bucket, every step
