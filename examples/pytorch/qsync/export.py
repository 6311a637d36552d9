"""Torch half of the QSync exporter: records an nn.Module's ops and profiles it.

- ``record_ops``: one training step with forward hooks and saved-tensor hooks, giving
  per leaf-module call its parameters, output size, producers (through the autograd
  graph, so functional glue between modules is seen through), saved-for-backward bytes
  and the indicator's statistics; run once per precision for the saved bytes.
- ``instrument``: ranges ``N`` / ``N.backward`` around every leaf-module call, the
  naming lowbit-plan's trace loader reads; ``profile`` runs a step function under the
  stock ``torch.profiler`` and writes the Chrome trace. A second, un-instrumented
  profile of the same loop gives lowbit-plan the true host time per iteration.

Leaf modules are the ops; the parameter-free code between them (residual adds,
attention's matmuls inside a module without children, the loss when it is a function)
is timed as the profile's tail. Nothing here imports lowbit_torch or its extension.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from typing import Callable, Dict, List, Optional

import torch

from .qsync_model import call_name, kind_of

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def leaf_modules(model: torch.nn.Module):
    """(qualified name, module) of every module without children: the ops."""
    return [(n, m) for n, m in model.named_modules() if next(m.children(), None) is None]


def precision_context(precision: str, device_type: str = "cuda"):
    """The context a uniform-precision step runs under: autocast at 16 bits, nothing
    at fp32 (the profile and the applied plan use the same one)."""
    if precision in ("fp16", "bf16"):
        return torch.autocast(device_type, dtype=DTYPES[precision])
    return contextlib.nullcontext()


class _Calls:
    """Per-iteration call counter of each module, so a module called twice gives two
    op names (call_name) in both the recording and the profiling run."""

    def __init__(self, model: torch.nn.Module):
        self.count: Dict[int, int] = {}
        self.handle = model.register_forward_pre_hook(lambda m, a: self.count.clear())

    def next(self, module: torch.nn.Module, name: str) -> str:
        k = self.count.get(id(module), 0)
        self.count[id(module)] = k + 1
        return call_name(name, k)

    def remove(self):
        self.handle.remove()


@contextlib.contextmanager
def _leaf_hooks(model: torch.nn.Module, pre, post):
    """Forward pre-hook ``pre(name)`` and hook ``post(name)`` on every leaf module, and a
    per-iteration call counter (_Calls), for the duration of the block; yields the
    counter."""
    calls = _Calls(model)
    handles = []
    for name, m in leaf_modules(model):
        handles.append(m.register_forward_pre_hook(pre(name)))
        handles.append(m.register_forward_hook(post(name)))
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()
        calls.remove()


def _tensors(x) -> List[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    if hasattr(x, "to_tuple"):  # transformers' ModelOutput
        return _tensors(x.to_tuple())
    return []


def _numel(ts) -> int:
    return sum(t.numel() for t in ts)


def _flops(module: torch.nn.Module, inputs, outputs) -> float:
    out = _numel(outputs)
    if isinstance(module, torch.nn.Linear):
        return 2.0 * out * module.in_features
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        k = math.prod(module.kernel_size)
        return 2.0 * out * (module.in_channels // module.groups) * k
    return float(out)


def _is_weight_copy(t: torch.Tensor, params: set) -> bool:
    """True for autocast's cast of a parameter (a to-copy whose only input is the
    parameter's gradient accumulator), or a view of one (a linear saves its weight
    transposed): lowbit counts those copies itself."""
    fn = (t._base if t._base is not None else t).grad_fn
    if fn is None or "ToCopy" not in type(fn).__name__:
        return False
    nxt = [f for f, _ in fn.next_functions if f is not None]
    var = getattr(nxt[0], "variable", None) if len(nxt) == 1 else None
    return var is not None and var.untyped_storage().data_ptr() in params


def _is_input_cast(t: torch.Tensor, params: set, dtype) -> bool:
    """True for a cast of an activation to `dtype` made inside an op (autocast casts an
    input that arrives at another width, once per consumer: it caches only parameters'
    casts), or a view of one (a linear on a 3-d input saves it flattened)."""
    fn = (t._base if t._base is not None else t).grad_fn
    if fn is None or "ToCopy" not in type(fn).__name__ or t.dtype != dtype:
        return False
    nxt = [f for f, _ in fn.next_functions if f is not None]
    var = getattr(nxt[0], "variable", None) if len(nxt) == 1 else None
    return var is None or var.untyped_storage().data_ptr() not in params


def record_ops(model: torch.nn.Module, step: Callable[[], torch.Tensor], precision: str,
               with_stats: bool = False, device_type: str = "cuda") -> Dict[str, dict]:
    """Runs ``step`` (forward and loss, returning the loss) once under ``precision``,
    calls backward, and returns one record per op (see qsync_model.model_json). Saved
    bytes count each storage once, skip parameters and autocast's copies of the
    module's own weights (lowbit-plan adds those itself), and charge tensors saved by
    code between modules to the op that ran last (also as its ``code_saved_bytes``);
    ``input_cast_bytes`` is the part of an op's saved bytes at 16 bits that are its own
    casts of activations to that width (autocast's, one per consumer of an fp32
    output). ``with_stats`` adds the indicator's
    statistics (norms and absmax of weights, inputs and gradients)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    records: Dict[str, dict] = {}
    producer: Dict[object, str] = {}  # grad_fn -> op name (kept alive by the dict)
    current: List[Optional[str]] = [None]
    last: List[Optional[str]] = [None]
    seen_storage = set()
    order = [0]
    grad_hooks = []

    def producers_of(inputs):
        """The ops whose outputs reach ``inputs`` (walking back through the autograd
        graph), and the subset that reach them only through code between the ops (an
        input that is not the producer's own output tensor: a residual add, attention's
        core, a view)."""
        direct = {producer[t.grad_fn] for t in inputs if t.grad_fn in producer}
        found, stack, visited = [], [t.grad_fn for t in inputs if t.grad_fn is not None], set()
        while stack and len(visited) < 4096:
            fn = stack.pop()
            if fn is None or fn in visited:
                continue
            visited.add(fn)
            if fn in producer:
                found.append(producer[fn])
                continue
            stack.extend(f for f, _ in fn.next_functions)
        return found, [n for n in dict.fromkeys(found) if n not in direct]

    def pre(name):
        def hook(m, args):
            op = calls.next(m, name)
            ins = [t for t in _tensors(args)]
            own = [p for p in m.parameters(recurse=False)]
            first_call = op == call_name(name, 0)
            inputs, via_code = producers_of(ins)
            records[op] = {
                "module_class": type(m).__name__, "kind": kind_of(type(m).__name__),
                "param_numel": float(sum(p.numel() for p in own)) if first_call else 0.0,
                "inputs": inputs, "via_code": via_code, "order": order[0],
                "saved_bytes": {precision: 0.0}, "input_cast_bytes": {precision: 0.0},
                "code_saved_bytes": {precision: 0.0},
                "input_numel": float(_numel(ins)),
            }
            order[0] += 1
            if with_stats:
                fl = [t.detach() for t in ins if t.is_floating_point()]
                w = [p.detach() for p in own if p.is_floating_point()]
                s = records[op].setdefault("stats", {})
                with torch.no_grad():  # nothing here may be recorded, or saved
                    if fl:
                        s["input_norm"] = float(torch.linalg.vector_norm(fl[0].float()))
                        s["input_absmax"] = float(fl[0].abs().max())
                        s["input_numel"] = float(fl[0].numel())
                    if w:
                        s["weight_norm"] = float(torch.linalg.vector_norm(w[0]))
                        s["weight_absmax"] = float(w[0].abs().max())
            current[0] = op
        return hook

    def post(name):
        def hook(m, args, out):
            op = current[0]
            outs = _tensors(out)
            r = records[op]
            r["output_numel"] = float(_numel(outs))
            r["flops"] = _flops(m, _tensors(args), outs)
            r["bytes"] = 4.0 * (r["input_numel"] + r["output_numel"] + r["param_numel"])
            for t in outs:
                if t.grad_fn is not None:
                    producer[t.grad_fn] = op
            if with_stats and outs and outs[0].requires_grad:
                def on_grad(g, op=op):
                    s = records[op].setdefault("stats", {})
                    with torch.no_grad():
                        s["grad_output_absmax"] = float(g.detach().abs().max())
                    s["grad_output_numel"] = float(g.numel())
                grad_hooks.append(outs[0].register_hook(on_grad))
            last[0] = op
            current[0] = None
        return hook

    def pack(t):
        op = current[0] or last[0]
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001 (tensor subclasses without storage)
            return t
        if op is None or key in params or _is_weight_copy(t, params):
            return t
        if key not in seen_storage:
            seen_storage.add(key)
            records[op]["saved_bytes"][precision] += float(size)
            if current[0] is None:  # code between modules, after op
                records[op]["code_saved_bytes"][precision] += float(size)
            elif precision != "fp32" and _is_input_cast(t, params, DTYPES[precision]):
                records[op]["input_cast_bytes"][precision] += float(size)
        return t

    try:
        model.zero_grad(set_to_none=True)
        with _leaf_hooks(model, pre, post) as calls, \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with precision_context(precision, device_type):
                loss = step()
        loss.backward()
        if with_stats:
            for name, m in leaf_modules(model):
                own = [p for p in m.parameters(recurse=False) if p.grad is not None]
                if own and name and name in records:
                    with torch.no_grad():
                        records[name].setdefault("stats", {})["grad_weight_norm"] = float(
                            torch.linalg.vector_norm(own[0].grad))
        model.zero_grad(set_to_none=True)
    finally:
        for h in grad_hooks:
            h.remove()
    for r in records.values():
        r.pop("input_numel", None)
    return records


def record_workspace(model: torch.nn.Module, step: Callable[[], torch.Tensor], precision: str,
                     device_type: str = "cuda") -> Dict[str, float]:
    """Runs ``step`` once under ``precision`` with backward and returns, per op, the
    transient bytes it allocated and freed within its forward or its backward call (the
    larger): a convolution's cuDNN workspace, a GEMM's scratch, temporaries. The peak of
    the CUDA caching allocator is reset as each op starts and read as it ends; its
    excess over what is still allocated at the end is the op's scratch. The forward is
    bracketed by the leaf module's hooks, the backward by hooks on the autograd node
    that made the module's output (the op's own backward for the single-kernel leaf
    modules). Empty where the device is not CUDA (the caching allocator's statistics
    are CUDA's). Run it after a few warm steps, so that one-time allocations (cuDNN's
    plans, cuBLAS's workspace) are not taken for an op's scratch."""
    if device_type != "cuda" or not torch.cuda.is_available():
        return {}
    cuda = torch.cuda
    scratch: Dict[str, float] = {}
    start: Dict[str, int] = {}
    running: Dict[int, str] = {}  # id(module) -> the op its current call is
    node_hooks = []

    def begin(op):
        cuda.reset_peak_memory_stats()
        start[op] = cuda.memory_allocated()

    def end(op):
        extra = cuda.max_memory_allocated() - max(start[op], cuda.memory_allocated())
        scratch[op] = max(scratch.get(op, 0.0), float(max(0, extra)))

    def pre(name):
        def hook(m, args):
            op = calls.next(m, name)
            running[id(m)] = op
            begin(op)
        return hook

    def post(name):
        def hook(m, args, out):
            op = running.pop(id(m))
            end(op)
            fns = {t.grad_fn for t in _tensors(out) if t.grad_fn is not None}
            for fn in fns:
                node_hooks.append(fn.register_prehook(lambda g, op=op: begin(op)))
                node_hooks.append(fn.register_hook(lambda gi, go, op=op: end(op)))
        return hook

    try:
        model.zero_grad(set_to_none=True)
        with _leaf_hooks(model, pre, post) as calls, precision_context(precision, device_type):
            loss = step()
        loss.backward()
        cuda.synchronize()
        model.zero_grad(set_to_none=True)
    finally:
        for h in node_hooks:
            h.remove()
    return scratch


def merge_workspace(records: Dict[str, dict], precision: str, scratch: Dict[str, float]) -> None:
    """Adds ``record_workspace``'s bytes at ``precision`` to the records."""
    for op, b in scratch.items():
        if op in records:
            records[op].setdefault("workspace_bytes", {})[precision] = b


def merge_saved_bytes(base: Dict[str, dict], other: Dict[str, dict]) -> None:
    """Adds ``other``'s saved bytes (another precision's recording) into ``base``."""
    for op, r in other.items():
        if op in base:
            base[op]["saved_bytes"].update(r.get("saved_bytes", {}))
            for k in ("input_cast_bytes", "code_saved_bytes"):
                base[op].setdefault(k, {}).update(r.get(k, {}))


class instrument:
    """Context manager: a record_function range around every leaf-module call (``N``)
    and its backward (``N.backward``, from the module's backward pre-hook until both
    its full backward hook and the accumulation of all its parameters' gradients have
    run: a module whose inputs need no gradient, the first conv, still times its weight
    gradient). In-place modules are switched off inplace while instrumented: a full
    backward hook cannot wrap an output that is later modified in place; build models
    with inplace=False so the plain run is the same program."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __enter__(self):
        # Expected for modules whose inputs need no gradient (the first conv): the full
        # backward hook fires early, the range waits for the weight gradients instead.
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        self.handles, self.calls = [], _Calls(self.model)
        self.inplace = []
        for name, m in leaf_modules(self.model):
            if getattr(m, "inplace", False):
                self.inplace.append(m)
                m.inplace = False
            self._hook(name, m)
        return self

    def _hook(self, name, m):
        fwd_open: List = []
        fwd_names: List[str] = []  # this iteration's calls, for the backward names
        bwd_open: List[list] = []  # [range, pending events]
        own = [p for p in m.parameters(recurse=False) if p.requires_grad]

        def pre(mod, args):
            op = self.calls.next(mod, name)
            if op == call_name(name, 0):  # a new iteration: drop what the last one left
                fwd_names.clear()
                while bwd_open:
                    bwd_open.pop()[0].__exit__(None, None, None)
            fwd_names.append(op)
            r = torch.profiler.record_function(op)
            r.__enter__()
            fwd_open.append(r)

        def post(mod, args, out):
            fwd_open.pop().__exit__(None, None, None)

        def close_one():
            if not bwd_open:
                return
            entry = bwd_open[-1]
            entry[1] -= 1
            if entry[1] <= 0:
                bwd_open.pop()
                entry[0].__exit__(None, None, None)

        def bpre(mod, grad_output):
            op = fwd_names.pop() if fwd_names else call_name(name, 0)
            r = torch.profiler.record_function(op + ".backward")
            r.__enter__()
            # Gradients of weights used by several calls accumulate once, after the
            # backward of the first call (the last to run): only that range waits.
            bwd_open.append([r, 1 + (len(own) if op == call_name(name, 0) else 0)])

        def bpost(mod, grad_input, grad_output):
            close_one()

        self.handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post),
                         m.register_full_backward_pre_hook(bpre),
                         m.register_full_backward_hook(bpost)]
        for p in own:
            self.handles.append(p.register_post_accumulate_grad_hook(lambda p: close_one()))

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.calls.remove()
        for m in self.inplace:
            m.inplace = True
        self.warnings.__exit__(None, None, None)
        return False


def profile(iteration: Callable[[], None], path: str, steps: int = 3, warmup: int = 2) -> str:
    """Runs ``iteration`` (one full training step ending in a synchronize) under the stock
    torch.profiler for ``warmup`` + ``steps`` steps (one ProfilerStep range each) and
    writes the Chrome trace of the active steps to ``path`` (plain JSON). Shapes, stacks
    and memory are not recorded: they inflate host time."""
    from torch.profiler import ProfilerActivity, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    if os.path.exists(path):
        os.remove(path)
    warnings.filterwarnings("ignore", message="Profiler clears events")
    with torch.profiler.profile(activities=acts,
                                schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                                on_trace_ready=lambda p: p.export_chrome_trace(path),
                                record_shapes=False, with_stack=False,
                                profile_memory=False) as prof:
        for _ in range(warmup + steps + 1):
            iteration()
            prof.step()
    if not os.path.exists(path):
        raise RuntimeError("the profiler wrote no trace to " + path)
    return path
