"""Applies a lowbit-plan plan to an nn.Module as per-module autocast, and fp8 GEMMs for
the linear layers a plan puts at fp8 (fp8.py: anything else at fp8 is refused by name).

The whole step runs under the plan's ambient precision (the one most parameter ops
take: autocast at fp16/bf16, nothing at fp32), exactly as a uniform profile ran, and
only the ops whose precision differs, or whose input comes at another precision, are
wrapped, per call (qsync_model.ops_to_wrap, resolve_precisions):

- a 16-bit op runs under ``torch.autocast(dtype)`` with its floating inputs cast to
  that dtype (a norm is on none of autocast's lists and would follow an fp32 input);
- an fp32 op turns autocast off and casts its floating inputs to fp32;
- a parameter-free op follows its first input (lowbit's rule); when that puts it at
  another precision than the ambient one it is wrapped the same way;
- an op at the ambient precision fed by an op at another one is wrapped only to let that
  op's own outputs go as it starts: it takes their ambient copy, so it enters no
  context and casts nothing.

Ops talk to ops at their own precisions, everything else sees the ambient one: an op
at another precision than the ambient returns its floating outputs cast to the
ambient dtype, and keeps its own (uncast) outputs for the ops that consume it. The code
between modules (attention's ``F.scaled_dot_product_attention``, residual adds,
in-place updates, the loss) therefore always gets tensors of one dtype, whatever the
plan: without the cast, q's Linear at fp32 with k and v at fp16 outside autocast is an
error in ``scaled_dot_product_attention``, and an fp32 output added in place into a
16-bit tensor is one too. The ambient dtype is also what lowbit-plan costs that code
at: it is the profile's tail, taken from the plan's dominant precision.

How the casts map onto the cost model's cast nodes (one per edge whose producer runs
at another precision than its consumer, forward and backward):

- producer at p != ambient, consumer op at the ambient: the output's cast to the
  ambient is the edge's cast (one per producer where the model counts one per edge);
- producer at the ambient, consumer op at c != ambient: the consumer casts its input;
- producer at p != ambient, consumer op at c != ambient: the consumer takes the
  producer's own output (no double rounding through the ambient dtype), cast to c
  when c != p, not cast at all when c == p: exactly the model's edge casts;
- what the model does not count: the forward cast to the ambient of an op at another
  precision whose outputs only ops consume (one cast of its output, launched and
  dropped; it saves nothing, so it has no backward), and the casts into and out of the
  code between modules, which is costed as the ambient profile's tail anyway.

An op's own outputs are released once every op the model JSON lists as consuming it
has started, so they are not kept longer than the cast they stand for. Ops are named
as export.py names them (module name, ``#k`` for the k-th call), and found the same way
(attribution.OpTracker): leaf-module calls through forward hooks on the wrapped ops'
modules only, and, when the plan wraps an op that is a torch function taking a
parameter (``"call": "function"`` in the model JSON: nn.MultiheadAttention's fused
attention, a layer scale), a torch function mode that wraps those calls while the
forward of the module that calls them (``"caller"``) runs, with hooks on the leaves
under it then, so that the calls are told apart and counted as recorded; the mode rests
while a module under it whose code calls none of the function ops the plan wraps runs
(a ViT's blocks, when the wrapped function op is its position embedding, even where the
blocks' attention in-projections are function ops at the ambient); a module whose every
call is one function op and nothing else (nn.MultiheadAttention) is hooked as that op,
as a leaf is, with no mode (whole_callers). Outputs keep
their containers' types (tuples, named tuples, dicts, ModelOutputs, dataclasses).
"""

from __future__ import annotations

from typing import Dict

import torch

from . import fp8
from .attribution import OpTracker, leaf_modules, map_tensors, quiet_modules, within
from .export import DTYPES as _AUTOCAST_DTYPES
from .export import precision_context

# What each precision hands the ops after it: fp8 ops compute fp8 GEMMs and return
# bf16 (fp8.CARRIER), the dtype the code around them runs at.
DTYPES = dict(_AUTOCAST_DTYPES, fp8=fp8.CARRIER)
from .qsync_model import (ambient_precision, consumer_counts, module_of, ops_to_wrap,
                         plan_precisions, resolve_precisions)


def _cast_one(t, dtype):
    return t.to(dtype) if t.dtype != dtype and t.is_floating_point() else t


def _casting(dtype, pairs=None):
    """A function for map_tensors that casts each distinct tensor to `dtype` once, however
    many arguments hold it, appending (cast, original) to `pairs` (when given) for every
    tensor the cast changed. A tensor passed as several arguments stays one tensor:
    self-attention's query, key and value are one (nn.MultiheadAttention projects them
    with one packed matmul when `query is key is value`, three apart, and three casts,
    when not)."""
    done = {}

    def one(t):
        y = done.get(id(t))
        if y is None:
            y = done[id(t)] = _cast_one(t, dtype)
            if pairs is not None and y is not t:
                pairs.append((y, t))
        return y
    return one


def _cast(x, dtype):
    """Floating tensors in `x` (nested in tuples, lists, dicts, dataclasses) at `dtype`."""
    return map_tensors(x, _casting(dtype))


def _cast_keeping(x, dtype, pairs):
    """`x` with its floating tensors cast to `dtype`; appends (cast, original) to
    `pairs` for every tensor the cast changed."""
    return map_tensors(x, _casting(dtype, pairs))


def whole_callers(ops: list, modules: dict) -> Dict[str, tuple]:
    """{caller: (owner, calls)}: the modules whose forward calls one function op a call
    and runs no other op (nn.MultiheadAttention's ``multi_head_attention_forward``; not
    torchvision's shifted window attention, which makes three), with the op's module
    (``owner``, its name's module) and how many calls a forward makes, from the model
    JSON's ``ops``. The applier wraps such a caller's whole forward as the op, as it
    wraps a leaf: no torch function mode checks its torch calls, and its parameters
    reach the function uncast, as in the uniform profile (autocast casts them inside the
    op; cast in Python as arguments, each would cost a ``Tensor.to`` of host time no
    profile holds)."""
    by_caller: Dict[str, list] = {}
    for o in ops:
        if o.get("call") == "function":
            by_caller.setdefault(o.get("caller", ""), []).append(o["name"])
    out = {}
    for caller, names in by_caller.items():
        owners = {module_of(n) for n in names}
        owner = next(iter(owners))
        if caller == "" or caller not in modules or len(owners) != 1 or owner not in modules:
            continue
        mine = set(names)
        # no other op is counted under the owner or runs within the caller
        if any(o["name"] not in mine and (
                within(module_of(o["name"]), caller) or module_of(o["name"]) == owner or
                (o.get("call") == "function" and within(o.get("caller", ""), caller)))
               for o in ops):
            continue
        out[caller] = (owner, len(names))
    return out


class applied_plan:
    """Context manager that installs the wrappers; ``step_context()`` is the ambient
    context a training step's forward and loss run in."""

    def __init__(self, model: torch.nn.Module, plan: dict, model_json: dict,
                 device_type: str = "cuda", wrap_all: bool = False):
        """`wrap_all`: wrap every op, at the precision the plan gives it (validate.py's
        probe of what the wrappers cost this model's host: with a uniform plan, the hooks
        and the function mode; every op is at the ambient, so nothing is entered or cast)."""
        self.model, self.device_type = model, device_type
        self.per_op: Dict[str, str] = plan_precisions(plan, model_json)
        modules = dict(model.named_modules())
        function_ops = {o["name"] for o in model_json["ops"] if o.get("call") == "function"}
        named = (plan["groups"][0] if "groups" in plan else plan).get("ops", {})
        self.fp8_ops = set()
        for op in sorted(op for op, p in self.per_op.items() if p == "fp8"):
            try:
                if op in function_ops or module_of(op) not in modules:
                    raise fp8.Fp8Unsupported(f"qsync fp8: op {op!r} is a function call, not a "
                                             "linear layer: only linear layers run at fp8")
                fp8.check_op(op, modules[module_of(op)])
                self.fp8_ops.add(op)
            except fp8.Fp8Unsupported:
                # An op the plan names at fp8 must run there; one that only took fp8 from
                # the plan's default runs at fp8's carrier, as under Transformer Engine.
                if named.get(op) == "fp8":
                    raise
                self.per_op[op] = "bf16"
        # fp8 is a precision of GEMMs only: where it is the most common, the code around
        # them runs at its carrier, bf16 (as Transformer Engine runs it under bf16 autocast)
        self.ambient = ambient_precision(self.per_op)
        if self.ambient == "fp8":
            self.ambient = "bf16"
        # A parameter-free op after an fp8 op follows its input's dtype, the carrier.
        self.resolved: Dict[str, str] = {
            n: ("bf16" if p == "fp8" and n not in self.fp8_ops else p)
            for n, p in resolve_precisions(self.per_op, model_json,
                                           graph_input=self.ambient).items()}
        # Ops with parameters at another precision or fed by one, and parameter-free ops
        # that follow an input at another precision than the ambient.
        self.wrapped: Dict[str, str] = ops_to_wrap(self.per_op, model_json, self.ambient)
        self.wrapped.update({n: p for n, p in self.resolved.items() if p != self.ambient})
        if wrap_all:
            self.wrapped.update({n: p for n, p in self.resolved.items() if n not in self.wrapped})
        self.wrapped = {n: ("bf16" if p == "fp8" and n not in self.fp8_ops else p)
                        for n, p in self.wrapped.items()}
        self.consumers = consumer_counts(model_json)
        self.model_json_ops = model_json["ops"]
        self.inputs = {o["name"]: [i for i in dict.fromkeys(o.get("inputs", []))
                                   if i not in o.get("weights_from", ())]
                       for o in model_json["ops"]}
        unknown = [op for op in self.per_op if module_of(op) not in modules]
        if unknown:
            raise ValueError("plan names ops with no module: %s" % ", ".join(unknown[:5]))
        bad = sorted({p for p in self.wrapped.values() if p not in DTYPES} |
                     ({self.ambient} - set(DTYPES)))
        if bad:
            raise ValueError("precision(s) %s cannot be applied (autocast's, and fp8 for "
                             "linear layers)" % ", ".join(bad))

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
        # id(cast) -> (cast, original), and the ids each op's outputs hold there, with the
        # number of its consumers still to start.
        self.kept: Dict[int, tuple] = {}
        self.kept_by_op: Dict[str, list] = {}
        self.pending: Dict[str, int] = {}
        self.open: Dict[str, object] = {}
        self.tracker = None
        # fp8 ops: the module's forward replaced by fp8 GEMMs for the context's life (its
        # hooks still run around it); restored on exit.
        self.patched = []
        modules = dict(self.model.named_modules())
        for op in sorted(self.fp8_ops):
            m = modules[module_of(op)]
            if any(m is q for q, _ in self.patched):
                continue
            self.patched.append((m, m.__dict__.get("forward")))
            m.forward = fp8.forward_of(m)
        # Hooks only on the modules of wrapped ops (every op at another precision than
        # the ambient and every consumer of one is wrapped): a module hook costs host
        # time on every call, which no profile holds (lowbit-plan prices it per wrapped
        # op, wrap_host_ms: switch_probe.py); a uniform plan installs none.
        # Where a wrapped op's module also has function ops (attribution), a torch
        # function mode runs while their callers' forwards run, with hooks on the leaves
        # under those callers, so that the calls are told apart and counted as recorded.
        # The mode rests in the modules under those callers that call none of these
        # function ops (quiet_modules): a ViT's position embedding is a function op of
        # the root's own code, and without the rest every torch call of every block
        # would pay the mode's Python check, host time no profile holds. A function op
        # the plan does not wrap (the blocks' attention in-projection at the ambient
        # precision) needs no watching: it is at the ambient and fed by none at another
        # precision (that would wrap it), so it neither casts nor consumes a kept output.
        # A caller whose every call is one function op and nothing else (whole_callers:
        # nn.MultiheadAttention) is hooked as that op instead, with no mode.
        hooked = {module_of(op) for op in self.wrapped}
        related = [o for o in self.model_json_ops
                   if o.get("call") == "function" and module_of(o["name"]) in hooked]
        wholes = {c: w for c, w in whole_callers(self.model_json_ops, modules).items()
                  if w[0] in hooked}
        related = [o for o in related if o.get("caller", "") not in wholes]
        scopes = {o.get("caller", "") for o in related}
        quiet = quiet_modules(self.model, scopes, scopes)

        def heard(n):  # under a scope, and not in a quiet module
            return any(within(n, s) for s in scopes) and not any(within(n, q) for q in quiet)

        under = {n for n, _ in leaf_modules(self.model) if heard(n)}
        if hooked:
            self.tracker = OpTracker(self.model, self._enter, self._exit,
                                     leaves=hooked | under, functions=bool(related),
                                     scopes=scopes, quiet=quiet if related else None,
                                     on_iteration=self._reset, recompute=self._recomputed,
                                     wholes=wholes)
            self.tracker.__enter__()
        return self

    def _reset(self):
        """A new forward: nothing of the last one is consumed any more."""
        self.kept.clear()
        self.kept_by_op.clear()
        self.pending.clear()

    def _recomputed(self, module_name, ops):
        """The op a recomputed call of `module_name` (activation checkpointing) runs as
        where the tracker cannot tell which of its forward calls it repeats: any, if they
        are applied alike (the same wrap, the same precision); else an error, never a
        guess."""
        def way(op):
            p = self.wrapped.get(op)
            return ("wrapped at " + p) if p else (
                "in the step's context, %s" % self.resolved.get(op, self.ambient))

        if len({way(op) for op in ops}) > 1:
            raise RuntimeError(
                "qsync apply_plan: %r is recomputed by activation checkpointing and called "
                "%d times a step, applied differently (%s), and this recomputed call cannot "
                "be matched to its forward call; give its calls one precision, or leave "
                "the module out of checkpointing" % (
                    module_name, len(ops), "; ".join("%s %s" % (op, way(op)) for op in ops)))
        return ops[0]

    def _originals(self, x):
        """`x` with every tensor that is an op's cast to the ambient replaced by the op's
        own output (recursively through containers)."""
        def one(t):
            k = self.kept.get(id(t))
            return k[1] if k is not None and k[0] is t else t
        return map_tensors(x, one)

    def _started(self, op):
        """`op` has taken its inputs: a producer whose consumers all have lets its own
        outputs go."""
        for i in self.inputs.get(op, ()):
            if i in self.pending:
                self.pending[i] -= 1
                if self.pending[i] <= 0:
                    del self.pending[i]
                    for k in self.kept_by_op.pop(i, ()):
                        self.kept.pop(k, None)

    def _keep(self, op, pairs):
        """Keeps `op`'s own outputs for its consumers (none kept for an op without)."""
        n = self.consumers.get(op, 0)
        if n <= 0 or not pairs:
            return
        ids = self.kept_by_op.setdefault(op, [])
        for cast, own in pairs:
            self.kept[id(cast)] = (cast, own)
            ids.append(id(cast))
        self.pending[op] = n

    def _enter(self, op, module, args, kwargs, own, func):
        foreign = self.resolved.get(op, self.ambient) != self.ambient
        if foreign:  # an op at its own precision takes its producers' own outputs
            args, kwargs = self._originals(args), self._originals(kwargs)
        self._started(op)
        p = self.wrapped.get(op)
        if p is None or p == self.ambient:
            # At the ambient, in the step's own context: what it takes from an op at
            # another precision is that op's ambient copy (its exit cast it), so it has
            # nothing to cast and no context to enter; wrapped only to let its
            # producers' own outputs go as it starts.
            return (args, kwargs) if foreign else None
        if p in ("fp32", "fp8"):  # fp8: the GEMMs set their own dtypes
            ctx = torch.autocast(self.device_type, enabled=False)
        else:
            ctx = torch.autocast(self.device_type, dtype=DTYPES[p])
        ctx.__enter__()
        self.open[op] = ctx
        # Inputs at the op's precision, as in the uniform profile: autocast would cast
        # a conv's or linear's anyway, but a norm (not on autocast's lists) follows
        # its input and would stay at fp32 after an fp32 op otherwise.
        cast = _casting(DTYPES[p])
        return map_tensors(args, cast), map_tensors(kwargs, cast)

    def _exit(self, op, args, kwargs, out):
        ctx = self.open.pop(op, None)
        if ctx is not None:
            ctx.__exit__(None, None, None)
        if self.resolved.get(op, self.ambient) == self.ambient:
            return None
        pairs = []
        cast = _cast_keeping(out, DTYPES[self.ambient], pairs)
        self._keep(op, pairs)
        return cast

    def __exit__(self, *exc):
        if self.tracker is not None:
            self.tracker.__exit__(*exc)
        for ctx in reversed(list(self.open.values())):  # innermost first
            ctx.__exit__(None, None, None)
        self.open.clear()
        for m, forward in self.patched:
            if forward is None:
                del m.forward
            else:
                m.forward = forward
        self.patched = []
        self._reset()
        return False
