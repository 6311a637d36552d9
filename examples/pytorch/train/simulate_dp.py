"""Low-bit data-parallel training, SIMULATED on one GPU: P ranks' gradients are computed
one after the other, each is put through lowbit's encode / decode kernels (the codec
functions of lowbit_torch, the same kernels the collectives run) with the feedback rule
of the configuration, and the decoded frames are summed in rank order in fp32 and
scaled by 1/P, as lowbit's all_reduce does (one_shot on 2 ranks; on more ranks the
sum is re-encoded by its owner and decoded again, as two_phase does). The real
collective on P GPUs is lowbit_torch.ddp_hook; this measures what the codec does to
training when only one GPU is at hand.

  python simulate_dp.py --ranks 2 --steps 600 --seeds 0 1 2 \
      --configs bf16 b8-zero-none b4-zero-residual --out results.csv

Two models: --model gpt (default), a GPT-2-like byte-level language model on the Python
standard library's sources with AdamW; --model cnn, a ResNet-like classifier of the
synthetic stroke glyphs of strokes.py with SGD and Nesterov momentum. --graphs replays each
rank's forward and backward as one CUDA graph: the same kernels, so the same values as
without it, less the launch cost of the small models' hundreds of kernels.

A configuration is "bf16" (the baseline: each rank's gradient rounded to bf16, summed in
fp32, rounded to bf16, as a bf16 all-reduce), "fp32", or b<bits>-<grid>-<feedback>
[-stochastic][-warm<steps>] with grid zero|full and feedback none|residual|residual_bf16|
residual_stage2|ef21|damped<beta> (a residual kept at beta times the error: e = beta *
(c - D(Q(c)))); residual_stage2 also keeps a residual on the owner's re-encoding of the
reduced shard (more than two ranks), as lowbit's residual<float, true> does;
-warm<k> sends full precision for the first k steps.

The seeds of a configuration train side by side in one process, a step each in turn, so
that a wall-clock budget (--budget seconds) stops them all at the same evaluated step;
--until N stops them after step N of the --steps schedule (the whole run's rows up to
step N, and a row at N).
Seed s fixes the model's initialisation and the data order, the same for every
configuration: gaps are paired per seed. Give each process its own --out file.
"""

import argparse
import contextlib
import csv
import math
import re
import time

import torch
import torch.nn.functional as F

from corpus import Corpus
from strokes import Strokes

try:  # installed, or examples/pytorch on PYTHONPATH (built just in time on first use)
    import lowbit_torch
except ImportError as e:  # the baselines run without it; checked() refuses the others
    lowbit_torch, LOWBIT_TORCH_MISSING = None, e

DEVICE = torch.device("cuda")  # --device cpu: a smoke test through the host codec
PROFILING = False  # --profile: label the phases of a step for torch.profiler


def span(name):
    """A labelled range in --profile's table; nothing otherwise."""
    return torch.profiler.record_function(name) if PROFILING else contextlib.nullcontext()


def parse_config(name):
    if name in ("bf16", "fp32"):
        return {"name": name, "kind": name}
    parts = name.split("-")
    if (len(parts) < 3 or not re.fullmatch(r"b[1248]", parts[0])
            or parts[1] not in ("zero", "full")
            or not re.fullmatch(r"none|residual|residual_bf16|residual_stage2|ef21|"
                                r"damped(0|1)?\.\d+", parts[2])):
        raise ValueError(f"unknown configuration {name!r}: bf16, fp32 or "
                         "b<1|2|4|8>-<zero|full>-<feedback>[-stochastic][-warm<k>]")
    c = {"name": name, "kind": "lowbit", "bits": int(parts[0][1:]), "grid": parts[1],
         "feedback": parts[2], "rounding": "nearest", "warm": 0}
    for p in parts[3:]:
        if p == "stochastic":
            c["rounding"] = "stochastic"
        elif p.startswith("warm"):
            c["warm"] = int(p[4:])
        else:
            raise ValueError(f"unknown option {p!r} in {name!r}")
    return c


class Reducer:
    """The gradient average of one configuration, with its feedback state."""

    def __init__(self, cfg, ranks, n, device, seed):
        self.cfg, self.P, self.n, self.seed = cfg, ranks, n, seed
        fb = cfg.get("feedback", "none")
        self.beta = float(fb[6:]) if fb.startswith("damped") else 1.0
        if fb.startswith("damped"):
            fb = "residual"
        self.fb = fb
        state_dtype = torch.bfloat16 if fb == "residual_bf16" else torch.float32
        self.e = (torch.zeros(ranks, n, device=device, dtype=state_dtype)
                  if fb in ("residual", "residual_bf16", "residual_stage2", "ef21") else None)
        self.g = torch.zeros(n, device=device) if fb == "ef21" else None  # EF21's replicated g
        self.e2 = (torch.zeros(n, device=device)
                   if fb in ("ef21", "residual_stage2") and ranks > 2 else None)
        self.batch_codec = True  # qd_ranks: one encode and decode for every rank's row
        self.padded = (torch.zeros(ranks, lowbit_torch.whole_blocks(n), device=device)
                       if cfg["kind"] == "lowbit" else None)

    def qd(self, x, step, rank, stage=0):
        c = self.cfg
        with span("lowbit_torch.encode"):
            f = lowbit_torch.encode(x, c["bits"], c["grid"], c["rounding"], seed=self.seed,
                                    step=step, rank=rank + 1000 * stage)
        with span("lowbit_torch.decode"):
            return lowbit_torch.decode(f, x.numel(), c["bits"], c["grid"])

    def qd_ranks(self, x, step):
        """qd of each rank's row of x (P, n). Nearest rounding uses no rank key, so the rows
        go through one encode and one decode, each row padded with zeros to whole codec
        blocks: a block's absmax, and so its codes, are those of the row's own blocks.
        The same values as P calls, in two launches instead of 2P."""
        if self.cfg["rounding"] != "nearest" or not self.batch_codec:
            return torch.stack([self.qd(x[r], step, r) for r in range(self.P)])
        self.padded[:, :self.n].copy_(x)
        return self.qd(self.padded.view(-1), step, 0).view(self.P, -1)[:, :self.n]

    def reduce(self, grads, step):
        """grads: (P, n) fp32, one row per rank. Returns the average every rank gets."""
        c, P = self.cfg, self.P
        if c["kind"] == "fp32" or (c["kind"] == "lowbit" and step < c["warm"]):
            return grads.mean(dim=0)
        if c["kind"] == "bf16":
            acc = grads.to(torch.bfloat16).float().sum(dim=0)
            return (acc / P).to(torch.bfloat16).float()
        fb = self.fb
        if fb == "none":
            d = self.qd_ranks(grads, step)
        elif fb in ("residual", "residual_bf16", "residual_stage2"):
            x = grads + self.e.float()
            d = self.qd_ranks(x, step)
            self.e.copy_(((x - d) * self.beta).to(self.e.dtype))
        else:  # ef21: send Q(x - g_i); g_i += D
            d = self.qd_ranks(grads - self.e, step)
            self.e += d
        acc = torch.zeros(self.n, device=grads.device)
        for r in range(P):  # rank order, fp32, as the decode-sum kernel
            acc += d[r]
        mean = acc * (1.0 / P)
        if P > 2:  # two_phase: the owner re-encodes the reduced shard
            if self.e2 is not None:
                x = mean + self.e2
                mean = self.qd(x, step, 0, stage=1)
                self.e2 = x - mean
            else:
                mean = self.qd(mean, step, 0, stage=1)
        if fb == "ef21":
            self.g += mean
            return self.g.clone()
        return mean


class GPT:
    """The language model: GPT-2-like (transformers' GPT2Config), byte-level, on the
    standard library's sources; loss in nats per byte."""

    optimizer, lr = "adamw", 1e-3

    def __init__(self, args, device):
        self.args = args
        self.data = Corpus(device, args.seq)

    def build(self, device, seed):
        from transformers import GPT2Config, GPT2LMHeadModel

        a = self.args
        torch.manual_seed(seed)
        cfg = GPT2Config(vocab_size=256, n_positions=a.seq, n_embd=a.width, n_layer=a.layers,
                         n_head=a.width // 64, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        return GPT2LMHeadModel(cfg).to(device)

    @staticmethod
    def loss(model, b):
        """Next-byte cross-entropy of a batch of seq + 1 bytes."""
        (b,) = b
        logits = model(b[:, :-1]).logits.float()
        return F.cross_entropy(logits.reshape(-1, 256), b[:, 1:].reshape(-1))

    def batch(self, gen, n):
        return (self.data.batch(gen, n),)

    val_batch = 64  # sequences per validation batch

    def val_batches(self, n):
        return [(b,) for b in self.data.val_batches(n, self.val_batch)]


class CNN:
    """The image classifier: a ResNet-like network (three stages of two basic blocks,
    widths w, 2w, 4w, GroupNorm) on the synthetic stroke glyphs of strokes.py; loss in
    nats per image."""

    optimizer, lr = "sgd", 0.05

    def __init__(self, args, device):
        self.args = args
        self.data = Strokes(device)

    def build(self, device, seed):
        torch.manual_seed(seed)
        return resnet(self.args.width, self.args.layers, self.data.classes).to(device)

    @staticmethod
    def loss(model, b):
        x, y = b
        return F.cross_entropy(model(x).float(), y)

    def batch(self, gen, n):
        return self.data.batch(gen, n)

    val_batch = 256  # images per validation batch

    def val_batches(self, n):
        return self.data.val_batches(n, self.val_batch)


def resnet(width, blocks, classes):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.GroupNorm(8, cout),
                nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.GroupNorm(8, cout))
            self.skip = (nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(8, cout)))

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers = [nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.GroupNorm(8, width), nn.ReLU()]
    cin = width
    for stage, stride in enumerate((1, 2, 2)):
        cout = width << stage
        for i in range(blocks):
            layers.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


TASKS = {"gpt": GPT, "cnn": CNN}


def optimizer(params, args, device):
    """The run's optimizer: AdamW (the GPT's) or SGD with Nesterov momentum (the CNN's)."""
    fused = device.type == "cuda"
    if args.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                 fused=fused)
    return torch.optim.SGD(params, lr=args.lr, momentum=0.9, nesterov=True,
                           weight_decay=5e-4, fused=fused)


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def val_loss(task, model, val):
    model.eval()
    total = 0.0
    for b in val:
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            total += task.loss(model, b).item()
    model.train()
    return total / len(val)


class Backward:
    """One rank's forward and backward, its gradient left in the flat buffer: eager, or
    (--graphs) one CUDA graph replay of the same kernels, which saves the launch cost of a
    small model's hundreds of kernels. Autocast's weight cache is off when capturing
    (torch requires it); the cache changes no value."""

    def __init__(self, task, model, flat, example, graphs):
        self.task, self.model, self.flat = task, model, flat
        self.graph = None
        if not graphs:
            return
        self.static = [t.clone() for t in example]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, as torch's docs ask
            for _ in range(3):
                self._eager(self.static, cache=False)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._eager(self.static, cache=False)
        flat.zero_()  # the warm-up's gradients are not a step's

    def _eager(self, b, cache=True):
        self.flat.zero_()
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, cache_enabled=cache):
            loss = self.task.loss(self.model, b)
        loss.backward()
        return loss.detach()

    def __call__(self, b):
        if self.graph is None:
            return self._eager(b)
        for s, t in zip(self.static, b):
            s.copy_(t)
        self.graph.replay()
        return self.loss


class Run:
    """One seed of one configuration: its model, optimizer, data order and reducer."""

    def __init__(self, cfg_name, seed, args, task):
        device = DEVICE
        self.cfg_name, self.seed, self.args, self.task = cfg_name, seed, args, task
        self.model = task.build(device, seed)
        params = [p for p in self.model.parameters() if p.requires_grad]
        n = sum(p.numel() for p in params)
        self.flat = torch.zeros(n, device=device)
        off = 0
        for p in params:  # gradients accumulate straight into the flat buffer
            p.grad = self.flat[off:off + p.numel()].view_as(p)
            off += p.numel()
        self.opt = optimizer(params, args, device)
        self.reducer = Reducer(parse_config(cfg_name), args.ranks, n, device, seed)
        self.grads = torch.empty(args.ranks, n, device=device)
        self.gen = torch.Generator().manual_seed(seed)
        # the example batch comes from a generator of its own: the data order is the seed's
        example = task.batch(torch.Generator().manual_seed(2**31 - 1), args.batch)
        self.backward = Backward(task, self.model, self.flat, example, args.graphs)
        self.loss = float("nan")

    def step(self, step):
        args = self.args
        for r in range(args.ranks):
            with span("batch"):
                b = self.task.batch(self.gen, args.batch)
            with span("forward and backward"):
                loss = self.backward(b)
            self.grads[r].copy_(self.flat)
        with span("reduce"):
            self.flat.copy_(self.reducer.reduce(self.grads, step))
        for group in self.opt.param_groups:
            group["lr"] = lr_at(step, args)
        with span("optimizer"):
            self.opt.step()
        self.loss = loss


PROFILE_FROM = 10  # past the first steps' allocations and lazy kernel loading
PHASES = ("batch", "forward and backward", "reduce", "lowbit_torch.encode",
          "lowbit_torch.decode", "optimizer")
PROFILE_ACTIVITIES = {
    "cpu": [torch.profiler.ProfilerActivity.CPU],
    "cuda": [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
}


def run(cfg_name, args, task, val, writer, fh):
    """Trains every seed of cfg_name side by side until --until (default --steps) or the
    budget."""
    runs = [Run(cfg_name, seed, args, task) for seed in args.seeds]
    t0 = time.time()
    profiled = range(PROFILE_FROM, PROFILE_FROM + args.profile)
    for step in range(args.until or args.steps):
        if step == profiled.start and args.profile:
            prof = torch.profiler.profile(activities=PROFILE_ACTIVITIES[DEVICE.type])
            prof.__enter__()
        for r in runs:
            r.step(step)
        if step + 1 == profiled.stop and args.profile:
            prof.__exit__(None, None, None)
            print(f"{cfg_name}: steps {profiled.start}-{profiled.stop - 1}, every seed")
            events = prof.key_averages()
            for e in events:  # the labelled phases first, then the ops
                if e.key in PHASES:
                    print(f"  {e.key:<22} {e.cpu_time_total / 1e3:10.2f} ms host  {e.count} calls")
            print(events.table(sort_by="cpu_time_total", row_limit=25), flush=True)
        if (step + 1) % args.eval_every == 0 or step + 1 in (args.steps, args.until):
            diverged = False
            for r in runs:
                v = val_loss(task, r.model, val)
                writer.writerow([cfg_name, r.seed, args.ranks, step + 1, f"{r.loss.item():.5f}",
                                 f"{v:.5f}", f"{time.time() - t0:.1f}"])
                diverged |= not math.isfinite(v)
            fh.flush()
            if diverged:
                break
            per_eval = (time.time() - t0) / (step + 1) * args.eval_every
            if args.budget and time.time() - t0 + per_eval > args.budget:
                break


def parser(description):
    """The arguments of a run (the model, its data, schedule, seeds, configurations and
    output), which real_dp.py shares."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(TASKS), default="gpt")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64, help="sequences (images) per rank per step")
    ap.add_argument("--seq", type=int, default=256, help="gpt: bytes per sequence")
    ap.add_argument("--layers", type=int, default=6,
                    help="gpt: transformer layers; cnn: basic blocks per stage")
    ap.add_argument("--width", type=int, default=384,
                    help="gpt: embedding width; cnn: the first stage's channels")
    ap.add_argument("--optimizer", choices=["adamw", "sgd"],
                    help="default: the model's (gpt adamw, cnn sgd with Nesterov momentum)")
    ap.add_argument("--lr", type=float, help="peak learning rate; default: the model's")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--val-seqs", type=int, default=512)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--configs", nargs="+", default=["bf16", "b4-zero-residual"])
    ap.add_argument("--out", default="simulate_dp.csv")
    ap.add_argument("--until", type=int, metavar="STEP",
                    help="stop after this step of the --steps schedule: the whole run's rows "
                         "to that step, and one at STEP itself")
    ap.add_argument("--device", default="cuda")
    return ap


def checked(ap, args):
    """args after the checks every run makes, with the model's optimizer and learning rate
    filled in; the task (model and data) and its validation batches."""
    if args.until is not None and not 0 < args.until <= args.steps:
        ap.error(f"--until must be in 1..--steps ({args.steps})")
    for c in args.configs:
        try:
            lowbit = parse_config(c)["kind"] == "lowbit"
        except ValueError as e:
            ap.error(str(e))
        if lowbit and lowbit_torch is None:
            ap.error(f"{c} needs lowbit_torch (pip install --no-build-isolation examples/pytorch, "
                     f"or examples/pytorch on PYTHONPATH): {LOWBIT_TORCH_MISSING}")
    val_batch = TASKS[args.model].val_batch
    if args.val_seqs <= 0 or args.val_seqs % val_batch:
        ap.error(f"--val-seqs must be a positive multiple of {val_batch} for --model {args.model}")
    task = TASKS[args.model](args, torch.device(args.device))
    args.optimizer = args.optimizer or task.optimizer
    args.lr = task.lr if args.lr is None else args.lr
    return task, task.val_batches(args.val_seqs)


def open_csv(path):
    """The CSV file (appended to) and its writer; the header where the file is new."""
    fh = open(path, "a", newline="")
    w = csv.writer(fh, lineterminator="\n")
    if fh.tell() == 0:
        w.writerow(["config", "seed", "ranks", "step", "train_loss", "val_loss", "seconds"])
        fh.flush()
    return fh, w


def main():
    ap = parser(__doc__)
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds per configuration; stops at the last evaluation that fits")
    ap.add_argument("--graphs", action="store_true",
                    help="replay each rank's forward and backward as a CUDA graph")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help=f"print torch.profiler's table of steps {PROFILE_FROM} to "
                         f"{PROFILE_FROM - 1}+K (CPU and CUDA time by phase and op)")
    args = ap.parse_args()
    global DEVICE, PROFILING
    DEVICE = torch.device(args.device)
    PROFILING = args.profile > 0
    if args.graphs and DEVICE.type != "cuda":
        ap.error("--graphs needs --device cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    task, val = checked(ap, args)
    if any(parse_config(c)["kind"] == "lowbit" for c in args.configs):
        lowbit_torch.load()  # built (or loaded) before the clock starts: --budget is training time
    fh, w = open_csv(args.out)  # one file per process: rows are not locked
    with fh:
        for cfg in args.configs:
            run(cfg, args, task, val, w, fh)


if __name__ == "__main__":
    main()
