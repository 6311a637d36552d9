"""fp8 training quality on one GPU: what the allocator's fp8 plan costs in loss and keeps
of uniform fp8's speed.

Run mode (CUDA on sm_89 or later), from the repository root:

    PYTHONPATH=examples/pytorch python3 -m qsync.fp8_quality --out OUT \\
        --lowbit-plan build-host/tools/lowbit-plan

For each model (``MODELS``; by default the zoo's Llama, GPT-2 and timm ViT made wider,
4096, 2048 and 1664 (ViT-G/14, 6 blocks), where fp8's GEMMs save more than their casts
cost, at batches where the GEMMs dominate the step) it

1. profiles the model at the training batch exactly as ``validate.py --fp8`` does
   (``validate.run_case`` up to its plans: export, uniform fp32, bf16 and fp8 profiles,
   the model JSON), or takes them from a ``validate.py`` OUT directory (``--from``);
2. asks lowbit-plan for the allocator's plans, ``--target-speedup T`` for each of
   ``--targets`` (``alloc-fp8-<T>pct``: the least indicator keeping T% of the fastest
   uniform plan's predicted speed-up over bf16), with the menu the applier can run:
   fp8, bf16 and fp32 (no fp16: these runs have no loss scaling), fp8 only for linear
   layers whose dimensions are multiples of 16 (``"allowed"`` in a copy of the model
   JSON);
3. times the GEMMs of its linear layers on their shapes (``OUT/gemm.csv``): the
   forward, input-gradient and weight-gradient GEMMs through ``torch._scaled_mm`` as
   fp8.py calls it against bf16 matmuls, and a whole linear's forward and backward
   (fp8.linear with its current scaling against bf16 autocast);
4. trains ``--steps`` steps for every seed and plan (uniform bf16, uniform fp8 and the
   allocator's), from the seed's initial weights on a fixed synthetic task that can be
   learnt: next-token prediction on a stream of a fixed random Markov chain (LMs), the
   labels of a fixed random linear teacher on pooled image patches (ViT); the data are
   a function of the seed, the same for every plan. Adam, linear warm-up over the first
   tenth of the steps. Each step is timed with CUDA events; a run's step time is the
   median after ``--time-warmup`` steps, its final loss the mean training loss of its
   last ``--last-k`` steps (on fresh batches). Rows go to ``OUT/quality.csv`` after
   every run (QUALITY_FIELDS; ``loss_gap`` is the final loss less bf16's of the same
   seed; ``predicted_ms`` lowbit-plan's step time for the plan from step 1's profiles).

Then it prints the table of scripts/qsync-fp8-table, which answers per model whether
the first allocator plan keeps at least 70% of uniform fp8's speed-up over bf16
(``(t_bf16 - t_plan) / (t_bf16 - t_fp8)``, as lowbit-plan's target counts it) with at
most half of uniform fp8's loss gap.

``--budget-s`` stops starting a profile or a run that would end past the budget
(estimated from those done); what is left is written as ``skipped (budget)`` rows and
listed. ``--part K/N`` takes every N-th model. ``--smoke`` runs tiny models on the CPU
(a check of the code, no measurement: CPU times, and fp8 GEMMs only where the CPU build
of torch has ``torch._scaled_mm``, else bf16 stand-ins, labelled so).

Exit status: 0 done, 1 an error, 2 bad arguments or no fp8-capable GPU.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.machinery
import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time

from . import qsync_model as qm
from . import validate as v

QUALITY_FIELDS = ["model", "batch", "plan", "seed", "steps", "final_loss", "loss_gap",
                  "step_ms", "predicted_ms", "fp8_ops", "status", "date", "commit", "hardware"]
GEMM_FIELDS = ["model", "batch", "m", "k", "n", "linears", "gemm", "bf16_us", "fp8_us",
               "speedup", "date", "commit", "hardware"]
# The models, with their training batch (larger than the zoo's, so that GEMMs rather than
# the host set the step) and learning rate; "config": overrides of the zoo case's
# full-size config. fp8 pays where a linear's GEMMs save more than its operands' casts
# cost: the saving grows as m k n, the casts (both operands read twice, written twice at
# one byte) as m (k + n), so per token the widths' k n / (k + n) must be large: at the
# zoo's widths (768-1024) the casts eat the saving (docs/qsync.md's GEMM table), so the
# default models are the same architectures at 1664-4096 wide. "tiny-lm" is the smoke
# test's LM (no transformers needed).
MODELS = {
    "hf-llama-4k": dict(zoo="hf-llama", batch=16, lr=1.5e-4,
                        config=dict(hidden_size=4096, intermediate_size=11008,
                                    num_hidden_layers=4, num_attention_heads=32,
                                    num_key_value_heads=8)),
    "timm-vit-g14": dict(zoo="timm-vit-small", batch=64, lr=1e-4,
                         config=dict(model="vit_gigantic_patch14_224", depth=6)),
    "hf-gpt2-2k": dict(zoo="hf-gpt2", batch=16, lr=2e-4,
                       config=dict(n_embd=2048, n_head=16, n_layer=6)),
    "hf-llama": dict(zoo="hf-llama", batch=64, lr=3e-4),
    "tv-vit-b16": dict(zoo="tv-vit-b16", batch=512, lr=1e-4),
    "hf-gpt2": dict(zoo="hf-gpt2", batch=64, lr=3e-4),
    "hf-qwen2": dict(zoo="hf-qwen2", batch=64, lr=3e-4),
    "timm-vit-small": dict(zoo="timm-vit-small", batch=512, lr=1e-4),
    "tiny-lm": dict(zoo=None, batch=8, lr=3e-3),
}
DEFAULT_MODELS = ("hf-llama-4k", "timm-vit-g14", "hf-gpt2-2k")
SMOKE_MODELS = ("tiny-lm", "timm-vit-small")
SMOKE_BATCH = {"tiny-lm": 4, "timm-vit-small": 2}
# The task's own randomness (the chain, the teacher): fixed, the same for every seed.
TASK_SEED = 1234
# Profiling effort (validate's zoo effort for a GPU-bound case; less in a smoke run).
PROFILE_EFFORT = dict(v.ZOO_EFFORT["gpu"])
SMOKE_EFFORT = dict(iters=2, host_iters=2, rounds=1, warmup=1, profile_steps=1)
GOAL_SHARE, GOAL_GAP = 70.0, 0.5  # the goal: >= 70% of fp8's speed-up, <= half its gap
T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
TABLE_SCRIPT = os.path.normpath(os.path.join(HERE, "..", "..", "..", "scripts",
                                             "qsync-fp8-table"))


def log(msg: str) -> None:
    print("[%6.1fs] %s" % (time.time() - T0, msg), flush=True)


# ------------------------------------------------------------------------ the tasks

class MarkovTask:
    """Next-token prediction on a fixed random Markov chain: ``states`` tokens of the
    vocabulary, each followed by one of ``successors`` tokens with fixed random
    probabilities. Its entropy per token (``entropy``, the mean over states) bounds the
    loss from below; an LM learns the transition table."""

    def __init__(self, torch, vocab, seq, states=1024, successors=8):
        g = torch.Generator().manual_seed(TASK_SEED)
        self.torch, self.seq = torch, seq
        self.states = min(states, vocab // 2)
        self.k = successors
        self.tokens = torch.randperm(vocab, generator=g)[:self.states]
        self.succ = torch.randint(0, self.states, (self.states, successors), generator=g)
        p = (2.0 * torch.randn(self.states, successors, generator=g)).softmax(-1)
        self.cdf = p.cumsum(-1)
        self.cdf[:, -1] = 1.0
        self.entropy = float(-(p * p.log()).sum(-1).mean())

    def stream(self, n_seq, seed):
        """``n_seq`` sequences of the chain (token ids, [n_seq, seq]), from `seed`."""
        torch = self.torch
        g = torch.Generator().manual_seed(seed)
        s = torch.randint(0, self.states, (n_seq,), generator=g)
        u = torch.rand(self.seq, n_seq, 1, generator=g)
        out = torch.empty(n_seq, self.seq, dtype=torch.long)
        for t in range(self.seq):
            out[:, t] = s
            j = torch.searchsorted(self.cdf[s], u[t]).squeeze(1).clamp_max(self.k - 1)
            s = self.succ[s, j]
        return self.tokens[out]

    def batches(self, batch, steps, seed, device):
        """step -> the step's input ids ([batch, seq], on `device`), all made up front
        (kept for the next call with the same arguments: every plan of a seed)."""
        key = (batch, steps, seed, str(device))
        if getattr(self, "_last", (None,))[0] != key:
            self._last = (None,)  # the previous seed's stream freed first
            self._last = (key, self.stream(batch * steps, seed).view(steps, batch,
                                                                     self.seq).to(device))
        ids = self._last[1]
        return lambda t: ids[t]


class TeacherTask:
    """Image classification by a fixed random linear teacher: images of unit Gaussian
    noise, labelled by the argmax of a fixed random linear map of their `pool` x `pool`
    patch means (scaled to unit variance) over `classes` classes. A ViT's patch
    embedding sees exactly those means, so the map can be learnt."""

    def __init__(self, torch, side, classes, pool):
        g = torch.Generator().manual_seed(TASK_SEED)
        self.torch, self.side, self.pool = torch, side, pool
        d = 3 * (side // pool) ** 2
        self.w = torch.randn(classes, d, generator=g) / math.sqrt(d)
        self.entropy = 0.0

    def batches(self, batch, steps, seed, device):
        """step -> (images, labels) on `device`: a generator seeded by `seed`, drawn in
        step order (steps are asked for in order)."""
        torch = self.torch
        import torch.nn.functional as F

        g = torch.Generator(device=device).manual_seed(seed)
        w = self.w.to(device)

        def make(t):
            x = torch.randn(batch, 3, self.side, self.side, generator=g, device=device)
            z = F.avg_pool2d(x, self.pool).flatten(1) * self.pool
            return x, (z @ w.t()).argmax(1)
        return make


def make_task(torch, name, tiny):
    """The task of model `name` and its loss: ``(task, loss(model, batch))``."""
    import torch.nn.functional as F

    if name == "tiny-lm":
        task = MarkovTask(torch, TINY_LM_VOCAB, TINY_LM_SEQ, successors=4)

        def loss(model, ids):
            logits = model(ids)
            return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        return task, loss
    from . import zoo

    case = zoo.CASES[MODELS[name]["zoo"]]
    if case.kind == "image":
        side = zoo.TINY_IMAGE if tiny else zoo.IMAGE
        classes = min(10, 10 if tiny else case.classes)
        task = TeacherTask(torch, side, classes, pool=8 if tiny else 16)

        def loss(model, xy):
            return F.cross_entropy(model(xy[0]), xy[1])
        return task, loss
    if case.kind != "causal":
        raise ValueError("fp8_quality: %s is a %s model; the tasks here are causal LMs and "
                         "image classifiers" % (name, case.kind))
    task = MarkovTask(torch, zoo.TINY_VOCAB if tiny else case.vocab,
                      zoo.TINY_SEQ if tiny else case.seq["gpu"], successors=4 if tiny else 8)

    def loss(model, ids):
        return model(input_ids=ids, labels=ids).loss
    return task, loss


def build_model(torch, name, tiny, seed, device):
    """Model `name` (tiny for a smoke run) with the initial weights of `seed`, training."""
    torch.manual_seed(seed)
    if name == "tiny-lm":
        model = tiny_lm(torch)
    else:
        from . import zoo

        model = zoo.CASES[MODELS[name]["zoo"]].build(tiny, **MODELS[name].get("config", {}))
    return model.to(device).train()


TINY_LM_VOCAB, TINY_LM_SEQ = 128, 16


def tiny_lm(torch):
    """A two-layer pre-LN causal LM in plain torch (vocab 128, width 32, 16 tokens): the
    smoke run's LM, where transformers is not installed."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d=32, heads=2):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.act, self.fc2 = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

        def forward(self, x):
            b, s, d = x.shape
            q, k, w = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, -1).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               w.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(TINY_LM_VOCAB, 32)
            self.pos = nn.Embedding(TINY_LM_SEQ, 32)
            self.blocks = nn.Sequential(Block(), Block())
            self.ln = nn.LayerNorm(32)
            self.head = nn.Linear(32, TINY_LM_VOCAB)

        def forward(self, ids):
            x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
            return self.head(self.ln(self.blocks(x)))

    return Model()


# --------------------------------------------------------------------- fp8 on device

def standin(plan: dict) -> dict:
    """`plan` with every fp8 made bf16: what a smoke run trains where fp8 GEMMs do not
    run (labelled in its rows)."""
    def swap(p):
        return "bf16" if p == "fp8" else p
    out = copy.deepcopy(plan)
    for g in out.get("groups", [out]):
        if "default" in g:
            g["default"] = swap(g["default"])
        for key in ("ops", "precisions"):
            if isinstance(g.get(key), dict):
                g[key] = {k: swap(p) for k, p in g[key].items()}
    return out


# ----------------------------------------------------------------- the GEMM shapes

def linear_shapes(torch, model, loss_fn, batch):
    """{(m, k, n): number of linear layers} of one forward at `batch` (m: rows of the
    input, k: in features, n: out features), for the linear layers fp8 can run."""
    from . import fp8

    shapes, hooks = {}, []
    for name, mod in model.named_modules():
        parts = fp8.linear_parts(mod)
        if parts is None:
            continue
        n, k = parts[0].shape
        if n % fp8.ALIGN or k % fp8.ALIGN:
            continue

        def hook(mod, args, out, k=k, n=n):
            m = args[0].numel() // k
            shapes[(m, k, n)] = shapes.get((m, k, n), 0) + 1
        hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            loss_fn(model, batch)
    finally:
        for h in hooks:
            h.remove()
    return shapes


def time_us(torch, fn, iters, warmup=3):
    """Median time of `fn()` in microseconds (CUDA events on CUDA, else the CPU clock)."""
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            times.append((a, b))
        else:
            t = time.perf_counter()
            fn()
            times.append(1e6 * (time.perf_counter() - t))
    if cuda:
        torch.cuda.synchronize()
        times = [1000.0 * a.elapsed_time(b) for a, b in times]
    return statistics.median(times)


def gemm_rows(torch, shapes, device, iters):
    """Per shape, bf16 and fp8 times of the forward (x W^T), input-gradient (dy W) and
    weight-gradient (dy^T x) GEMMs as fp8.py runs them (operands already in fp8, in the
    layouts fp8.cast gives them: no copy inside the timed call), and of
    a whole linear's forward and backward (fp8.linear with its current scaling, against
    F.linear under bf16 autocast, fp32 master weights both)."""
    from . import fp8

    rows = []
    for (m, k, n), count in sorted(shapes.items()):
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(m, k, device=device, generator=g)
        w = torch.randn(n, k, device=device, generator=g) / math.sqrt(k)
        dy = torch.randn(m, n, device=device, generator=g)
        xb, wb, dyb = x.bfloat16(), w.bfloat16(), dy.bfloat16()
        xq, xqt, sx = fp8.cast(x, fp8.E4M3)
        wq, wqt, sw = fp8.cast(w, fp8.E4M3)
        gq, gqt, sg = fp8.cast(dy, fp8.E5M2)
        F = torch.nn.functional
        cases = {
            "forward": (lambda: F.linear(xb, wb),
                        lambda: fp8._mm(xq, sx, wq.t(), sw, fp8.CARRIER)),
            "dgrad": (lambda: dyb @ wb, lambda: fp8._mm(gq, sg, wqt.t(), sw, torch.float32)),
            "wgrad": (lambda: dyb.t() @ xb, lambda: fp8._mm(gqt, sg, xqt.t(), sx, torch.float32)),
        }
        xl = xb.clone().requires_grad_(True)
        wl = w.clone().requires_grad_(True)

        def bf16_linear():
            with torch.autocast(device, dtype=torch.bfloat16):
                y = F.linear(xl, wl)
            y.backward(dyb)
            xl.grad = wl.grad = None

        def fp8_linear():
            fp8.linear(xl, wl).backward(dyb)
            xl.grad = wl.grad = None
        cases["linear"] = (bf16_linear, fp8_linear)
        for gemm, (fb, f8) in cases.items():
            try:
                tb, t8 = time_us(torch, fb, iters), time_us(torch, f8, iters)
            except RuntimeError as e:  # a shape _scaled_mm refuses: logged, left out
                log("gemm %dx%dx%d %s: %s" % (m, k, n, gemm, str(e).splitlines()[0][:200]))
                continue
            rows.append({"m": m, "k": k, "n": n, "linears": count, "gemm": gemm,
                         "bf16_us": "%.2f" % tb, "fp8_us": "%.2f" % t8,
                         "speedup": "%.3f" % (tb / t8 if t8 > 0 else float("nan"))})
    return rows


# -------------------------------------------------------------------- training runs

def train_run(torch, args, model, init, task_batches, loss_fn, plan, model_json, device,
              seed, lr):
    """One training run: `args.steps` steps of Adam from `init` under `plan`; returns
    (final loss, median step ms after the warm-up, fp8 ops, every step's loss)."""
    from .apply_plan import applied_plan

    cuda = device == "cuda"
    model.load_state_dict(init)
    torch.manual_seed(seed)  # dropout: the same masks' stream for every plan
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=cuda)
    warm_lr = max(1, args.steps // 10)
    losses = torch.zeros(args.steps, device=device)
    marks = []
    batches = task_batches()
    with applied_plan(model, plan, model_json, device_type=device) as ap:
        fp8_ops = len(ap.fp8_ops)
        gc.collect()
        gc.freeze()  # what exists now stays out of the collector's passes; it stays on
        try:
            for t in range(args.steps):
                batch = batches(t)
                for group in opt.param_groups:
                    group["lr"] = lr * min(1.0, (t + 1) / warm_lr)
                if cuda:
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True)
                    a.record()
                else:
                    a = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                with ap.step_context():
                    loss = loss_fn(model, batch)
                loss.backward()
                opt.step()
                if cuda:
                    b.record()
                else:
                    b = time.perf_counter()
                losses[t] = loss.detach().float()
                marks.append((a, b))
        finally:
            gc.unfreeze()
    if cuda:
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in marks]
    else:
        ms = [1000.0 * (b - a) for a, b in marks]
    curve = losses.tolist()
    del opt
    gc.collect()
    last = curve[-args.last_k:]
    final = sum(last) / len(last) if all(math.isfinite(x) for x in last) else float("nan")
    timed = ms[min(args.time_warmup, len(ms) - 1):]
    return final, statistics.median(timed), fp8_ops, curve


# ---------------------------------------------------------------- profiles and plans

def profile_args(args, out):
    """validate.py's arguments for its run_case (profiling only, no allocator there)."""
    a = v.parse_args(["--out", out, "--fp8"] + (["--smoke"] if args.smoke else []))
    a.device = args.device
    a.fp8 = not args.fp8_standin
    a.lowbit_plan = ""
    return a


def profile(torch, args, name, case, batch, task, loss_fn):
    """Step 1: validate.run_case up to its plans for `case` (its traces and model JSON
    under OUT); returns the model JSON."""
    tiny = args.smoke

    def make(device, smoke):
        model = build_model(torch, name, tiny, 0, device)
        first = task.batches(batch, 1, 0, device)(0)
        return model, lambda: loss_fn(model, first)

    for d in ("traces", "plans"):
        os.makedirs(os.path.join(args.out, d), exist_ok=True)
    effort = SMOKE_EFFORT if args.smoke else PROFILE_EFFORT
    spec = dict(model=name, zoo=name, batch=batch, make=make, profile_only=True,
                precisions=("fp32", "bf16"), **effort)
    return v.run_case(torch, profile_args(args, args.out), case, spec, args.out, [], {}, {})


def allocator_plans(args, case, src, model, model_json):
    """Step 2: lowbit-plan --target-speedup T for each target, over the profiles in
    `src` (OUT, or --from's), with the fp8 menu the applier can run; ({name: plan},
    {name: predicted step ms}), the predictions of the uniform bf16 and fp8 plans too."""
    pdir = os.path.join(args.out, "plans")
    os.makedirs(pdir, exist_ok=True)
    mpath = qm.write_json(os.path.join(args.out, "%s.fp8menu.model.json" % case),
                          v.fp8_menu_model(model, model_json, ("bf16", "fp32")))
    cluster = qm.write_json(os.path.join(args.out, "fp8menu.cluster.json"),
                            qm.cluster_json(qm.device_base(getattr(args, "gpu", "")),
                                            ("fp8", "bf16", "fp32")))
    plans, predicted = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        base = v.plan_args(src, case, tmp, precisions=("fp32", "bf16", "fp8"),
                           gz=v.reads_gz(args.lowbit_plan, src, case))
        base[base.index("--model") + 1] = mpath
        base[base.index("--cluster") + 1] = cluster
        for pn in ("bf16", "fp8"):
            path = qm.write_json(os.path.join(tmp, pn + ".plan.json"), qm.uniform_plan(pn))
            pred = os.path.join(tmp, pn + ".predicted.json")
            v.lowbit_plan(args.lowbit_plan, base + ["--plan", path, "--json", pred])
            predicted[pn] = qm.read_json(pred)["plans"][0]["iteration_ms"]
        for target in args.targets:
            pn = "alloc-fp8-%gpct" % target
            path = os.path.join(pdir, "%s_%s.lowbit.json" % (case, pn))
            v.lowbit_plan(args.lowbit_plan, base + ["--target-speedup", "%g" % target,
                                                    "--out", path, "--comm-bits", "32"])
            plans[pn] = qm.read_json(path)
            predicted[pn] = plans[pn].get("predicted_iteration_ms")
            qm.write_json(os.path.join(pdir, "%s_%s.json" % (case, pn)), plans[pn])  # --from's
            log("%s: %s: %.2f ms predicted (target %.2f ms)" % (
                case, pn, predicted[pn] or 0.0, plans[pn].get("target_ms", 0.0)))
    log("%s: predicted uniform bf16 %.2f ms, fp8 %.2f ms" % (case, predicted["bf16"],
                                                           predicted["fp8"]))
    return plans, predicted


def from_dir_model(args, case):
    """The model JSON of `case` in --from's directory (a validate.py --fp8 OUT)."""
    path = os.path.join(args.from_dir, "%s.model.json" % case)
    if not os.path.exists(path):
        have = sorted(f[:-len(".model.json")] for f in os.listdir(args.from_dir)
                      if f.endswith(".model.json"))
        raise RuntimeError("--from %s has no %s (it has: %s); its case must be profiled at "
                           "the training batch" % (args.from_dir, path, ", ".join(have)))
    if not os.path.exists(os.path.join(args.from_dir, "traces", "%s_fp8.json.gz" % case)):
        raise RuntimeError("--from %s has no fp8 profile of %s (validate.py --fp8 makes it)"
                           % (args.from_dir, case))
    return qm.read_json(path)


# -------------------------------------------------------------------------- the run

class Budget:
    """Whether the next piece of work, estimated from the pieces of its kind done so
    far (the closest kind known), still ends within --budget-s of the start."""

    def __init__(self, seconds):
        self.seconds, self.took = seconds, {}

    def allows(self, *keys):
        if self.seconds <= 0:
            return True
        est = 0.0
        for i in range(len(keys), 0, -1):
            done = self.took.get(keys[:i])
            if done:
                est = sum(done) / len(done)
                break
        return time.time() - T0 + est <= self.seconds

    def done(self, seconds, *keys):
        for i in range(1, len(keys) + 1):
            self.took.setdefault(keys[:i], []).append(seconds)


def run_model(torch, args, name, facts, budget, rows, gemm):
    """Steps 1-4 for model `name`; appends to `rows` (QUALITY_FIELDS) and `gemm`,
    rewriting both CSVs after every piece."""
    device, tiny = args.device, args.smoke
    batch = args.batch.get(name) or (SMOKE_BATCH.get(name, 2) if args.smoke
                                     else MODELS[name]["batch"])
    lr = args.lr or MODELS[name]["lr"]
    case = "%s-b%d" % (name, batch)
    plans = {"bf16": qm.uniform_plan("bf16"), "fp8": qm.uniform_plan("fp8")}
    predicted = {}  # plan -> lowbit-plan's step ms (with --lowbit-plan)
    plan_names = list(plans) + (["alloc-fp8-%gpct" % t for t in args.targets]
                                if args.lowbit_plan or args.from_dir else [])
    base = dict(model=name, batch=batch, steps=args.steps, date=facts[0], commit=facts[1],
                hardware=facts[2])

    def record(plan, seed, status, **kw):
        ms = predicted.get(plan)
        row = dict(base, plan=plan, seed=seed, final_loss="", loss_gap="", step_ms="",
                   predicted_ms="" if ms is None else "%.3f" % ms, fp8_ops="", status=status)
        row.update(kw)
        rows.append(row)
        qm.write_csv(os.path.join(args.out, "quality.csv"), QUALITY_FIELDS, rows)

    def skip_all(status, plans_left=None):
        for seed in args.seeds:
            for pn in plans_left or plan_names:
                record(pn, seed, status)

    task, loss_fn = make_task(torch, name, tiny)
    if task.entropy:
        log("%s: Markov chain of %d tokens, %.3f nats per token at best" % (
            case, task.states, task.entropy))
    # 1-2: the model JSON and the allocator's plans
    if not budget.allows("profile"):
        log("%s: skipped, the time budget (%.0f s) would be exceeded" % (case, budget.seconds))
        skip_all("skipped (budget)")
        return
    t0, stage = time.time(), "profile"
    try:
        if args.from_dir:
            model_json, src = from_dir_model(args, case), args.from_dir
        elif args.lowbit_plan:
            model_json, src = profile(torch, args, name, case, batch, task, loss_fn), args.out
        model = build_model(torch, name, tiny, 0, device)
        if not (args.from_dir or args.lowbit_plan):
            # no allocator: the model JSON alone (op names and producers), no profile
            from . import export as ex

            first = task.batches(batch, 1, 0, device)(0)
            model_json = qm.model_json(ex.record_ops(model, lambda m=model: loss_fn(m, first),
                                                     "fp32", device_type=device), case)
        stage = "plan"
        if args.lowbit_plan:
            alloc, predicted = allocator_plans(args, case, src, model, model_json)
            plans.update(alloc)
        elif args.from_dir:
            for pn in plan_names[2:]:
                path = os.path.join(args.from_dir, "plans", "%s_%s.json" % (case, pn))
                if not os.path.exists(path):
                    raise RuntimeError("no --lowbit-plan, and --from has no %s" % path)
                plans[pn] = qm.read_json(path)
    except Exception as e:  # noqa: BLE001 (reported in the CSV, the next model goes on)
        import traceback

        traceback.print_exc()
        why = ("%s: %s" % (type(e).__name__, e)).splitlines()[0][:300]
        log("%s: FAILED at %s: %s" % (case, stage, why))
        skip_all("failed (%s): %s" % (stage, why))
        v.free_memory(torch)
        return
    budget.done(time.time() - t0, "profile")
    log("%s: model JSON and %d plans in %.1f s" % (case, len(plans), time.time() - t0))

    # 3: the GEMMs of the linear layers
    if budget.allows("gemm"):
        t0 = time.time()
        first = task.batches(batch, 1, 0, device)(0)
        shapes = linear_shapes(torch, model, loss_fn, first)
        del first
        for r in gemm_rows(torch, shapes, device, args.gemm_iters):
            gemm.append(dict(r, model=name, batch=batch, date=facts[0], commit=facts[1],
                             hardware=facts[2]))
            log("%s: gemm %sx%sx%s %s: bf16 %s us, fp8 %s us (%sx)" % (
                case, r["m"], r["k"], r["n"], r["gemm"], r["bf16_us"], r["fp8_us"],
                r["speedup"]))
        qm.write_csv(os.path.join(args.out, "gemm.csv"), GEMM_FIELDS, gemm)
        budget.done(time.time() - t0, "gemm")
        v.free_memory(torch)
    else:
        log("%s: GEMM timing skipped (budget)" % case)

    # 4: the training runs, seed by seed (every plan of a seed before the next seed)
    bf16_loss = {}
    for seed in args.seeds:
        init = None
        for pn in plan_names:
            if not budget.allows("train", name, pn):
                log("%s: %s seed %d skipped, the time budget (%.0f s) would be exceeded"
                    % (case, pn, seed, budget.seconds))
                record(pn, seed, "skipped (budget)")
                continue
            if pn not in plans:
                record(pn, seed, "failed (plan): no plan")
                continue
            t0 = time.time()
            try:
                if init is None:
                    del model
                    v.free_memory(torch)
                    model = build_model(torch, name, tiny, seed, device)
                    init = {k: t.detach().clone() for k, t in model.state_dict().items()}
                plan, status = plans[pn], "ok"
                if args.fp8_standin:
                    plan, status = standin(plan), "ok (fp8 ops ran as bf16 stand-ins)"
                final, ms, n8, curve = train_run(
                    torch, args, model, init,
                    lambda: task.batches(batch, args.steps, seed, device), loss_fn, plan,
                    model_json, device, seed, lr)
            except Exception as e:  # noqa: BLE001 (a failing plan is reported, others go on)
                import traceback

                traceback.print_exc()
                why = ("%s: %s" % (type(e).__name__, e)).splitlines()[0][:300]
                log("%s: %s seed %d FAILED: %s" % (case, pn, seed, why))
                record(pn, seed, "failed (train): " + why)
                v.free_memory(torch)
                continue
            if pn == "bf16":
                bf16_loss[seed] = final
            gap = final - bf16_loss[seed] if seed in bf16_loss else float("nan")
            record(pn, seed, status, final_loss="%.5f" % final,
                   loss_gap="" if math.isnan(gap) else "%+.5f" % gap, step_ms="%.3f" % ms,
                   fp8_ops=n8)
            budget.done(time.time() - t0, "train", name, pn)
            log("%s: %s seed %d: final loss %.4f (gap %+.4f), %.2f ms/step, %d fp8 ops, "
                "loss %s -> %s, %.1f s" % (case, pn, seed, final, gap, ms, n8,
                                           " ".join("%.3f" % x for x in curve[:2]),
                                           " ".join("%.3f" % x for x in curve[-2:]),
                                           time.time() - t0))
        init = None
    del model
    v.free_memory(torch)


def table_module():
    """scripts/qsync-fp8-table as a module (the table and the goal come from there), or
    None where this file is not in the repository."""
    if not os.path.exists(TABLE_SCRIPT):
        return None
    loader = importlib.machinery.SourceFileLoader("qsync_fp8_table", TABLE_SCRIPT)
    spec = importlib.util.spec_from_loader("qsync_fp8_table", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (quality.csv, gemm.csv, "
                                                 "profiles, plans)")
    ap.add_argument("--lowbit-plan", default="", help="the built lowbit-plan binary: the "
                    "allocator's plans (without it and --from: bf16 and fp8 only)")
    ap.add_argument("--from", dest="from_dir", default="",
                    help="a validate.py --fp8 OUT holding <model>-b<batch> profiled at the "
                         "training batch: its profiles (with --lowbit-plan) or its plans")
    ap.add_argument("--models", default="",
                    help="comma list of %s (default: %s; smoke: %s)" % (
                        ", ".join(MODELS), ",".join(DEFAULT_MODELS), ",".join(SMOKE_MODELS)))
    ap.add_argument("--batch", default="", help="per-model batch, e.g. hf-llama=32,hf-gpt2=16")
    ap.add_argument("--steps", type=int, default=0, help="training steps per run (200; "
                                                         "smoke: 8)")
    ap.add_argument("--seeds", default="", help="seed count, or a comma list of seeds (one "
                    "seed: '2,') (3; smoke: 2)")
    ap.add_argument("--last-k", type=int, default=0,
                    help="final loss: mean of the last K steps' losses (20; smoke: 2)")
    ap.add_argument("--time-warmup", type=int, default=0,
                    help="steps left out of the step time's median (10; smoke: 1)")
    ap.add_argument("--targets", default="80",
                    help="lowbit-plan --target-speedup values, comma list (the first is the "
                         "one the goal asks about)")
    ap.add_argument("--lr", type=float, default=0.0, help="Adam's learning rate (default: "
                                                          "the model's in MODELS)")
    ap.add_argument("--gemm-iters", type=int, default=0, help="timed calls per GEMM (20; "
                                                              "smoke: 2)")
    ap.add_argument("--part", default="1/1", help="K/N: only every N-th model, from the K-th")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no profile or run that would end past this many seconds "
                         "since the start (estimated from those done); the rest is written "
                         "as skipped")
    ap.add_argument("--commit", default="", help="the commit measured (default: git's)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny models on the CPU: checks the code, measures nothing")
    ap.add_argument("--fp8-standin", action="store_true",
                    help="with --smoke: run fp8 ops as bf16 (what a smoke run does by itself "
                         "where torch._scaled_mm does not run on the CPU)")
    a = ap.parse_args(argv)
    s = a.smoke
    a.steps = a.steps or (8 if s else 200)
    a.last_k = a.last_k or (2 if s else 20)
    a.time_warmup = a.time_warmup or (1 if s else 10)
    a.gemm_iters = a.gemm_iters or (2 if s else 20)
    seeds = a.seeds or ("2" if s else "3")
    try:
        a.seeds = list(range(int(seeds))) if "," not in seeds else [int(x) for x in
                                                                    seeds.split(",") if x]
        a.targets = [float(x) for x in a.targets.split(",") if x]
        a.batch = {k: int(b) for k, b in (x.split("=") for x in a.batch.split(",") if x)}
        k, n = (int(x) for x in a.part.split("/"))
        if not 1 <= k <= n:
            raise ValueError
        a.part = (k, n)
    except ValueError:
        ap.error("--seeds, --targets, --batch (NAME=N,...) or --part (K/N) is malformed")
    if not a.seeds or a.steps < 2 or not 1 <= a.last_k <= a.steps:
        ap.error("need seeds, --steps >= 2 and 1 <= --last-k <= --steps")
    if any(not 0 <= t <= 100 for t in a.targets):
        ap.error("--targets are percentages in [0, 100]")
    models = [m for m in (a.models.split(",") if a.models else
                          SMOKE_MODELS if s else DEFAULT_MODELS) if m]
    unknown = [m for m in models + list(a.batch) if m not in MODELS]
    if unknown:
        ap.error("unknown model(s): %s (known: %s)" % (", ".join(unknown), ", ".join(MODELS)))
    a.models = [m for i, m in enumerate(models) if i % a.part[1] == a.part[0] - 1]
    if a.lowbit_plan and not os.access(a.lowbit_plan, os.X_OK):
        ap.error("--lowbit-plan %s is not an executable" % a.lowbit_plan)
    if a.from_dir and not os.path.isdir(a.from_dir):
        ap.error("--from %s is not a directory" % a.from_dir)
    if a.fp8_standin and not s:
        ap.error("--fp8-standin is for --smoke only: a measurement runs fp8 or nothing")
    return a


def main(argv=None):
    global T0
    T0 = time.time()  # --budget-s counts from here
    args = parse_args(argv)
    torch = v.torch_for(args, "fp8_quality.py")
    if torch is None:
        return 2
    from . import fp8  # torch's: imported once torch is known to be there

    if not fp8.runs_on(args.device):
        if not args.smoke:
            print("fp8_quality.py: torch._scaled_mm does not run on this GPU (sm_89 or later "
                  "needed)", file=sys.stderr)
            return 2
        args.fp8_standin = True
        log("torch._scaled_mm does not run on the CPU here: fp8 ops run as bf16 stand-ins")
    os.makedirs(args.out, exist_ok=True)
    if args.smoke:
        hw = "cpu (smoke: not a measurement%s), torch %s" % (
            "; fp8 as bf16 stand-ins" if args.fp8_standin else "", torch.__version__)
    else:
        args.gpu = torch.cuda.get_device_name(0)  # the allocator's device (its memory)
        hw = "%s, torch %s" % (args.gpu, torch.__version__)
    facts = (time.strftime("%Y-%m-%d", time.gmtime()), args.commit or v.git_commit(), hw)
    log("%s; models %s; %d steps x %d seeds; part %d/%d" % (
        hw, ", ".join(args.models), args.steps, len(args.seeds), *args.part))
    rows, gemm, budget = [], [], Budget(args.budget_s)
    for name in args.models:
        run_model(torch, args, name, facts, budget, rows, gemm)
    qm.write_csv(os.path.join(args.out, "quality.csv"), QUALITY_FIELDS, rows)
    qm.write_csv(os.path.join(args.out, "gemm.csv"), GEMM_FIELDS, gemm)
    left = [r for r in rows if r["status"].startswith(("skipped", "failed"))]
    if left:
        log("%d run(s) not made: %s" % (len(left), "; ".join(
            "%s %s seed %s: %s" % (r["model"], r["plan"], r["seed"], r["status"])
            for r in left)))
    tm = table_module()
    if tm is None:
        log("scripts/qsync-fp8-table not found: its table answers the goal from %s"
            % os.path.join(args.out, "quality.csv"))
    else:
        print(tm.quality_table(rows, "quality.csv"), flush=True)
        if gemm:
            print(tm.gemm_table(gemm, "gemm.csv"), flush=True)
    log("done: %s" % os.path.join(args.out, "quality.csv"))
    return 0


def cli():
    try:
        return main()
    except Exception as e:  # noqa: BLE001 (any failure: printed, status 1)
        import traceback

        traceback.print_exc()
        print("fp8_quality.py: error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli())
