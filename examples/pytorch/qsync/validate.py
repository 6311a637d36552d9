"""QSync end to end on one GPU: profile, export, plan, apply, measure, compare.

Run mode (needs torch with CUDA), from the repository root:

    lowbit-qsync-validate --out OUT --lowbit-plan build/tools/lowbit-plan

(``python3 -m qsync.validate`` with examples/pytorch on the path runs the same).

For every model case (a ResNet-like CNN at batch 256, a 6-layer BERT-like encoder at
seq 512 at batch 32 and 64, the CNN at batch 1 as the host-bound case) it

1. records the ops (leaf-module calls, producers, saved bytes at fp32/fp16/bf16,
   indicator statistics) and writes ``OUT/<case>.model.json``;
2. profiles each precision twice with the stock torch.profiler, with per-op ranges
   (``traces/<case>_<p>.json.gz``) and without (``traces/<case>_<p>_plain.json.gz``),
   and times ``--host-iters`` steps' host side without any profiler
   (``traces/<case>_<p>_host.json.gz``, the host truth the allocator's plans are made
   with), and measures each op's scratch per precision (export.record_workspace: the
   bytes it allocates and frees within its forward or backward call);
3. writes the plans (uniform fp32/fp16/bf16, two mixed plans by rule, and with
   ``--lowbit-plan`` the allocator's plans at two targets) to ``plans/``;
4. runs every plan un-instrumented in ``--rounds`` rounds: each round times
   ``--host-iters / rounds`` steps of every precision's uniform step (host samples
   beside the measurement) and then ``--iters / rounds`` steps of every plan (after
   ``--warmup`` steps in the first round, 1 later), the collector frozen and off
   while timing; the median over all rounds and torch.cuda.max_memory_allocated
   (first round) go to ``OUT/measured.csv``, every sample to ``OUT/host_times.json``;
5. with ``--lowbit-plan``, runs the predict mode below.

Your own model: ``--model MODULE:FUNCTION`` (repeatable; MODULE importable, e.g. on
PYTHONPATH, or a path ``FILE.py``) names ``FUNCTION(batch, device) -> (model,
forward_loss)``, as ``qsync.zoo.make`` builds its models: ``forward_loss()`` runs the
forward on a fixed batch and returns the loss. Each size of ``--batch`` (default 32) is a
case ``<FUNCTION>-b<batch>``, run through the same steps instead of the built-in cases.

The host side of a step is not steady on the machine this was written for (a VM
whose per-thread speed drifts by 20% or more from minute to minute, whatever the
process does: host_drift.py measures it): host samples taken minutes before the
measurement predict a host-bound step no better than that, so the host truth is sampled
in the same rounds as the plans.

Predict mode (no torch needed): ``lowbit-qsync-validate --predict --out OUT --lowbit-plan BIN``
runs ``lowbit-plan --plan`` on every measured case, given the host samples that
``--host-truth`` names (``rounds``: those beside the measurement, the default;
``profiling``; ``all``), and writes the validation table (case, predicted, measured,
error %) to ``OUT/validation.md`` and ``OUT/validation.csv``. With ``--switch-probe FILE``
(switch_probe.py's JSON, in either mode) the cluster's device takes its cast fit and the
host times of a precision switch: the file is copied to ``OUT/switch_probe.json``, which
every later prediction from OUT uses too.

Exit status: 0 done, 1 an error (printed), 2 bad arguments or no CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

from . import qsync_model as qm

PRECISIONS = ("fp32", "fp16", "bf16")
MEASURED_FIELDS = ["case", "model", "plan", "batch", "iters", "iter_ms_median", "iter_ms_mean",
                   "iter_ms_min", "iter_ms_max", "peak_gib", "host_ms_median", "plan_summary",
                   "zoo_model", "regime"]
# The zoo's CSV (--zoo): one row per case and plan, and one per case that failed.
ZOO_FIELDS = ["model", "batch", "bound", "plan", "predicted_ms", "measured_ms", "time_error",
              "predicted_mem", "measured_mem", "mem_error", "within_target", "date", "commit",
              "hardware"]
# A step is host-bound when the host's part of it (up to the final synchronize) is at
# least this share of the step: the GPU then waits for the host most of the step.
HOST_BOUND_SHARE = 0.9
# The allocator's plans: the most ops at high precision (lowest indicator) within 5% and
# 15% of the fastest uniform plan's predicted time (lowbit-plan --target-slack).
ALLOC_SLACKS = (("alloc-5pct", 5.0), ("alloc-15pct", 15.0))
# With --fp8 (an fp8 profile), the plan a Hopper user asks for: the fewest, least
# sensitive fp8 ops keeping 80% of the fastest plan's speed-up over uniform bf16
# (lowbit-plan --target-speedup).
ALLOC_FP8_SPEEDUPS = (("alloc-fp8-80pct", 80.0),)
# Per-case effort in the zoo (--zoo), small so that 30 cases fit in two calls of ~550 s:
# per plan `iters` timed steps over `rounds` rounds, `host_iters` host samples per
# precision, `profile_steps` profiled steps (three: the trace loader takes each op's
# median over them, so that a stall of the host in one step is no op's); the batch-1
# cases, whose steps are short and whose medians follow the host's drift, take more.
# The host's speed wanders by tens of percent over seconds on the GPU machine (the same
# plan's round medians 37-53 ms at BART's batch 1), so the steps are spread over more,
# shorter rounds, each after one untimed step (the first after a new optimizer).
ZOO_EFFORT = {"gpu": dict(iters=12, host_iters=6, rounds=4, warmup=2, profile_steps=3),
              "host": dict(iters=30, host_iters=15, rounds=6, warmup=3, profile_steps=3)}
T0 = time.time()
# switch_probe.py's constants, copied into OUT by --switch-probe: every prediction from
# OUT (and --predict on it later) prices precision switches with them.
SWITCH_PROBE = "switch_probe.json"


def log(msg: str) -> None:
    print("[%6.1fs] %s" % (time.time() - T0, msg), flush=True)


# ----------------------------------------------------------------------------- models

def build_cnn(torch, nn, classes=1000, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2)):
    """A ResNet-18-like CNN (basic blocks, batch norm, a ReLU module shared within each
    block as torchvision does), inplace=False as it was first validated (export.instrument
    no longer needs it: it handles outputs modified in place)."""

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=False)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return self.relu(y + (x if self.down is None else self.down(x)))

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=False)
            self.pool = nn.MaxPool2d(3, 2, 1)
            layers, cin = [], widths[0]
            for i, (w, n) in enumerate(zip(widths, blocks)):
                for j in range(n):
                    layers.append(Block(cin, w, 2 if (j == 0 and i > 0) else 1))
                    cin = w
            self.layers = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            x = self.pool(self.relu(self.bn1(self.conv1(x))))
            x = self.avgpool(self.layers(x))
            return self.fc(torch.flatten(x, 1))

    return CNN()


def build_bert(torch, nn, F, layers=6, hidden=768, heads=12, ffn=3072, vocab=30522, seq=512,
               classes=2):
    """A BERT-base-like encoder (post-LN, GELU FFN, dropout 0.1) with a classification
    head on the first token; attention through F.scaled_dot_product_attention."""

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.o = nn.Linear(hidden, hidden)
            self.drop1 = nn.Dropout(0.1)
            self.ln1 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, ffn)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(ffn, hidden)
            self.drop2 = nn.Dropout(0.1)
            self.ln2 = nn.LayerNorm(hidden)

        def forward(self, x):
            b, s, _ = x.shape
            split = lambda t: t.view(b, s, heads, hidden // heads).transpose(1, 2)  # noqa: E731
            a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)),
                                               split(self.v(x)), dropout_p=0.1)
            a = a.transpose(1, 2).reshape(b, s, hidden)
            x = self.ln1(x + self.drop1(self.o(a)))
            return self.ln2(x + self.drop2(self.fc2(self.act(self.fc1(x)))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(seq, hidden)
            self.ln = nn.LayerNorm(hidden)
            self.drop = nn.Dropout(0.1)
            self.layers = nn.Sequential(*[Layer() for _ in range(layers)])
            self.head = nn.Linear(hidden, classes)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.drop(self.ln(self.tok(ids) + self.pos(pos)))
            return self.head(self.layers(x)[:, 0])

    return Bert()


CASES = {
    "cnn-b256": dict(model="cnn", batch=256),
    # Host-bound steps (BERT at batch 32 in 16 bits here, the CNN at batch 1) follow the
    # host's speed, which drifts by 20% within seconds on the machine this was written
    # for: a median within a few percent takes hundreds of samples, cheap at 10-25 ms.
    "bert-b32": dict(model="bert", batch=32, seq=512, iters=200, host_iters=200),
    "bert-b64": dict(model="bert", batch=64, seq=512),
    "cnn-b1": dict(model="cnn", batch=1, precisions=("fp32", "bf16"),
                   plans=("fp32", "bf16"), iters=300, host_iters=300),
}


def zoo_cases(part=(1, 1)):
    """The zoo's cases (qsync/zoo.py): every model at its two batch sizes, named
    ``<model>-b<batch>``; with ``part`` (k, n) only the models whose index is k-1 modulo n
    (a model's two cases go to one part, and the parts alternate over the list)."""
    from . import zoo

    k, n = part
    out = {}
    for i, (zname, c) in enumerate(zoo.CASES.items()):
        if i % n != k - 1:
            continue
        for regime in ("gpu", "host"):
            b = c.batches[regime]
            out["%s-b%d" % (zname, b)] = dict(model="zoo", zoo=zname, batch=b, regime=regime,
                                              **ZOO_EFFORT[regime])
    return out


def model_cases(targets, batches):
    """The cases of ``--model MODULE:FUNCTION`` or ``FILE.py:FUNCTION`` (each imported
    here) at each batch size, named ``<FUNCTION>-b<batch>``: ``FUNCTION(batch, device)``
    builds the model and its forward-and-loss closure (under --smoke at a batch of at most
    2). ValueError for a target that is not MODULE:FUNCTION, or a function that does not
    import or is not callable, naming it."""
    import importlib.util

    out = {}
    for target in targets:
        module, sep, function = target.rpartition(":")
        if not (sep and module and function):
            raise ValueError("--model %r: expected MODULE:FUNCTION or FILE.py:FUNCTION" % target)
        try:
            if module.endswith(".py"):  # a script of one's own, by its path
                if not os.path.isfile(module):
                    raise ImportError("no file %s" % module)
                spec = importlib.util.spec_from_file_location(
                    os.path.splitext(os.path.basename(module))[0], module)
                loaded = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(loaded)
            else:
                loaded = importlib.import_module(module)
            make = getattr(loaded, function)
        except (ImportError, AttributeError, SyntaxError, OSError) as e:
            raise ValueError("--model %s: %s: %s" % (target, type(e).__name__, e)) from e
        if not callable(make):
            raise ValueError("--model %s: not callable" % target)
        for b in batches:
            out["%s-b%d" % (function, b)] = dict(
                model=function, batch=b, regime="host" if b == 1 else "gpu",
                make=lambda device, smoke, make=make, b=b: make(min(b, 2) if smoke else b,
                                                               device))
    return out


def make_case(torch, name, spec, device, smoke=False):
    """The model, on `device`, and its forward-and-loss closure over a fixed batch.
    `smoke` shrinks everything (a CPU check of the pipeline, not a measurement)."""
    import torch.nn as nn
    import torch.nn.functional as F

    if spec.get("make"):  # a caller's own model (fp8_quality.py): make(device, smoke)
        return spec["make"](device, smoke)
    if spec.get("zoo"):
        from . import zoo

        b = min(spec["batch"], 2) if smoke else spec["batch"]
        return zoo.make(spec["zoo"], b, tiny=smoke, device=device)
    torch.manual_seed(0)
    b = min(spec["batch"], 2) if smoke else spec["batch"]
    if spec["model"] == "cnn":
        side, classes = (64, 10) if smoke else (224, 1000)
        kw = dict(widths=(8, 16, 16, 32), blocks=(1, 1, 1, 1)) if smoke else {}
        model = build_cnn(torch, nn, classes=classes, **kw).to(device)
        x = torch.randn(b, 3, side, side, device=device)
        y = torch.randint(0, classes, (b,), device=device)
    else:
        seq = 16 if smoke else spec["seq"]
        kw = dict(layers=2, hidden=32, heads=4, ffn=64, vocab=100) if smoke else {}
        model = build_bert(torch, nn, F, seq=seq, **kw).to(device)
        x = torch.randint(0, kw.get("vocab", 30522), (b, seq), device=device)
        y = torch.randint(0, 2, (b,), device=device)
    model.train()

    def forward_loss():
        return F.cross_entropy(model(x), y)

    return model, forward_loss


# ---------------------------------------------------------------------- run-mode steps

@contextlib.contextmanager
def uniform_step_context(model, precision, model_json, device):
    """The forward's context (a zero-argument callable) of a uniform-`precision` step:
    autocast's, or for fp8 the applied uniform-fp8 plan (its linear layers through fp8
    GEMMs, the rest at bf16), which needs the model JSON of the fp32 profile."""
    from . import export as ex
    if precision != "fp8":
        yield lambda: ex.precision_context(precision, device)
        return
    from .apply_plan import applied_plan
    if model_json is None:
        raise ValueError("the fp8 profile runs after the fp32 one (its model JSON)")
    with applied_plan(model, qm.uniform_plan("fp8"), model_json, device_type=device) as ap:
        yield ap.step_context


def training_step(torch, model, opt, forward_loss, context):
    """One training step as profiled and as measured: the same code in both. Given a
    list, `step(host)` appends the host time up to the final synchronize (ms): the host
    never waits for the GPU before it, so that is the step's host work. It also appends
    that step's host phases to ``step.phases``: (forward, backward) ms, from the step's
    start to the loss and from there to the end of ``loss.backward()`` (the optimizer
    step is the rest): where the host spends its time decides when the GPU can run."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def step(host=None):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with context():
            loss = forward_loss()
        tf = time.perf_counter()
        loss.backward()
        tb = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        sync()
        if host is not None:
            host.append(1000.0 * (t1 - t0))
            step.phases.append((1000.0 * (tf - t0), 1000.0 * (tb - tf)))

    step.phases = []
    return step


def new_optimizer(torch, model):
    """Adam, fused on CUDA (few launches, no large temporaries)."""
    return torch.optim.Adam(model.parameters(), lr=1e-5, fused=torch.cuda.is_available())


def free_memory(torch):
    """Returns what the last run held to the allocator, so the next peak is its own."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def settle_heap():
    """Collects, then moves every object alive now (the imported libraries: torch,
    transformers and timm hold a few hundred thousand) into the collector's permanent
    generation, where no later collection walks them. Run before a case builds its model,
    so that the collections a case makes (before each timing and after each plan, to free
    its memory) walk only what the case made: under 1 ms against 120-140 ms a collection
    with transformers imported (the development machine's CPU). Nothing is lost: what is
    alive before a case outlives it."""
    gc.collect()
    gc.freeze()


def timed_steps(args, step, n):
    """`n` timed steps (pinned where --pin asks, the collector off): their times and
    host times, ms."""
    if args.pin != "none":
        from .host_drift import gpu_local_cpus, set_affinity

        set_affinity(args.pin, args.all_cpus, gpu_local_cpus())
    times, host = [], []
    with qm.collector_off():
        for _ in range(n):
            t = time.perf_counter()
            step(host)
            times.append(1000.0 * (time.perf_counter() - t))
    return times, host


def wrap_cost(torch, args, model, opt, forward_loss, precision, model_json, device, pairs):
    """What the plan applier's wrappers cost this model's host in the forward, per wrapped
    op, at `precision`: every op wrapped (apply_plan's ``wrap_all``, a uniform plan: the
    hooks, the function mode; every op at the ambient: no autocast, no cast) against the
    plain uniform step, alternating, each side's second step after a switch timed; the median
    of the pairs' forward phases' difference over the ops wrapped (ms, at least 0). The
    switch probe's ``wrap_host_ms`` is measured on a chain of linears, where a model's
    modules have other arguments to walk and function ops whose callers the mode
    watches (``--wrap-pairs``; on one H100 0.03-0.10 ms against the probe's 0.07)."""
    from . import export as ex
    from .apply_plan import applied_plan

    plain = training_step(torch, model, opt, forward_loss,
                          lambda: ex.precision_context(precision, device))
    diffs, wrapped = [], 0
    for _ in range(pairs):
        with applied_plan(model, qm.uniform_plan(precision), model_json, device_type=device,
                          wrap_all=True) as ap:
            wrapped = len(ap.wrapped)
            step = training_step(torch, model, opt, forward_loss, ap.step_context)
            timed_steps(args, step, 2)
        timed_steps(args, plain, 2)
        diffs.append(step.phases[-1][0] - plain.phases[-1][0])
    per_op = max(0.0, qm.median(diffs) / wrapped) if wrapped else 0.0
    return {"precision": precision, "wrapped": wrapped, "forward_ms_diffs": diffs,
            "ms_per_op": per_op}


def profile_with_ranges(model, step, records, path, steps):
    """Profiles `step` with a range per op (export.instrument; the function ops' mode
    only where the model has any) to the plain JSON trace `path`."""
    from . import export as ex

    with ex.instrument(model, functions=ex.function_ops(records)):
        ex.profile(step, path, steps=steps)


def trace_plans(args, name, plans, model, forward_loss, records, model_json, tdir, steps):
    """--trace-plans: every plan but the uniform ones profiled as it was measured, with a
    range per op (export.instrument inside applied_plan), to
    traces/<case>_plan_<plan>.json.gz: what plan_gap.py compares with the prediction."""
    import torch

    from .apply_plan import applied_plan

    for pn, pl in plans.items():
        if pn in PRECISIONS or pn == "fp8":
            continue
        with applied_plan(model, pl, model_json, device_type=args.device) as ap:
            opt = new_optimizer(torch, model)
            step = training_step(torch, model, opt, forward_loss, ap.step_context)
            for _ in range(2):
                step()
            with tempfile.TemporaryDirectory() as tmp:
                raw = os.path.join(tmp, "t.json")
                profile_with_ranges(model, step, records, raw, steps)
                qm.gzip_file(raw, os.path.join(tdir, "%s_plan_%s.json.gz" % (name, pn)))
        del opt, step
        gc.collect()
    log("%s: plans traced" % name)


def run_case(torch, args, name, spec, out, measured_rows, host_times, stage=None):
    """Steps 1-4 of the module docstring for one case; appends to measured_rows and
    rewrites measured.csv after every case, so a failure keeps what was measured, and
    the host samples (per round) to OUT/host_times.json. ``stage["now"]`` says which step
    runs (export, profile, plan, measure), for the report of a case that fails."""
    stage = {} if stage is None else stage
    stage["now"] = "export"
    settle_heap()
    from . import export as ex
    from .apply_plan import applied_plan

    device = args.device
    precisions = tuple(spec.get("precisions", PRECISIONS))
    if getattr(args, "fp8", False) and "fp8" not in precisions:
        precisions += ("fp8",)  # last: its profile runs the applied uniform-fp8 plan
    if precisions[0] != "fp32":
        raise ValueError("case %s: the fp32 profile (first) gives the model JSON" % name)
    model, forward_loss = make_case(torch, name, spec, device, smoke=args.smoke)
    log("%s: %.1fM parameters, batch %d" % (
        name, sum(p.numel() for p in model.parameters()) / 1e6, spec["batch"]))

    # 1. ops and saved bytes per precision
    records = ex.record_ops(model, forward_loss, "fp32", with_stats=True, device_type=device)
    for p in precisions:
        if p not in ("fp32", "fp8"):  # fp8's saved bytes: the model's, by storage width
            ex.merge_saved_bytes(records, ex.record_ops(model, forward_loss, p, device_type=device))
    log("%s: recorded %d ops (%d torch functions taking a parameter); code between the "
        "ops, priced as the tail: %s" % (
            name, len(records), sum(r.get("call") == "function" for r in records.values()),
            ", ".join("%s x%d" % (u["name"], u["count"]) for u in records.unattributed[:6])))

    # 2. profiles: instrumented and plain, per precision
    stage["now"] = "profile"
    rounds = max(1, spec.get("rounds", args.rounds))
    iters = spec.get("iters", args.iters)
    host_iters = spec.get("host_iters", args.host_iters)
    profile_steps = spec.get("profile_steps", args.profile_steps)
    warmup = spec.get("warmup", args.warmup)
    host_log = {}
    wraps = {}  # precision -> the wrappers' host cost a wrapped op (wrap_cost)
    traces = {}
    tdir = os.path.join(out, "traces")
    opt = new_optimizer(torch, model)
    model_json = None
    for p in precisions:
        with uniform_step_context(model, p, model_json, device) as context:
            step = training_step(torch, model, opt, forward_loss, context)
            for _ in range(2):
                step()  # optimizer state and allocator warm before profiling
            scratch, code = ({}, {}) if p == "fp8" else ex.record_workspace(
                model, forward_loss, p, device)
            ex.merge_workspace(records, p, scratch, code)
            if scratch:
                top = max(scratch, key=scratch.get)
                log("%s: %s scratch: largest %.1f MiB (%s), %d ops with any" % (
                    name, p, scratch[top] / 2**20, top, sum(b > 0 for b in scratch.values())))
            with tempfile.TemporaryDirectory() as tmp:
                raw = os.path.join(tmp, "t.json")
                profile_with_ranges(model, step, records, raw, profile_steps)
                if p == "fp32":
                    inst = qm.read_json(raw)
                    model_json = qm.model_json(records, name, trace=inst)
                    missing = qm.missing_ranges(inst, model_json)
                    if missing:
                        log("%s: warning: %d ops without a range (roofline): %s" % (
                            name, len(missing), ", ".join(missing[:5])))
                    del inst
                traces[p] = qm.gzip_file(raw, os.path.join(tdir, "%s_%s.json.gz" % (name, p)))
                if not spec.get("zoo"):  # the zoo times the host without a profiler only
                    ex.profile(step, raw, steps=profile_steps)
                    qm.gzip_file(raw, os.path.join(tdir, "%s_%s_plain.json.gz" % (name, p)))
            # The profiler itself inflates host time (every op and launch is recorded), so
            # the host truth comes from steps timed without it (step 4 adds more samples,
            # interleaved with the measurement).
            for _ in range(2):  # settle
                step()
            host = timed_steps(args, step, host_iters)[1]
            host_log[p] = {"profiling": host, "rounds": [],
                           "phases": {"profiling": step.phases[-len(host):], "rounds": []}}
            qm.write_json(os.path.join(tdir, "%s_%s_host.json.gz" % (name, p)),
                          qm.host_trace([qm.median(host)], qm.median_phases(
                              host_log[p]["phases"]["profiling"]) if args.host_phases else None))
            log("%s: profiled %s (host %.2f ms)" % (name, p, qm.median(host)))
            if p != "fp8" and spec.get("wrap_pairs", args.wrap_pairs) > 0:
                w = wrap_cost(torch, args, model, opt, forward_loss, p, model_json, device,
                              spec.get("wrap_pairs", args.wrap_pairs))
                host_log[p]["wrap"] = w
                wraps[p] = w["ms_per_op"]
                qm.write_json(os.path.join(tdir, "%s_wrap.json" % name),
                              {"wrap_host_ms": qm.median(list(wraps.values())),
                               "by_precision": wraps})
                log("%s: the wrappers at %s: %.4f ms a wrapped op (%d ops wrapped)" % (
                    name, p, w["ms_per_op"], w["wrapped"]))
    del opt, step  # the step holds the optimizer: its state must not stay allocated
    free_memory(torch)
    for o in model_json["ops"]:  # measured per precision in the loop, after the JSON
        for key in ("workspace_bytes", "code_workspace_bytes"):
            ws = qm.measured_part(records[o["name"]], key)
            if ws:
                o[key] = ws
    if "fp8" in precisions:  # the allocator may put at fp8 only what applied_plan runs
        model_json = fp8_menu_model(model, model_json)
    mpath = os.path.join(out, "%s.model.json" % name)
    qm.write_json(mpath, model_json)

    # 3. plans
    stage["now"] = "plan"
    pdir = os.path.join(out, "plans")
    plans = {}
    for p in tuple(spec.get("plans", PRECISIONS)) + (("fp8",) if "fp8" in precisions else ()):
        plans[p] = qm.uniform_plan(p)
    if "plans" not in spec:
        plans.update(qm.mixed_plans(model_json))

    if args.lowbit_plan and "plans" not in spec:
        plans.update(allocator_plans(args, name, out, pdir))
    for pn, pl in plans.items():
        qm.write_json(os.path.join(pdir, "%s_%s.json" % (name, pn)), pl)
    if spec.get("profile_only"):  # the caller measures (fp8_quality.py): steps 1-3 only
        del model
        free_memory(torch)
        return model_json

    # 4. measure every plan un-instrumented, in `rounds` rounds: each round times every
    # precision's uniform step (the host truth lowbit-plan is given, as at profiling)
    # and then every plan, so the host samples and the measurement are interleaved and
    # the host's drift over minutes is in both (their medians over all rounds).
    stage["now"] = "measure"
    cuda = torch.cuda.is_available()
    res = {pn: {"times": [], "host": [], "phases": []} for pn in plans}
    for r in range(rounds):
        for p in precisions:
            opt = new_optimizer(torch, model)
            with uniform_step_context(model, p, model_json, device) as context:
                step = training_step(torch, model, opt, forward_loss, context)
                for _ in range(2 if r == 0 else 1):  # a new optimizer's state, allocated
                    step()
                host_log[p]["rounds"].append(
                    timed_steps(args, step, -(-host_iters // rounds))[1])
                host_log[p]["phases"]["rounds"].append(step.phases)
            del opt, step
            gc.collect()
        for pn, pl in plans.items():
            with applied_plan(model, pl, model_json, device_type=device) as ap:
                opt = new_optimizer(torch, model)
                step = training_step(torch, model, opt, forward_loss, ap.step_context)
                for _ in range(warmup if r == 0 else 1):
                    step()
                if r == 0 and cuda:
                    torch.cuda.reset_peak_memory_stats()
                times, host = timed_steps(args, step, -(-iters // rounds))
                if r == 0:
                    res[pn]["peak"] = torch.cuda.max_memory_allocated() / 2.0 ** 30 if cuda else 0.0
                    res[pn]["summary"] = ap.summary()
                res[pn]["times"].append(times)
                res[pn]["host"].append(host)
                res[pn]["phases"].append(step.phases[-len(host):])
            del opt, step
            gc.collect()
        log("%s: round %d of %d measured" % (name, r + 1, rounds))
    if getattr(args, "trace_plans", False):
        trace_plans(args, name, plans, model, forward_loss, records, model_json, tdir,
                    profile_steps)
    host_times[name] = {"precisions": host_log,
                        "plans": {pn: {"times": v["times"], "host": v["host"],
                                       "phases": v["phases"]} for pn, v in res.items()}}
    qm.write_json(os.path.join(out, "host_times.json"), host_times)
    for pn, v in res.items():
        times = [t for rr in v["times"] for t in rr]
        host = [h for rr in v["host"] for h in rr]
        row = {"case": "%s/%s" % (name, pn), "model": name, "plan": pn, "batch": spec["batch"],
               "iters": len(times), "iter_ms_median": "%.4f" % qm.median(times),
               "iter_ms_mean": "%.4f" % (sum(times) / len(times)),
               "iter_ms_min": "%.4f" % min(times), "iter_ms_max": "%.4f" % max(times),
               "peak_gib": "%.4f" % v["peak"], "host_ms_median": "%.4f" % qm.median(host),
               "plan_summary": v["summary"], "zoo_model": spec.get("zoo", ""),
               "regime": spec.get("regime", "")}
        measured_rows.append(row)
        log("%s/%s: median %.2f ms (rounds %s), host %.2f ms, peak %.2f GiB (%s)" % (
            name, pn, qm.median(times),
            " ".join("%.2f" % qm.median(rr) for rr in v["times"]), qm.median(host),
            v["peak"], v["summary"]))
    write_measured(out, measured_rows)
    del model
    free_memory(torch)


def fp8_menu_model(model, model_json: dict, others=("fp16", "bf16", "fp32")) -> dict:
    """A copy of `model_json` whose ops with parameters that cannot run at fp8 (not a
    linear layer, a function call, dimensions not multiples of 16: fp8.check_op) are
    allowed `others` only (the device's menu without fp8), so that an allocator's plan
    never puts at fp8 an op that applied_plan refuses."""
    from . import fp8

    modules = dict(model.named_modules())
    out = copy.deepcopy(model_json)
    for o in out["ops"]:
        if o.get("param_numel", 0) <= 0 and not o.get("weights_from"):
            continue
        mod = modules.get(qm.module_of(o["name"]))
        ok = o.get("call") != "function" and mod is not None
        if ok:
            try:
                fp8.check_op(o["name"], mod)
            except fp8.Fp8Unsupported:
                ok = False
        if not ok:
            o["allowed"] = list(others)
    return out


def write_measured(out, rows):
    """OUT/measured.csv, one row per case (model/plan)."""
    qm.write_csv(os.path.join(out, "measured.csv"), MEASURED_FIELDS, rows)


# ------------------------------------------------------------------- lowbit-plan calls

def plan_args(out, name, tmp, precisions=None, gz=False, host="host"):
    """lowbit-plan's model, cluster and trace arguments for case `name`: the gzipped
    traces as they are when the binary reads .gz (`gz`), else plain copies in `tmp`;
    the host truth from traces/<case>_<p>_<host>.json.gz (host_truth_traces), else the
    plain profile."""
    tdir = os.path.join(out, "traces")
    use = (lambda t: t) if gz else (lambda t: qm.gunzip_to(t, tmp))
    inst, plain = [], []
    found = []
    for p in precisions or PRECISIONS + ("fp8",):
        t = os.path.join(tdir, "%s_%s.json.gz" % (name, p))
        if not os.path.exists(t):
            continue
        found.append(p)
        inst.append("%s=%s" % (p, use(t)))
        for kind in (host, "plain"):  # host timing without a profiler, if there
            plain_gz = os.path.join(tdir, "%s_%s_%s.json.gz" % (name, p, kind))
            if os.path.exists(plain_gz):
                plain.append("%s=%s" % (p, use(plain_gz)))
                break
    if not inst:
        raise RuntimeError("no traces for %s under %s" % (name, tdir))
    # the menu: what was profiled and can be applied (autocast's, and fp8 where profiled)
    menu = tuple(p for p in ("fp8", "fp16", "bf16", "fp32") if p in found or p != "fp8")
    env = os.path.join(out, "env.json")  # the GPU the profiles were taken on
    gpu = qm.read_json(env).get("gpu", "") if os.path.exists(env) else ""
    cluster = qm.cluster_json(qm.device_base(gpu), menu)
    probe = os.path.join(out, SWITCH_PROBE)  # what a precision switch costs, measured
    if os.path.exists(probe):
        cluster["groups"][0]["device"].update(qm.read_json(probe)["device"])
    path = qm.write_json(os.path.join(out, "cluster.json"), cluster)
    # The wrappers' cost on this model's modules, measured at profiling (wrap_cost), in
    # place of the probe's chain of linears.
    wrap = os.path.join(tdir, "%s_wrap.json" % name)
    if os.path.exists(wrap):
        cluster["groups"][0]["device"]["wrap_host_ms"] = qm.read_json(wrap)["wrap_host_ms"]
        path = qm.write_json(os.path.join(out, "cluster_%s.json" % name), cluster)
    cluster = path
    a = ["--model", os.path.join(out, "%s.model.json" % name), "--cluster", cluster,
         "--traces", ",".join(inst)]
    if plain:
        a += ["--plain-traces", ",".join(plain)]
    return a


_READS_GZ: dict = {}  # binary -> whether it read a case's gzipped traces


def reads_gz(binary, out, name):
    """True when `binary` reads gzipped traces (built with zlib); asked once a binary (a
    lowbit-plan run a case, in a zoo of thirty)."""
    if binary not in _READS_GZ:
        with tempfile.TemporaryDirectory() as tmp:
            plan = qm.write_json(os.path.join(tmp, "p.json"), qm.uniform_plan("fp32"))
            argv = plan_args(out, name, tmp, gz=True) + ["--plan", plan]
            _READS_GZ[binary] = subprocess.run([binary] + argv,
                                               capture_output=True).returncode == 0
    return _READS_GZ[binary]


def lowbit_plan(binary, argv):
    """Runs lowbit-plan; its failure (with its message) is this script's error."""
    r = subprocess.run([binary] + argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("lowbit-plan %s failed (%d): %s" % (" ".join(argv), r.returncode,
                                                               r.stderr.strip()))
    return r.stdout


def allocator_plans(args, name, out, pdir):
    """lowbit-plan's own plans, the ones a user on one GPU would pick: the most ops at
    high precision (lowest indicator) within 5% and 15% of the fastest uniform plan's
    predicted time (``--target-slack``, ALLOC_SLACKS)."""
    os.makedirs(pdir, exist_ok=True)
    plans = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = plan_args(out, name, tmp, gz=reads_gz(args.lowbit_plan, out, name))
        jobs = [(k, ["--target-slack", "%g" % slack]) for k, slack in ALLOC_SLACKS]
        if os.path.exists(os.path.join(out, "traces", "%s_fp8.json.gz" % name)):
            jobs += [(k, ["--target-speedup", "%g" % share]) for k, share in ALLOC_FP8_SPEEDUPS]

        def run(job):
            k, target = job
            path = os.path.join(pdir, "%s_%s.lowbit.json" % (name, k))
            lowbit_plan(args.lowbit_plan, base + target + ["--out", path, "--comm-bits", "32"])
            return k, qm.read_json(path), target

        # Side by side: each run reads the case's traces and searches on its own (one
        # core each; a second or two a run on the GPU machine).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            for k, plan, target in pool.map(run, jobs):
                plans[k] = plan
                log("%s: allocator plan %s (%s %s): %.2f ms predicted, target %.2f ms" % (
                    name, k, target[0], target[1], plan.get("predicted_iteration_ms", 0.0),
                    plan.get("target_ms", 0.0)))
    return plans


def with_profile_host(out, row, measured, host="host"):
    """`row` with ``profile_host_ms`` after ``meas_host_ms``: the host time per step of the
    plan's ambient precision that lowbit-plan was given (traces/<case>_<p>_<host>.json.gz).
    Beside the host time measured with the plan it shows how far the host side moved
    between the samples and the measurement."""
    summary = measured.get("plan_summary", "")
    ambient = summary.split(";")[0].split()[-1] if summary.startswith("ambient") else ""
    path = os.path.join(out, "traces", "%s_%s_%s.json.gz" % (measured["model"], ambient, host))
    if not ambient or not os.path.exists(path):
        return row
    steps = [e["dur"] / 1000.0 for e in qm.read_json(path)["traceEvents"]
             if e.get("name", "").startswith("ProfilerStep#")]
    out_row = {}
    for k, v in row.items():
        out_row[k] = v
        if k == "meas_host_ms":
            out_row["profile_host_ms"] = qm.median(steps)
    return out_row


def host_truth_traces(out, kind, phases=False):
    """Writes traces/<case>_<p>_host_<kind>.json.gz from OUT/host_times.json (the median
    of the host samples of `kind`: ``rounds``, those timed in the measurement's rounds,
    beside the plans; ``profiling``, those timed at profiling; ``all``), with the median
    forward and backward phases of the same samples where `phases` (``--host-phases``),
    and returns the trace kind plan_args reads: ``host_<kind>``, or ``host`` (timed at
    profiling) for an OUT without host_times.json."""
    path = os.path.join(out, "host_times.json")
    if not os.path.exists(path):
        return "host"
    for name, case in qm.read_json(path).items():
        for p, d in case["precisions"].items():
            # The host phases of the same samples (runs before they were timed have none).
            ph = d.get("phases", {})
            by_kind = {"rounds": ([h for r in d["rounds"] for h in r],
                                  [x for r in ph.get("rounds", []) for x in r]),
                       "profiling": (d["profiling"], ph.get("profiling", []))}
            by_kind["all"] = tuple(a + b for a, b in zip(by_kind["profiling"], by_kind["rounds"]))
            samples, split = by_kind[kind] if by_kind[kind][0] else by_kind["profiling"]
            qm.write_json(os.path.join(out, "traces", "%s_%s_host_%s.json.gz" % (name, p, kind)),
                          qm.host_trace([qm.median(samples)],
                                        qm.median_phases(split) if phases else None))
    return "host_" + kind


def predict(args):
    """Runs lowbit-plan --plan for every measured case and writes the validation table."""
    if not args.lowbit_plan:
        raise SystemExit("validate.py --predict needs --lowbit-plan BIN")
    with open(os.path.join(args.out, "measured.csv")) as f:
        measured = list(csv.DictReader(f))
    predicted, commands, predict_failures = {}, [], {}
    pdir = os.path.join(args.out, "predicted")
    os.makedirs(pdir, exist_ok=True)
    host = host_truth_traces(args.out, args.host_truth, args.host_phases)
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []  # (measured row, argv, prediction's path), in the measured order
        gz = None
        for name in dict.fromkeys(m["model"] for m in measured):
            if gz is None:  # one binary: whether it reads .gz is asked once
                gz = reads_gz(args.lowbit_plan, args.out, name)
            base = plan_args(args.out, name, tmp, gz=gz, host=host)
            for m in (m for m in measured if m["model"] == name):
                plan = os.path.join(args.out, "plans", "%s_%s.json" % (name, m["plan"]))
                pred = os.path.join(pdir, "%s_%s.json" % (name, m["plan"]))
                jobs.append((m, base + ["--plan", plan, "--json", pred], pred))

        def run(job):
            try:
                lowbit_plan(args.lowbit_plan, job[1])
                return None
            except RuntimeError as e:
                return e

        # Each call reads its case's traces again: they run side by side, one per core
        # (the measurement is over; on the GPU machine this takes seconds, not a minute).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            errors = list(pool.map(run, jobs))
        for (m, argv, pred), e in zip(jobs, errors):
            if e is not None:  # reported in the zoo's CSV, the others go on
                log("%s: prediction failed: %s" % (m["case"], e))
                predict_failures[m["case"]] = str(e)
                continue
            commands.append("lowbit-plan " + " ".join(argv))
            j = qm.read_json(pred)["plans"][0]
            predicted[m["case"]] = {"iteration_ms": j["iteration_ms"],
                                    "memory_gib": j["groups"][0]["memory_gib"]}
    rows = [with_profile_host(args.out, r, m, host) for r, m in
            zip(qm.validation_rows(predicted, measured), [m for m in measured
                                                          if m["case"] in predicted])]
    table = qm.markdown_table(rows)
    with open(os.path.join(args.out, "validation.md"), "w") as f:
        f.write(table + "\n")
    qm.write_csv(os.path.join(args.out, "validation.csv"),
                 list(rows[0].keys()) if rows else ["case"], rows)
    with open(os.path.join(args.out, "predict_commands.txt"), "w") as f:
        f.write("\n".join(commands) + "\n")
    if any(m.get("zoo_model") for m in measured) or os.path.exists(
            os.path.join(args.out, "failures.csv")):
        path = write_zoo_csv(args.out, measured, rows, predict_failures)
        log("zoo CSV: %s" % path)
    print(table, flush=True)
    return 0


def bound_of(measured_row) -> str:
    """"host" when the step's measured host time is at least HOST_BOUND_SHARE of its
    measured time (the GPU waits for the host), else "gpu"."""
    try:
        host, step = float(measured_row["host_ms_median"]), float(measured_row["iter_ms_median"])
    except (KeyError, TypeError, ValueError):
        return ""
    return "host" if step > 0 and host >= HOST_BOUND_SHARE * step else "gpu"


def run_facts(out):
    """(date, commit, hardware) of the run in OUT (env.json), "" where unknown."""
    env = {}
    path = os.path.join(out, "env.json")
    if os.path.exists(path):
        env = qm.read_json(path)
    hw = env.get("gpu", "")
    if env.get("torch"):
        hw += ", torch " + env["torch"]
    return env.get("date", ""), env.get("commit", ""), hw


def zoo_rows(out, measured, rows, predict_failures=None):
    """The zoo CSV's rows (ZOO_FIELDS): a row per measured plan with its prediction, and
    one per case that failed (OUT/failures.csv: export, profile, plan, measure, or
    skipped for the time budget) or whose prediction failed, its reason under
    within_target."""
    date, commit, hw = run_facts(out)
    by_case = {r["case"]: r for r in rows}
    out_rows = []
    for m in measured:
        r = by_case.get(m["case"])
        base = {"model": m.get("zoo_model") or m["model"], "batch": m["batch"],
                "bound": bound_of(m), "plan": m["plan"], "measured_ms": "%.3f" % float(
                    m["iter_ms_median"]), "measured_mem": "%.3f" % float(m["peak_gib"]),
                "date": date, "commit": commit, "hardware": hw}
        if r is None:
            why = (predict_failures or {}).get(m["case"], "not predicted")
            out_rows.append(dict(base, predicted_ms="", time_error="", predicted_mem="",
                                 mem_error="", within_target="failed (predict): " +
                                 why.splitlines()[0][:200]))
            continue
        target = qm.HOST_BOUND_TARGET_PCT if base["bound"] == "host" else qm.TIME_TARGET_PCT
        time_ok = abs(r["time_err_pct"]) <= target
        missed = [w for w, ok in (("time", time_ok), ("memory", r["mem_ok"])) if not ok]
        out_rows.append(dict(base, predicted_ms="%.3f" % r["pred_ms"],
                             time_error="%+.2f" % r["time_err_pct"],
                             predicted_mem="%.3f" % r["pred_gib"],
                             mem_error="%+.2f" % r["mem_err_pct"],
                             within_target="yes" if not missed else "no (%s)" % ", ".join(missed)))
    path = os.path.join(out, "failures.csv")
    if os.path.exists(path):
        with open(path) as f:
            for fl in csv.DictReader(f):
                out_rows.append({"model": fl["model"], "batch": fl["batch"], "bound": "",
                                 "plan": "", "predicted_ms": "", "measured_ms": "",
                                 "time_error": "", "predicted_mem": "", "measured_mem": "",
                                 "mem_error": "", "within_target": "failed (%s): %s" % (
                                     fl["stage"], fl["error"]),
                                 "date": date, "commit": commit, "hardware": hw})
    return out_rows


def write_zoo_csv(out, measured, rows, predict_failures=None):
    """OUT/zoo.csv (ZOO_FIELDS); returns its path."""
    return qm.write_csv(os.path.join(out, "zoo.csv"), ZOO_FIELDS,
                        zoo_rows(out, measured, rows, predict_failures))


FAILURE_FIELDS = ["case", "model", "batch", "stage", "error"]


def write_failures(out, failures):
    """OUT/failures.csv: the cases that failed or were not run, by name and stage."""
    qm.write_csv(os.path.join(out, "failures.csv"), FAILURE_FIELDS, failures)


# ------------------------------------------------------------------------------ main

def parse_args(argv=None):
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--lowbit-plan", default="", help="path of the built lowbit-plan binary")
    ap.add_argument("--cases", default="", help="comma list of " + ", ".join(CASES) +
                    " (default: all), or with --zoo of the zoo's <model>-b<batch> cases "
                    "(with --model, of <FUNCTION>-b<batch>)")
    ap.add_argument("--zoo", action="store_true",
                    help="the validation zoo (qsync/zoo.py: 15 models at two batch sizes, "
                         "7 plans each, small per-case effort ZOO_EFFORT) instead of the "
                         "built-in cases; writes OUT/zoo.csv")
    ap.add_argument("--model", action="append", default=[], metavar="MODULE:FUNCTION",
                    help="a model of your own instead of the built-in cases (repeatable): "
                         "FUNCTION(batch, device) -> (model, forward_loss), as qsync.zoo.make, "
                         "in an importable MODULE or a FILE.py")
    ap.add_argument("--batch", default="32",
                    help="with --model, comma list of batch sizes, a case each (default 32)")
    ap.add_argument("--part", default="1/1",
                    help="with --zoo, K/N: only the models whose index is K-1 modulo N "
                         "(e.g. 1/2 and 2/2 in two calls)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="stop starting cases once the next one (estimated as the mean of "
                         "those done) would end past this many seconds since the start; "
                         "the cases left are reported in failures.csv as skipped")
    ap.add_argument("--commit", default="",
                    help="the commit measured (default: git's short HEAD, +modified where "
                         "tracked files differ from it)")
    ap.add_argument("--iters", type=int, default=50,
                    help="timed iterations per plan (>= 20), over all rounds")
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed iterations per plan in the first round (one in each later)")
    ap.add_argument("--profile-steps", type=int, default=3, help="profiled steps per trace")
    ap.add_argument("--host-iters", type=int, default=30,
                    help="steps timed without a profiler for the host time per precision, "
                         "at profiling and again spread over the rounds")
    ap.add_argument("--wrap-pairs", type=int, default=0,
                    help="pairs of steps (every op wrapped, none) per precision at profiling "
                         "that measure what the applier's wrappers cost this model's host, "
                         "used in place of the switch probe's wrap_host_ms (default 0: the "
                         "probe's; on four zoo cases on one H100 the model's own did not "
                         "bring the wrapped plans' predictions nearer; it holds the function "
                         "mode's checks, which lowbit-plan also prices per wrapped function "
                         "op, function_call_host_ms)")
    ap.add_argument("--rounds", type=int, default=10,
                    help="rounds the measurement is spread over, each timing every "
                         "precision's host side and then every plan (interleaved)")
    ap.add_argument("--pin", choices=("none", "pin", "pin1"), default="none",
                    help="pin the process's threads while timing (host_drift.py)")
    ap.add_argument("--predict", action="store_true", help="only run lowbit-plan on OUT")
    ap.add_argument("--host-phases", action="store_true",
                    help="give lowbit-plan the host samples' forward and backward phases, so "
                         "that each phase loses its own profiler excess (the phases are "
                         "recorded either way, in host_times.json; on two runs of four zoo "
                         "cases on one H100 they did not bring the predictions nearer)")
    ap.add_argument("--host-truth", choices=("rounds", "profiling", "all"), default="rounds",
                    help="the host samples lowbit-plan is given (OUT/host_times.json): "
                         "those timed in the measurement's rounds, beside the plans "
                         "(default), at profiling, or all")
    ap.add_argument("--fp8", action="store_true",
                    help="also profile uniform fp8 (the applied plan's fp8 linear layers), "
                         "measure it and the allocator's alloc-fp8-80pct plan (sm_89+, or "
                         "a CPU torch with torch._scaled_mm under --smoke)")
    ap.add_argument("--trace-plans", action="store_true",
                    help="also profile every mixed and allocator plan, with a range per op, "
                         "to traces/<case>_plan_<plan>.json.gz (plan_gap.py compares them "
                         "with the prediction, op by op)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny models on the CPU: checks the pipeline, measures nothing")
    ap.add_argument("--switch-probe", default="", metavar="FILE",
                    help="switch_probe.py's JSON: copied to OUT/%s, whose cast fit and "
                         "switch host times lowbit-plan then prices every prediction "
                         "from OUT with" % SWITCH_PROBE)
    a = ap.parse_args(argv)
    a.all_cpus = sorted(os.sched_getaffinity(0))
    try:
        k, n = (int(x) for x in a.part.split("/"))
        if not 1 <= k <= n:
            raise ValueError
        a.part = (k, n)
    except ValueError:
        ap.error("--part must be K/N with 1 <= K <= N, got %r" % a.part)
    if a.lowbit_plan and not os.access(a.lowbit_plan, os.X_OK):
        ap.error("--lowbit-plan %s is not an executable" % a.lowbit_plan)
    if a.predict:
        return a
    if a.model and a.zoo:
        ap.error("--model and --zoo are two sets of cases: give one")
    try:
        batches = [int(b) for b in a.batch.split(",")]
        if not batches or min(batches) < 1:
            raise ValueError
    except ValueError:
        ap.error("--batch must be a comma list of positive integers, got %r" % a.batch)
    if a.model:
        try:
            a.case_specs = model_cases(a.model, batches)
        except ValueError as e:
            ap.error(str(e))
    else:
        a.case_specs = zoo_cases(a.part) if a.zoo else dict(CASES)
    if not a.cases:
        a.cases = ",".join(a.case_specs)
    unknown = [c for c in a.cases.split(",") if c not in a.case_specs]
    if unknown:
        ap.error("unknown case(s): " + ", ".join(unknown) + " (known: " +
                 ", ".join(a.case_specs) + ")")
    if a.lowbit_plan and not os.access(a.lowbit_plan, os.X_OK):
        ap.error("--lowbit-plan %s is not an executable" % a.lowbit_plan)
    if a.iters < 1 or a.warmup < 0 or a.profile_steps < 1 or a.host_iters < 1 or a.rounds < 1:
        ap.error("--iters, --profile-steps must be positive, --warmup non-negative")
    return a


def torch_for(args, who, hint=""):
    """torch, with args.device set ("cpu" under --smoke, else "cuda"); None, having said
    why on stderr, where torch is missing or no CUDA device is (and --smoke is not set)."""
    try:
        import torch
    except ImportError:
        print(f"{who}: torch is not installed{hint}", file=sys.stderr)
        return None
    args.device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        print(f"{who}: no CUDA device (--smoke checks the code on the CPU)", file=sys.stderr)
        return None
    return torch


def main(argv=None):
    """Run mode, or --predict; returns the exit status."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.switch_probe:
        probe = qm.read_json(args.switch_probe)
        qm.write_json(os.path.join(args.out, SWITCH_PROBE), probe)
        log("switch costs from %s (%s, %s, torch %s%s): %s" % (
            args.switch_probe, probe.get("date", "?"), probe.get("gpu", "?"),
            probe.get("torch", "?"), ", smoke" if probe.get("smoke") else "",
            json.dumps(probe["device"], sort_keys=True)))
    if args.predict:
        return predict(args)
    torch = torch_for(args, "validate.py", " (use --predict to only predict)")
    if torch is None:
        return 2
    torch.backends.cudnn.benchmark = False
    for d in ("traces", "plans"):
        os.makedirs(os.path.join(args.out, d), exist_ok=True)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "argv": sys.argv,
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (smoke)",
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": args.commit or git_commit()}
    try:  # reported, not changed: "fp32" convolutions use TF32 by PyTorch's default
        env["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
        env["matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception:  # noqa: BLE001 (a newer torch may drop these flags)
        pass
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    log("torch %s on %s" % (env["torch"], env["gpu"]))
    rows, host_times, failures, took = [], {}, [], []
    for name in args.cases.split(","):
        spec = args.case_specs[name]
        fail = {"case": name, "model": spec.get("zoo") or spec["model"], "batch": spec["batch"]}
        if args.budget_s > 0 and took and \
                time.time() - T0 + sum(took) / len(took) > args.budget_s:
            log("%s: skipped, the time budget (%.0f s) would be exceeded" % (name, args.budget_s))
            failures.append(dict(fail, stage="skipped (budget)", error="not run"))
            write_failures(args.out, failures)
            continue
        t0, stage = time.time(), {}
        try:
            run_case(torch, args, name, spec, args.out, rows, host_times, stage)
        except Exception as e:  # noqa: BLE001 (a model that fails is reported, the run goes on)
            import traceback

            traceback.print_exc()
            why = ("%s: %s" % (type(e).__name__, e)).splitlines()[0][:300]
            log("%s: FAILED at %s: %s" % (name, stage.get("now", "build"), why))
            failures.append(dict(fail, stage=stage.get("now", "build"), error=why))
            write_failures(args.out, failures)
            free_memory(torch)
        took.append(time.time() - t0)
        log("%s: %.1f s" % (name, took[-1]))
    if failures:
        log("%d case(s) failed or not run: %s" % (len(failures), ", ".join(
            "%s (%s)" % (f["case"], f["stage"]) for f in failures)))
    log("measured %d plans; %s" % (len(rows), os.path.join(args.out, "measured.csv")))
    if not rows:
        write_measured(args.out, rows)
    if args.lowbit_plan:
        predict(args)
    log("done")
    return 0


def git_commit():
    """The short commit of the repository this file is in, with "+modified" where tracked
    files differ from it (a copy of a working tree beside an older .git names the wrong
    code otherwise), or ""."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, cwd=here)
        if r.returncode != 0:
            return ""
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, cwd=here)
        return r.stdout.strip() + ("+modified" if d.returncode != 0 or d.stdout.strip() else "")
    except OSError:
        return ""


def cli():
    """The command (lowbit-qsync-validate): main's status, 1 for any failure, printed."""
    try:
        return main()
    except Exception as e:  # noqa: BLE001 (report any failure with a nonzero status)
        import traceback

        traceback.print_exc()
        print("validate.py: error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli())
