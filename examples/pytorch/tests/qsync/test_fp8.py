"""fp8 linear layers (qsync/fp8.py) and plans that put them at fp8 (qsync/apply_plan.py):
the three GEMMs against fp64 within the bound fp8.py derives, and refused ops named. Runs
where torch._scaled_mm runs (CUDA on sm_89+, or a CPU build of torch that has it)."""

import unittest

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    torch = None


def _device():
    """A device _scaled_mm runs on here (qsync.fp8.first_device), or None."""
    if torch is None or not hasattr(torch, "float8_e4m3fn"):
        return None
    from qsync import fp8

    return fp8.first_device()


DEVICE = _device()

if DEVICE is not None:
    from qsync import export as ex
    from qsync import fp8
    from qsync import qsync_model as qm
    from qsync.apply_plan import applied_plan

    class _Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act = nn.Linear(32, 64), nn.GELU()
            self.norm, self.fc2 = nn.LayerNorm(64), nn.Linear(64, 16)

        def forward(self, x):
            return self.fc2(self.norm(self.act(self.fc1(x))))


@unittest.skipIf(DEVICE is None, "torch._scaled_mm does not run here")
class Fp8Gemms(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(48, 64, generator=g)
        self.x[5, :] *= 300.0  # a row of outliers: most values then sit far below amax
        self.x[:, 7] *= 1e-4   # and a column near the subnormals
        self.w = torch.randn(32, 64, generator=g) * 0.05
        self.dy = torch.randn(48, 32, generator=g)

    def scales(self):
        return (fp8.quantize(self.x, fp8.E4M3)[1].item(), fp8.quantize(self.w, fp8.E4M3)[1].item(),
                fp8.quantize(self.dy, fp8.E5M2)[1].item())

    def test_forward_within_the_bound_and_not_bf16(self):
        x, w = self.x.to(DEVICE), self.w.to(DEVICE)
        y = fp8.linear(x, w).double().cpu()
        ref = self.x.double() @ self.w.double().t()
        sx, sw, _ = self.scales()
        bound = fp8.gemm_bound(self.x.double(), self.w.double().t(), fp8.E4M3, fp8.E4M3, sx, sw)
        self.assertTrue(bool(((y - ref).abs() <= bound).all()), (y - ref).abs().max())
        bf16 = (self.x.bfloat16() @ self.w.bfloat16().t()).double()
        self.assertGreater((y - bf16).abs().max().item(), 0.0)  # the fp8 path ran

    def test_both_backward_gemms_within_the_bound(self):
        x = self.x.to(DEVICE).requires_grad_()
        w = self.w.to(DEVICE).requires_grad_()
        fp8.linear(x, w).backward(self.dy.to(DEVICE).to(fp8.CARRIER))
        sx, sw, sg = self.scales()
        dy, xd, wd = self.dy.bfloat16().double(), self.x.double(), self.w.double()
        dx_bound = fp8.gemm_bound(dy, wd, fp8.E5M2, fp8.E4M3, sg, sw, out_rounding=2.0 ** -24)
        dw_bound = fp8.gemm_bound(dy.t(), xd, fp8.E5M2, fp8.E4M3, sg, sx, out_rounding=2.0 ** -24)
        self.assertEqual(x.grad.dtype, torch.float32)
        self.assertTrue(bool(((x.grad.double().cpu() - dy @ wd).abs() <= dx_bound).all()))
        self.assertTrue(bool(((w.grad.double().cpu() - dy.t() @ xd).abs() <= dw_bound).all()))

    def test_a_token_count_that_is_no_multiple_of_16(self):
        # the weight gradient reduces over the tokens, which fp8 GEMMs want a multiple of
        # 16 on CUDA: the transposes are padded with zeros, the bound still holds
        for rows in (13, 1, 394 % 48):
            xs, dys = self.x[:rows], self.dy[:rows]
            x = xs.to(DEVICE).requires_grad_()
            w = self.w.to(DEVICE, copy=True).requires_grad_()  # a gradient of its own each time
            fp8.linear(x, w).backward(dys.to(DEVICE).to(fp8.CARRIER))
            sx = fp8.quantize(xs, fp8.E4M3)[1].item()
            sg = fp8.quantize(dys.bfloat16(), fp8.E5M2)[1].item()
            dy, xd = dys.bfloat16().double(), xs.double()
            bound = fp8.gemm_bound(dy.t(), xd, fp8.E5M2, fp8.E4M3, sg, sx, out_rounding=2.0 ** -24)
            self.assertEqual(tuple(x.grad.shape), (rows, 64))
            self.assertTrue(bool(((w.grad.double().cpu() - dy.t() @ xd).abs() <= bound).all()), rows)

    def test_the_transpose_is_padded_with_zeros(self):
        q, qt, _ = fp8.cast(self.x[:13].to(DEVICE), fp8.E4M3)
        self.assertEqual(tuple(qt.shape), (64, 16))
        self.assertTrue(torch.equal(qt[:, :13].view(torch.uint8), q.t().view(torch.uint8)))
        self.assertFalse(bool(qt[:, 13:].view(torch.uint8).any()))

    def test_a_bf16_input_gets_a_bf16_gradient_within_the_bound(self):
        # the input gradient comes out of the GEMM in the input's type
        x = self.x.bfloat16().to(DEVICE).requires_grad_()
        w = self.w.to(DEVICE).requires_grad_()
        fp8.linear(x, w).backward(self.dy.to(DEVICE).to(fp8.CARRIER))
        _, sw, sg = self.scales()
        dy, wd = self.dy.bfloat16().double(), self.w.double()
        bound = fp8.gemm_bound(dy, wd, fp8.E5M2, fp8.E4M3, sg, sw)  # bf16's rounding
        self.assertEqual(x.grad.dtype, torch.bfloat16)
        self.assertTrue(bool(((x.grad.double().cpu() - dy @ wd).abs() <= bound).all()))

    def test_the_bias_is_in_the_output_within_the_bound(self):
        x, w = self.x.to(DEVICE), self.w.to(DEVICE)
        b = torch.linspace(-3.0, 3.0, 32, device=DEVICE)
        y = fp8.linear(x, w, b).double().cpu()
        ref = self.x.double() @ self.w.double().t() + b.bfloat16().double().cpu()
        sx, sw, _ = self.scales()
        bound = fp8.gemm_bound(self.x.double(), self.w.double().t(), fp8.E4M3, fp8.E4M3, sx, sw)
        bound = bound + 2.0 ** -8 * ref.abs()  # the sum's rounding to bf16
        self.assertTrue(bool(((y - ref).abs() <= bound).all()), (y - ref).abs().max())

    def test_bias_and_leading_dimensions(self):
        lin = nn.Linear(64, 32).to(DEVICE)
        x = torch.randn(3, 16, 64, device=DEVICE, requires_grad=True)
        y = fp8.forward_of(lin)(x)
        self.assertEqual(tuple(y.shape), (3, 16, 32))
        self.assertEqual(y.dtype, fp8.CARRIER)
        y.float().sum().backward()
        self.assertTrue(torch.allclose(lin.bias.grad, torch.full_like(lin.bias, 48.0)))
        self.assertEqual(tuple(x.grad.shape), (3, 16, 64))

    def test_ops_that_cannot_run_at_fp8_are_refused_by_name(self):
        with self.assertRaisesRegex(fp8.Fp8Unsupported, "'body.2'.*Conv2d"):
            fp8.check_op("body.2", nn.Conv2d(3, 16, 3))
        with self.assertRaisesRegex(fp8.Fp8Unsupported, "'head'.*10 -> 20.*multiples of 16"):
            fp8.check_op("head", nn.Linear(10, 20))
        fp8.check_op("ok", nn.Linear(32, 48))


@unittest.skipIf(DEVICE is None, "torch._scaled_mm does not run here")
class Fp8Plans(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = _Net().to(DEVICE)
        self.x = torch.randn(16, 32, device=DEVICE)
        self.y = torch.randint(0, 16, (16,), device=DEVICE)
        self.step = lambda: F.cross_entropy(self.model(self.x).float(), self.y)
        records = ex.record_ops(self.model, self.step, "fp32", device_type=DEVICE)
        self.model_json = qm.model_json(records, "net")

    def test_a_plan_with_fp8_linears_runs_them_and_restores_the_modules(self):
        calls = []
        real = fp8.linear
        fp8.linear = lambda *a: calls.append(1) or real(*a)
        try:
            for plan in ({"default": "bf16", "ops": {"fc1": "fp8"}}, {"default": "fp8"}):
                self.model.zero_grad(set_to_none=True)
                calls.clear()
                with applied_plan(self.model, plan, self.model_json, device_type=DEVICE) as ap:
                    with ap.step_context():
                        loss = self.step()
                    loss.backward()
                self.assertEqual(len(calls), 1 if plan.get("ops") else 2, plan)
                self.assertTrue(all(torch.isfinite(p.grad).all() for p in self.model.parameters()))
                self.assertNotIn("forward", self.model.fc1.__dict__)  # the module is itself again
        finally:
            fp8.linear = real

    def test_a_plan_putting_a_norm_at_fp8_is_refused_by_name(self):
        with self.assertRaisesRegex(fp8.Fp8Unsupported, "'norm'.*LayerNorm"):
            applied_plan(self.model, {"default": "bf16", "ops": {"norm": "fp8"}}, self.model_json,
                         device_type=DEVICE)


if __name__ == "__main__":
    unittest.main()


def _fused_cast():
    """The fused cast module where CUDA and _scaled_mm are here and it builds, else None."""
    if DEVICE != "cuda":
        return None
    return fp8._cast_module()


@unittest.skipIf(DEVICE != "cuda", "the fused cast is CUDA code (and needs fp8 on this GPU)")
class FusedCast(unittest.TestCase):
    """csrc/fp8_cast.cu against quantize(), the torch expression it replaces: the same bits
    in both layouts, for every input dtype, both formats, ragged shapes and specials."""

    def setUp(self):
        if _fused_cast() is None:
            self.fail("qsync fp8: the fused cast did not build on this CUDA machine")

    def inputs(self):
        g = torch.Generator(device="cuda").manual_seed(11)
        for shape in [(1, 16), (67, 129), (64, 64), (72, 136), (130, 8), (300, 1000), (1024, 2048)]:
            x = torch.randn(*shape, device="cuda", generator=g)
            x[0, 0] *= 1e4  # outlier: most values far below amax, some near the subnormals
            if shape[0] > 2 and shape[1] > 5:
                x[1, :5] = torch.tensor([0.0, -0.0, 1e-30, -3e-8, 2.5], device="cuda")
            yield x
        yield torch.zeros(33, 65, device="cuda")  # amax 0: scale 1
        special = torch.randn(40, 48, device="cuda", generator=g)
        special[3, 3], special[7, 9] = float("nan"), float("inf")
        yield special  # amax NaN: scale 1 (as torch's where), NaN stays, inf clamps to the max

    def test_the_same_bits_as_quantize_in_both_layouts(self):
        for x in self.inputs():
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                for fmt in (fp8.E4M3, fp8.E5M2):
                    t = x.to(dtype)
                    want, want_scale = fp8.quantize(t, fmt)
                    q, qt, scale = fp8.cast(t, fmt, transposed=True)
                    what = (tuple(t.shape), dtype, fmt)
                    self.assertEqual(q.dtype, fmt)
                    self.assertTrue(torch.equal(scale, want_scale) or
                                    (scale.isnan().item() and want_scale.isnan().item()), what)
                    self.assertTrue(torch.equal(q.view(torch.uint8), want.view(torch.uint8)), what)
                    self.assertTrue(torch.equal(qt.view(torch.uint8),
                                                fp8.padded_t(want).view(torch.uint8)), what)

    def test_a_tensor_stored_transposed_is_cast_without_a_copy_and_the_same(self):
        w = torch.randn(96, 160, device="cuda").t()  # a Conv1D weight: its .t() is contiguous
        want, _ = fp8.quantize(w, fp8.E4M3)
        q, qt, _ = fp8.cast(w, fp8.E4M3)
        self.assertTrue(torch.equal(q.view(torch.uint8), want.view(torch.uint8)))
        self.assertTrue(torch.equal(qt.view(torch.uint8), fp8.padded_t(want).view(torch.uint8)))

    def test_bad_inputs_are_refused_by_name(self):
        m = _fused_cast()
        inv = fp8.INV_MAX[fp8.E4M3]
        with self.assertRaisesRegex(Exception, "contiguous 2-D CUDA"):
            m.fp8_cast(torch.ones(4, 4, 4, device="cuda"), fp8.E4M3, 448.0, inv, True)
        with self.assertRaisesRegex(Exception, "contiguous 2-D CUDA"):
            m.fp8_cast(torch.ones(4, 4), fp8.E4M3, 448.0, inv, True)
        with self.assertRaisesRegex(Exception, "not reciprocals"):
            m.fp8_cast(torch.ones(4, 4, device="cuda"), fp8.E4M3, 448.0, 1.0, True)
        with self.assertRaisesRegex(Exception, "float8_e4m3fn or float8_e5m2"):
            m.fp8_cast(torch.ones(4, 4, device="cuda"), torch.bfloat16, 448.0, inv, True)
        with self.assertRaisesRegex(Exception, "float32, bfloat16 or float16"):
            m.fp8_cast(torch.ones(4, 4, device="cuda").double(), fp8.E4M3, 448.0, inv, True)

    def test_empty_and_misaligned_inputs(self):
        # no rows: no launch, scale 1; a view 2 bytes into its storage: the value-by-value path
        q, qt, scale = fp8.cast(torch.ones(0, 32, device="cuda"), fp8.E4M3)
        self.assertEqual((tuple(q.shape), tuple(qt.shape), scale.item()), ((0, 32), (32, 0), 1.0))
        base = torch.randn(40 * 72 + 1, device="cuda").bfloat16()
        x = base[1:].view(40, 72)
        want, _ = fp8.quantize(x, fp8.E5M2)
        q, qt, _ = fp8.cast(x, fp8.E5M2)
        self.assertTrue(torch.equal(q.view(torch.uint8), want.view(torch.uint8)))
        self.assertTrue(torch.equal(qt.view(torch.uint8), fp8.padded_t(want).view(torch.uint8)))

    def test_the_linear_gives_the_torch_casts_bits(self):
        # the fp8 linear with the fused cast and with the torch expression: identical outputs
        # and gradients (the GEMMs get the same operands either way)
        g = torch.Generator(device="cuda").manual_seed(5)
        x0 = torch.randn(4, 24, 64, device="cuda", generator=g).bfloat16()
        w0 = torch.randn(48, 64, device="cuda", generator=g) * 0.05
        b0 = torch.randn(48, device="cuda", generator=g)
        dy = torch.randn(4, 24, 48, device="cuda", generator=g).bfloat16()
        results = []
        saved = fp8._CAST.get("cuda")
        try:
            for module in (saved, None):
                fp8._CAST["cuda"] = module
                x, w, b = (t.clone().requires_grad_(True) for t in (x0, w0, b0))
                y = fp8.linear(x, w, b)
                y.backward(dy)
                results.append((y, x.grad, w.grad, b.grad))
        finally:
            fp8._CAST["cuda"] = saved
        for fused, torch_ops in zip(*results):
            self.assertTrue(torch.equal(fused, torch_ops))
