"""CPU tests of qsync.export's measurements that need torch but no GPU.

record_workspace reads the CUDA caching allocator's statistics; here a fake allocator
stands in for them, and modules whose forward and backward allocate and free known
scratch check that each op gets the larger of its two, under its call name."""

import unittest
from unittest import mock

try:
    import torch
    import torch.nn as nn
except ImportError:
    torch = None


class FakeAllocator:
    """memory_allocated / max_memory_allocated / reset_peak_memory_stats of one device."""

    def __init__(self):
        self.now = self.peak = 0

    def spike(self, n):  # allocate n bytes and free them again
        self.peak = max(self.peak, self.now + n)

    def keep(self, n):  # allocate n bytes that stay (an output)
        self.now += n
        self.peak = max(self.peak, self.now)

    def reset(self):
        self.peak = self.now


if torch is not None:
    ALLOC = FakeAllocator()

    class Spiky(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fwd, bwd):
            ALLOC.keep(100)  # its output, allocated first (as a convolution's), stays
            ALLOC.spike(fwd)
            ctx.bwd = bwd
            return x * 2

        @staticmethod
        def backward(ctx, g):
            ALLOC.spike(ctx.bwd)
            return g * 2, None, None

    class Op(nn.Module):
        def __init__(self, fwd, bwd):
            super().__init__()
            self.fwd, self.bwd = fwd, bwd

        def forward(self, x):
            return Spiky.apply(x, self.fwd, self.bwd)


def fake_cuda():
    """torch.cuda's allocator statistics read from ALLOC (reset first)."""
    ALLOC.__init__()
    return mock.patch.multiple(torch.cuda, is_available=lambda: True,
                               memory_allocated=lambda: ALLOC.now,
                               max_memory_allocated=lambda: ALLOC.peak,
                               reset_peak_memory_stats=ALLOC.reset,
                               synchronize=lambda: None)


@unittest.skipIf(torch is None, "needs torch")
class RecordWorkspace(unittest.TestCase):
    def test_scratch_per_op_forward_or_backward(self):
        from qsync import export as ex

        shared = Op(300, 50)  # called twice: two ops, "b" and "b#2"
        model = nn.Sequential()
        model.add_module("a", Op(1000, 4000))
        model.add_module("b", shared)
        model.add_module("c", Op(0, 0))
        model.add_module("d", shared)
        x = torch.ones(4, requires_grad=True)
        with fake_cuda():
            got, code = ex.record_workspace(model, lambda: model(x).sum(), "fp32",
                                            device_type="cuda")
        self.assertEqual(got, {"a": 4000.0, "b": 300.0, "c": 0.0, "b#2": 300.0})
        self.assertEqual(code, {"a": 0.0, "b": 0.0, "c": 0.0, "b#2": 0.0})
        self.assertEqual(ex.record_workspace(model, lambda: model(x).sum(), "fp32",
                                             device_type="cpu"), ({}, {}))

    def test_the_code_between_ops_backward_goes_to_the_op_whose_backward_follows(self):
        # a -> code (backward: 500 transient) -> b -> the loss (backward: 7000, as a
        # language model's logits gradients): each code stretch is charged to the op
        # that ran last before it, whose backward comes next, apart from the ops' own.
        from qsync import export as ex

        class Code(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, bwd):
                ctx.bwd = bwd
                return x + 1

            @staticmethod
            def backward(ctx, g):
                ALLOC.spike(ctx.bwd)
                return g, None

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = Op(10, 20), Op(30, 40)

            def forward(self, x):
                return self.b(Code.apply(self.a(x), 500))

        model = Model()
        x = torch.ones(4, requires_grad=True)
        with fake_cuda():
            got, code = ex.record_workspace(model, lambda: Code.apply(model(x), 7000).sum(),
                                            "fp32", device_type="cuda")
        self.assertEqual(got, {"a": 20.0, "b": 40.0})
        self.assertEqual(code, {"b": 7000.0, "a": 500.0})

    def test_merge_into_records(self):
        from qsync import export as ex

        records = {"a": {"saved_bytes": {"fp32": 1.0}}, "b": {}}
        ex.merge_workspace(records, "bf16", {"a": 10.0, "zzz": 5.0}, {"b": 7.0})
        self.assertEqual(records["a"]["workspace_bytes"], {"bf16": 10.0})
        self.assertNotIn("workspace_bytes", records["b"])
        self.assertEqual(records["b"]["code_workspace_bytes"], {"bf16": 7.0})
        self.assertNotIn("code_workspace_bytes", records["a"])


@unittest.skipIf(torch is None, "needs torch")
class Profile(unittest.TestCase):
    def test_collector_off_while_profiling_and_restored_after(self):
        import gc
        import tempfile

        from qsync import export as ex

        seen = []
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            try:
                with tempfile.TemporaryDirectory() as d:
                    ex.profile(lambda: seen.append(gc.isenabled()), d + "/t.json", steps=1,
                               warmup=0)
                self.assertEqual(gc.isenabled(), before)
            finally:
                gc.enable()
        self.assertEqual(seen, [False] * len(seen))
        self.assertEqual(len(seen), 4)  # 0 + 1 + 1 steps, twice


@unittest.skipIf(torch is None, "needs torch")
class ModeCalls(unittest.TestCase):
    """export.record_ops counts, per function op, the torch calls the applier's function
    mode would check while the op's caller runs (shared among the caller's function ops;
    none for a caller hooked whole), not the export's own hooks' calls."""

    def records(self, extra):
        import torch.nn.functional as F
        from qsync import export as ex

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w1 = torch.nn.Parameter(torch.randn(4, 4))
                self.w2 = torch.nn.Parameter(torch.randn(4, 4))
                self.act = torch.nn.ReLU()

            def forward(self, x):
                y = self.act(F.linear(x, self.w1) + 1)
                for _ in range(extra):
                    y = torch.add(y, 0.5)
                return F.linear(y, self.w2) * 2

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()
                self.mha = torch.nn.MultiheadAttention(4, 1, batch_first=True)

            def forward(self, x):
                return self.mha(self.block(x), x, x, need_weights=False)[0]

        torch.manual_seed(0)
        model, x = Net(), torch.randn(2, 3, 4)
        return ex.record_ops(model, lambda: model(x).pow(2).mean(), "fp32", device_type="cpu")

    def test_shared_among_the_callers_function_ops_and_none_for_a_whole_caller(self):
        plain, more = self.records(0), self.records(3)
        fn = [op for op, r in plain.items() if r.get("call") == "function"]
        self.assertEqual(sorted(r["caller"] for r in (plain[op] for op in fn)),
                         ["block", "block", "mha"])
        block = [op for op in fn if plain[op]["caller"] == "block"]
        self.assertGreater(plain[block[0]]["mode_calls"], 0)
        self.assertEqual(plain[block[0]]["mode_calls"], plain[block[1]]["mode_calls"])
        # three more torch calls in the block's code: three more between its two ops
        self.assertEqual(sum(more[op]["mode_calls"] for op in block) -
                         sum(plain[op]["mode_calls"] for op in block), 3)
        mha = next(op for op in fn if plain[op]["caller"] == "mha")
        self.assertEqual(plain[mha]["mode_calls"], 0.0)
