"""Applies a lowbit-plan plan to an nn.Module as per-module autocast.

The whole step runs under the plan's ambient precision (the one most parameter ops
take: autocast at fp16/bf16, nothing at fp32), exactly as a uniform profile ran, and
only the ops whose precision differs are wrapped, per call:

- a 16-bit op runs under ``torch.autocast(dtype)``;
- an fp32 op turns autocast off and casts its floating inputs to fp32;
- parameter-free ops are not wrapped: without autocast a PyTorch op keeps its input's
  dtype, which is lowbit's rule that they follow their input.

Ops are named as export.py names them (module name, ``#k`` for the k-th call).
"""

from __future__ import annotations

import contextlib
from typing import Dict

import torch

from export import DTYPES, _Calls, leaf_modules, precision_context
from qsync_model import ambient_precision, module_of, plan_precisions


def _to_fp32(x):
    if isinstance(x, torch.Tensor):
        return x.float() if x.is_floating_point() and x.dtype != torch.float32 else x
    if isinstance(x, tuple):
        return tuple(_to_fp32(y) for y in x)
    if isinstance(x, list):
        return [_to_fp32(y) for y in x]
    if isinstance(x, dict):
        return {k: _to_fp32(v) for k, v in x.items()}
    return x


class applied_plan:
    """Context manager that installs the wrappers; ``step_context()`` is the ambient
    context a training step's forward and loss run in."""

    def __init__(self, model: torch.nn.Module, plan: dict, model_json: dict,
                 device_type: str = "cuda"):
        self.model, self.device_type = model, device_type
        self.per_op: Dict[str, str] = plan_precisions(plan, model_json)
        self.ambient = ambient_precision(self.per_op)
        modules = dict(model.named_modules())
        unknown = [op for op in self.per_op if module_of(op) not in modules]
        if unknown:
            raise ValueError("plan names ops with no module: %s" % ", ".join(unknown[:5]))

    def step_context(self):
        """The ambient precision's context (autocast at 16 bits)."""
        return precision_context(self.ambient, self.device_type)

    def summary(self) -> str:
        counts: Dict[str, int] = {}
        for p in self.per_op.values():
            counts[p] = counts.get(p, 0) + 1
        return "ambient %s; %s" % (self.ambient, ", ".join(
            "%s=%d" % kv for kv in sorted(counts.items())))

    def __enter__(self):
        self.calls = _Calls(self.model)
        self.handles = []
        for name, m in leaf_modules(self.model):
            self._wrap(name, m)
        return self

    def _wrap(self, name, m):
        stack = []

        def pre(mod, args, kwargs):
            op = self.calls.next(mod, name)
            p = self.per_op.get(op)
            if p is None or p == self.ambient:
                stack.append(None)
                return None
            if p == "fp32":
                ctx = torch.autocast(self.device_type, enabled=False)
                ctx.__enter__()
                stack.append(ctx)
                return _to_fp32(args), _to_fp32(kwargs)
            if p in DTYPES:
                ctx = torch.autocast(self.device_type, dtype=DTYPES[p])
            else:
                raise ValueError("op %r: precision %r cannot be applied by autocast" % (op, p))
            ctx.__enter__()
            stack.append(ctx)
            return None

        def post(mod, args, kwargs, out):
            ctx = stack.pop() if stack else None
            if ctx is not None:
                ctx.__exit__(None, None, None)
            return None

        self.handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(m.register_forward_hook(post, with_kwargs=True))

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.calls.remove()
        return False


def null_plan():
    """An ambient context for code that runs without a plan."""
    return contextlib.nullcontext()
