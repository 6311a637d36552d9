"""DDPState across DDP's bucket rebuild (CPU, no compiled module): each bucket's feedback
state follows its parameters into whatever bucket DDP puts them, never stays at an index
that now holds other gradients."""

import types

import pytest
import torch

from lowbit_torch import ddp


class FakeHandle:
    """An AllReduce's state accessors over plain tensors; as rank ``rank`` of ``size``, with
    a second-stage residual over its reduced shard when ``stage2``."""

    def __init__(self, dtype, count, replicated, stage2=False, rank=0, size=2):
        self.dtype, self.max_count, self.step = dtype, count, 0
        self.algorithm = "two_phase"
        self.rank, self.size = rank, size
        self.worker = torch.zeros(count)
        self.replicated = torch.zeros(count) if replicated else torch.empty(0)
        begin, end = self.reduced_shard(count, 4)
        self.stage2 = torch.zeros(end - begin) if stage2 else None

    def reduced_shard(self, count, bits):
        n = -(-count // self.size)
        return min(count, self.rank * n), min(count, (self.rank + 1) * n)

    def stage2_state(self):
        return None if self.stage2 is None else self.stage2.clone()

    def load_stage2_state(self, t):
        assert self.stage2 is not None and t.numel() == self.stage2.numel()
        self.stage2 = t.clone()

    def worker_state(self, count):
        return self.worker[:count].clone()

    def replicated_state(self, count):
        return self.replicated[:count].clone()

    def load_state(self, worker, replicated, step):
        assert worker.numel() == self.max_count
        self.worker, self.replicated, self.step = worker.clone(), replicated.clone(), step


@pytest.fixture
def make_state(monkeypatch):
    monkeypatch.setattr(ddp, "communicator", lambda group: types.SimpleNamespace(
        backend="nccl", size=2))

    def make(feedback="residual"):
        st = ddp.DDPState(bits=4, feedback=feedback, crossover=0)
        st._new_handle = lambda dtype, count, grid: FakeHandle(dtype, count,
                                                               feedback == "ef21")
        return st
    return make


def call(st, index, params):
    """What the hook does with a bucket before its collective; the bucket's handle."""
    st.note_layout(index, params)
    bits = st.bucket_bits(index, params)
    return st._handle(index, torch.empty(sum(p.numel() for p in params)), bits)


def test_a_reordered_bucket_carries_each_parameters_state_with_it(make_state):
    st = make_state()
    a, b, c = torch.zeros(4), torch.zeros(2, 3), torch.zeros(5)
    h0, h1 = call(st, 0, [a, b]), call(st, 1, [c])
    h0.worker = torch.arange(10.0)          # a: 0..3, b: 4..9
    h1.worker = torch.arange(100.0, 105.0)  # c
    h0.step = h1.step = 7
    # DDP's rebuild: c joins a in bucket 0, in another order; b alone in bucket 1
    n0, n1 = call(st, 0, [c, a]), call(st, 1, [b])
    assert torch.equal(n0.worker, torch.cat([torch.arange(100.0, 105.0), torch.arange(4.0)]))
    assert torch.equal(n1.worker, torch.arange(4.0, 10.0))
    assert n0.step == n1.step == 7
    assert st.stats()["layout_rebuilds"] == 1
    assert not st._carried  # every slice went somewhere
    # the next step: layouts as before, the same collectives
    assert call(st, 0, [c, a]) is n0 and call(st, 1, [b]) is n1
    assert st.stats()["layout_rebuilds"] == 1


def test_the_same_size_at_an_index_with_other_parameters_is_not_reused(make_state):
    # the case that went wrong: bucket 0 keeps its size, its parameters swap order
    st = make_state()
    a, b = torch.zeros(3), torch.zeros(3)
    h = call(st, 0, [a, b])
    h.worker = torch.tensor([1.0, 1, 1, 2, 2, 2])
    n = call(st, 0, [b, a])
    assert n is not h
    assert torch.equal(n.worker, torch.tensor([2.0, 2, 2, 1, 1, 1]))


def test_ef21s_replicated_state_moves_too_and_a_new_parameter_starts_at_zero(make_state):
    st = make_state("ef21")
    a, b, new = torch.zeros(2), torch.zeros(2), torch.zeros(3)
    h = call(st, 0, [a, b])
    h.worker, h.replicated = torch.tensor([1.0, 2, 3, 4]), torch.tensor([5.0, 6, 7, 8])
    n = call(st, 0, [b, new, a])
    assert torch.equal(n.worker, torch.tensor([3.0, 4, 0, 0, 0, 1, 2]))
    assert torch.equal(n.replicated, torch.tensor([7.0, 8, 0, 0, 0, 5, 6]))
    assert st.stats()["feedback_fresh_on_rebuild"] == 1


def test_without_feedback_nothing_is_carried(make_state):
    st = make_state("none")
    a, b = torch.zeros(3), torch.zeros(3)
    h = call(st, 0, [a, b])
    h.step = 5
    # the collective stays (no state to move), its step, stochastic rounding's key, goes on
    assert call(st, 0, [b, a]) is h and h.step == 5
    assert not st._carried and st.stats()["layout_rebuilds"] == 1


@pytest.mark.parametrize("feedback", ["residual_stage2", "ef21"])
def test_the_second_stage_residual_follows_its_values_into_another_ranks_shard(
        monkeypatch, feedback):
    # Four ranks; this is rank 1, whose reduced shard of 8 values is [2, 4). The other
    # ranks' shards of the whole residual W arrive through the group's sum; after DDP's
    # rebuild puts b before a, rank 1's shard holds values that were rank 2's.
    monkeypatch.setattr(ddp, "communicator", lambda group: types.SimpleNamespace(
        backend="nccl", size=4))
    whole = torch.arange(1.0, 9.0)  # a: 1..3, b: 4..8
    summed = []

    def all_reduce(t, group=None, async_op=False):
        mine = t.clone()
        assert torch.equal(mine[2:4], whole[2:4]) and not mine[:2].any() and not mine[4:].any()
        t.add_(whole).sub_(mine)  # the other ranks' shards, zeros at rank 1's
        summed.append(True)
        return types.SimpleNamespace(wait=lambda: None)

    monkeypatch.setattr(ddp.dist, "all_reduce", all_reduce)
    st = ddp.DDPState(bits=4, feedback=feedback, crossover=0)
    st._new_handle = lambda dtype, count, grid: FakeHandle(dtype, count, feedback == "ef21",
                                                           stage2=True, rank=1, size=4)
    st._streams = {}
    a, b = torch.zeros(3), torch.zeros(5)
    h = call(st, 0, [a, b])
    h.stage2 = whole[2:4].clone()
    saved = st.state_dict()
    assert torch.equal(saved["buckets"][0]["stage2"], whole[2:4])  # each rank saves its own
    n = call(st, 0, [b, a])
    assert summed == [True]
    assert torch.equal(n.stage2, torch.cat([whole[3:], whole[:3]])[2:4])  # values 6, 7
    assert not st._carried


def test_two_ranks_have_no_second_stage_and_no_group_call(monkeypatch):
    monkeypatch.setattr(ddp, "communicator", lambda group: types.SimpleNamespace(
        backend="nccl", size=2))  # two ranks: one shot, no re-encode
    monkeypatch.setattr(ddp.dist, "all_reduce", lambda *a, **k: pytest.fail("a group call"))
    st = ddp.DDPState(bits=4, feedback="residual_stage2", crossover=0)
    st._new_handle = lambda dtype, count, grid: FakeHandle(dtype, count, False)
    a, b = torch.zeros(3), torch.zeros(5)
    call(st, 0, [a, b]).worker = torch.arange(8.0)
    n = call(st, 0, [b, a])
    assert n.stage2 is None and torch.equal(n.worker, torch.cat([torch.arange(3.0, 8.0),
                                                                 torch.arange(3.0)]))
