"""simulate_dp.py's experiment on REAL ranks: P processes (torchrun), each a rank of a
DistributedDataParallel model whose gradients go through the configuration's all-reduce:
lowbit's DDP hook for b<bits>-<grid>-<feedback>[-stochastic], torch's bf16_compress_hook
for bf16, DDP's own all-reduce for fp32. Rank 0 writes simulate_dp.py's CSV rows, so
that a real run and its simulation are compared row by row (scripts/training-docs,
sweep.py's merge):

  torchrun --nproc-per-node 2 real_dp.py --configs bf16 b4-zero-residual --seeds 0 1 2 \\
      --out real.csv <simulate_dp.py's model, data and schedule arguments>

Everything the simulation fixes is the same here: seed s fixes the initialisation and
the data order (every rank draws the step's P batches from the seed's generator, in
rank order, and keeps its own, as the simulation computes rank r's gradient from the
r-th), the optimizer, the learning-rate schedule, the validation set, bf16 autocast.
What differs is the all-reduce itself: DDP pre-divides each gradient by P and reduces it
in buckets (in reverse parameter order, 25 MB by default), so a lowbit frame's blocks
of 128 fall elsewhere than in the simulation's one frame of the whole gradient. The
seeds of a configuration run one after another; the all-reduce is lowbit's from the
first step (crossover 0, as simulated) unless --crossover says otherwise.
"""

import os
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import ranks
import simulate_dp as sim


def hook(cfg, ddp, seed, crossover):
    """Registers the configuration's all-reduce on ddp; the lowbit state, or None."""
    if cfg["kind"] == "bf16":
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
    if cfg["kind"] != "lowbit":
        return None
    state = sim.lowbit_torch.DDPState(bits=cfg["bits"], grid=cfg["grid"],
                                      rounding=cfg["rounding"], feedback=cfg["feedback"],
                                      crossover=crossover, seed=seed)
    ddp.register_comm_hook(state, sim.lowbit_torch.ddp_hook)
    return state


def train(name, seed, args, task, val, writer, fh, rank, world, device):
    """One seed of one configuration; rows written by rank 0. Returns the lowbit
    state's counters (or None)."""
    cfg = sim.parse_config(name)
    model = task.build(device, seed)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_mb)
    state = hook(cfg, ddp, seed, args.crossover)
    opt = sim.optimizer([p for p in model.parameters() if p.requires_grad], args, device)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    for step in range(args.until or args.steps):
        batches = [task.batch(gen, args.batch) for _ in range(world)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = task.loss(ddp, batches[rank])
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = sim.lr_at(step, args)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 in (args.steps, args.until):
            last = loss.detach().float().clone()  # the simulation reports the last rank's
            dist.broadcast(last, src=world - 1)
            v = sim.val_loss(task, model, val)
            if rank == 0:
                writer.writerow([name, seed, world, step + 1, f"{last.item():.5f}", f"{v:.5f}",
                                 f"{time.time() - t0:.1f}"])
                fh.flush()
            if v != v or v in (float("inf"), float("-inf")):
                break
    stats = state.stats() if state is not None else None
    del ddp, opt, state
    return stats


def main():
    ap = sim.parser(__doc__)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    ap.add_argument("--crossover", type=int, default=0,
                    help="bytes: smaller buckets take NCCL's plain all-reduce (default 0: "
                         "always lowbit, as the simulation)")
    ap.set_defaults(ranks=None)
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.ranks is not None and args.ranks != world:
        ap.error(f"--ranks {args.ranks} but the process group has {world} (torchrun "
                 "--nproc-per-node sets it)")
    args.ranks = world
    try:
        configs = [sim.parse_config(name) for name in args.configs]
    except ValueError as e:
        ap.error(str(e))
    for c in configs:
        if c.get("warm") or c.get("feedback", "").startswith("damped"):
            ap.error(f"{c['name']}: -warm and damped feedback are simulated only")
    lowbit = any(c["kind"] == "lowbit" for c in configs)
    cuda = args.device == "cuda"
    if not cuda and lowbit:
        ap.error("lowbit's collectives need --device cuda (bf16 and fp32 run over gloo)")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29513")
    device = ranks.init_group(rank, local, world, cuda)
    args.device = str(device)
    sim.DEVICE = device  # simulate_dp's val_loss autocasts on it
    torch.backends.cuda.matmul.allow_tf32 = True
    task, val = sim.checked(ap, args)
    fh, writer = sim.open_csv(args.out) if rank == 0 else (open(os.devnull, "w"), None)
    with fh:
        for name in args.configs:
            for seed in args.seeds:
                stats = train(name, seed, args, task, val, writer, fh, rank, world, device)
                if rank == 0 and stats is not None:
                    print(f"{name} seed {seed}: {stats}", flush=True)
    if lowbit:
        sim.lowbit_torch.release()  # lowbit borrows the group's communicator: it goes first
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
