"""Per-bucket bit-widths for the DDP hook from a QSync plan (what ``lowbit-plan`` writes).

    state = lowbit_torch.DDPState(bits="plan.json", model=model)

The plan's buckets are lowbit-plan's, not DDP's: ``{"buckets": [{"bits": 8, "ops":
["fc1", ...]}, ...]}``, optionally with ``"bucket_bits": [8, ...]`` replacing the widths
in order. Its ops are named as examples/pytorch/qsync/export.py names them: a module's
qualified name (``name#k`` for its k-th call, ``model`` for the root module). So the
widths are mapped through the parameters: every op gives its module's own parameters
its bucket's bits (the widest where a parameter is named twice), and a DDP bucket takes
the widest bits of the parameters it holds, so that no parameter is quantised more
coarsely than the plan asked.

Widths: 1, 2, 4 and 8 run lowbit's collective; 16 and 32 go through the full-precision
path (torch.distributed's all-reduce of the bucket in its own dtype; the hook has no
bf16 wire, so a 16 is sent at least that wide). Anything else is an error naming the
plan bucket.

Parameters the plan does not name (trainable ones of no planned op: a model changed
since the export) take 32, full precision, as lowbit-plan prices a bucket it is not
given: ``PlanBits.unplanned`` lists them, and a warning names them once. A plan naming
an op that is no module of the model is an error (it was made for another model, or
under a wrapper's prefix). Nothing here needs the compiled extension."""

import json
import os
import warnings

#: The widths lowbit's collective runs (compiled in).
LOWBIT_BITS = (1, 2, 4, 8)
#: The widths that take the full-precision path.
FULL_PRECISION_BITS = (16, 32)
#: The widths a bucket may take.
BITS = LOWBIT_BITS + FULL_PRECISION_BITS
#: What a parameter no planned op names gets.
UNPLANNED_BITS = 32


def check_bits(bits, where="lowbit_torch.DDPState: bits"):
    """Raises ValueError unless ``bits`` is one of BITS."""
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"{where} must be 1, 2, 4, 8 (low-bit) or 16, 32 (full precision), "
                         f"got {bits!r}")


def is_plan(bits):
    """True for what DDPState's ``bits`` takes as a plan: a dict, a path, or a PlanBits."""
    return isinstance(bits, (dict, str, os.PathLike, PlanBits))


def module_of(op):
    """The qualified module name behind a plan's op name (qsync_model.module_of)."""
    base = op.split("#", 1)[0]
    return "" if base == "model" else base


def read_plan(plan):
    """The plan's buckets as ``[(bits, [op, ...]), ...]``, from a plan dict or a JSON file's
    path; ValueError naming what is malformed."""
    where = "lowbit_torch plan"
    if isinstance(plan, (str, os.PathLike)):
        where = f"lowbit_torch plan {os.fspath(plan)!r}"
        with open(plan) as f:
            try:
                plan = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON: {e}") from e
    if not isinstance(plan, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(plan).__name__}")
    buckets = plan.get("buckets")
    if not isinstance(buckets, list) or not buckets:
        if "bucket_bits" in plan:
            raise ValueError(f'{where}: "bucket_bits" alone does not say which ops each bucket '
                             'holds: give "buckets" with their "ops", as lowbit-plan writes')
        raise ValueError(f'{where}: no "buckets" list (expected {{"buckets": [{{"bits": 8, '
                         '"ops": [...]}, ...]}, as lowbit-plan writes)')
    out = []
    for k, b in enumerate(buckets):
        if not isinstance(b, dict) or "ops" not in b:
            raise ValueError(f'{where}: bucket {k} has no "ops" list')
        ops = b["ops"]
        if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
            raise ValueError(f'{where}: bucket {k}: "ops" must be a list of op names')
        out.append([b.get("bits"), list(ops)])
    if "bucket_bits" in plan:
        widths = plan["bucket_bits"]
        if not isinstance(widths, list) or len(widths) != len(out):
            n = len(widths) if isinstance(widths, list) else type(widths).__name__
            raise ValueError(f'{where}: "bucket_bits" has {n} widths, "buckets" {len(out)} '
                             "entries")
        for b, w in zip(out, widths):
            b[0] = w
    for k, (bits, ops) in enumerate(out):
        if bits is None:
            raise ValueError(f'{where}: bucket {k} has no "bits"')
        check_bits(bits, f"{where}: bucket {k} ({', '.join(ops[:3]) or 'no ops'}): bits")
    return [(bits, ops) for bits, ops in out]


def unwrap(model):
    """The module the plan names: DDP's ``module``, torch.compile's ``_orig_mod``."""
    import torch.nn as nn

    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


class PlanBits:
    """A plan's widths per parameter of ``model`` (the module, or the DDP wrapping it).

    ``bits_of(parameters)``: the widest bits of those parameters (a DDP bucket's).
    ``op_bits``: op name -> bits; ``unplanned``: the trainable parameters no op names
    (they take UNPLANNED_BITS). The parameters are looked up by identity; the mapping is
    made again when a bucket holds one it does not know (parameters replaced since)."""

    def __init__(self, plan, model):
        if model is None:
            raise ValueError("lowbit_torch.DDPState: bits from a plan needs the model "
                             "(DDPState(bits=plan, model=model)): the plan names modules")
        self.buckets = read_plan(plan)
        self.model = model
        self.op_bits = {}
        for bits, ops in self.buckets:
            for op in ops:
                self.op_bits[op] = max(bits, self.op_bits.get(op, bits))
        self.unplanned = []
        self._by_id = {}  # id(parameter) -> (parameter, bits, name)
        self._resolve()

    def _resolve(self):
        module = unwrap(self.model)
        modules = dict(module.named_modules())
        unknown = [op for op in self.op_bits if module_of(op) not in modules]
        if unknown and len(unknown) == len(self.op_bits):
            raise ValueError(f"lowbit_torch plan: it names no op of the model (first: "
                             f"{', '.join(unknown[:3])}; the model's modules: "
                             f"{', '.join(list(modules)[1:4])}, ...): a plan for another "
                             "model, or one exported under a wrapper's prefix")
        if unknown:
            raise ValueError(f"lowbit_torch plan: {len(unknown)} op(s) are no module of the "
                             f"model: {', '.join(unknown[:5])}")
        bits_of = {}
        for op, bits in self.op_bits.items():
            for p in modules[module_of(op)].parameters(recurse=False):
                bits_of[id(p)] = max(bits, bits_of.get(id(p), bits))
        if not bits_of:
            raise ValueError("lowbit_torch plan: the modules it names hold no parameters")
        self._by_id, unplanned = {}, []
        for name, p in module.named_parameters():
            bits = bits_of.get(id(p))
            if bits is None and p.requires_grad:
                unplanned.append(name)
            self._by_id[id(p)] = (p, UNPLANNED_BITS if bits is None else bits, name)
        if unplanned and unplanned != self.unplanned:
            warnings.warn(f"lowbit_torch plan: {len(unplanned)} parameter(s) of the model are "
                          f"in no planned op and go at full precision: "
                          f"{', '.join(unplanned[:5])}{', ...' if len(unplanned) > 5 else ''}",
                          stacklevel=3)
        self.unplanned = unplanned

    def _entry(self, p):
        e = self._by_id.get(id(p))
        return e if e is not None and e[0] is p else None

    def bits_of(self, parameters, index=None):
        """The widest bits of ``parameters`` (UNPLANNED_BITS for none)."""
        parameters = list(parameters)
        if any(self._entry(p) is None for p in parameters):
            self._resolve()
        widest = None
        for p in parameters:
            e = self._entry(p)
            if e is None:
                raise ValueError(f"lowbit_torch.DDPState: bucket {index} holds a parameter "
                                 f"(shape {tuple(p.shape)}) that is not the model's: give "
                                 "DDPState the model (or the DDP) the hook is registered on")
            widest = e[1] if widest is None else max(widest, e[1])
        return UNPLANNED_BITS if widest is None else widest

    def names_of(self, parameters):
        """The model's names of ``parameters`` (None for one it does not hold)."""
        return [e[2] if e is not None else None for e in map(self._entry, parameters)]

    def to_json(self):
        """The plan as this reads it: ``{"buckets": [{"bits", "ops"}, ...]}``."""
        return {"buckets": [{"bits": b, "ops": list(ops)} for b, ops in self.buckets]}
