"""A GPT-2-like byte-level language model trained with DistributedDataParallel, its
gradients all-reduced by lowbit's hook, by DDP's default all-reduce or by torch's
bf16_compress_hook (or not at all: --comm none, each rank's own gradient, the step's
compute alone): the example of using lowbit from a DDP script, and the step-time
comparison (step_time.py runs it in each link regime and writes the CSV).

  torchrun --nproc-per-node 2 examples/pytorch/train/train_gpt_ddp.py --comm lowbit --bits 4
  torchrun --nproc-per-node 2 examples/pytorch/train/train_gpt_ddp.py --comm nccl
  torchrun --nproc-per-node 2 examples/pytorch/train/train_gpt_ddp.py --comm bf16

Each rank draws its own batches (seeded by --seed and its rank) from the Python standard
library's sources; rank 0 prints the validation loss at the end, the median step time
over the timed steps (CUDA events around forward, backward with the all-reduce, and the
optimizer step; the host clock on the CPU), and the hook's counters. --device cpu runs
the nccl, bf16 and none paths over gloo as a smoke test (lowbit's collectives need CUDA).
"""

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import ranks
from corpus import Corpus


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comm", choices=["lowbit", "nccl", "bf16", "none"], default="lowbit",
                    help="none: DDP's no_sync, no all-reduce (the compute alone; each "
                    "rank's model then drifts on its own gradients)")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--feedback", default="residual")
    ap.add_argument("--grid", help="zero or full; default: lowbit_torch.gradient_grid(bits)")
    ap.add_argument("--rounding", default="nearest")
    ap.add_argument("--crossover", default="auto", help="'auto' or bytes")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--timed", type=int, default=50, help="the last steps timed")
    ap.add_argument("--batch", type=int, default=32, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--val-seqs", type=int, default=256, help="validation sequences")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.val_seqs < 32 or args.val_seqs % 32:
        ap.error(f"--val-seqs must be a positive multiple of 32 (the validation batch), "
                 f"got {args.val_seqs}")
    if not 0 < args.timed <= args.steps:
        ap.error(f"--timed must be in 1..--steps ({args.steps}), got {args.timed}")
    return args


def main():
    args = parse_args()
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    cuda = args.device == "cuda"
    if args.comm == "lowbit" and not cuda:
        sys.exit("train_gpt_ddp.py: --comm lowbit needs --device cuda")
    # a GPU per rank (NCCL), or ranks sharing the GPUs there are (gloo; lowbit's node backend)
    device = ranks.init_group(rank, local, world, cuda)
    train(args, rank, world, device, cuda)
    # lowbit's collectives borrow the process group's communicator: they go first.
    if args.comm == "lowbit":
        import lowbit_torch

        lowbit_torch.release()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


class StepClock:
    """Milliseconds of one step: CUDA events on the GPU, the host clock on the CPU (where
    every operation is synchronous)."""

    def __init__(self, cuda):
        self.cuda = cuda
        if cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def elapsed_ms(self):
        if not self.cuda:
            return (time.perf_counter() - self.t0) * 1e3
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


def train(args, rank, world, device, cuda):
    """Trains, evaluates and prints (rank 0); every object it made is gone on return."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)  # the same initial model on every rank
    cfg = GPT2Config(vocab_size=256, n_positions=args.seq, n_embd=args.width,
                     n_layer=args.layers, n_head=max(1, args.width // 64), resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if cuda else None, bucket_cap_mb=args.bucket_mb)
    state = None
    if args.comm == "lowbit":
        import lowbit_torch

        crossover = args.crossover if args.crossover == "auto" else int(args.crossover)
        state = lowbit_torch.DDPState(bits=args.bits, grid=args.grid, rounding=args.rounding,
                                      feedback=args.feedback, crossover=crossover,
                                      seed=args.seed)
        ddp.register_comm_hook(state, lowbit_torch.ddp_hook)
    elif args.comm == "bf16":
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)

    corpus = Corpus(device, args.seq)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=cuda)
    amp = torch.autocast(device.type, dtype=torch.bfloat16)
    times = []
    for step in range(args.steps):
        b = corpus.batch(gen, args.batch)
        timed = step >= args.steps - args.timed
        if timed:
            clock = StepClock(cuda)
        opt.zero_grad(set_to_none=True)
        with ddp.no_sync() if args.comm == "none" else contextlib.nullcontext():
            with amp:
                logits = ddp(b[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256),
                                                     b[:, 1:].reshape(-1))
            loss.backward()
        opt.step()
        if timed:
            times.append(clock.elapsed_ms())

    ddp.eval()
    with torch.no_grad(), amp:
        val = [torch.nn.functional.cross_entropy(
            ddp.module(v[:, :-1]).logits.float().reshape(-1, 256), v[:, 1:].reshape(-1))
            for v in corpus.val_batches(args.val_seqs, 32)]
    val_loss = torch.stack(val).mean()
    # identical parameters give identical losses; under --comm none the ranks' mean
    dist.all_reduce(val_loss)
    if rank == 0:
        print(f"comm={args.comm} bits={args.bits if args.comm == 'lowbit' else '-'} "
              f"ranks={world} group={dist.get_backend()} steps={args.steps} "
              f"val_loss={val_loss.item() / world:.4f}")
        shared = cuda and torch.cuda.device_count() < world
        if times:
            print(f"step time: median {statistics.median(times):.2f} ms over the last "
                  f"{len(times)} steps (min {min(times):.2f}, max {max(times):.2f})"
                  + ("; the ranks share a GPU: not a time of one GPU per rank" if shared else ""))
        if state is not None:
            print(f"lowbit: {state.stats()}")


if __name__ == "__main__":
    main()
