"""Applies a lowbit-plan plan to an nn.Module as per-module autocast.

The whole step runs under the plan's ambient precision (the one most parameter ops
take: autocast at fp16/bf16, nothing at fp32), exactly as a uniform profile ran, and
only the ops whose precision differs, or whose input comes at another precision, are
wrapped, per call (qsync_model.ops_to_wrap):

- a 16-bit op runs under ``torch.autocast(dtype)`` with its floating inputs cast to
  that dtype (a norm is on none of autocast's lists and would follow an fp32 input);
- an fp32 op turns autocast off and casts its floating inputs to fp32;
- parameter-free ops are not wrapped: without autocast a PyTorch op keeps its input's
  dtype, which is lowbit's rule that they follow their input.

Ops are named as export.py names them (module name, ``#k`` for the k-th call).
"""

from __future__ import annotations

from typing import Dict

import torch

from export import DTYPES, _Calls, leaf_modules, precision_context
from qsync_model import ambient_precision, module_of, ops_to_wrap, plan_precisions


def _cast(x, dtype):
    """Floating tensors in `x` (nested in tuples, lists, dicts) at `dtype`."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() and x.dtype != dtype else x
    if isinstance(x, tuple):
        return tuple(_cast(y, dtype) for y in x)
    if isinstance(x, list):
        return [_cast(y, dtype) for y in x]
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


class applied_plan:
    """Context manager that installs the wrappers; ``step_context()`` is the ambient
    context a training step's forward and loss run in."""

    def __init__(self, model: torch.nn.Module, plan: dict, model_json: dict,
                 device_type: str = "cuda"):
        self.model, self.device_type = model, device_type
        self.per_op: Dict[str, str] = plan_precisions(plan, model_json)
        self.ambient = ambient_precision(self.per_op)
        self.wrapped: Dict[str, str] = ops_to_wrap(self.per_op, model_json, self.ambient)
        modules = dict(model.named_modules())
        unknown = [op for op in self.per_op if module_of(op) not in modules]
        if unknown:
            raise ValueError("plan names ops with no module: %s" % ", ".join(unknown[:5]))

    def step_context(self):
        """The ambient precision's context (autocast at 16 bits)."""
        return precision_context(self.ambient, self.device_type)

    def summary(self) -> str:
        """One line for logs and measured.csv: ambient precision, ops per precision and
        how many are wrapped."""
        counts: Dict[str, int] = {}
        for p in self.per_op.values():
            counts[p] = counts.get(p, 0) + 1
        return "ambient %s; %s; %d wrapped" % (self.ambient, " ".join(
            "%s=%d" % kv for kv in sorted(counts.items())), len(self.wrapped))

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
            p = self.wrapped.get(op)
            if p is None:
                stack.append(None)
                return None
            if p not in DTYPES:
                raise ValueError("op %r: precision %r cannot be applied by autocast" % (op, p))
            if p == "fp32":
                ctx = torch.autocast(self.device_type, enabled=False)
            else:
                ctx = torch.autocast(self.device_type, dtype=DTYPES[p])
            ctx.__enter__()
            stack.append(ctx)
            # Inputs at the op's precision, as in the uniform profile: autocast would cast
            # a conv's or linear's anyway, but a norm (not on autocast's lists) follows
            # its input and would stay at fp32 after an fp32 op otherwise.
            return _cast(args, DTYPES[p]), _cast(kwargs, DTYPES[p])

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

