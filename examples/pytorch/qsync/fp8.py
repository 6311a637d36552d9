"""fp8 linear layers for plans that put ops in fp8 (apply_plan.py).

A linear op at fp8 runs its three GEMMs through ``torch._scaled_mm``:

- forward      y  = x W^T + b      x and W in e4m3 (3 mantissa bits, max 448)
- backward     dx = dy W           dy in e5m2 (2 mantissa bits, max 57344), W in e4m3
               dW = dy^T x         dy in e5m2, x in e4m3
               db = sum(dy)        in the gradient's own dtype

Scaling is per tensor and current (the scale of a tensor is its amax at this call times
the fp32 reciprocal of the format's largest finite value; a tensor of zeros, or one with a
NaN, gets scale 1), the rule torchao's float8 calls "dynamic" scaling; no amax history.
The parameters keep their master copy at the precision the model holds them in (fp32):
only the GEMM operands are fp8. The output is
in ``CARRIER`` (bf16), the dtype an fp8 op hands the ops after it, and the GEMMs accumulate
in fp32.

Layouts: ``torch._scaled_mm`` takes its first operand row-major and its second
column-major, so every operand is wanted in both layouts by one of its two GEMMs (the
weight gradient reduces over the tokens, which x and dy hold as rows). It also wants the
dimension a GEMM reduces over to be a multiple of 16: the weight gradient's is the token
count, which is any number (a ViT at batch 2 has 394), so the transposes of x and dy are
padded to a multiple of 16 tokens with zeros, which add nothing to the sums. ``cast``
computes the scale and writes an operand in fp8 and its padded transpose on CUDA in two
passes over it and one call from Python (``csrc/fp8_cast.cu``, built just in time on
first use), with the bits of ``quantize``, the torch expression it replaces: that takes
seven launches (each ~10 us of host time, more than the GPU's for a small operand), fp32
temporaries and a 1-byte transpose far below memory bandwidth.

Which modules: ``nn.Linear`` and transformers' ``Conv1D`` (a linear with its weight stored
transposed). Anything else at fp8 is refused by name (``Fp8Unsupported``), never run at
another precision silently. ``torch._scaled_mm`` on CUDA wants the GEMM's dimensions to be
multiples of 16; an op whose are not is refused by name too.

Error (what the tests hold the GEMMs to): rounding to a format with m mantissa bits moves
a value by at most u = 2^-(m+1) of itself (e4m3: 1/16, e5m2: 1/8), and a value below the
smallest subnormal times the scale (2^-9 and 2^-16 of the scale) by at most half of that;
a product of two rounded operands is off by (u_a + u_b + u_a u_b) |a b| plus the
subnormal terms, summed over the dot product; the output's rounding to bf16 adds 2^-8 of
it.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
CARRIER = torch.bfloat16
MAX = {E4M3: 448.0, E5M2: 57344.0}
#: the unit roundoff of each format (half an ulp at 1), and its smallest subnormal
UNIT = {E4M3: 2.0 ** -4, E5M2: 2.0 ** -3}
TINY = {E4M3: 2.0 ** -9, E5M2: 2.0 ** -16}
#: fp32(1 / max): a scale is amax times it (one rounding here, one in the product)
INV_MAX = {f: (torch.ones((), dtype=torch.float32) / torch.tensor(m, dtype=torch.float32)).item()
           for f, m in MAX.items()}
ALIGN = 16
#: the output types _scaled_mm rounds to in its epilogue
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def runs_on(device) -> bool:
    """True when torch._scaled_mm runs on `device` (CUDA on sm_89 or later, or a CPU build
    of torch that has it)."""
    try:
        a = torch.ones(16, 16, device=device).to(E4M3)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=CARRIER)
        return True
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):
        return False


def first_device():
    """The GPU where fp8 GEMMs run on it, else the CPU where they run there, else None."""
    devices = (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]
    return next((d for d in devices if runs_on(d)), None)


class Fp8Unsupported(ValueError):
    """An op a plan puts at fp8 that the fp8 path cannot run (named)."""


def quantize(t: torch.Tensor, fmt):
    """(t / scale in `fmt`, scale as a 0-d fp32 tensor): current per-tensor scaling, the
    scale amax * INV_MAX (a NaN amax fails `> 0`: scale 1, the NaN stays in q)."""
    amax = t.detach().abs().amax().float()
    scale = torch.where(amax > 0, amax * INV_MAX[fmt], torch.ones_like(amax))
    q = (t.float() / scale).clamp(-MAX[fmt], MAX[fmt]).to(fmt)
    return q, scale


def padded_t(q: torch.Tensor) -> torch.Tensor:
    """q^T row-major with its rows padded to a multiple of ALIGN with zeros (the layout
    ``cast`` gives the transpose)."""
    rows, cols = q.shape
    out = torch.zeros(cols, -(-rows // ALIGN) * ALIGN, dtype=torch.uint8, device=q.device)
    out[:, :rows] = q.view(torch.uint8).t()
    return out.view(q.dtype)


_CAST = {}  # "cuda" -> the fused cast's module, or None where it did not build


def _cast_module():
    """The fused cast (csrc/fp8_cast.cpp, .cu), built just in time once per process; None where
    it cannot be built, with a warning naming why (the casts then run as torch ops: the
    same bits, several times the memory traffic)."""
    if "cuda" not in _CAST:
        import os
        import warnings

        try:
            from torch.utils.cpp_extension import load

            # the compiler lowbit_torch builds with: one that links the libstdc++ this
            # process runs (another one's copy crashes the module's first error message)
            from lowbit_torch._build import build_environment

            csrc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
            with build_environment():
                _CAST["cuda"] = load(name="qsync_fp8_cast",
                                     sources=[os.path.join(csrc, "fp8_cast.cpp"),
                                              os.path.join(csrc, "fp8_cast.cu")],
                                     extra_cflags=["-O3"], extra_cuda_cflags=["-O3"],
                                     verbose=False)
        except Exception as e:  # noqa: BLE001 (any build failure: reported, torch ops run)
            warnings.warn("qsync fp8: the fused cast (csrc/fp8_cast.cu) did not build (%s); "
                          "fp8 operands are cast by torch ops, several times slower"
                          % str(e).splitlines()[0][:200])
            _CAST["cuda"] = None
    return _CAST["cuda"]


def cast(t: torch.Tensor, fmt, transposed: bool = True):
    """(q, q^T or None, scale) of a 2-D tensor: `quantize`'s bits, and the transpose laid
    out row-major with its rows padded to a multiple of ALIGN (``padded_t``: what the other
    side of a GEMM wants). On CUDA one call computes all three (csrc/fp8_cast.cu); a
    tensor whose transpose is contiguous and whose rows need no padding (transformers'
    Conv1D weight) is cast as that transpose with the outputs swapped, so no copy is
    made."""
    if t.dim() != 2:
        raise ValueError("qsync fp8: cast wants a 2-D tensor, got shape %s" % (tuple(t.shape),))
    module = _cast_module() if t.is_cuda else None
    if module is None:
        q, scale = quantize(t, fmt)
        return q, (padded_t(q) if transposed else None), scale
    if (not t.is_contiguous() and t.t().is_contiguous() and t.shape[0] % ALIGN == 0
            and t.shape[1] % ALIGN == 0):
        qt, q, scale = cast(t.t(), fmt, True)
        return q, (qt if transposed else None), scale
    q, qt, scale = module.fp8_cast(t.detach().contiguous(), fmt, MAX[fmt], INV_MAX[fmt],
                                   transposed)
    return q, qt, scale


def _mm(a, sa, b, sb, out_dtype, bias=None):
    """(a * sa) @ (b * sb) (+ bias) from fp8 operands, a row-major and b column-major (b.t()
    contiguous), the layouts _scaled_mm takes; operands in other layouts are copied. The
    output is rounded once, to `out_dtype`, in the GEMM's epilogue, the bias added before
    (in `out_dtype`): no pass of its own over the output for either."""
    if not a.is_contiguous():
        a = a.contiguous()
    if not b.t().is_contiguous():
        b = b.t().contiguous().t()
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                            bias=None if bias is None else bias.to(out_dtype))


class _Fp8Linear(torch.autograd.Function):
    # Each operand is cast once, in both layouts where its GEMMs need both: x (forward: as
    # is; weight gradient: transposed), W (forward: as is; input gradient: transposed), dy
    # (input gradient: as is; weight gradient: transposed).
    @staticmethod
    def forward(ctx, x, weight, bias):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xq, xqt, sx = cast(x2, E4M3, transposed=ctx.needs_input_grad[1])
        wq, wqt, sw = cast(weight, E4M3, transposed=ctx.needs_input_grad[0])
        y = _mm(xq, sx, wq.t(), sw, CARRIER, bias)
        ctx.save_for_backward(xqt, sx, wqt, sw)
        ctx.meta = (shape, x.dtype, weight.dtype, bias is not None,
                    None if bias is None else bias.dtype)
        return y.reshape(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        xqt, sx, wqt, sw = ctx.saved_tensors
        shape, x_dtype, w_dtype, has_bias, b_dtype = ctx.meta
        g = dy.reshape(-1, dy.shape[-1])
        gq, gqt, sg = cast(g, E5M2, transposed=ctx.needs_input_grad[1])
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx_dtype = x_dtype if x_dtype in OUT_DTYPES else torch.float32
            dx = _mm(gq, sg, wqt.t(), sw, dx_dtype).to(x_dtype).reshape(shape)
        if ctx.needs_input_grad[1]:
            dw = _mm(gqt, sg, xqt.t(), sx, torch.float32).to(w_dtype)
        db = g.sum(0, dtype=torch.float32).to(b_dtype) if has_bias else None
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """y = x W^T + b with fp8 GEMMs (the module docstring); W is [out, in]."""
    return _Fp8Linear.apply(x, weight, bias)


def linear_parts(module: torch.nn.Module):
    """(weight as [out, in], bias) of a linear-like module, or None for any other."""
    if isinstance(module, torch.nn.Linear):
        return module.weight, module.bias
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):  # transformers (GPT-2)
        return module.weight.t(), module.bias
    return None


def check_op(name: str, module: torch.nn.Module):
    """Raises Fp8Unsupported naming `name` unless its module can run at fp8."""
    parts = linear_parts(module)
    if parts is None:
        raise Fp8Unsupported(f"qsync fp8: op {name!r} is a {type(module).__name__}: only linear "
                             "layers (nn.Linear, transformers' Conv1D) run at fp8")
    out_f, in_f = parts[0].shape
    if out_f % ALIGN or in_f % ALIGN:
        raise Fp8Unsupported(f"qsync fp8: op {name!r} is {in_f} -> {out_f}: fp8 GEMMs need both "
                             f"dimensions multiples of {ALIGN}")


def forward_of(module: torch.nn.Module):
    """A forward for `module` (linear-like, check_op passed) with fp8 GEMMs."""
    def forward(x, *args, **kwargs):
        weight, bias = linear_parts(module)
        return linear(x, weight, bias)
    return forward


def gemm_bound(a: torch.Tensor, b: torch.Tensor, fa, fb, sa: float, sb: float,
               out_rounding: float = 2.0 ** -8) -> torch.Tensor:
    """Elementwise bound on |fp8 GEMM(a, b) - a @ b| (fp64 inputs): the module docstring's
    sum over the dot product of each product's error, plus the output's rounding."""
    ua, ub = UNIT[fa], UNIT[fb]
    ta, tb = TINY[fa] * sa / 2, TINY[fb] * sb / 2  # a flushed value's error, at most
    aa, bb = a.abs(), b.abs()
    rel = (ua + ub + ua * ub) * (aa @ bb)
    sub = ta * (1 + ub) * bb.sum(0, keepdim=True) + tb * (1 + ua) * aa.sum(1, keepdim=True) \
        + ta * tb * a.shape[1]
    exact = (aa @ bb) + rel + sub
    accumulate = a.shape[1] * 2.0 ** -24 * exact  # fp32 sums of K products
    return rel + sub + accumulate + out_rounding * exact
