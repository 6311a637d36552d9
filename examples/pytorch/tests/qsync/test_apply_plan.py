"""CPU tests of the plan applier, qsync.apply_plan (needs torch; CPU autocast in
bfloat16).

The failing shape: a module whose forward combines, in one functional op, the outputs of
leaf modules the plan puts at different precisions (q's Linear at fp32, k's and v's at
bf16, then F.scaled_dot_product_attention), and an fp32 output added in place into a
16-bit one. Any plan the allocator may emit must run."""

import unittest

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the torch-free tests are test_qsync_model.py
    torch = None

if torch is not None:
    from qsync import export as ex
    from qsync import qsync_model as qm
    from qsync.apply_plan import applied_plan

    class Attention(nn.Module):
        """q, k, v and o Linears, attention and a residual between them as functional
        code (not modules), then a norm."""

        def __init__(self, hidden=16, heads=2):
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
            self.ln = nn.LayerNorm(hidden)

        def forward(self, x):
            b, s, h = x.shape
            n = self.heads
            split = lambda t: t.view(b, s, n, h // n).transpose(1, 2)  # noqa: E731
            a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)),
                                               split(self.v(x)))
            y = self.o(a.transpose(1, 2).reshape(b, s, h))
            y += x  # in place: the ambient dtype must hold the result
            return self.ln(y)

    class Net(nn.Module):
        def __init__(self, hidden=16):
            super().__init__()
            self.inp = nn.Linear(8, hidden)
            self.att = Attention(hidden)
            self.fc1 = nn.Linear(hidden, hidden)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(hidden, 4)

        def forward(self, x):
            y = self.att(self.inp(x))
            return self.fc2(self.act(self.fc1(y)))


@unittest.skipIf(torch is None, "needs torch")
class AppliedPlan(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = Net()
        self.x = torch.randn(2, 6, 8)
        self.y = torch.randint(0, 4, (2, 6))
        self.step = lambda: F.cross_entropy(self.model(self.x).flatten(0, 1), self.y.flatten())
        records = ex.record_ops(self.model, self.step, "fp32", device_type="cpu")
        self.model_json = qm.model_json(records, "net")

    def run_plan(self, plan, seen=None):
        """One training step under `plan`; `seen` (module name -> list) collects the
        dtypes of each listed module's first input as the module gets it."""
        self.model.zero_grad(set_to_none=True)
        with applied_plan(self.model, plan, self.model_json, device_type="cpu") as ap:
            hooks = []
            for name in seen or {}:
                m = dict(self.model.named_modules())[name]
                hooks.append(m.register_forward_pre_hook(
                    lambda mod, args, kwargs, n=name: seen[n].append(args[0].dtype),
                    with_kwargs=True))
            with ap.step_context():
                loss = self.step()
            loss.backward()
            for h in hooks:
                h.remove()
        self.assertTrue(torch.isfinite(loss).item())
        for n, p in self.model.named_parameters():
            self.assertEqual(p.grad.dtype, torch.float32, n)
        return ap

    def test_mixed_attention_inputs_outside_autocast(self):
        # Ambient fp32 (most ops), k and v at bf16: before the applier cast outputs back
        # to the ambient dtype this raised "Expected query, key, and value to have the
        # same dtype" in scaled_dot_product_attention.
        ap = self.run_plan({"default": "fp32", "ops": {"att.k": "bf16", "att.v": "bf16"}})
        self.assertEqual(ap.ambient, "fp32")

    def test_fp32_ops_in_a_16_bit_ambient(self):
        # Ambient bf16 (most parameter ops; a tie would go to fp32) with o at fp32: o's
        # fp32 output is added in place into the residual, and fc1 -> fc2 at fp32 must
        # pass fc1's own fp32 output, not its bf16 cast (the edge has no cast in lowbit's
        # model).
        seen = {"att.o": [], "att.ln": [], "fc2": []}
        ap = self.run_plan({"default": "bf16",
                            "ops": {"att.o": "fp32", "fc1": "fp32", "fc2": "fp32"}}, seen)
        self.assertEqual(ap.ambient, "bf16")
        self.assertEqual(seen["att.o"], [torch.float32])  # attention's output, cast by o
        self.assertEqual(seen["att.ln"], [torch.bfloat16])  # the in-place sum, ambient
        self.assertEqual(seen["fc2"], [torch.float32])  # act follows fc1 at fp32
        self.assertEqual(ap.resolved["act"], "fp32")

    def test_uniform_and_alternating_plans(self):
        params = [o["name"] for o in self.model_json["ops"] if o["param_numel"] > 0]
        for default in ("fp32", "bf16"):
            ap = self.run_plan(qm.uniform_plan(default))
            self.assertEqual(ap.wrapped, {})  # the profiled program itself
            self.assertEqual(ap.kept, {})
        # Every other parameter op at the other precision: every edge is mixed.
        for first, second in (("fp32", "bf16"), ("bf16", "fp32")):
            ops = {n: (first if k % 2 else second) for k, n in enumerate(params)}
            ap = self.run_plan({"default": "fp32", "ops": ops})
            self.assertEqual(ap.kept, {})  # nothing held past the step

    def test_wrap_all_wraps_every_op_and_changes_nothing(self):
        # validate.py's probe of the wrappers' host cost: a uniform plan with every op
        # wrapped at its own precision computes what the unwrapped plan does.
        def step(plan, wrap_all):
            self.model.zero_grad(set_to_none=True)
            with applied_plan(self.model, plan, self.model_json, device_type="cpu",
                              wrap_all=wrap_all) as ap:
                with ap.step_context():
                    loss = self.step()
                loss.backward()
            return ap, loss.item(), {n: p.grad.clone() for n, p in self.model.named_parameters()}

        for default in ("fp32", "bf16"):
            plan = qm.uniform_plan(default)
            _, loss, grads = step(plan, False)
            ap, wrapped_loss, wrapped_grads = step(plan, True)
            self.assertEqual(set(ap.wrapped), {o["name"] for o in self.model_json["ops"]})
            self.assertEqual(set(ap.wrapped.values()), {default})
            self.assertEqual(wrapped_loss, loss, default)
            for n, g in grads.items():
                self.assertTrue(torch.equal(wrapped_grads[n], g), (default, n))

    def test_one_tensor_in_several_arguments_is_cast_once(self):
        # Self-attention: nn.MultiheadAttention gets one tensor as query, key and value and
        # projects it with one packed matmul when they are the same object. At fp32 in a
        # bf16 step it takes its producer's bf16 output and casts it: its three arguments
        # must stay one tensor.
        class SelfAttention(nn.Module):
            def __init__(self):
                super().__init__()
                self.inp = nn.Linear(8, 8)
                self.att = nn.MultiheadAttention(8, 2, batch_first=True)
                self.head = nn.Linear(8, 4)

            def forward(self, x):
                h = self.inp(x)
                return self.head(self.att(h, h, h, need_weights=False)[0])

        torch.manual_seed(0)
        model = SelfAttention()
        x = torch.randn(2, 5, 8)
        step = lambda: model(x).float().pow(2).mean()  # noqa: E731
        mj = qm.model_json(ex.record_ops(model, step, "fp32", device_type="cpu"), "sa")
        seen = []
        import torch.nn.functional as fn_mod
        orig = fn_mod.multi_head_attention_forward

        def spy(query, key, value, *a, **k):
            seen.append((query is key, key is value, query.dtype))
            return orig(query, key, value, *a, **k)

        fn_mod.multi_head_attention_forward = spy
        try:
            with applied_plan(model, {"default": "bf16", "ops": {"att": "fp32"}}, mj,
                              device_type="cpu") as ap:
                self.assertEqual(ap.wrapped.get("att"), "fp32")
                with ap.step_context():
                    loss = step()
                loss.backward()
        finally:
            fn_mod.multi_head_attention_forward = orig
        self.assertTrue(seen)
        self.assertEqual(seen[-1], (True, True, torch.float32))

    def test_hooks_only_on_wrapped_modules(self):
        # A module hook costs host time on every call, which no profile holds: a uniform
        # plan installs none, a mixed one only on the modules of the ops it wraps.
        def hooked():
            return {n for n, m in self.model.named_modules()
                    if m._forward_pre_hooks or m._forward_hooks}

        with applied_plan(self.model, qm.uniform_plan("bf16"), self.model_json,
                          device_type="cpu"):
            self.assertEqual(hooked(), set())
        plan = {"default": "bf16", "ops": {"fc1": "fp32"}}
        with applied_plan(self.model, plan, self.model_json, device_type="cpu") as ap:
            # fc1 at fp32, act following it, fc2 fed by act; the root clears the counts.
            self.assertEqual(set(ap.wrapped), {"fc1", "act", "fc2"})
            self.assertEqual(hooked(), {"", "fc1", "act", "fc2"})
        self.assertEqual(hooked(), set())
        self.run_plan(plan)  # and it still runs

    def test_an_op_at_the_ambient_enters_no_context(self):
        # fc2 runs at the ambient, wrapped only because act (after fc1, at fp32) feeds
        # it: it takes act's ambient copy, so it enters no autocast of its own; fc1 and
        # act enter one each (act follows fc1 at fp32).
        from unittest import mock

        entered = []
        real = torch.autocast.__enter__

        def counting(ctx):
            entered.append(ctx)
            return real(ctx)
        plan = {"default": "bf16", "ops": {"fc1": "fp32"}}
        with mock.patch.object(torch.autocast, "__enter__", counting):
            with applied_plan(self.model, plan, self.model_json, device_type="cpu") as ap:
                self.assertEqual(ap.wrapped["fc2"], ap.ambient)
                with ap.step_context():
                    out = self.model(self.x)
        self.assertEqual(len(entered), 3)  # the step's, fc1's, act's
        self.assertEqual(out.dtype, torch.bfloat16)

    def test_own_outputs_released_after_the_last_consumer(self):
        # q at fp32 in a bf16 ambient: its own output is kept until the last op the model
        # JSON lists as consuming it has started, and let go then. That op is o, which
        # reads q's output through the functional attention; ln reads o's output (plus the
        # residual added in place), not q's.
        plan = {"default": "bf16", "ops": {"att.q": "fp32"}}
        last = [o["name"] for o in self.model_json["ops"] if "att.q" in o["inputs"]][-1]
        self.assertEqual(last, "att.o")
        with applied_plan(self.model, plan, self.model_json, device_type="cpu") as ap:
            held = {}

            def count(name):
                def hook(mod, args):
                    held.setdefault(name, len(ap.kept))  # returns None: args unchanged
                return hook

            hooks = [self.model.att.v.register_forward_pre_hook(count("att.v")),
                     self.model.fc1.register_forward_pre_hook(count("fc1"))]
            with ap.step_context():
                self.step()
            for h in hooks:
                h.remove()
        # held while v runs (after q, before o), let go by the time fc1 runs
        self.assertEqual(held, {"att.v": 1, "fc1": 0})

