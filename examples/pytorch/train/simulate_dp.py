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

A configuration is "bf16" (the baseline: each rank's gradient rounded to bf16, summed in
fp32, rounded to bf16, as a bf16 all-reduce), "fp32", or b<bits>-<grid>-<feedback>
[-stochastic][-warm<steps>] with grid zero|full and feedback none|residual|residual_bf16|
residual_stage2|ef21|damped<beta> (a residual kept at beta times the error: e = beta *
(c - D(Q(c)))); residual_stage2 also keeps a residual on the owner's re-encoding of the
reduced shard (more than two ranks), as lowbit's residual<float, true> does;
-warm<k> sends full precision for the first k steps.

The seeds of a configuration train side by side in one process, a step each in turn, so
that a wall-clock budget (--budget seconds) stops them all at the same evaluated step.
Seed s fixes the model's initialisation and the data order, the same for every
configuration: gaps are paired per seed.
"""

import argparse
import csv
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import Corpus  # noqa: E402

import lowbit_torch  # noqa: E402

DEVICE = torch.device("cuda")  # --device cpu: a smoke test through the host codec


def parse_config(name):
    if name in ("bf16", "fp32"):
        return {"name": name, "kind": name}
    parts = name.split("-")
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

    def qd(self, x, step, rank, stage=0):
        c = self.cfg
        f = lowbit_torch.encode(x, c["bits"], c["grid"], c["rounding"], seed=self.seed,
                                step=step, rank=rank + 1000 * stage)
        return lowbit_torch.decode(f, x.numel(), c["bits"], c["grid"])

    def reduce(self, grads, step):
        """grads: (P, n) fp32, one row per rank. Returns the average every rank gets."""
        c, P = self.cfg, self.P
        if c["kind"] == "fp32" or (c["kind"] == "lowbit" and step < c["warm"]):
            return grads.mean(dim=0)
        if c["kind"] == "bf16":
            acc = grads.to(torch.bfloat16).float().sum(dim=0)
            return (acc / P).to(torch.bfloat16).float()
        fb = self.fb
        acc = torch.zeros(self.n, device=grads.device)
        for r in range(P):  # rank order, fp32, as the decode-sum kernel
            if fb == "none":
                acc += self.qd(grads[r], step, r)
            elif fb in ("residual", "residual_bf16", "residual_stage2"):
                x = grads[r] + self.e[r].float()
                d = self.qd(x, step, r)
                self.e[r] = ((x - d) * self.beta).to(self.e.dtype)
                acc += d
            else:  # ef21: send Q(x - g_i); g_i += D
                d = self.qd(grads[r] - self.e[r], step, r)
                self.e[r] += d
                acc += d
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


def build_model(args, device, seed):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=256, n_positions=args.seq, n_embd=args.width,
                     n_layer=args.layers, n_head=args.width // 64, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).to(device)


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def val_loss(model, val):
    model.eval()
    total = 0.0
    for b in val:
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            total += _loss(model, b).item()
    model.train()
    return total / len(val)


def _loss(model, b):
    """Next-byte cross-entropy of a batch of seq + 1 bytes."""
    logits = model(b[:, :-1]).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), b[:, 1:].reshape(-1))


class Run:
    """One seed of one configuration: its model, optimizer, data order and reducer."""

    def __init__(self, cfg_name, seed, args):
        device = DEVICE
        self.cfg_name, self.seed, self.args = cfg_name, seed, args
        self.model = build_model(args, device, seed)
        params = [p for p in self.model.parameters() if p.requires_grad]
        n = sum(p.numel() for p in params)
        self.flat = torch.zeros(n, device=device)
        off = 0
        for p in params:  # gradients accumulate straight into the flat buffer
            p.grad = self.flat[off:off + p.numel()].view_as(p)
            off += p.numel()
        self.opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                     fused=device.type == "cuda")
        self.reducer = Reducer(parse_config(cfg_name), args.ranks, n, device, seed)
        self.grads = torch.empty(args.ranks, n, device=device)
        self.gen = torch.Generator().manual_seed(seed)
        self.loss = float("nan")

    def step(self, step, corpus):
        args = self.args
        for r in range(args.ranks):
            self.flat.zero_()
            b = corpus.batch(self.gen, args.batch)
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                loss = _loss(self.model, b)
            loss.backward()
            self.grads[r].copy_(self.flat)
        self.flat.copy_(self.reducer.reduce(self.grads, step))
        for group in self.opt.param_groups:
            group["lr"] = lr_at(step, args)
        self.opt.step()
        self.loss = loss


def run(cfg_name, args, corpus, val, writer, fh):
    """Trains every seed of cfg_name side by side until --steps or the budget."""
    runs = [Run(cfg_name, seed, args) for seed in args.seeds]
    t0 = time.time()
    for step in range(args.steps):
        for r in runs:
            r.step(step, corpus)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            diverged = False
            for r in runs:
                v = val_loss(r.model, val)
                writer.writerow([cfg_name, r.seed, args.ranks, step + 1, f"{r.loss.item():.5f}",
                                 f"{v:.5f}", f"{time.time() - t0:.1f}"])
                diverged |= not math.isfinite(v)
            fh.flush()
            if diverged:
                break
            per_eval = (time.time() - t0) / (step + 1) * args.eval_every
            if args.budget and time.time() - t0 + per_eval > args.budget:
                break


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--val-seqs", type=int, default=512)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--configs", nargs="+", default=["bf16", "b4-zero-residual"])
    ap.add_argument("--out", default="simulate_dp.csv")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds per configuration; stops at the last evaluation that fits")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    corpus = Corpus(DEVICE, args.seq)
    val = corpus.val_batches(args.val_seqs, 64)
    new = not os.path.exists(args.out)
    with open(args.out, "a", newline="") as fh:
        w = csv.writer(fh)
        if new:
            w.writerow(["config", "seed", "ranks", "step", "train_loss", "val_loss", "seconds"])
        for cfg in args.configs:
            run(cfg, args, corpus, val, w, fh)


if __name__ == "__main__":
    main()
