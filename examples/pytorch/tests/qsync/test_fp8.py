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
    """A device _scaled_mm runs on here, or None."""
    if torch is None or not hasattr(torch, "float8_e4m3fn"):
        return None
    for dev in (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]:
        try:
            a = torch.ones(16, 16, device=dev).to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev)
            torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            return dev
        except (RuntimeError, NotImplementedError, TypeError):
            continue
    return None


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
