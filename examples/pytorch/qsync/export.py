"""Torch half of the QSync exporter: records an nn.Module's ops and profiles it.

- ``record_ops``: one training step with op hooks (attribution.OpTracker), saved-tensor
  hooks and an aten counter, giving per op call its parameters (each counted at one
  op), kind, FLOPs, output size, producers (through the autograd graph, so functional
  glue between the ops is seen through), saved-for-backward bytes and the indicator's
  statistics, and the aten operators of the code between the ops by name
  (``Records.unattributed``); run once per precision for the saved bytes.
- ``instrument``: ranges ``N`` / ``N.backward`` around every op call, the naming
  lowbit-plan's trace loader reads; ``profile`` runs a step function under the stock
  ``torch.profiler`` and writes the Chrome trace. A second, un-instrumented profile of
  the same loop gives lowbit-plan the true host time per iteration.

The ops are the leaf-module calls and the torch functions called with a parameter
outside them (attribution); the parameter-free code between them (residual adds,
attention's core inside a module with children, the loss) is timed as the profile's
tail. Any nn.Module runs as it is: outputs modified in place, functional forwards,
custom linear-like leaves, shared and tied modules, modules called several times,
buffers updated in forward (restored after a recording), dict or dataclass outputs.
Nothing here imports lowbit_torch or its extension.
"""

from __future__ import annotations

import collections
import contextlib
import os
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .attribution import (AtenCounter, OpTracker, Span, aten_kind, backward_nodes, grad_fns,
                          reentrant_checkpoint, tensors)
from .qsync_model import collector_off, kind_of

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def precision_context(precision: str, device_type: str = "cuda"):
    """The context a uniform-precision step runs under: autocast at 16 bits, nothing
    at fp32 (the profile and the applied plan use the same one)."""
    if precision in ("fp16", "bf16"):
        return torch.autocast(device_type, dtype=DTYPES[precision])
    return contextlib.nullcontext()


def _numel(ts) -> int:
    return sum(t.numel() for t in ts)


def _autograd_sequence_now() -> int:
    """The autograd sequence number of a node made now: every node made later in this
    thread has a larger one (torch numbers them in creation order)."""
    with torch.enable_grad():
        return torch.empty(0, requires_grad=True).view(0).grad_fn._sequence_nr()


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


class Records(dict):
    """record_ops's records, op name -> record, and ``unattributed``: the aten operators
    that ran outside every op in the forward (code between the ops: residual adds,
    attention's core in a module with children, the loss), by name, with their count,
    FLOPs, output size and the ops they ran after (up to 8), most FLOPs first.
    lowbit-plan prices them, forward and backward, as the profile's tail.
    ``unused_params``: the model's parameters no op of the step took (a branch the
    forward did not take, Longformer's global-attention projections without a global
    mask), by name, with their size and requires_grad: they cost their weights' memory
    and nothing else (no gradient, so no optimizer state either)."""

    unattributed: List[dict]
    unused_params: List[dict]


def _snapshot_buffers(model: torch.nn.Module):
    """Copies of the model's buffers (batch norm's running statistics and step count,
    which a recorded step updates): the recording leaves the model as it found it."""
    with torch.no_grad():
        return [(b, b.detach().clone()) for b in model.buffers()]


def _restore_buffers(snapshot) -> None:
    with torch.no_grad():
        for b, copy in snapshot:
            b.copy_(copy)


def _op_kind(record: dict, aten: Dict[str, int]) -> str:
    """The op's kind: the class name's, unless its aten operators say otherwise (a
    convolution or GEMM under another name: transformers' Conv1D is a transposed
    linear) or the class name says nothing (a function op)."""
    by_class = kind_of(record["module_class"])
    by_aten = aten_kind(aten, record["uses_params"])
    if by_aten in ("conv", "linear", "matmul") and by_class in ("conv", "linear", "other"):
        return by_aten
    return by_class if by_class != "other" else (by_aten or "other")


def _assign_params(records: Dict[str, dict], uses: Dict[str, list], names: Dict[int, str]) -> None:
    """Each parameter counts once, at the first op that takes it (a module called twice
    counts its weights on its first call; a tied embedding and LM head, at the
    embedding). An op that takes parameters but holds none gets the holder as its
    first input and ``weights_from``: it follows the holder's precision (one decision
    per parameter) rather than a graph input's precision, and a uniform plan still wraps
    nothing; lowbit-plan prices from it the autocast copy of those weights and when
    their gradient is held (memory_bytes). Sets each record's ``param_numel``,
    ``frozen_numel`` (of those, the ones without requires_grad: weights with no
    gradient, optimizer state or bucket share)
    and ``param_names`` (the parameters' qualified names). Returns the ids of the
    parameters some op took."""
    owner: Dict[int, str] = {}
    objs: Dict[int, torch.nn.Parameter] = {}
    for op in sorted(uses, key=lambda n: records[n]["order"]):
        for p in uses[op]:
            owner.setdefault(id(p), op)
            objs[id(p)] = p
    for op, r in records.items():
        r["params"] = [objs[k] for k, o in owner.items() if o == op]
        r["param_numel"] = float(sum(p.numel() for p in r["params"]))
        r["frozen_numel"] = float(sum(p.numel() for p in r["params"] if not p.requires_grad))
        r["param_names"] = [names.get(id(p), "?") for p in r["params"]]
        held = [owner[id(p)] for p in uses.get(op, ()) if owner[id(p)] != op]
        if held and not r["params"]:
            # It runs with weights another op holds (a module's later call, a tied head):
            # that op is its first input, so that it follows the weights' precision in
            # lowbit-plan and in the applier (not a graph input's).
            r["weights_from"] = held[:1]
            r["inputs"] = held[:1] + [i for i in r["inputs"] if i != held[0]]
    return set(owner)


def _mode_calls(records, by_caller: Dict[str, int], model: torch.nn.Module) -> None:
    """Gives each function op ``mode_calls``: the torch calls the plan applier's function
    mode checks in a step while the op's caller runs (by_caller: OpTracker.mode_calls),
    shared among the caller's function ops; 0 where the applier hooks the caller as its
    one op, with no mode (apply_plan.whole_callers). Its host time is in no profile:
    lowbit-plan prices it on a wrapped function op (function_call_host_ms)."""
    from .apply_plan import whole_callers  # apply_plan imports this module

    fn = {op: r for op, r in records.items() if r.get("call") == "function"}
    if not fn:
        return
    wholes = whole_callers([dict(r, name=op) for op, r in records.items()],
                           dict(model.named_modules()))
    share = collections.Counter(r.get("caller", "") for r in fn.values())
    for r in fn.values():
        c = r.get("caller", "")
        r["mode_calls"] = 0.0 if c in wholes else by_caller.get(c, 0) / float(share[c])


def record_ops(model: torch.nn.Module, step: Callable[[], torch.Tensor], precision: str,
               with_stats: bool = False, device_type: str = "cuda") -> Records:
    """Runs ``step`` (forward and loss, returning the loss) once under ``precision``,
    calls backward, and returns one record per op (see qsync_model.model_json, and
    attribution for what an op is). Saved bytes count each storage once, skip
    parameters, buffers and autocast's copies of the op's own weights (lowbit-plan adds
    those itself), and charge tensors saved by code between the ops to the op that ran
    last (also as its ``code_saved_bytes``); ``input_cast_bytes`` is the part of an op's
    saved bytes at 16 bits that are its own casts of activations to that width
    (autocast's, one per consumer of an fp32 output). FLOPs and the op's kind come from
    the aten operators it ran (torch.utils.flop_counter's formulas, also as
    ``counted_flops``; an op without a GEMM, convolution or attention counts its
    output's size; ``aten``: its operators and their counts); each parameter counts at
    one op (``_assign_params``). ``with_stats`` adds the indicator's statistics (norms
    and absmax of weights, inputs and gradients). The model's buffers are restored
    after the step."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    state = {b.untyped_storage().data_ptr() for b in model.buffers()} | params
    records = Records()
    uses: Dict[str, list] = {}
    producer: Dict[object, str] = {}  # grad_fn -> op name (kept alive by the dict)
    started: Dict[str, int] = {}  # op -> the autograd sequence number at its start
    current: List[Optional[str]] = [None]
    last: List[Optional[str]] = [None]
    seen_storage = set()
    order = [0]
    grad_hooks = []
    counter = AtenCounter(lambda: current[0], lambda: last[0])

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

    def enter(op, module, args, kwargs, own, func):
        if reentrant_checkpoint():
            raise RuntimeError(
                "qsync export: op %r runs under reentrant activation checkpointing "
                "(torch.utils.checkpoint with use_reentrant=True), whose forward keeps the "
                "region's ops out of autograd's graph, where export finds each op's inputs "
                "and backward: checkpoint with use_reentrant=False (transformers' default)"
                % op)
        counter.paused = True
        started[op] = _autograd_sequence_now()
        ins = tensors((args, kwargs))
        ins_fl = [t for t in ins if not isinstance(t, torch.nn.Parameter)]
        inputs, via_code = producers_of(ins_fl)
        records[op] = {
            "module_class": type(module).__name__,
            "call": "module" if func is None else "function",
            "inputs": inputs, "via_code": via_code, "order": order[0],
            "uses_params": bool(own),
            "saved_bytes": {precision: 0.0}, "input_cast_bytes": {precision: 0.0},
            "code_saved_bytes": {precision: 0.0},
            "input_numel": float(_numel(ins_fl)),
        }
        if func is not None:
            records[op]["function"] = getattr(func, "__name__", str(func))
            records[op]["caller"] = tracker.caller()
        uses[op] = list(own)
        order[0] += 1
        if with_stats:
            fl = [t.detach() for t in ins_fl if t.is_floating_point()]
            w = [p.detach() for p in own if p.is_floating_point()]
            s = records[op].setdefault("stats", {})
            with torch.no_grad():  # nothing here may be recorded, or saved
                if fl:
                    s["input_norm"] = float(torch.linalg.vector_norm(fl[0].float()))
                    s["input_absmax"] = float(fl[0].abs().max())
                    s["input_numel"] = float(fl[0].numel())
                if w:
                    s["weight_norm"] = float(torch.linalg.vector_norm(w[0].float()))
                    s["weight_absmax"] = float(w[0].abs().max())
        current[0] = op
        counter.paused = False
        return None

    def exit(op, args, kwargs, out):
        counter.paused = True
        outs = tensors(out)
        r = records[op]
        r["output_numel"] = float(_numel(outs))
        # whether the op has a backward at all: an output whose autograd node the op made.
        # An identity, a dropout of p = 0 or a view-only op hands on its input's node (or
        # none) and does nothing in backward; instrument() opens no "N.backward" range
        # for it either, so its profile holds no backward to price.
        r["backward"] = r.get("backward", False) or any(
            t.grad_fn is not None and t.grad_fn._sequence_nr() > started[op] for t in outs)
        for t in outs:
            if t.grad_fn is not None:
                producer[t.grad_fn] = op
            # An output that is a view of a tensor the op made (Linear on a 3-D input
            # returns its 2-D GEMM's result viewed): an in-place op on the view later
            # rebases its history onto the base's node, so the base's node is the op's too.
            # A base made before the op (a view of an input) keeps its own producer.
            base = t._base
            if (base is not None and base.grad_fn is not None and base.grad_fn not in producer
                    and base.grad_fn._sequence_nr() > started[op]):
                producer[base.grad_fn] = op
        grads = [t for t in outs if t.requires_grad and t.is_floating_point()]
        if with_stats and grads:
            def on_grad(g, op=op):
                s = records[op].setdefault("stats", {})
                with torch.no_grad():
                    s["grad_output_absmax"] = float(g.detach().abs().max())
                s["grad_output_numel"] = float(g.numel())
            grad_hooks.append(grads[0].register_hook(on_grad))
        last[0] = op
        current[0] = None
        counter.paused = False
        return None

    def pack(t):
        op = current[0] or last[0]
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001 (tensor subclasses without storage)
            return t
        if op is None or key in state or _is_weight_copy(t, params):
            return t
        if key not in seen_storage:
            seen_storage.add(key)
            records[op]["saved_bytes"][precision] += float(size)
            if current[0] is None:  # code between the ops, after op
                records[op]["code_saved_bytes"][precision] += float(size)
            elif precision != "fp32" and _is_input_cast(t, params, DTYPES[precision]):
                records[op]["input_cast_bytes"][precision] += float(size)
        return t

    buffers = _snapshot_buffers(model)
    try:
        model.zero_grad(set_to_none=True)
        tracker = OpTracker(model, enter, exit, callers=True)
        with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with precision_context(precision, device_type), counter:
                loss = step()
        loss.backward()
        for op, r in records.items():
            a = counter.per_op.get(op, {"flops": 0.0, "aten": {}})
            r["kind"] = _op_kind(r, a["aten"])
            r["aten"] = dict(a["aten"])
            r["counted_flops"] = a["flops"]
            r["flops"] = a["flops"] if a["flops"] > 0 else r["output_numel"]
        taken = _assign_params(records, uses, {id(p): n for n, p in model.named_parameters()})
        for op, r in records.items():
            r["bytes"] = 4.0 * (r["input_numel"] + r["output_numel"] + r["param_numel"])
            own = [p for p in r.pop("params") if p.grad is not None]
            if with_stats and own:
                with torch.no_grad():
                    r.setdefault("stats", {})["grad_weight_norm"] = float(
                        torch.linalg.vector_norm(own[0].grad.float()))
        model.zero_grad(set_to_none=True)
    finally:
        for h in grad_hooks:
            h.remove()
        _restore_buffers(buffers)
    for r in records.values():
        for k in ("input_numel", "uses_params"):
            r.pop(k, None)
    _mode_calls(records, tracker.mode_calls, model)
    records.unattributed = [
        {"name": "aten::" + n, "count": u["count"], "flops": u["flops"],
         "output_numel": u["output_numel"], "after": u["after"]}
        for n, u in sorted(counter.unattributed.items(),
                           key=lambda kv: (-kv[1]["flops"], -kv[1]["count"], kv[0]))]
    records.unused_params = [{"name": n, "numel": p.numel(), "requires_grad": p.requires_grad}
                             for n, p in model.named_parameters() if id(p) not in taken]
    return records


def record_workspace(model: torch.nn.Module, step: Callable[[], torch.Tensor], precision: str,
                     device_type: str = "cuda") -> Tuple[Dict[str, float], Dict[str, float]]:
    """Runs ``step`` once under ``precision`` with backward and returns two maps of op
    to bytes. The first: the transient bytes each op allocated and freed within its
    forward or its backward call (the larger): a convolution's cuDNN workspace, a GEMM's
    scratch, temporaries. The second: the peak the backward of the code between the ops
    reached above what was allocated as it started (the loss's backward: a language
    model's logits gradient in fp32 and log-softmax's, several times the logits), charged
    to the op whose backward comes next (the op that ran last before that code, as
    record_ops charges what the code saved). The peak of the CUDA caching allocator is
    reset as each op starts and read as it ends; its excess over what is still allocated
    at the end is the op's scratch. The forward is bracketed by the op's start and end
    (attribution.OpTracker), the backward by hooks on the autograd nodes its forward made
    (attribution.Span); a stretch of backward while an op's span is open is that op's,
    not code's. Both empty where the device is not CUDA (the caching allocator's
    statistics are CUDA's). Run it after a few warm steps, so that one-time allocations
    (cuDNN's plans, cuBLAS's workspace) are not taken for an op's scratch. The model's
    buffers are restored after the step."""
    if device_type != "cuda" or not torch.cuda.is_available():
        return {}, {}
    cuda = torch.cuda
    scratch: Dict[str, float] = {}
    code: Dict[str, float] = {}
    start: Dict[str, int] = {}
    stops: Dict[str, set] = {}
    claimed: set = set()
    spans: List[Span] = []
    # Backward: the allocation where the code between the ops began (after the last span
    # closed, or as backward started), and how many op spans are open.
    code_from = [0]
    open_spans = [0]

    def begin(op):
        cuda.reset_peak_memory_stats()
        start[op] = cuda.memory_allocated()

    def end(op):
        extra = cuda.max_memory_allocated() - max(start[op], cuda.memory_allocated())
        scratch[op] = max(scratch.get(op, 0.0), float(max(0, extra)))

    def code_until(op):  # the code's backward ran since code_from; op's begins now
        if open_spans[0] == 0:
            extra = cuda.max_memory_allocated() - code_from[0]
            code[op] = max(code.get(op, 0.0), float(max(0, extra)))

    def code_starts():
        cuda.reset_peak_memory_stats()
        code_from[0] = cuda.memory_allocated()

    def backward_begin(op):
        code_until(op)
        open_spans[0] += 1
        begin(op)

    def backward_end(op):
        end(op)
        open_spans[0] -= 1
        if open_spans[0] == 0:
            code_starts()

    def enter(op, module, args, kwargs, own, func):
        stops[op] = grad_fns(tensors((args, kwargs)))
        begin(op)

    def exit(op, args, kwargs, out):
        end(op)
        heads, nodes = backward_nodes(tensors(out), stops.pop(op), claimed)
        spans.append(Span(heads, nodes, 0, lambda op=op: backward_begin(op),
                          lambda op=op: backward_end(op)))

    buffers = _snapshot_buffers(model)
    try:
        model.zero_grad(set_to_none=True)
        with OpTracker(model, enter, exit, on_iteration=claimed.clear), \
                precision_context(precision, device_type):
            loss = step()
        code_starts()
        loss.backward()
        cuda.synchronize()
        model.zero_grad(set_to_none=True)
    finally:
        for span in spans:
            span.release()
        claimed.clear()
        _restore_buffers(buffers)
    return scratch, code


def function_ops(records: Dict[str, dict]) -> bool:
    """Whether ``record_ops`` found ops that are torch functions (attribution)."""
    return any(r.get("call") == "function" for r in records.values())


def merge_workspace(records: Dict[str, dict], precision: str, scratch: Dict[str, float],
                    code: Optional[Dict[str, float]] = None) -> None:
    """Adds ``record_workspace``'s bytes at ``precision`` to the records: ``scratch`` as
    "workspace_bytes", ``code`` as "code_workspace_bytes"."""
    for key, part in (("workspace_bytes", scratch), ("code_workspace_bytes", code or {})):
        for op, b in part.items():
            if op in records:
                records[op].setdefault(key, {})[precision] = b


def merge_saved_bytes(base: Dict[str, dict], other: Dict[str, dict]) -> None:
    """Adds ``other``'s saved bytes (another precision's recording) into ``base``."""
    for op, r in other.items():
        if op in base:
            base[op]["saved_bytes"].update(r.get("saved_bytes", {}))
            for k in ("input_cast_bytes", "code_saved_bytes"):
                base[op].setdefault(k, {}).update(r.get(k, {}))


class instrument:
    """Context manager: a record_function range around every op's forward (``N``) and
    its backward (``N.backward``: from the moment the first autograd node its forward
    made is about to run until all of them have run and, on the first call of the
    iteration that takes a parameter, its parameters' gradients have accumulated, so a
    first conv whose input needs no gradient still times its weight gradient).
    attribution says what an op is and why the backward is found on the autograd graph
    rather than with module backward hooks: outputs modified in place afterwards (an
    in-place ReLU, ``out += identity``) are fine, the model runs as it is.
    ``functions=False`` leaves out function ops (and the torch function mode that finds
    them, a Python check on every torch call): right when ``record_ops`` found none
    (no record has ``"call": "function"``), as ``function_ops(records)`` says."""

    def __init__(self, model: torch.nn.Module, functions: bool = True):
        self.model, self.functions = model, functions

    def __enter__(self):
        self.claimed: set = set()  # autograd nodes some op of this iteration made
        self.seen: set = set()  # ids of parameters some op of this iteration took
        self.waiting: Dict[int, Span] = {}  # id(parameter) -> the span it closes
        self.fwd: Dict[str, tuple] = {}
        self.spans: List[Span] = []
        self.handles = [p.register_post_accumulate_grad_hook(self._accumulated)
                        for p in self.model.parameters() if p.requires_grad]
        self.tracker = OpTracker(self.model, self._enter, self._exit,
                                 functions=self.functions, on_iteration=self._new_iteration)
        self.tracker.__enter__()
        return self

    def _new_iteration(self):
        self.claimed.clear()
        self.seen.clear()
        self.waiting.clear()
        for span in self.spans:  # a graph never run backward keeps no span alive
            span.release()
        self.spans.clear()

    def _enter(self, op, module, args, kwargs, own, func):
        r = torch.profiler.record_function(op)
        r.__enter__()
        self.fwd[op] = (r, grad_fns(tensors((args, kwargs))), own)

    def _exit(self, op, args, kwargs, out):
        r, stop, own = self.fwd.pop(op)
        r.__exit__(None, None, None)
        heads, nodes = backward_nodes(tensors(out), stop, self.claimed)
        first = [p for p in own if p.requires_grad and id(p) not in self.seen]
        self.seen.update(id(p) for p in own)
        if not heads:
            return
        rng: List = []

        def open_range(op=op):
            rng.append(torch.profiler.record_function(op + ".backward"))
            rng[0].__enter__()

        span = Span(heads, nodes, len(first), open_range,
                    lambda: rng[0].__exit__(None, None, None))
        self.spans.append(span)
        for p in first:
            self.waiting[id(p)] = span

    def _accumulated(self, p):
        span = self.waiting.pop(id(p), None)
        if span is not None:
            span.done()

    def __exit__(self, *exc):
        self.tracker.__exit__(*exc)
        for h in self.handles:
            h.remove()
        self._new_iteration()
        return False


def profile(iteration: Callable[[], None], path: str, steps: int = 3, warmup: int = 2) -> str:
    """Runs ``iteration`` (one full training step ending in a synchronize) under the stock
    torch.profiler for ``warmup`` + ``steps`` steps (one ProfilerStep range each) and
    writes the Chrome trace of the active steps to ``path`` (plain JSON). Shapes, stacks
    and memory are not recorded: they inflate host time. Python's collector is off while
    it runs (collected first, its state restored after): a collection inside a profiled
    step would be host time of whichever op range it lands in."""
    from torch.profiler import ProfilerActivity, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    if os.path.exists(path):
        os.remove(path)
    warnings.filterwarnings("ignore", message="Profiler clears events")
    with collector_off():
        with torch.profiler.profile(activities=acts,
                                    schedule=schedule(wait=0, warmup=warmup, active=steps,
                                                      repeat=1),
                                    on_trace_ready=lambda p: p.export_chrome_trace(path),
                                    record_shapes=False, with_stack=False,
                                    profile_memory=False) as prof:
            for _ in range(warmup + steps + 1):
                iteration()
                prof.step()
    if not os.path.exists(path):
        raise RuntimeError("the profiler wrote no trace to " + path)
    return path
