"""What a precision switch costs on one GPU under the plan applier (apply_plan.py), as
constants lowbit-plan takes (``--switch-costs FILE``, or validate.py ``--switch-probe FILE``).

    lowbit-qsync-switch-probe --out switch-h200.json
    lowbit-qsync-switch-probe --smoke --out /tmp/switch-smoke.json   # CPU: plumbing only

A switch is an edge between ops at different precisions. Under the applier an op at
another precision than the step's ambient one is wrapped per call (forward pre- and
post-hooks: autocast entered and left, its inputs cast to its precision, its output cast
to the ambient), and so is every op with parameters fed by an op at another precision.
No profile holds any of it (a uniform plan wraps nothing), so it measures:

(a) the GPU time of a cast, fp32 <-> bf16 and fp32 <-> fp16, from 4 KiB to 256 MiB of
    fp32 elements: bursts of casts queued behind ``torch.cuda._sleep`` (the host is ahead,
    as in a GPU-bound step), CUDA events around the burst, the median per cast over
    repeats; so a cast's time holds the GPU's dispatch gap after it, as the trace loader's
    op times do. Fit ``a * numel + b`` (ms), least squares in relative error
    -> ``cast_fits.float_to_float``;
(b) the host time of the applier's cast in forward (``apply_plan._cast`` on a tensor that
    needs a gradient: the walk over the arguments, ``Tensor.to``, its autograd node)
    -> ``cast_host_ms``; and of its gradient's cast in backward (autograd's
    ToCopyBackward node and its launch: a chain of casts backward, less the chain without
    them) -> ``cast_backward_host_ms`` (a cross-check in situ below);
(c) in situ: a chain of linears under bf16 autocast with every third at fp32, applied
    by ``apply_plan.applied_plan`` (wrapped ops, the casts in and out of each fp32 op and
    their gradients), against the uniform bf16 and fp32 chains. The ops' own host time
    is additive (lowbit-plan's assumption), so the mixed chain without switches takes
    ``(n_bf16 H_bf16 + n_fp32 H_fp32) / n``; what it takes beyond that, forward, less its
    casts at (b)'s price, over the wrapped ops -> ``wrap_host_ms`` (the hooks, autocast
    enter and exit, the walks; the root module's two hooks of a step spread over them);
    backward, less its gradients' casts at (b)'s price, over the wrapped ops ->
    ``wrap_backward_host_ms`` (what the switches cost backward beyond the casts: on one
    H100, 0.029 ms a backward cast in situ against (b)'s 0.012). The casts and wrapped ops
    are counted, not assumed: the applier's ``Tensor.to`` calls (a TorchFunctionMode), its
    ToCopyBackward nodes on the autograd graph, its wrapped ops;
(d) the host time of one torch call the applier's torch function mode checks (on while a
    wrapped function op's caller runs): a module whose forward makes n ``torch.add``
    calls, under an OpTracker whose mode is on against none, at two n; the difference of
    the slopes -> ``function_call_host_ms`` (lowbit-plan prices a wrapped function op's
    ``mode_calls`` at it, the model JSON's count from export.py).

Host times are wall-clock medians of interleaved rounds with Python's collector off, on
steps whose GPU work is small (host-bound). Writes JSON: ``{"probe", "date", "torch",
"gpu", "smoke", "device": {the fields lowbit-plan's device JSON takes}, "measured":
{every median and count behind them}}``. ``--smoke`` runs every part on the CPU with
tiny sizes: a check of the code, whose numbers mean nothing for a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

from .qsync_model import collector_off

PAIRS = (("fp32", "bf16"), ("bf16", "fp32"), ("fp32", "fp16"), ("fp16", "fp32"))
KIB = 1024


def median(xs):
    return float(statistics.median(xs))


def fit_linear(points):
    """(a, b) minimising sum(((a n + b) - t) / t)^2 over points (n, t): every size counts
    by its relative error, so the launch-bound small casts set b and the large ones a."""
    sw = swn = swnn = swt = swnt = 0.0
    for n, t in points:
        w = 1.0 / (t * t)
        sw, swn, swnn = sw + w, swn + w * n, swnn + w * n * n
        swt, swnt = swt + w * t, swnt + w * n * t
    det = sw * swnn - swn * swn
    if det == 0:
        return 0.0, median([t for _, t in points])
    a = (sw * swnt - swn * swt) / det
    b = (swnn * swt - swn * swnt) / det
    return a, b


class Clock:
    """GPU time of queued work (CUDA events behind a sleep kernel), or wall time on the
    CPU (--smoke)."""

    def __init__(self, torch, device):
        self.torch, self.device = torch, device
        self.cycles = 0
        if device == "cuda":
            # Calibrate the sleep: cycles per ms of this GPU's clock.
            torch.cuda._sleep(1000)
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.cuda._sleep(10_000_000)
            e.record()
            e.synchronize()
            self.cycles_per_ms = 10_000_000 / max(1e-3, s.elapsed_time(e))

    def burst_ms(self, fn, k, host_ms_hint):
        """Milliseconds per call of `fn` over a burst of `k` calls, all queued before the
        first runs (the sleep lasts twice the host time the burst is expected to take)."""
        torch = self.torch
        if self.device != "cuda":
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            return 1000.0 * (time.perf_counter() - t0) / k
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sleep_ms = max(2.0, 2.0 * host_ms_hint * k)
        torch.cuda._sleep(int(self.cycles_per_ms * self.sleep_ms))
        s.record()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        host = 1000.0 * (time.perf_counter() - t0)
        e.record()
        e.synchronize()
        gpu = s.elapsed_time(e)
        self.last_host_ms = host
        return gpu / k

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()


def cast_gpu(torch, device, dtypes, smoke):
    """(a): per pair and size the median GPU time of one cast (ms), and the fit."""
    clock = Clock(torch, device)
    sizes = [4 * KIB * 4 ** k for k in range(4 if smoke else 9)]  # 4 KiB .. 256 MiB of fp32
    repeats = 3 if smoke else 9
    rows, points = [], []
    for src, dst in PAIRS:
        for nbytes in sizes:
            numel = nbytes // 4
            x = torch.randn(numel, device=device).to(dtypes[src])
            k = 5 if smoke else max(5, min(100, int(2e8 // max(numel, 1))))
            fn = lambda: x.to(dtypes[dst])  # noqa: E731 (the result is dropped, as a cast's)
            for _ in range(3):
                fn()
            clock.sync()
            times, host = [], 0.0
            for _ in range(repeats):
                times.append(clock.burst_ms(fn, k, host_ms_hint=0.05))
                host = max(host, getattr(clock, "last_host_ms", 0.0))
            t = median(times)
            # The burst is GPU time only if the host queued it all while the GPU slept.
            queued = host <= getattr(clock, "sleep_ms", float("inf"))
            rows.append({"from": src, "to": dst, "numel": numel, "fp32_bytes": nbytes,
                         "burst": k, "ms": t, "burst_host_ms_max": host,
                         "queued_behind_sleep": queued})
            points.append((float(numel), t))
            x = None  # freed before the next size's tensor
    a, b = fit_linear(points)
    per_pair = {}
    for src, dst in PAIRS:
        pa, pb = fit_linear([(float(r["numel"]), r["ms"]) for r in rows
                             if r["from"] == src and r["to"] == dst])
        per_pair["%s->%s" % (src, dst)] = {"a_ms": pa, "b_ms": pb}
    worst = max(abs((a * n + b) - t) / t for n, t in points)
    return {"a_ms": a, "b_ms": b, "per_pair": per_pair, "worst_relative_error": worst,
            "not_queued": sum(not r["queued_behind_sleep"] for r in rows), "points": rows}


def host_loop(fn, n, rounds, sync):
    """Median over `rounds` of the wall time of `n` calls of fn, per call (ms)."""
    out = []
    with collector_off():
        for _ in range(rounds):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out.append(1000.0 * (time.perf_counter() - t0) / n)
    sync()
    return median(out)


def cast_host(torch, device, dtypes, smoke):
    """(b): the applier's forward cast and a cast's backward, host time (ms)."""
    from . import apply_plan as ap

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rounds, n = (3, 20) if smoke else (15, 200)
    x = torch.randn(64, 64, device=device, requires_grad=True)
    args = ((x,), {})
    for _ in range(10):
        ap._cast(args, dtypes["bf16"])
    fwd = host_loop(lambda: ap._cast(args, dtypes["bf16"]), n, rounds, sync)

    def chain(k):
        y = x
        for j in range(k):
            y = y.to(dtypes["bf16"] if j % 2 == 0 else dtypes["fp32"])
        return y.float().sum()

    k = 8 if smoke else 64
    times = {0: [], k: []}
    with collector_off():
        for _ in range(rounds * 2):
            for m in (0, k):
                loss = chain(m)
                sync()
                t0 = time.perf_counter()
                loss.backward()
                times[m].append(1000.0 * (time.perf_counter() - t0))
                sync()
                x.grad = None
    bwd = (median(times[k]) - median(times[0])) / k
    return {"cast_forward_ms": fwd, "cast_backward_ms": bwd, "backward_chain_casts": k,
            "backward_chain_ms": median(times[k]), "backward_no_casts_ms": median(times[0])}


class _ToCounter:
    """Counts the Python-level ``Tensor.to`` calls that change a floating tensor's dtype
    (the applier's casts; autocast's own casts are C++, not seen)."""

    def __init__(self, torch):
        from torch.overrides import TorchFunctionMode

        counter = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if getattr(func, "__name__", "") == "to" and args and \
                        isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor) \
                        and out.dtype != args[0].dtype:
                    counter.n += 1
                return out

        self.n, self.mode = 0, Mode()


def to_copy_nodes(loss):
    """ToCopyBackward nodes on the autograd graph behind `loss` (casts with a backward)."""
    seen, stack, n = set(), [loss.grad_fn], 0
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        n += "ToCopyBackward" in type(fn).__name__
        stack.extend(f for f, _ in fn.next_functions)
    return n


def in_situ(torch, device, smoke, blocks, width, batch):
    """(c): the applier on a chain of linears, mixed against uniform; host ms and counts."""
    from . import apply_plan as ap

    nn = torch.nn
    torch.manual_seed(0)
    layers = [nn.Linear(width, width).to(device) for _ in range(blocks)]
    x = torch.randn(batch, width, device=device)
    short = max(2, blocks // 3)  # the uniform chains again at this length: per-op slopes

    def chain(n):
        ops = [{"name": str(k), "kind": "linear", "param_numel": width * width + width,
                "output_numel": batch * width, "inputs": [str(k - 1)] if k else []}
               for k in range(n)]
        return nn.Sequential(*layers[:n]), {"name": "switch-probe-chain", "ops": ops}

    off = [str(k) for k in range(blocks - 1) if k % 3 == 2]  # fp32 ops, the last one at bf16
    variants = {"bf16": (blocks, {"default": "bf16"}), "fp32": (blocks, {"default": "fp32"}),
                "bf16-short": (short, {"default": "bf16"}),
                "fp32-short": (short, {"default": "fp32"}),
                "mixed": (blocks, {"default": "bf16", "ops": {k: "fp32" for k in off}})}
    runs = {}
    for k, (n, plan) in variants.items():
        model, model_json = chain(n)
        runs[k] = (model, ap.applied_plan(model, plan, model_json, device_type=device))
    assert runs["mixed"][1].ambient == "bf16" and not runs["bf16"][1].wrapped
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def forward(model, a):
        with a.step_context():
            return model(x).float().pow(2).mean()

    counts = {}
    for k, (model, a) in runs.items():  # counted once, untimed
        with a:
            c = _ToCounter(torch)
            with c.mode:
                loss = forward(model, a)
            counts[k] = {"forward_casts": c.n, "to_copy_nodes": to_copy_nodes(loss),
                         "wrapped": len(a.wrapped)}
            loss.backward()
        model.zero_grad(set_to_none=True)
    rounds, steps, warm = (2, 2, 1) if smoke else (10, 20, 3)
    fwd = {k: [] for k in runs}
    bwd = {k: [] for k in runs}
    with collector_off():
        for r in range(rounds):
            for k, (model, a) in runs.items():
                with a:
                    for s in range(warm + steps):
                        sync()
                        t0 = time.perf_counter()
                        loss = forward(model, a)
                        t1 = time.perf_counter()
                        loss.backward()
                        t2 = time.perf_counter()
                        sync()
                        model.zero_grad(set_to_none=True)
                        if s >= warm:
                            fwd[k].append(1000.0 * (t1 - t0))
                            bwd[k].append(1000.0 * (t2 - t1))
    n_off = len(off)

    def without_switches(v):
        """The mixed chain priced op by op from the uniform ones: uniform bf16 (same first
        and last op, same loss) plus, per fp32 op, the per-op difference of the uniform
        chains' slopes (what one more op costs at fp32 and at bf16)."""
        slope = {p: (v[p] - v[p + "-short"]) / (blocks - short) for p in ("bf16", "fp32")}
        return v["bf16"] + n_off * (slope["fp32"] - slope["bf16"])

    out = {"blocks": blocks, "short_blocks": short, "width": width, "batch": batch,
           "fp32_ops": n_off, "counts": counts, "rounds": rounds, "steps_per_round": steps}
    for what, t in (("forward", fwd), ("backward", bwd)):
        med = {k: median(v) for k, v in t.items()}
        out[what] = {"median_ms": med, "mixed_without_switches_ms": without_switches(med),
                     "switch_ms": med["mixed"] - without_switches(med)}
    # The mixed plan's own casts and wrapped ops, beyond its ops' (counted the same way).
    for what, key in (("forward_casts", "forward_casts"), ("backward_casts", "to_copy_nodes"),
                      ("wrapped", "wrapped")):
        c = {k: float(v[key]) for k, v in counts.items()}
        out[what] = c["mixed"] - without_switches(c)
    return out


def mode_call(torch, device, smoke):
    """(d): host ms of one torch call checked by the applier's function mode."""
    from .attribution import OpTracker

    class Calls(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4, device=device))  # the mode's owners
            self.n = 0

        def forward(self, x):
            for _ in range(self.n):
                x = torch.add(x, 1.0)
            return x * self.w

    m, x = Calls(), torch.zeros(4, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    counts, reps = ((2, 6), 5) if smoke else ((8, 72), 200)
    med = {}
    tracker = OpTracker(m, lambda *a: None, lambda *a: None, leaves=set(), functions=True)
    with torch.no_grad(), collector_off():
        for tracked in (False, True):
            for n in counts:
                m.n, times = n, []
                with tracker if tracked else contextlib.nullcontext():
                    for r in range(reps + 3):
                        sync()
                        t0 = time.perf_counter()
                        m(x)
                        t1 = time.perf_counter()
                        if r >= 3:
                            times.append(1000.0 * (t1 - t0))
                med[(tracked, n)] = median(times)
    slope = {t: (med[(t, counts[1])] - med[(t, counts[0])]) / (counts[1] - counts[0])
             for t in (False, True)}
    return {"calls": list(counts), "reps": reps,
            "plain_ms": [med[(False, n)] for n in counts],
            "moded_ms": [med[(True, n)] for n in counts],
            "per_call_ms": slope[True] - slope[False]}


def wrap_costs(situ, host):
    """(forward, backward) host ms a wrapped op costs beyond its casts: the in-situ
    chain's switch time each way, less its casts at (b)'s prices, over its wrapped ops
    (either may come out below 0 where the host's noise exceeds them)."""
    n = max(1.0, situ["wrapped"])
    forward = situ["forward"]["switch_ms"] - situ["forward_casts"] * host["cast_forward_ms"]
    backward = (situ["backward"]["switch_ms"] -
                situ["backward_casts"] * max(0.0, host["cast_backward_ms"]))
    return forward / n, backward / n


def probe(args):
    import torch

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("switch_probe.py: needs a CUDA device (--smoke runs on the CPU)", file=sys.stderr)
        return None
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    fit = cast_gpu(torch, device, dtypes, args.smoke)
    host = cast_host(torch, device, dtypes, args.smoke)
    situ = in_situ(torch, device, args.smoke, 7 if args.smoke else args.blocks,
                   8 if args.smoke else args.width, 4 if args.smoke else args.batch)
    calls = mode_call(torch, device, args.smoke)
    wrap, wrap_backward = wrap_costs(situ, host)
    situ["backward_cast_ms"] = situ["backward"]["switch_ms"] / max(1.0, situ["backward_casts"])
    situ["wrap_ms"], situ["wrap_backward_ms"] = wrap, wrap_backward
    notes = []
    if device == "cuda" and fit["not_queued"]:
        notes.append("%d cast bursts were not all queued behind the sleep: their GPU time "
                     "may hold host time" % fit["not_queued"])
    if wrap < 0:
        notes.append("wrap_host_ms measured below 0 (%.4f ms): written as 0" % wrap)
    if calls["per_call_ms"] < 0:
        notes.append("function_call_host_ms measured below 0 (%.5f ms): written as 0"
                     % calls["per_call_ms"])
    if wrap_backward < 0:
        notes.append("wrap_backward_host_ms measured below 0 (%.4f ms): written as 0"
                     % wrap_backward)
    if host["cast_backward_ms"] < 0:
        notes.append("cast_backward_host_ms measured below 0: written as 0")
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (smoke)"
    return {
        "probe": "examples/pytorch/qsync/switch_probe.py",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu,
        "smoke": bool(args.smoke), "notes": notes,
        "device": {
            "cast_fits": {"float_to_float": {"a_ms": fit["a_ms"], "b_ms": fit["b_ms"]}},
            "cast_host_ms": host["cast_forward_ms"],
            "cast_backward_host_ms": max(0.0, host["cast_backward_ms"]),
            "wrap_host_ms": max(0.0, wrap),
            "wrap_backward_host_ms": max(0.0, wrap_backward),
            "function_call_host_ms": max(0.0, calls["per_call_ms"]),
        },
        "measured": {"cast_gpu": fit, "cast_host": host, "in_situ": situ, "mode_call": calls},
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON to write")
    ap.add_argument("--smoke", action="store_true",
                    help="on the CPU with tiny sizes: checks the code, measures nothing")
    ap.add_argument("--blocks", type=int, default=49,
                    help="linears in the in-situ chain (every third but the last at fp32)")
    ap.add_argument("--width", type=int, default=64, help="the chain's features")
    ap.add_argument("--batch", type=int, default=32, help="the chain's batch")
    args = ap.parse_args(argv)
    if args.blocks < 4:
        ap.error("--blocks must be at least 4")
    result = probe(args)
    if result is None:
        return 2
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    d = result["device"]
    print("switch_probe: %s, torch %s: cast %.3e ms/element + %.4f ms; host per cast %.4f ms "
          "forward, %.4f ms backward; a wrapped op %.4f ms forward (hooks), %.4f ms "
          "backward; a torch call in the function mode %.5f ms -> %s" % (
              result["gpu"], result["torch"], d["cast_fits"]["float_to_float"]["a_ms"],
              d["cast_fits"]["float_to_float"]["b_ms"], d["cast_host_ms"],
              d["cast_backward_host_ms"], d["wrap_host_ms"], d["wrap_backward_host_ms"],
              d["function_call_host_ms"], args.out))
    for n in result["notes"]:
        print("switch_probe: " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
