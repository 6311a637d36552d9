"""CPU tests: qsync's export and apply_plan on the shapes of nn.Module that broke them
(issue 34), built from torch alone: an output modified in place after its module ran
(ResNet's ``out += identity``, an in-place ReLU), functional forwards
(``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``'s fused in-projection, a
non-leaf module's own parameter), a custom linear-like leaf (GPT-2's Conv1D, a
transposed linear), shared and tied modules, a module called twice, buffers updated in
forward, dict and dataclass outputs, activation checkpointing, and torch's recurrent,
transformer, parametrized, bag and 3-D layers through check_model. test_zoo.py runs the same checks on real
library models."""

import dataclasses
import tempfile
import unittest

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    torch = None

if torch is not None:
    from qsync import export as ex
    from qsync import qsync_model as qm
    from qsync.apply_plan import applied_plan
    from qsync.model_check import step_under_plan

    class Conv1D(nn.Module):
        """transformers' Conv1D: a linear with its weight transposed, via addmm."""

        def __init__(self, nf, nx):
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
            self.bias = nn.Parameter(torch.zeros(nf))

        def forward(self, x):
            out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
            return out.view(x.shape[:-1] + (self.nf,))

    class Block(nn.Module):
        """conv -> bn -> in-place ReLU, then ``out += identity`` on the second bn's
        output and a shared in-place ReLU, as torchvision's BasicBlock."""

        def __init__(self, c):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            out += x
            return self.relu(out)

    @dataclasses.dataclass
    class Output:
        logits: torch.Tensor
        aux: torch.Tensor = None

    class Net(nn.Module):
        """Every awkward case in one model; returns a dict or a dataclass."""

        def __init__(self, c=4, hidden=8, vocab=16, as_dict=True):
            super().__init__()
            self.as_dict = as_dict
            self.stem = nn.Conv2d(3, c, 3, padding=1)
            self.block = Block(c)
            self.scale = nn.Parameter(torch.ones(c, 1, 1))  # a non-leaf module's own
            self.proj = nn.Linear(c, hidden)
            self.mha = nn.MultiheadAttention(hidden, 2, batch_first=True)
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.c1 = Conv1D(hidden, hidden)
            self.act = nn.GELU()  # called twice
            self.emb = nn.Embedding(vocab, hidden)
            self.head = nn.Linear(hidden, vocab, bias=False)
            self.head.weight = self.emb.weight  # tied
            self.shared = nn.Linear(hidden, hidden)
            self.again = self.shared  # the same module under two names

        def forward(self, img, ids):
            x = self.block(self.stem(img)) * self.scale
            x = self.proj(x.flatten(2).transpose(1, 2))  # (b, hw, hidden)
            x = x + self.emb(ids)
            a, _ = self.mha(x, x, x, need_weights=False)
            b, s, h = a.shape
            split = lambda t: t.view(b, s, 2, h // 2).transpose(1, 2)  # noqa: E731
            y = F.scaled_dot_product_attention(split(self.q(a)), split(self.k(a)),
                                               split(self.v(a)))
            y = self.act(self.c1(y.transpose(1, 2).reshape(b, s, h)))
            y = self.act(self.again(self.shared(y)))
            logits = self.head(y)
            return {"logits": logits} if self.as_dict else Output(logits=logits)


def _export(model, step):
    records = ex.record_ops(model, step, "fp32", with_stats=True, device_type="cpu")
    ex.merge_saved_bytes(records, ex.record_ops(model, step, "bf16", device_type="cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def iteration():
        opt.zero_grad(set_to_none=True)
        step().backward()
        opt.step()

    with tempfile.TemporaryDirectory() as d:
        with ex.instrument(model):
            ex.profile(iteration, d + "/t.json", steps=1, warmup=1)
        trace = qm.read_json(d + "/t.json")
    return records, qm.model_json(records, "net", trace=trace), trace


def _ranges(trace):
    return [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"
            and e.get("ph") == "X" and not e["name"].startswith("ProfilerStep")
            and not e["name"].startswith("Optimizer")]


def _overlaps(trace):
    """Pairs of op ranges that overlap on one thread: lowbit-plan would count the
    kernels in both."""
    rs = sorted(_ranges(trace), key=lambda e: e["ts"])
    out = []
    for i, a in enumerate(rs):
        for b in rs[i + 1:]:
            if b["ts"] >= a["ts"] + a["dur"]:
                break
            if b["tid"] == a["tid"]:
                out.append((a["name"], b["name"]))
    return out


def check_export(test, model, step, records, model_json, trace):
    """What every export must give (shared with test_zoo.py)."""
    # Every parameter counted once, at one op.
    names = sorted(n for r in records.values() for n in r["param_names"])
    test.assertEqual(names, sorted(n for n, _ in model.named_parameters()))
    test.assertEqual(sum(o["param_numel"] for o in model_json["ops"]),
                     sum(p.numel() for p in model.parameters()))
    # Kinds lowbit-plan knows; FLOPs positive; the code between the ops named.
    for o in model_json["ops"]:
        test.assertIn(o["kind"], qm.KNOWN_KINDS, o["name"])
        test.assertGreater(o["flops"], 0, o["name"])
    un = model_json.get("unattributed", [])
    test.assertTrue(un, "the loss at least runs outside every op")
    for u in un:
        test.assertTrue(u["name"].startswith("aten::"), u)
        test.assertGreater(u["count"], 0)
        test.assertEqual(u["priced_as"], "tail")
    # The FLOPs of the ops and of the code between them add up to torch's own count.
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        step()
    counted = sum(r["counted_flops"] for r in records.values()) + sum(u["flops"] for u in un)
    test.assertAlmostEqual(counted, float(fc.get_total_flops()), delta=1e-6 * counted + 1)
    # Every op with parameters has its ranges, forward and backward, and no two op
    # ranges overlap on a thread.
    ranges = {e["name"] for e in _ranges(trace)}
    for o in model_json["ops"]:
        if o["param_numel"] > 0:
            test.assertIn(o["name"], ranges)
            test.assertIn(o["name"] + ".backward", ranges)
    test.assertEqual(qm.missing_ranges(trace, model_json), [])
    test.assertEqual(_overlaps(trace), [])


def run_mixed_plans(test, model, step, model_json):
    """Forward and backward under plans that put every other parameter op at the other
    precision (every edge mixed), in both ambients: finite loss, fp32 gradients.
    Returns the ops each plan wrapped. A uniform plan wraps nothing: it runs the
    profiled program."""
    for p in ("fp32", "bf16"):
        with applied_plan(model, qm.uniform_plan(p), model_json, device_type="cpu") as ap:
            test.assertEqual(ap.wrapped, {})
            test.assertIsNone(ap.tracker)
    params = [o["name"] for o in model_json["ops"] if o["param_numel"] > 0]
    wrapped = set()
    for first, second in (("fp32", "bf16"), ("bf16", "fp32")):
        plan = {"default": "fp32", "ops": {n: (first if k % 2 else second)
                                           for k, n in enumerate(params)}}
        ap, loss = step_under_plan(model, plan, model_json, step)
        test.assertTrue(ap.wrapped)
        wrapped.update(ap.wrapped)
        test.assertTrue(torch.isfinite(loss).item())
        for n, p in model.named_parameters():
            if p.grad is not None:
                test.assertEqual(p.grad.dtype, torch.float32, n)
        test.assertEqual(ap.kept, {})
    return wrapped


@unittest.skipIf(torch is None, "needs torch")
class AnyModule(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.img = torch.randn(2, 3, 4, 4)
        self.ids = torch.randint(0, 16, (2, 16))

    def make(self, as_dict=True):
        model = Net(as_dict=as_dict)
        out = (lambda o: o["logits"]) if as_dict else (lambda o: o.logits)

        def step():
            return F.cross_entropy(out(model(self.img, self.ids)).flatten(0, 1),
                                   self.ids.flatten())
        return model, step

    def test_export_and_apply(self):
        for as_dict in (True, False):
            model, step = self.make(as_dict)
            records, mj, trace = _export(model, step)
            check_export(self, model, step, records, mj, trace)
            wrapped = run_mixed_plans(self, model, step, mj)
            self.assertLessEqual({"model", "mha", "c1", "emb"}, wrapped)  # function ops too
        ops = {o["name"]: o for o in mj["ops"]}
        # The in-place ReLU shared within the block: two calls, two ops.
        self.assertIn("block.relu", ops)
        self.assertIn("block.relu#2", ops)
        # A non-leaf module's own parameter and the MHA's fused in-projection are
        # function ops, named after the module holding the parameter.
        self.assertEqual(ops["model"]["call"], "function")
        self.assertEqual(ops["mha"]["call"], "function")
        self.assertEqual(ops["mha"]["function"], "multi_head_attention_forward")
        self.assertEqual(records["mha"]["param_names"],
                         ["mha.in_proj_weight", "mha.in_proj_bias",
                          "mha.out_proj.weight", "mha.out_proj.bias"])
        # Conv1D is a linear (addmm), not a convolution: 2 * rows * in * out FLOPs.
        self.assertEqual(ops["c1"]["kind"], "linear")
        self.assertEqual(ops["c1"]["flops"], 2.0 * 32 * 8 * 8)
        # Tied: the embedding (first) holds the weight; the head follows its input.
        self.assertEqual(ops["emb"]["param_numel"], 16 * 8)
        self.assertEqual(ops["head"]["param_numel"], 0)
        self.assertEqual(ops["head"]["weights_from"], ["emb"])  # follows the weights'
        self.assertEqual(ops["head"]["inputs"][0], "emb")
        self.assertEqual(ops["shared#2"]["weights_from"], ["shared"])
        # The same module under two names: one module, called twice, weights once.
        self.assertEqual(ops["shared"]["param_numel"], 8 * 8 + 8)
        self.assertEqual(ops["shared#2"]["param_numel"], 0)
        self.assertIn("shared", ops["shared#2"]["inputs"])
        self.assertIn("act#2", ops)
        # Attention's core (functional, between the ops) is named, not dropped.
        un = {u["name"] for u in mj["unattributed"]}
        self.assertTrue(any("scaled_dot_product" in n for n in un), un)

    def test_function_op_wrapped_as_its_whole_caller(self):
        # The MHA's forward is one function op and nothing else: the applier hooks the
        # MHA as that op, like a leaf, and runs no function mode; the rest of the model
        # carries none of the applier's hooks.
        model, step = self.make()
        records = ex.record_ops(model, step, "fp32", device_type="cpu")
        self.assertEqual(records["mha"]["caller"], "mha")
        self.assertEqual(records["model"]["caller"], "")  # the root's own code
        mj = qm.model_json(records, "net")
        self.assertEqual(next(o for o in mj["ops"] if o["name"] == "mha")["caller"], "mha")
        seen = []
        with applied_plan(model, {"default": "bf16", "ops": {"mha": "fp32"}}, mj,
                          device_type="cpu") as ap:
            hooked = {n for n, m in model.named_modules() if m._forward_pre_hooks}
            enter = ap.tracker.enter
            ap.tracker.enter = lambda op, *a: (seen.append(op), enter(op, *a))[1]
            with ap.step_context():
                loss = step()
            loss.backward()
        self.assertEqual(ap.tracker.wholes, {"mha": ("mha", 1)})
        self.assertIsNone(ap.tracker.mode)
        self.assertEqual(hooked, {"", "mha", "q", "k", "v"})
        self.assertEqual(seen, ["mha", "q", "k", "v"])
        self.assertTrue(torch.isfinite(loss).item())

    def test_whole_caller_runs_as_the_function_mode_ran_it(self):
        # The same plan through the whole caller and through the function mode (the
        # caller left out of whole_callers): the same loss and gradients to the bit.
        # Sequence-first, so that the MHA hands its inputs to the function untransposed
        # (batch-first, the mode saw transposed views of the ambient copies, which it
        # cannot map back to the producer's own output: a second rounding the whole
        # caller does not make).
        from unittest import mock

        import qsync.apply_plan as ap_mod

        torch.manual_seed(0)

        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.pre = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
                self.q = nn.Linear(8, 8)
                self.mha = nn.MultiheadAttention(8, 2)
                self.head = nn.Linear(8, 3)

            def forward(self, x):
                h = self.q(self.pre(x))
                return self.head(self.mha(h, h, h, need_weights=False)[0])

        model, x = Attn(), torch.randn(5, 2, 8)
        y = torch.randint(0, 3, (5 * 2,))

        def step():
            return F.cross_entropy(model(x).flatten(0, 1).float(), y)
        mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"), "attn")
        plan = {"default": "bf16", "ops": {"mha": "fp32", "q": "fp32"}}

        def run():
            model.zero_grad(set_to_none=True)
            with applied_plan(model, plan, mj, device_type="cpu") as ap:
                with ap.step_context():
                    loss = step()
                loss.backward()
            return ap, loss.detach(), [p.grad.clone() for p in model.parameters()
                                       if p.grad is not None]

        ap1, loss1, g1 = run()
        with mock.patch.object(ap_mod, "whole_callers", lambda ops, modules: {}):
            ap2, loss2, g2 = run()
        self.assertEqual(ap1.tracker.wholes, {"mha": ("mha", 1)})
        self.assertEqual(ap2.tracker.scopes, {"mha"})
        self.assertTrue(torch.equal(loss1, loss2))
        self.assertEqual(len(g1), len(g2))
        for a, b in zip(g1, g2):
            self.assertTrue(torch.equal(a, b))

    def test_whole_caller_called_another_number_of_times_is_an_error(self):
        # A forward that calls the MHA twice where the recorded one called it once: its
        # second call would be named "mha#1", an op the plan does not know. Loud.
        model, step = self.make()
        mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"), "net")
        mha = model.mha
        with applied_plan(model, {"default": "bf16", "ops": {"mha": "fp32"}}, mj,
                          device_type="cpu") as ap:
            with ap.step_context():
                step()  # as recorded
                x = torch.randn(2, 4, mha.embed_dim)
                with self.assertRaisesRegex(RuntimeError, "'mha' ran 2 times"):
                    model.register_forward_pre_hook(lambda m, a: (mha(x, x, x), None)[1])
                    step()

    def test_the_mode_finds_parameters_in_nested_arguments(self):
        # torch.cat([cls_token, x]), a dict of weights: the mode's own walk finds the
        # model's parameters through tuples, lists and dicts, in order, and skips others
        from qsync.attribution import _parameters_in

        a, b, c = (nn.Parameter(torch.zeros(1)) for _ in range(3))
        owners = {id(a): ("a", None), id(b): ("b", None)}
        found = []
        _parameters_in(((torch.ones(1), [b, {"k": (a,)}]), c, {"w": [a]}), owners, found)
        self.assertEqual([id(p) for p in found], [id(b), id(a), id(a)])
        found = []
        _parameters_in((torch.ones(1), 3, "s", None), owners, found)
        self.assertEqual(found, [])

    def test_function_mode_rests_in_modules_without_wrapped_function_ops(self):
        # A ViT's shape: the position embedding is a function op of the root's own code,
        # the blocks (in a ModuleList, which is never called) call only function ops of
        # their own (a layer scale) that the plan leaves at the ambient. With the
        # embedding wrapped the mode runs in the root's code only: the blocks' torch
        # calls never reach it, and the step's numbers are those of a mode that sees all.
        import qsync.apply_plan as apm
        from qsync import attribution

        class Blk(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv, self.proj = nn.Linear(8, 24), nn.Linear(8, 8)
                self.gamma = nn.Parameter(torch.full((8,), 0.5))

            def forward(self, x):
                q, k, v = self.qkv(x).reshape(x.shape[0], x.shape[1], 3, 2, 4).unbind(2)
                a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                   v.transpose(1, 2))
                return x + self.gamma * self.proj(a.transpose(1, 2).reshape(x.shape))

        class Vit(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Linear(4, 8)
                self.pos = nn.Parameter(torch.randn(1, 5, 8) * 0.1)
                self.blocks = nn.ModuleList([Blk() for _ in range(3)])
                self.head = nn.Linear(8, 2)

            def forward(self, x):
                x = self.embed(x) + self.pos
                for b in self.blocks:
                    x = b(x)
                return self.head(x.mean(1))

        torch.manual_seed(0)
        model, x = Vit(), torch.randn(2, 5, 4)
        y = torch.tensor([0, 1])

        def step():
            return F.cross_entropy(model(x), y)

        mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"), "vit")
        fop = next(o for o in mj["ops"] if o.get("call") == "function")
        self.assertEqual(fop["caller"], "")
        self.assertEqual(sorted(o["caller"] for o in mj["ops"] if o.get("call") == "function"),
                         ["", "blocks.0", "blocks.1", "blocks.2"])
        self.assertEqual(attribution.quiet_modules(model, {""}, {""}),
                         {"embed", "blocks.0", "blocks.1", "blocks.2", "head"})
        # a block whose own code calls one is looked into: its children rest, it does not
        self.assertEqual(attribution.quiet_modules(model, {""}, {"", "blocks.1"}),
                         {"embed", "blocks.0", "blocks.1.qkv", "blocks.1.proj", "blocks.2",
                          "head"})
        self.assertEqual(attribution.quiet_modules(model, {"blocks.1"}, {"blocks.1"}),
                         {"blocks.1.qkv", "blocks.1.proj"})
        plan = {"default": "bf16", "ops": {fop["name"]: "fp32"}}
        counted = []
        checked = attribution._FunctionOps.__torch_function__

        def counting(mode, func, *a, **k):
            counted[-1] += 1
            return checked(mode, func, *a, **k)

        def run():
            counted.append(0)
            for p in model.parameters():
                p.grad = None
            with applied_plan(model, plan, mj, device_type="cpu") as ap:
                with ap.step_context():
                    loss = step()
                loss.backward()
            return loss.detach(), [p.grad.clone() for p in model.parameters()]

        attribution._FunctionOps.__torch_function__ = counting
        try:
            loss, grads = run()
            every = apm.quiet_modules
            apm.quiet_modules = lambda *a: set()
            try:
                loss_all, grads_all = run()
            finally:
                apm.quiet_modules = every
        finally:
            attribution._FunctionOps.__torch_function__ = checked
        self.assertEqual(loss.item(), loss_all.item())
        for g, h in zip(grads, grads_all):
            self.assertTrue(torch.equal(g, h))
        # the root's own calls (the add, the loop's iteration, the mean): a few, where
        # the blocks alone make more than ten each
        self.assertLess(counted[0], 10, counted)
        self.assertGreater(counted[1], 30, counted)

    def test_a_view_output_modified_in_place_keeps_its_producer(self):
        # A leaf whose output is a view of its own result (Conv1D's addmm, viewed; a Linear
        # on a 3-D input in some torch versions), then ``y += r``: the in-place add rebases
        # the view's history onto its base, and the next op still reads the leaf's output.
        # A view of an op's input (Flatten) is not that op's output: its base keeps the
        # producer it had.
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.inp, self.proj = nn.Linear(4, 8), Conv1D(8, 8)
                self.flat, self.head = nn.Flatten(), nn.Linear(24, 2)

            def forward(self, x):
                h = self.inp(x)
                y = self.proj(h)
                y += h  # in place on the view
                return self.head(self.flat(y * 2.0))

        torch.manual_seed(0)
        model, x = M(), torch.randn(2, 3, 4)
        records = ex.record_ops(model, lambda: model(x).square().mean(), "fp32",
                                device_type="cpu")
        self.assertEqual(records["head"]["inputs"], ["flat"])
        self.assertEqual(set(records["flat"]["inputs"]), {"proj", "inp"})
        self.assertEqual(records["proj"]["inputs"], ["inp"])

    def test_an_op_fed_by_the_step_alone_runs_in_its_context(self):
        # A detection model's input transform: parameter-free, fed by no op, handing on
        # the images and the targets' box coordinates. It runs where the uniform
        # profiles ran it, in the step's context: no plan wraps it, and the boxes reach
        # the head as the caller gave them (torchvision's roi heads refuse others than
        # fp32).
        class Transform(nn.Module):
            def forward(self, x, boxes):
                return x * 2.0, boxes / 4.0

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.transform, self.body, self.head = Transform(), nn.Linear(4, 8), nn.Linear(8, 2)

            def forward(self, x, boxes):
                x, boxes = self.transform(x, boxes)
                if boxes.dtype != torch.float32:
                    raise TypeError(f"boxes must be float32, got {boxes.dtype}")
                return self.head(self.body(x)).float().square().mean() + boxes.sum()

        torch.manual_seed(0)
        model, x, boxes = M(), torch.randn(2, 4), torch.rand(2, 4)
        step = lambda: model(x, boxes)  # noqa: E731
        mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"), "m")
        self.assertEqual(next(o for o in mj["ops"] if o["name"] == "transform")["inputs"], [])
        for plan in (qm.uniform_plan("bf16"), {"default": "bf16", "ops": {"body": "fp32"}},
                     {"default": "fp32", "ops": {"head": "bf16"}}):
            model.zero_grad(set_to_none=True)
            with applied_plan(model, plan, mj, device_type="cpu") as ap:
                with ap.step_context():
                    loss = step()
                loss.backward()
            self.assertNotIn("transform", ap.wrapped, plan)
            self.assertTrue(torch.isfinite(loss).item())
        self.assertEqual(ap.wrapped, {"head": "bf16"})

    def test_frozen_and_unused_parameters_are_told_apart(self):
        # A frozen embedding (fine-tuning), a linear whose bias alone trains, and a branch
        # the forward does not take (Longformer's global projections without a global
        # mask): the model JSON says which weights take no gradient, and which no op took.
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.fc = nn.Embedding(16, 8), nn.Linear(8, 4)
                self.spare = nn.Linear(8, 8)
                self.emb.weight.requires_grad_(False)
                self.fc.weight.requires_grad_(False)

            def forward(self, ids):
                return self.fc(self.emb(ids))

        torch.manual_seed(0)
        model, ids = M(), torch.randint(0, 16, (2, 5))
        records = ex.record_ops(model, lambda: model(ids).square().mean(), "fp32",
                                device_type="cpu")
        mj = qm.model_json(records, "m")
        ops = {o["name"]: o for o in mj["ops"]}
        self.assertEqual((ops["emb"]["param_numel"], ops["emb"]["frozen_numel"]), (128, 128))
        self.assertEqual((ops["fc"]["param_numel"], ops["fc"]["frozen_numel"]), (36, 32))
        self.assertEqual(mj["unused_params"], {"numel": 72.0,
                                               "names": ["spare.weight", "spare.bias"]})
        self.assertEqual(sum(o["param_numel"] for o in mj["ops"]) + 72,
                         sum(p.numel() for p in model.parameters()))

    def test_model_check_names_the_step_that_fails(self):
        from qsync.model_check import ModelCheckError, check_model

        class Refuses16Bits(nn.Module):  # e.g. a custom kernel that takes fp32 alone
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                if torch.is_autocast_enabled("cpu"):
                    raise TypeError("fp32 only")
                return self.fc(x)

        x = torch.randn(3, 4)
        m = Refuses16Bits()
        with self.assertRaisesRegex(ModelCheckError, "the uniform bf16 plan failed: TypeError"):
            check_model(m, lambda: m(x).square().mean(), "refuses")
        p = nn.ReLU()
        with self.assertRaisesRegex(ModelCheckError, "no op holds a parameter"):
            check_model(p, lambda: p(x.requires_grad_()).sum(), "no-params")
        ok = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
        mj = check_model(ok, lambda: ok(x).square().mean(), "mlp")
        self.assertEqual([o["name"] for o in mj["ops"]], ["0", "1", "2"])

    def test_ops_without_a_backward_are_marked(self):
        # An identity, a dropout of p = 0 (it returns its input) and a view-free pass-through
        # make no autograd node: no backward work, and the profile has no backward range for
        # them, so the model JSON says "backward": false (lowbit-plan prices 0, not the
        # roofline). An in-place ReLU on a linear's output and the linears have one.
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.same, self.drop = nn.Linear(4, 8), nn.Identity(), nn.Dropout(0.0)
                self.act, self.fc2 = nn.ReLU(inplace=True), nn.Linear(8, 2)

            def forward(self, x):
                return self.fc2(self.act(self.drop(self.same(self.fc1(x)))))

        model, x = M().train(), torch.randn(3, 4)
        records = ex.record_ops(model, lambda: model(x).square().mean(), "fp32",
                                device_type="cpu")
        backward = {o["name"]: o.get("backward", True)
                    for o in qm.model_json(records, "m")["ops"]}
        self.assertEqual(backward, {"fc1": True, "same": False, "drop": False, "act": True,
                                    "fc2": True})

    def test_buffers_left_as_found(self):
        model, step = self.make()
        before = {n: b.clone() for n, b in model.named_buffers()}
        ex.record_ops(model, step, "fp32", device_type="cpu")
        for n, b in model.named_buffers():
            self.assertTrue(torch.equal(b, before[n]), n)
        # Running statistics are state, not saved activations.
        records = ex.record_ops(model, step, "fp32", device_type="cpu")
        self.assertEqual(records["block.bn1"]["kind"], "batch_norm")

    def test_unused_output_closes_its_range(self):
        # An op whose second output is unused: its backward range closes when the nodes
        # this backward runs have run, before the op before it starts its backward.
        class Two(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.ones(4))

            def forward(self, x):
                return x * self.w, x + self.w

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc0, self.two, self.fc = nn.Linear(4, 4), Two(), nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(self.two(self.fc0(x))[0])

        m = M()
        x = torch.randn(3, 4)
        records, mj, trace = _export(m, lambda: m(x).sum())
        ranges = [e["name"] for e in _ranges(trace)]
        self.assertEqual(ranges.count("two.backward"), 1)
        self.assertEqual(_overlaps(trace), [])


if torch is not None:
    class Checkpointed(nn.Module):
        """Blocks under activation checkpointing (torch.utils.checkpoint), non-reentrant
        or reentrant; ``shared`` calls one block in every region, or ``ckpt=False``, the
        same model without it."""

        def __init__(self, ckpt=True, reentrant=False, shared=False):
            super().__init__()
            self.ckpt, self.reentrant, self.shared = ckpt, reentrant, shared
            self.inp = nn.Linear(8, 16)
            n = 1 if shared else 3
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))
                for _ in range(n))
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            h = self.inp(x)
            for i in range(3):
                b = self.blocks[0 if self.shared else i]
                if self.ckpt:
                    h = h + torch.utils.checkpoint.checkpoint(b, h, use_reentrant=self.reentrant)
                else:
                    h = h + b(h)
            return self.head(h)


@unittest.skipIf(torch is None, "needs torch")
class ActivationCheckpointing(unittest.TestCase):
    """A recomputed region (torch.utils.checkpoint runs its forward again during
    backward) runs each op at the plan's precision, as its forward call did: the
    gradients equal those of the same model without checkpointing, bit for bit."""

    def grads(self, model, plan, x):
        torch.manual_seed(0)  # the same weights for every variant
        fresh = type(model)(model.ckpt, model.reentrant, model.shared)
        model.load_state_dict(fresh.state_dict())
        step = lambda: model(x).square().mean()  # noqa: E731
        mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"), "ckpt")
        step_under_plan(model, plan, mj, step)
        self.assertFalse(torch.is_autocast_enabled("cpu"))  # every context left
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    def test_recomputed_ops_run_at_their_planned_precision(self):
        x = torch.randn(6, 8)
        plan = {"default": "bf16", "ops": {"blocks.0.0": "fp32", "blocks.1.3": "fp32",
                                           "blocks.2.2": "fp32"}}
        ref = self.grads(Checkpointed(ckpt=False), plan, x)
        uniform = self.grads(Checkpointed(ckpt=False), {"default": "bf16"}, x)
        self.assertFalse(all(torch.equal(ref[n], uniform[n]) for n in ref))  # the plan matters
        got = self.grads(Checkpointed(), plan, x)
        for n in ref:
            self.assertTrue(torch.equal(got[n], ref[n]), n)

    def test_a_module_recomputed_in_several_regions(self):
        # One block called in all three regions: each recomputed call is matched to its
        # forward call (the region's saved input, then the forward's order), so its
        # calls may be applied differently. Under the first plan the block's second
        # linear is wrapped in its first call only (the model JSON gives the later calls
        # no parameters of their own); under the second every call of it runs at fp32.
        x = torch.randn(6, 8)
        for ops in ({"blocks.0.0": "fp32"}, {"inp": "bf16", "blocks.0.0": "fp32",
                                            "blocks.0.2": "fp32", "blocks.0.3": "fp32"}):
            plan = {"default": "bf16", "ops": ops}
            ref = self.grads(Checkpointed(ckpt=False, shared=True), plan, x)
            got = self.grads(Checkpointed(shared=True), plan, x)
            for n in ref:
                self.assertTrue(torch.equal(got[n], ref[n]), (ops, n))

    def test_a_call_that_cannot_be_matched_is_an_error_unless_all_run_alike(self):
        model, x = Checkpointed(shared=True), torch.randn(6, 8)
        step = lambda: model(x).square().mean()  # noqa: E731
        mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"), "ckpt")
        calls = ["blocks.0.2", "blocks.0.2#2", "blocks.0.2#3"]
        with applied_plan(model, {"default": "bf16", "ops": {"blocks.0.0": "fp32"}}, mj,
                          device_type="cpu") as ap:
            with self.assertRaisesRegex(RuntimeError, "'blocks.0.2' is recomputed by "
                                        "activation checkpointing and called 3 times a "
                                        "step, applied differently"):
                ap._recomputed("blocks.0.2", calls)
            self.assertEqual(ap._recomputed("blocks.0.3", ["blocks.0.3", "blocks.0.3#2"]),
                             "blocks.0.3")

    def test_reentrant_checkpointing_is_refused_by_name(self):
        # its forward runs without autograd: export could not see the region's ops
        model, x = Checkpointed(reentrant=True), torch.randn(6, 8)
        with self.assertRaisesRegex(RuntimeError, "op 'blocks.0.0' runs under reentrant "
                                    "activation checkpointing"):
            ex.record_ops(model, lambda: model(x).square().mean(), "fp32", device_type="cpu")

    def test_profiling_leaves_a_recomputation_in_its_backward_range(self):
        # no op ranges of its own: its time is the backward's that needs it
        model, x = Checkpointed(), torch.randn(6, 8)
        records, mj, trace = _export(model, lambda: model(x).square().mean())
        names = [e["name"] for e in _ranges(trace)]
        ops = [o["name"] for o in mj["ops"]]
        self.assertEqual(sorted(n for n in names if not n.endswith(".backward")), sorted(ops))
        self.assertFalse(any("#" in n for n in names), names)
        self.assertEqual(_overlaps(trace), [])


if torch is not None:
    def _builtins():
        """torch's own layers the other tests do not build: {name: (model, step)}."""
        from torch.nn.utils import parametrizations as P

        class RNN(nn.Module):
            def __init__(self, cell):
                super().__init__()
                self.emb = nn.Embedding(40, 16)
                self.rnn = cell(16, 24, num_layers=2, batch_first=True, bidirectional=True)
                self.head = nn.Linear(48, 40)

            def forward(self, x):
                return self.head(self.rnn(self.emb(x))[0])

        class Bag(nn.Module):
            def __init__(self):
                super().__init__()
                self.bag, self.act, self.fc = nn.EmbeddingBag(30, 16), nn.PReLU(), nn.Linear(16, 2)

            def forward(self, x, offsets):
                return self.fc(self.act(self.bag(x, offsets)))

        ids = torch.randint(0, 40, (3, 7))
        lm = lambda m: lambda: F.cross_entropy(m(ids).flatten(0, 1), ids.flatten())  # noqa: E731
        out = {}
        for cell in (nn.LSTM, nn.GRU):
            m = RNN(cell)
            out[cell.__name__] = (m, lm(m))
        t = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=32, batch_first=True)
        src, tgt = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
        out["Transformer"] = (t, lambda: t(src, tgt).square().mean())
        norm = nn.Sequential(P.weight_norm(nn.Linear(8, 16)), nn.ReLU(),
                             P.spectral_norm(nn.Linear(16, 2)))
        x8 = torch.randn(4, 8)
        out["parametrizations"] = (norm, lambda: norm(x8).square().mean())
        bag, flat, offsets = Bag(), torch.randint(0, 30, (9,)), torch.tensor([0, 4])
        out["EmbeddingBag"] = (bag, lambda: bag(flat, offsets).square().mean())
        vol = nn.Sequential(nn.Conv3d(2, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU(),
                            nn.ConvTranspose3d(4, 2, 2, stride=2), nn.GroupNorm(1, 2),
                            nn.Flatten(2), nn.Conv1d(2, 3, 3), nn.AdaptiveAvgPool1d(1))
        v = torch.randn(2, 2, 3, 3, 3)
        out["conv3d"] = (vol, lambda: vol(v).square().mean())
        seq = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)])
        out["checkpoint_sequential"] = (seq, lambda: torch.utils.checkpoint.checkpoint_sequential(
            seq, 2, x8, use_reentrant=False).square().mean())
        return out


@unittest.skipIf(torch is None, "needs torch")
class TorchBuiltins(unittest.TestCase):
    def test_check_model_on_torchs_own_layers(self):
        from qsync.model_check import check_model

        torch.manual_seed(0)
        for name, (model, step) in _builtins().items():
            with self.subTest(model=name):
                check_model(model.train(), step, name)


if __name__ == "__main__":
    unittest.main()
