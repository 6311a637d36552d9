"""Which calls of a training step are ops, for any nn.Module: shared by export (record,
instrument, workspace) and apply_plan.

An op is

- a call of a leaf module (one without children), named as ``call_name`` names it
  (``name``, ``name#2`` for its second call in an iteration), or
- a torch function called inside the model's forward but outside every other op, with
  a parameter among its arguments: a
  module's own parameter used by the module's code rather than by a leaf (ConvNeXt's
  layer scale, ViT's class token and position embedding, ``nn.MultiheadAttention``'s
  fused in-projection through ``F.multi_head_attention_forward``, timm's ``BatchNormAct2d``
  calling ``F.batch_norm``), or a leaf's weight used without calling the leaf
  (torchvision's Swin passes ``qkv.weight`` to ``F.linear``). It is named after the
  module that holds the parameter and counted with that module's calls. Its kind of
  call is ``"function"`` (a leaf's is ``"module"``): the model JSON says which.

A call made while autograd runs a backward pass is activation checkpointing's
recomputation of a forward region (``torch.utils.checkpoint``): it is no op of its own.
Profiling leaves it inside the backward range around it (the recomputation is part of
that backward's time and memory); the plan applier runs it as the forward call it
repeats, at that op's precision, so the recomputed tensors are the ones the forward made.
Which call that is: a module's only call; else, within one region's recomputation (one
autograd node asks for it), the forward's next call after the last one matched; else the
call whose first input tensor is the very one (the region's saved input); else the
tracker's ``recompute`` decides. Reentrant checkpointing (``use_reentrant=True``) runs the
region's forward with autograd off, so its ops are missing from the graph export reads
their inputs and backward from: export refuses it by name (``reentrant_checkpoint``).

Everything else (residual adds, attention's core in a module with children, the loss)
is code between the ops; ``AtenCounter`` names its aten operators and counts their FLOPs,
so that nothing is dropped silently: lowbit-plan prices it as the profile's tail.

An op's backward is found on the autograd graph (``Span``), not with module backward
hooks: a full backward hook wraps the module's outputs in views, and an output modified
in place afterwards (``out += identity`` in torchvision's ResNet, an in-place ReLU) is an
error then. The nodes an op's forward created are walked back from its outputs'
``grad_fn`` to the ``grad_fn`` its inputs had when it started; hooks on those nodes see
the op's backward start and end whatever is later done to the outputs in place.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .qsync_model import call_name

# Torch functions that read a tensor's metadata or identity, never an op.
_NOT_OPS = {"__get__", "__set__", "size", "dim", "numel", "stride", "data_ptr", "is_contiguous",
            "__len__", "__repr__", "__format__", "element_size", "nelement", "type",
            "is_floating_point", "is_complex", "__hash__", "__bool__", "item", "tolist",
            "get_device", "untyped_storage", "storage_offset", "register_hook",
            "__reduce_ex__", "__deepcopy__", "requires_grad_", "detach", "__iter__",
            "__contains__", "__array__", "__dlpack__", "is_set_to", "_is_view", "has_names",
            "__setstate__", "__getstate__", "_typed_storage", "dtype", "device", "shape"}

MAX_NODES = 4096  # an op's backward nodes walked at most


def recomputing() -> bool:
    """Whether autograd's engine is running a backward pass on this thread: a module
    called now is recomputed by activation checkpointing, not called by the forward."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


def reentrant_checkpoint() -> bool:
    """Whether this call runs inside torch.utils.checkpoint's reentrant forward (autograd
    off, the region's ops out of the graph that export follows)."""
    if torch.is_grad_enabled():
        return False
    fn = getattr(getattr(torch.utils, "checkpoint", None), "CheckpointFunction", None)
    code = getattr(getattr(fn, "forward", None), "__code__", None)
    frame = sys._getframe(1)
    while code is not None and frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _fingerprint(args) -> tuple:
    """Where a call's first input tensor lives: a recomputed region's first call takes
    the tensor its forward call took (checkpointing saves it), detached but in place.
    Taken on every call the applier hooks, so kept to one tensor's address and shape."""
    for a in args:
        if isinstance(a, torch.Tensor):
            try:
                return a.data_ptr(), a.shape
            except (RuntimeError, NotImplementedError):  # no storage (sparse, nested)
                return id(a), a.shape
    return ()


def leaf_modules(model: torch.nn.Module):
    """(qualified name, module) of every module without children."""
    return [(n, m) for n, m in model.named_modules() if next(m.children(), None) is None]


def within(name: str, module: str) -> bool:
    """True when the module called `name` is `module` or lies under it ("" is the root,
    which holds every module)."""
    return module == "" or name == module or name.startswith(module + ".")


def quiet_modules(model: torch.nn.Module, scopes: set, callers: set) -> set:
    """The largest modules under the ``scopes`` (module names) whose code, their
    children's included, calls none of the function ops watched: no name in ``callers``
    (the modules that call one, export's ``"caller"``) is theirs or under theirs.
    OpTracker's function mode can rest while they run. Containers that are never called
    (ModuleList, ModuleDict) are looked into instead: their entries are the modules that
    run."""
    def calls_functions(name):
        return any(within(c, name) for c in callers)

    modules = dict(model.named_modules())
    out: set = set()

    def visit(name, m):
        for child, c in m.named_children():
            full = "%s.%s" % (name, child) if name else child
            if isinstance(c, (torch.nn.ModuleList, torch.nn.ModuleDict)) or \
                    calls_functions(full):
                visit(full, c)
            else:
                out.add(full)

    for s in scopes:
        if s in modules:
            visit(s, modules[s])
    return out


def tensors(x) -> List[torch.Tensor]:
    """The tensors in `x`: nested tuples, lists, dicts, dataclasses, ModelOutputs."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in tensors(y)]
    if hasattr(x, "__dataclass_fields__"):
        return [t for k in x.__dataclass_fields__ for t in tensors(getattr(x, k, None))]
    return []


def map_tensors(x, fn):
    """`x` with every tensor t replaced by fn(t), keeping the containers' types (tuples,
    named tuples, lists, dicts and their subclasses such as ModelOutput, dataclasses)."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if type(x) is tuple:  # a call's positional arguments: once per hooked call
        return tuple(fn(y) if isinstance(y, torch.Tensor) else map_tensors(y, fn) for y in x)
    if type(x) is dict and not x:  # its keyword arguments, mostly none
        return x
    if isinstance(x, tuple):
        items = [map_tensors(y, fn) for y in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if isinstance(x, list):
        return [map_tensors(y, fn) for y in x]
    if isinstance(x, dict):
        new = {k: map_tensors(v, fn) for k, v in x.items()}
        if type(x) is dict:
            return new
        try:
            return type(x)(**new)
        except Exception:  # noqa: BLE001 (a mapping that cannot be rebuilt so)
            return new
    if hasattr(x, "__dataclass_fields__") and not isinstance(x, type):
        import dataclasses

        return dataclasses.replace(x, **{k: map_tensors(getattr(x, k), fn)
                                         for k, f in x.__dataclass_fields__.items() if f.init})
    return x


def param_owners(model: torch.nn.Module) -> Dict[int, Tuple[str, torch.nn.Module]]:
    """id(parameter) -> (qualified name, module) of the first module holding it (a tied
    weight, e.g. GPT-2's lm_head.weight, belongs to the module listed first)."""
    out: Dict[int, Tuple[str, torch.nn.Module]] = {}
    for name, m in model.named_modules():
        for p in m.parameters(recurse=False):
            out.setdefault(id(p), (name, m))
    return out


class OpTracker:
    """Context manager calling ``enter(op, module, args, kwargs, params, func)`` as every
    op starts and ``exit(op, args, kwargs, out)`` as it ends (``module``: the leaf, or for
    a function op the module holding its first parameter; ``params``: the parameters it
    takes; ``func``: None for a leaf's call, else the function). ``enter`` may return
    ``(args, kwargs)`` and ``exit`` an output to replace the call's. ``leaves``: the leaf
    modules' names to hook (all when None); ``functions``: whether function ops are
    seen (a TorchFunctionMode: every torch call pays a Python check), while the tracker
    is active or, given ``scopes`` (module names), only while one of those modules'
    forward runs (the leaves under them must be among ``leaves``, so that their own
    calls are told apart), and never while one of the ``quiet`` modules' forward runs
    (modules whose code, children included, calls none of the function ops the user
    watches: the mode's Python check on each of their torch calls would be host time
    for nothing).
    ``callers=True`` keeps ``caller()``: the innermost non-leaf module running, the one
    whose code calls a function op (its scope), and ``mode_calls``: {caller: torch calls
    the function mode saw in the root's forward while that module was the innermost
    non-leaf one running, but for the calls of ``enter`` and ``exit`` themselves}: what
    the applier's mode checks while a scope runs. Calls are
    counted per module and iteration (the root's forward starts one), so every user
    names an op the same way. ``recompute``: None, and a call made during a backward pass
    (``recomputing()``) is no op (no ``enter``/``exit``); else such a call is the forward
    call it repeats (the module docstring), and where that cannot be told,
    ``recompute(name, forward_ops)`` names it among the module's calls in the forward.
    ``wholes``: {caller: (owner, calls)} for callers each of whose calls makes exactly
    one function op, of the module ``owner`` (export's op name), and no other op, ``calls``
    of them a forward: the caller's forward is hooked as that op, as a leaf's is, with no
    function mode; a forward that calls one another number of times is an error as it
    ends (the ops would be misnamed)."""

    def __init__(self, model: torch.nn.Module, enter: Callable, exit: Callable,
                 leaves: Optional[set] = None, functions: bool = True,
                 on_iteration: Optional[Callable[[], None]] = None,
                 scopes: Optional[set] = None, callers: bool = False,
                 recompute: Optional[Callable[[str, List[str]], str]] = None,
                 quiet: Optional[set] = None,
                 wholes: Optional[Dict[str, Tuple[str, int]]] = None):
        self.model, self.enter, self.exit = model, enter, exit
        self.wholes = wholes or {}
        self.leaves, self.functions, self.on_iteration = leaves, functions, on_iteration
        self.scopes, self.callers, self.recompute = scopes, callers, recompute
        self.mode_calls: Dict[str, int] = {}
        self.counting = True
        self.quiet = quiet or set()
        self.count: Dict[int, int] = {}
        # with recompute: each module's ops this iteration, the forward's calls in order,
        # (id(module), op, _fingerprint), each op's place there, and the recomputation
        # under way (its autograd node and the place of the next call it should make)
        self.forward_ops: Dict[int, List[str]] = {}
        self.calls: List[tuple] = []
        self.place: Dict[str, int] = {}
        self.burst: Tuple[object, Optional[int]] = (None, None)
        self.active: Optional[str] = None
        self.owners = param_owners(model) if functions else {}

    def next_name(self, module: torch.nn.Module, name: str, args=()) -> Optional[str]:
        """The op this call of `module` (with inputs `args`) is, or None for a recomputed
        call that is none."""
        if recomputing():
            ops = self.forward_ops.get(id(module))
            if self.recompute is None or not ops:
                return None
            return self._repeated(module, name, ops, args)
        k = self.count.get(id(module), 0)
        self.count[id(module)] = k + 1
        op = call_name(name, k)
        if self.recompute is not None:
            self.forward_ops.setdefault(id(module), []).append(op)
            self.place[op] = len(self.calls)
            self.calls.append((id(module), op, _fingerprint(args)))
        return op

    def _repeated(self, module, name, ops, args) -> str:
        """The forward call a recomputed call of `module` repeats (the module docstring)."""
        current = getattr(torch._C, "_current_autograd_node", lambda: None)()
        node, cursor = self.burst
        if current is not node:  # another region's recomputation
            cursor = None
        if len(ops) == 1:
            op = ops[0]
        elif cursor is not None and cursor < len(self.calls) and \
                self.calls[cursor][0] == id(module):
            op = self.calls[cursor][1]
        else:
            fp = _fingerprint(args)
            same = [o for o in ops if self.calls[self.place[o]][2] == fp]
            if len(same) == 1:
                op = same[0]
            else:  # not told apart: what follows is not placed either
                self.burst = (current, None)
                return self.recompute(name, ops)
        self.burst = (current, self.place[op] + 1)
        return op

    def _new_iteration(self, *_):
        self.in_forward += 1
        if self.in_forward > 1 or recomputing():  # the root within itself, or recomputed
            return
        self.count.clear()
        self.mode_calls.clear()
        self.forward_ops.clear()
        self.calls.clear()
        self.place.clear()
        self.burst = (None, None)
        self.active = None
        if self.on_iteration is not None:
            self.on_iteration()

    def _forward_done(self, *_):
        self.in_forward = max(0, self.in_forward - 1)
        if self.in_forward == 0 and not recomputing():
            self._check_wholes()

    def _check_wholes(self):
        """Each whole caller made as many calls as the forward recorded (``wholes``)."""
        for caller, owner, calls in self.whole_counts:
            seen = self.count.get(owner, 0)
            if seen != calls:
                raise RuntimeError(
                    "qsync: %r ran %d times this forward, where the recorded forward ran "
                    "it %d times, one call of a function op each: its ops cannot be named "
                    "as recorded; record the model again as it runs now" % (
                        caller, seen, calls))

    def __enter__(self):
        # Function ops are looked for only inside the root's forward: not in the loss
        # code after it, nor in the optimizer's step (foreach updates take every
        # parameter).
        self.in_forward = 0
        self.handles = [self.model.register_forward_pre_hook(self._new_iteration),
                        self.model.register_forward_hook(self._forward_done,
                                                         always_call=True)]
        for name, m in leaf_modules(self.model):
            if self.leaves is None or name in self.leaves:
                self._hook(name, m)
        modules = dict(self.model.named_modules())
        self.whole_counts = []  # (caller, id(owner module), calls a forward)
        for caller, (owner, calls) in sorted(self.wholes.items()):
            self._hook(caller, modules[caller], (owner, modules[owner]))
            self.whole_counts.append((caller, id(modules[owner]), calls))
        self.mode = _FunctionOps(self) if self.functions else None
        self.mode_on = False
        self.running: List[str] = []
        self.depth = 0  # scopes whose forward is running
        self.hush = 0   # quiet modules whose forward is running
        if self.callers:
            for name, m in modules.items():
                if next(m.children(), None) is not None:
                    self._around(m, lambda n=name: self.running.append(n), self.running.pop)
        if self.mode is not None:
            for name in sorted(self.scopes or ()):
                self._around(modules[name], lambda: self._move(scopes=1),
                             lambda: self._move(scopes=-1))
            for name in sorted(self.quiet):
                self._around(modules[name], lambda: self._move(quiet=1),
                             lambda: self._move(quiet=-1))
            self._sync_mode()
        return self

    def _around(self, m, before, after):
        """Calls ``before()`` as `m`'s forward starts and ``after()`` as it ends."""
        def pre(mod, args):
            before()

        def post(mod, args, out):
            after()

        self.handles.append(m.register_forward_pre_hook(pre))
        self.handles.append(m.register_forward_hook(post, always_call=True))

    def _sync_mode(self):
        """Enters or leaves the function mode as the running scopes and quiet modules
        say."""
        on = (self.scopes is None or self.depth > 0) and self.hush == 0
        if on and not self.mode_on:
            self.mode.__enter__()
        elif self.mode_on and not on:
            self.mode.__exit__(None, None, None)
        self.mode_on = on

    def _move(self, scopes=0, quiet=0):
        """A scope's or a quiet module's forward starts (+1) or ends (-1)."""
        self.depth += scopes
        self.hush += quiet
        self._sync_mode()

    def caller(self) -> str:
        """The innermost non-leaf module whose forward is running (``callers=True``)."""
        return self.running[-1] if self.running else ""

    def _hook(self, name, m, owner=None):
        """Hooks `m`'s calls as ops: a leaf's, named after it, or a whole caller's, named
        after ``owner`` (name, module), the module its function op is counted under."""
        stack: List[Optional[str]] = []
        op_name, op_module = owner or (name, m)
        own = list(op_module.parameters(recurse=False))

        def pre(mod, args, kwargs):
            # None on the stack: a call that is no op, or whose enter has not returned
            stack.append(None)
            if self.active is not None:  # a leaf called inside another op: part of it
                return None
            op = self.next_name(op_module, op_name, args)
            if op is None:
                return None
            self.active = op
            self.counting = False  # enter's own torch calls are not the model's
            try:
                new = self.enter(op, op_module, args, kwargs, own, None)
            except BaseException:
                self.active = None
                raise
            finally:
                self.counting = True
            stack[-1] = op
            return new

        def post(mod, args, kwargs, out):
            # also run when the forward raised (out is None then): a recomputation that
            # activation checkpointing stops early, once it has the tensors it needs,
            # ends an op that way, and its exit (an autocast context) must still run
            op = stack.pop() if stack else None
            if op is None:
                return None
            self.active = None
            self.counting = False  # nor exit's
            try:
                return self.exit(op, args, kwargs, out)
            finally:
                self.counting = True

        self.handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))

    def run_function(self, func, args, kwargs, owner, params):
        name, module = owner
        op = self.next_name(module, name, args)
        if op is None:
            return func(*args, **kwargs)
        self.active = op
        entered = False
        try:
            new = self.enter(op, module, args, kwargs, params, func)
            entered = True
            if new is not None:
                args, kwargs = new
            out = func(*args, **kwargs)
        except BaseException:
            self.active = None
            if entered:  # as a leaf's forward hook: the exit runs however the call ends
                self.exit(op, args, kwargs, None)
            raise
        self.active = None
        new = self.exit(op, args, kwargs, out)
        return out if new is None else new

    def __exit__(self, *exc):
        if self.mode is not None and self.mode_on:
            self.mode.__exit__(*exc)
        self.mode_on = False
        self.depth = self.hush = 0
        for h in self.handles:
            h.remove()
        self.active = None
        return False


def _parameters_in(x, owners, out: list) -> None:
    """Appends the model's parameters (``owners``' keys) found in `x`, in order, looking
    through tuples, lists and dicts. The mode runs it on every torch call it checks, so
    it walks the containers itself: pytree's leaves cost several times as much a call."""
    if isinstance(x, torch.nn.Parameter):
        if id(x) in owners:
            out.append(x)
    elif isinstance(x, (tuple, list)):
        for y in x:
            if isinstance(y, (torch.Tensor, tuple, list, dict)):
                _parameters_in(y, owners, out)
    elif isinstance(x, dict):
        for y in x.values():
            _parameters_in(y, owners, out)


class _FunctionOps(TorchFunctionMode):
    """Turns a torch function called outside every op with a parameter among its
    arguments into an op (OpTracker.run_function)."""

    def __init__(self, tracker: OpTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = self.tracker
        if t.callers and t.counting and t.in_forward:
            c = t.caller()
            t.mode_calls[c] = t.mode_calls.get(c, 0) + 1
        if (t.active is None and (t.in_forward or (t.recompute is not None and recomputing()))
                and getattr(func, "__name__", "") not in _NOT_OPS):
            params = []
            _parameters_in(args, t.owners, params)
            if kwargs:
                _parameters_in(kwargs, t.owners, params)
            owner = t.owners[id(params[0])] if params else None
            if owner is not None:
                return t.run_function(func, args, kwargs, owner, params)
        return func(*args, **kwargs)


def grad_fns(ts) -> set:
    return {t.grad_fn for t in ts if isinstance(t, torch.Tensor) and t.grad_fn is not None}


def backward_nodes(outs, stop: set, claimed: set):
    """(heads, nodes): the ``grad_fn`` of an op's outputs and every autograd node its
    forward created, walking back from the heads and stopping at ``stop`` (the grad_fn
    its inputs had as it started), at nodes an earlier op claimed and at the
    parameters' gradient accumulators."""
    heads = list(dict.fromkeys(t.grad_fn for t in outs if t.grad_fn is not None))
    nodes, stack, seen = [], list(heads), set()
    while stack and len(nodes) < MAX_NODES:
        fn = stack.pop()
        if fn is None or fn in seen or fn in stop or fn in claimed or hasattr(fn, "variable"):
            continue
        seen.add(fn)
        nodes.append(fn)
        stack.extend(f for f, _ in fn.next_functions)
    claimed.update(nodes)
    return [h for h in heads if h in seen], nodes


class Span:
    """An op's backward on the autograd graph: ``on_open`` as the first of its head
    nodes is about to run, ``on_close`` once those of its nodes that this backward runs
    (``torch._C._will_engine_execute_node``: the nodes of an unused output never run)
    have run and ``extra`` more events (``done()``: its parameters' gradients
    accumulated) have happened, or at the end of the backward pass at the latest.
    ``release()`` drops the nodes (the hooks on them hold the span): call it when the
    graph may never be run backward."""

    def __init__(self, heads, nodes, extra: int, on_open: Callable, on_close: Callable):
        self.nodes, self.extra, self.on_open, self.on_close = nodes, extra, on_open, on_close
        self.ran = self.extra_done = 0
        self.needed: Optional[int] = None
        self.opened = self.closed = False
        for h in heads:
            h.register_prehook(self._pre)
        for n in nodes:
            n.register_hook(self._post)

    def release(self):
        self.nodes = None

    def _pre(self, grad_outputs):
        if not self.opened:
            self.opened = True
            will = torch._C._will_engine_execute_node
            self.needed = sum(1 for n in self.nodes or () if will(n))
            self.nodes = None
            self.on_open()
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def _post(self, grad_inputs, grad_outputs):
        self.ran += 1
        self._check()

    def done(self):
        self.extra_done += 1
        self._check()

    def _check(self):
        if self.opened and self.ran >= self.needed and self.extra_done >= self.extra:
            self.finish()

    def finish(self):
        if self.opened and not self.closed:
            self.closed = True
            self.on_close()


# Aten operators -> op kind, for ops whose class name says nothing (a function op, a
# custom leaf: transformers' Conv1D is a transposed linear, not a convolution).
_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "matmul", "linear"}
_CONVS = {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable",
          "_slow_conv2d_forward", "mkldnn_convolution"}
_NORMS = {"native_batch_norm": "batch_norm", "_native_batch_norm_legit": "batch_norm",
          "_batch_norm_with_update": "batch_norm", "cudnn_batch_norm": "batch_norm",
          "native_layer_norm": "layer_norm", "native_group_norm": "layer_norm",
          "_fused_rms_norm": "layer_norm", "rms_norm": "layer_norm",
          "embedding": "embedding", "_softmax": "softmax", "gelu": "gelu"}


def aten_kind(names, has_params: bool) -> Optional[str]:
    """The op kind the aten operators of an op's forward say (None: nothing telling)."""
    if any(n in _CONVS for n in names):
        return "conv"
    if any(n in _GEMMS for n in names):
        return "linear" if has_params else "matmul"
    for n in names:
        if n in _NORMS:
            return _NORMS[n]
    return None


class AtenCounter(TorchDispatchMode):
    """Counts the aten operators of a forward: per op (``per_op[op]``: {"flops",
    "aten": {name: count}}), by ``current()``, and those outside every op
    (``unattributed``: name -> {"count", "flops", "output_numel", "after": [ops]}).
    FLOPs are torch.utils.flop_counter's formulas (GEMMs, convolutions, attention),
    0 for the rest."""

    def __init__(self, current: Callable[[], Optional[str]], last: Callable[[], Optional[str]]):
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.current, self.last = current, last
        self.per_op: Dict[str, dict] = {}
        self.unattributed: Dict[str, dict] = {}
        self.paused = False  # the recorder's own calls (statistics) are not the model's

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused:
            return out
        packet = func._overloadpacket
        name = packet.__name__
        flops = 0.0
        f = self.registry.get(packet)
        if f is not None:
            try:
                flops = float(f(*args, **kwargs, out_val=out))
            except Exception:  # noqa: BLE001 (a formula that does not fit the call)
                flops = 0.0
        op = self.current()
        if op is not None:
            r = self.per_op.setdefault(op, {"flops": 0.0, "aten": {}})
            r["flops"] += flops
            r["aten"][name] = r["aten"].get(name, 0) + 1
        elif name not in ("detach", "alias", "lift_fresh"):
            u = self.unattributed.setdefault(name, {"count": 0, "flops": 0.0,
                                                    "output_numel": 0.0, "after": []})
            u["count"] += 1
            u["flops"] += flops
            u["output_numel"] += float(sum(t.numel() for t in tensors(out)))
            prev = self.last()
            if prev is not None and prev not in u["after"] and len(u["after"]) < 8:
                u["after"].append(prev)
        return out
