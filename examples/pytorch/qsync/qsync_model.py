"""Pure-Python half of the QSync exporter: no torch, no CUDA, unit-testable anywhere.

``lowbit-plan`` reads a model JSON (``include/lowbit/qsync/plan_io.hpp``,
``model_from_json``)::

    {"name", "optimizer_bytes_per_param", "bucket_cap_mb", "first_bucket_mb",
     "ops": [{"name", "kind", "flops", "bytes", "output_numel", "saved_numel",
              "param_numel", "inputs": [...], "saved_bytes": {"fp32": B, ...},
              "workspace_bytes": {"fp32": B, ...}, "stats": {...}}]}

and PyTorch-profiler traces in which op ``N`` is timed by ``user_annotation`` ranges
``N`` (forward) and ``N.backward``. The torch half (``export.py``) records one entry per
leaf-module call while the model runs; this module turns those records plus a trace into
the model JSON, and holds the helpers the validation script needs without torch.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import gzip
import json
import os
import statistics
from typing import Dict, Iterable, List, Optional, Tuple

BACKWARD_SUFFIX = ".backward"

# Module class name (lowercase, substring) -> op kind lowbit-plan knows. First match wins:
# "batchnorm" must be tested before "norm"-like fallbacks, "conv" covers Conv1d/2d/3d.
_KINDS = [
    ("batchnorm", "batch_norm"), ("syncbatchnorm", "batch_norm"),
    ("layernorm", "layer_norm"), ("rmsnorm", "layer_norm"), ("groupnorm", "layer_norm"),
    ("conv", "conv"), ("linear", "linear"), ("embedding", "embedding"),
    ("softmax", "softmax"), ("gelu", "gelu"), ("relu", "relu"), ("silu", "relu"),
    ("pool", "pool"), ("loss", "loss"),
]

KNOWN_KINDS = {"conv", "linear", "matmul", "embedding", "layer_norm", "batch_norm",
               "softmax", "gelu", "relu", "pool", "add", "loss", "other"}

PRECISIONS = ("int8", "fp8", "fp16", "bf16", "tf32", "fp32")


def kind_of(class_name: str) -> str:
    """The op kind of a module class: decides lowbit's 16-bit floor and backward cost."""
    low = class_name.lower()
    for key, kind in _KINDS:
        if key in low:
            return kind
    return "other"


def call_name(module_name: str, call_index: int) -> str:
    """Op name of a module's call: the module's qualified name for its first call in an
    iteration, ``name#k`` for the k-th (k >= 2), so that a module used twice (a shared
    ReLU) is two ops with their own ranges and inputs."""
    name = module_name or "model"
    return name if call_index == 0 else "%s#%d" % (name, call_index + 1)


def module_of(op_name: str) -> str:
    """The module's qualified name behind an op name (inverse of call_name)."""
    base = op_name.split("#", 1)[0]
    return "" if base == "model" else base


def _events(trace) -> list:
    if isinstance(trace, dict):
        if "traceEvents" not in trace:
            raise ValueError('malformed trace: no "traceEvents" array')
        return trace["traceEvents"]
    return trace


def forward_ranges(trace) -> List[str]:
    """Names of the forward ranges of the trace's first profiler step in start order
    (the order the ops ran), without backward and ProfilerStep ranges; without
    ProfilerStep ranges, every distinct forward range. Non-op ranges (the optimizer's)
    are the caller's to filter."""
    ranges = [e for e in _events(trace)
              if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    ranges.sort(key=lambda e: e["ts"])
    steps = [e for e in ranges if e["name"].startswith("ProfilerStep#")]
    window = (steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]) if steps else None
    out, seen = [], set()
    for e in ranges:
        n = e["name"]
        if n.startswith("ProfilerStep#") or n.endswith(BACKWARD_SUFFIX) or n in seen:
            continue
        if window and not (window[0] <= e["ts"] <= window[1]):
            continue
        seen.add(n)
        out.append(n)
    return out


# Per-precision byte maps of a record that the model JSON carries only where non-zero.
MEASURED_PARTS = ("input_cast_bytes", "code_saved_bytes", "workspace_bytes",
                  "code_workspace_bytes")


def measured_part(record: dict, key: str) -> Dict[str, float]:
    """``record[key]`` ({precision: bytes}) as the model JSON holds it: known precisions,
    non-zero entries."""
    return {p: float(b) for p, b in (record.get(key) or {}).items() if p in PRECISIONS and b > 0}


def model_json(records: Dict[str, dict], name: str, trace=None,
               optimizer_bytes_per_param: float = 8.0, bucket_cap_mb: float = 25.0,
               first_bucket_mb: float = 1.0) -> dict:
    """The model JSON lowbit-plan reads, from per-op records (what export.py collects:
    ``{op_name: {"kind" or "module_class", "flops", "bytes", "output_numel",
    "saved_bytes": {precision: bytes}, "input_cast_bytes": {precision: bytes},
    "code_saved_bytes": {precision: bytes}, "workspace_bytes": {precision: bytes},
    "code_workspace_bytes": {precision: bytes},
    "param_numel", "inputs", "via_code", "stats", "order"}}``; "via_code" lists the inputs
    that reach the op through code between the ops rather than as the producer's own
    output).

    Ops are in the records' forward order. With a trace (a profile of the same
    program), the ops that ran in it must come in the same order, else the records and
    the trace describe different programs (ValueError); ops without a range are kept
    (their parameters still cost memory and optimizer time) and listed under
    "untimed" (lowbit-plan times them by roofline and ignores the key). An op that
    runs with weights an earlier op holds (a module's later call, a tied head) has that
    op as its first input, also under ``"weights_from"``. An op that is a torch
    function rather than a leaf module's call carries ``"call": "function"``, the
    function's name and the ``"caller"``, the module whose code called it (the plan
    applier finds it so; lowbit-plan ignores all three), and ``"mode_calls"``, the torch
    calls the applier's function mode checks a step on its account where it wraps it
    (export._mode_calls; lowbit-plan prices them). The
    records' ``unattributed`` list (export.Records: the aten operators of the code
    between the ops, by name, with count and FLOPs) goes under "unattributed", each
    marked ``"priced_as": "tail"``: lowbit-plan ignores the key and prices that code as
    the profile's tail. An op holding parameters without requires_grad carries
    ``"frozen_numel"`` (weights without gradient, optimizer state or bucket share), and
    the records' ``unused_params`` (parameters no op took) go under ``"unused_params"``
    (``{"numel", "names"}``): lowbit-plan counts their weights' memory alone. Inputs naming
    unknown or later ops are dropped; ``saved_numel`` is the fp32 saved size in
    elements (4 bytes each)."""
    order = sorted(records, key=lambda n: records[n].get("order", 0))
    untimed: List[str] = []
    if trace is not None:
        timed = [n for n in forward_ranges(trace) if n in records]
        if not timed:
            raise ValueError("the trace has no range named like any recorded op")
        pos = {n: k for k, n in enumerate(order)}
        if [pos[n] for n in timed] != sorted(pos[n] for n in timed):
            raise ValueError("the trace ran the ops in another order than the recording")
        untimed = [n for n in order if n not in set(timed)]
    known = set(order)
    ops = []
    for n in order:
        r = records[n]
        kind = r.get("kind") or kind_of(r.get("module_class", ""))
        if kind not in KNOWN_KINDS:
            raise ValueError("op %r: unknown kind %r" % (n, kind))
        saved = {p: float(b) for p, b in (r.get("saved_bytes") or {}).items() if p in PRECISIONS}
        o = {
            "name": n,
            "kind": kind,
            "flops": float(r.get("flops", 0)),
            "bytes": float(r.get("bytes", 0)),
            "output_numel": float(r.get("output_numel", 0)),
            "saved_numel": saved.get("fp32", float(r.get("saved_numel", 0)) * 4) / 4.0,
            "param_numel": float(r.get("param_numel", 0)),
            "inputs": [i for i in dict.fromkeys(r.get("inputs", [])) if i in known and i != n],
        }
        if r.get("frozen_numel"):  # parameters without requires_grad
            o["frozen_numel"] = float(r["frozen_numel"])
        if r.get("call") == "function":  # a torch function taking a parameter
            o["call"] = "function"
            for k in ("function", "caller", "mode_calls"):
                if r.get(k) is not None:
                    o[k] = r[k]
        if r.get("backward") is False:  # its forward made no autograd node (export.py)
            o["backward"] = False
        if r.get("weights_from"):  # its first input holds its weights (export.py)
            o["weights_from"] = list(r["weights_from"])
        if saved:
            o["saved_bytes"] = saved
        for key in MEASURED_PARTS:
            part = measured_part(r, key)
            if part:
                o[key] = part
        stats = {k: float(v) for k, v in (r.get("stats") or {}).items() if v is not None}
        if stats:
            o["stats"] = stats
        ops.append(o)
    pos = {o["name"]: k for k, o in enumerate(ops)}
    for o in ops:
        o["inputs"] = [i for i in o["inputs"] if pos[i] < pos[o["name"]]]
        via = [i for i in records[o["name"]].get("via_code", []) if i in o["inputs"]]
        if via:
            o["via_code"] = via
    # apply_plan.py casts through the step's ambient precision: lowbit-plan prices that.
    out = {"name": name, "optimizer_bytes_per_param": optimizer_bytes_per_param,
           "bucket_cap_mb": bucket_cap_mb, "first_bucket_mb": first_bucket_mb,
           "casts": "ambient", "ops": ops}
    if untimed:
        out["untimed"] = untimed
    unattributed = getattr(records, "unattributed", None)
    if unattributed:
        out["unattributed"] = [dict(u, priced_as="tail") for u in unattributed]
    unused = getattr(records, "unused_params", None)
    if unused:
        out["unused_params"] = {"numel": float(sum(u["numel"] for u in unused)),
                                "names": [u["name"] for u in unused]}
    return out


#: the devices lowbit-plan knows (include/lowbit/qsync/device_profile.hpp), newest first
KNOWN_DEVICES = ("H200", "H100", "A100", "V100", "T4")


def device_base(gpu_name: str, default: str = "H200") -> str:
    """lowbit-plan's device for a GPU as torch names it ("NVIDIA H100 80GB HBM3" -> "H100"),
    `default` for a name it knows none of (a CPU smoke run's): the device sets what fits
    in memory, so a plan made for another card's capacity is not the card's."""
    for d in KNOWN_DEVICES:
        if d in (gpu_name or "").upper():
            return d
    return default


def cluster_json(device: str = "H200", precisions=("fp16", "bf16", "fp32")) -> dict:
    """A one-GPU cluster whose menu holds only what autocast can apply (no fp8, int8 or
    tf32), so the allocator's plans can be run."""
    return {"name": "1x " + device, "link": "nvlink4",
            "groups": [{"device": {"base": device, "precisions": list(precisions)},
                        "count": 1}]}


def missing_ranges(trace, model: dict) -> List[str]:
    """Op names of ``model`` that have no forward range in ``trace`` (timed by roofline
    then): what the validation reports before trusting a prediction."""
    names = {e.get("name") for e in _events(trace)
             if isinstance(e, dict) and e.get("cat") == "user_annotation"}
    return [o["name"] for o in model["ops"] if o["name"] not in names]


def uniform_plan(precision: str) -> dict:
    """Every op at ``precision`` (nearest allowed), every bucket fp32."""
    return {"default": precision}


def mixed_plans(model: dict) -> Dict[str, dict]:
    """Two mixed plans built by rule from the model, not tuned to it:
    ``mixed-ends``: bf16 everywhere but the first and last ops with parameters in fp32
    (the layers QSync's indicator usually protects);
    ``mixed-norms``: fp16 for convolutions and linears, fp32 for everything else with
    parameters (norms, embeddings)."""
    params = [o for o in model["ops"] if o["param_numel"] > 0]
    ends = {}
    if params:
        ends = {params[0]["name"]: "fp32", params[-1]["name"]: "fp32"}
    gemm = {o["name"]: "fp16" for o in params if o["kind"] in ("conv", "linear")}
    return {"mixed-ends": {"default": "bf16", "ops": ends},
            "mixed-norms": {"default": "fp32", "ops": gemm}}


def plan_precisions(plan: dict, model: dict) -> Dict[str, str]:
    """Op name -> precision for the ops with parameters under ``plan`` (a plan as
    lowbit-plan reads it: top-level or first group's "default"/"ops"). Parameter-free
    ops are left out: they follow their input."""
    g = plan["groups"][0] if "groups" in plan else plan
    default = g.get("default", "fp32")
    ops = g.get("ops", {})
    return {o["name"]: ops.get(o["name"], default) for o in model["ops"] if o["param_numel"] > 0}


def resolve_precisions(per_op: Dict[str, str], model: dict,
                       graph_input: str = "fp32") -> Dict[str, str]:
    """Every op's precision, lowbit's way: ops with parameters as `per_op` says (fp32
    when absent), parameter-free ops their first input's. One fed by no op (only the
    step's own inputs: a detection model's input transform, a Flatten in front) runs in
    the step's context, ``graph_input``: the plan applier's ambient precision, where the
    uniform profiles ran it (lowbit-plan resolves it so through the ambient), or fp32,
    QSync's per-edge rule."""
    out: Dict[str, str] = {}
    for o in model["ops"]:
        if o["param_numel"] > 0:
            out[o["name"]] = per_op.get(o["name"], "fp32")
        else:
            ins = [i for i in o.get("inputs", []) if i in out]
            out[o["name"]] = out[ins[0]] if ins else graph_input
    return out


def ops_to_wrap(per_op: Dict[str, str], model: dict, ambient: str) -> Dict[str, str]:
    """The ops with parameters the plan applier must wrap: those at another precision
    than the ambient one, and those fed by an op at another precision than their own
    (their inputs are cast; a norm would follow its input otherwise). A uniform plan
    wraps nothing, so it runs the profiled program."""
    resolved = resolve_precisions(per_op, model, graph_input=ambient)
    out = {}
    for o in model["ops"]:
        n = o["name"]
        if o["param_numel"] <= 0:
            continue
        fed = any(resolved.get(i, "fp32") != resolved[n] for i in o.get("inputs", []))
        if resolved[n] != ambient or fed:
            out[n] = resolved[n]
    return out


def consumer_counts(model: dict) -> Dict[str, int]:
    """Op name -> how many later ops list it as an input (directly or through the code
    between modules), not counting an input that only holds the op's weights
    (``weights_from``). The plan applier keeps an op's own output for its consumers
    until the last of them has started, then lets it go."""
    out: Dict[str, int] = {o["name"]: 0 for o in model["ops"]}
    for o in model["ops"]:
        for i in dict.fromkeys(o.get("inputs", [])):
            if i in out and i not in o.get("weights_from", ()):
                out[i] += 1
    return out


RANK = ("int8", "fp8", "fp16", "bf16", "tf32", "fp32")  # lowbit's precision order


def ambient_precision(precisions: Dict[str, str]) -> str:
    """The precision most ops with parameters run at (``precisions`` holds those ops;
    ties to the higher precision in lowbit's order): the plan applier runs the whole
    step under it (autocast for 16 bits) and wraps only the ops that differ. lowbit-plan
    costs the code between modules at the same precision (simulator's
    dominant_precision), so the two must agree."""
    if not precisions:
        return "fp32"
    counts: Dict[str, int] = {}
    for p in precisions.values():
        counts[p] = counts.get(p, 0) + 1
    return max(counts, key=lambda p: (counts[p], RANK.index(p)))


def host_trace(host_ms: List[float], phases: Optional[List[Tuple[float, float]]] = None) -> dict:
    """A trace holding only ProfilerStep ranges of the given host times (ms): the host
    side of iterations timed without any profiler (validate.py times the step up to its
    final synchronize), which lowbit-plan takes as the un-instrumented trace. With
    `phases` (one (forward, backward) ms pair per step), each step also holds its
    ``qsync.forward`` and ``qsync.backward`` ranges, one after the other from its start:
    lowbit-plan then takes each phase's profiler excess off that phase's op ranges."""
    def span(name, ts, ms):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts,
                "dur": 1000.0 * ms, "pid": 0, "tid": 0}

    events = []
    for k, ms in enumerate(host_ms):
        ts = 1e6 * k
        events.append(span("ProfilerStep#%d" % k, ts, ms))
        if phases:
            fwd, bwd = phases[k]
            events += [span("qsync.forward", ts, fwd),
                       span("qsync.backward", ts + 1000.0 * fwd, bwd)]
    return {"traceEvents": events,
            "lowbit": {"source": "host time per step, timed without a profiler"}}


def median_phases(phases) -> Optional[List[Tuple[float, float]]]:
    """[(median forward, median backward)] of (forward, backward) ms pairs, or None for
    none: the phases of host_trace's one step of median host time."""
    phases = [tuple(x) for x in phases or []]
    if not phases:
        return None
    return [(median([f for f, _ in phases]), median([b for _, b in phases]))]


def write_csv(path: str, fields, rows) -> str:
    """Writes ``rows`` (dicts) under the header ``fields``, LF line ends (csv's default is
    CRLF); returns the path."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def write_json(path: str, obj, gz: Optional[bool] = None) -> str:
    """Writes ``obj`` as JSON, gzipped when ``path`` ends in .gz (or ``gz``)."""
    gz = path.endswith(".gz") if gz is None else gz
    if gz:
        with gzip.open(path, "wt", compresslevel=5) as f:
            json.dump(obj, f)
    else:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
    return path


def gzip_file(src: str, dst: str) -> str:
    """Gzips a file as it is (a trace straight from the profiler, not re-encoded)."""
    import shutil

    with open(src, "rb") as a, gzip.open(dst, "wb", compresslevel=5) as b:
        shutil.copyfileobj(a, b, 1 << 20)
    return dst


def read_json(path: str):
    """Reads a JSON file, gunzipping a .gz one."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def gunzip_to(path: str, directory: str) -> str:
    """A plain copy of a gzipped JSON trace in ``directory`` (lowbit-plan reads plain
    JSON); returns its path."""
    base = os.path.basename(path)
    out = os.path.join(directory, base[:-3] if base.endswith(".gz") else base)
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        dst.write(src.read())
    return out


@contextlib.contextmanager
def collector_off():
    """Python's garbage collector off for the block (as timeit does), collected first so
    that the block starts without garbage, its state restored after: a collection inside
    a timed or profiled step is host time of whichever op it lands in. What gc.freeze
    moved to the permanent generation (validate.settle_heap) stays there."""
    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def median(xs: Iterable[float]) -> float:
    """Median of the per-iteration times."""
    return float(statistics.median(list(xs)))


def error_pct(predicted: float, measured: float) -> float:
    """Signed prediction error in percent of the measurement."""
    return 100.0 * (predicted - measured) / measured if measured else float("nan")


TIME_TARGET_PCT, HOST_BOUND_TARGET_PCT, MEMORY_TARGET_PCT = 5.0, 15.0, 10.0


def validation_rows(predicted: Dict[str, dict], measured: List[dict]) -> List[dict]:
    """Joins predictions (case -> {"iteration_ms", "memory_gib"}) with measured rows
    (measured.csv: case, batch, iter_ms_median, peak_gib, ...) into the validation
    table's rows: case, predicted and measured time (the median; the min, max and host
    time per step too where measured.csv has them) and memory, errors in percent, and
    whether each is within its target (time 5%, 15% at batch 1, the host-bound case;
    memory 10%)."""
    rows = []
    for m in measured:
        case = m["case"]
        if case not in predicted:
            continue
        p = predicted[case]
        t, mem = float(m["iter_ms_median"]), float(m["peak_gib"])
        te, me = error_pct(p["iteration_ms"], t), error_pct(p["memory_gib"], mem)
        target = HOST_BOUND_TARGET_PCT if int(m.get("batch", 0) or 0) == 1 else TIME_TARGET_PCT
        extra = {k: float(m[f]) for k, f in (("meas_min_ms", "iter_ms_min"),
                                              ("meas_max_ms", "iter_ms_max"),
                                              ("meas_host_ms", "host_ms_median"))
                 if m.get(f) not in (None, "")}
        rows.append({"case": case, "pred_ms": p["iteration_ms"], "meas_ms": t, **extra,
                     "time_err_pct": te, "time_target_pct": target,
                     "time_ok": abs(te) <= target, "pred_gib": p["memory_gib"], "meas_gib": mem,
                     "mem_err_pct": me, "mem_ok": abs(me) <= MEMORY_TARGET_PCT})
    return rows


def markdown_table(rows: List[dict]) -> str:
    """The validation table as markdown (the form docs/qsync.md takes)."""
    out = ["| case | predicted ms | measured ms | error % | within | predicted GiB "
           "| measured GiB | error % | within |", "|---|---|---|---|---|---|---|---|---|"]
    yes = lambda ok, pct: ("yes" if ok else "no") + " (%g%%)" % pct  # noqa: E731
    for r in rows:
        out.append("| %s | %.2f | %.2f | %+.1f | %s | %.2f | %.2f | %+.1f | %s |" % (
            r["case"], r["pred_ms"], r["meas_ms"], r["time_err_pct"],
            yes(r["time_ok"], r["time_target_pct"]), r["pred_gib"], r["meas_gib"],
            r["mem_err_pct"], yes(r["mem_ok"], MEMORY_TARGET_PCT)))
    return "\n".join(out)
