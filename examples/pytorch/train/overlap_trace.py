"""Does the lowbit DDP hook's communication overlap the backward pass? A torch.profiler
trace of a few DDP steps, reduced to its kernels, and a picture of them.

    # on the GPU machine (one GPU: ranks share it over gloo and the node backend)
    PYTHONPATH=.. torchrun --nproc-per-node 2 overlap_trace.py run --out kernels.csv
    # anywhere (standard library only)
    python3 overlap_trace.py draw kernels.csv --svg overlap.svg

`run` trains a stack of `--layers` linear layers of `--width` (each layer's gradient a
bucket of its own at the default `--bucket-mb`) with lowbit's hook at `--bits`, profiles
`--steps` steps after `--warmup`, and rank 0 writes every CUDA kernel of the profile as a
row (stream, start_us, dur_us, lowbit, name). lowbit's kernels are told by their names
(its codec, reduction and transfer kernels); the others are the model's forward, backward
and optimizer. `draw` prints how much of lowbit's kernel time runs while a kernel of
another stream runs (the overlap), which streams lowbit's kernels ran on and whether any ran
on the stream of the model's kernels (the caller's), and writes a timeline as SVG: a lane
per stream, lowbit's kernels in orange.
"""

import argparse
import csv
import os
import re
import sys

FIELDS = ["stream", "start_us", "dur_us", "lowbit", "name"]
# lowbit's kernels (codec, reduction, transfer: what the hook launches) are all in namespace
# lowbit, so their demangled names start with it; matching bare kernel names would also take
# torch's own (at::native::reduce_kernel is the optimizer's norm)
LOWBIT = re.compile(r"^(?:void\s+)?lowbit::")


def kernels_of_trace(events):
    """Kernel rows from a chrome trace's events (torch.profiler's export)."""
    rows = []
    for e in events:
        if not isinstance(e, dict) or e.get("cat") != "kernel" or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        name = e.get("name", "")
        rows.append({"stream": int(args.get("stream", -1)), "start_us": float(e["ts"]),
                     "dur_us": float(e.get("dur", 0.0)),
                     "lowbit": int(bool(LOWBIT.search(name))), "name": name[:160]})
    rows.sort(key=lambda r: r["start_us"])
    return rows


def _union(intervals):
    """Disjoint, sorted (start, end) covering the same time as `intervals`."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _intersection(a, b):
    """Length of the time two disjoint sorted interval lists share."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(rows):
    """{lowbit_us, overlapped_us, share, lowbit_streams, caller_stream, on_caller} where
    the caller's stream is the one most of the model's kernel time ran on."""
    ours = [r for r in rows if r["lowbit"]]
    theirs = [r for r in rows if not r["lowbit"]]
    busy = {}
    for r in theirs:
        busy[r["stream"]] = busy.get(r["stream"], 0.0) + r["dur_us"]
    caller = max(busy, key=busy.get) if busy else None
    mine = _union([(r["start_us"], r["start_us"] + r["dur_us"]) for r in ours])
    total = sum(e - s for s, e in mine)
    shared = 0.0
    for stream in {r["stream"] for r in ours}:
        # time a lowbit kernel of this stream runs beside a model kernel of another stream
        a = _union([(r["start_us"], r["start_us"] + r["dur_us"]) for r in ours
                    if r["stream"] == stream])
        b = _union([(r["start_us"], r["start_us"] + r["dur_us"]) for r in theirs
                    if r["stream"] != stream])
        shared += _intersection(a, b)
    return {"lowbit_us": total, "overlapped_us": shared,
            "share": shared / total if total > 0 else 0.0,
            "lowbit_streams": sorted({r["stream"] for r in ours}), "caller_stream": caller,
            "on_caller": sum(1 for r in ours if r["stream"] == caller)}


def svg(rows, width=1200, lane=26):
    """A timeline: a lane per stream (the caller's first), a rectangle per kernel."""
    if not rows:
        raise ValueError("overlap_trace: no kernels to draw")
    t0 = min(r["start_us"] for r in rows)
    t1 = max(r["start_us"] + r["dur_us"] for r in rows)
    streams = sorted({r["stream"] for r in rows},
                     key=lambda s: -sum(r["dur_us"] for r in rows if r["stream"] == s
                                        and not r["lowbit"]))
    left, top = 110, 30
    scale = (width - left - 10) / max(t1 - t0, 1e-9)
    height = top + lane * len(streams) + 40
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18">CUDA kernels by stream, rank 0 (orange: lowbit\'s hook; '
           'blue: the model)</text>' % left]
    for i, s in enumerate(streams):
        y = top + i * lane
        out.append('<text x="4" y="%d">stream %d</text>' % (y + lane * 0.65, s))
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#ddd"/>' % (
            left, width - 10, y + lane - 2, y + lane - 2))
    for r in rows:
        y = top + streams.index(r["stream"]) * lane
        x = left + (r["start_us"] - t0) * scale
        w = max(r["dur_us"] * scale, 0.5)
        color = "#e8871e" if r["lowbit"] else "#3a6ea5"
        out.append('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"/>' % (
            x, y + 3, w, lane - 8, color))
    axis = top + lane * len(streams) + 16
    span_ms = (t1 - t0) / 1000.0
    ticks = 10
    for k in range(ticks + 1):
        x = left + (width - left - 10) * k / ticks
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%.1f ms</text>' % (
            x, axis, span_ms * k / ticks))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def read_rows(path):
    """A kernels CSV's rows; whose kernel each is comes from its name, as run tells it now."""
    with open(path, newline="") as f:
        return [{"stream": int(r["stream"]), "start_us": float(r["start_us"]),
                 "dur_us": float(r["dur_us"]), "lowbit": int(bool(LOWBIT.search(r["name"]))),
                 "name": r["name"]} for r in csv.DictReader(f)]


def draw(args):
    rows = read_rows(args.csv)
    o = overlap(rows)
    print("lowbit kernels: %.1f us on streams %s; %.1f us (%.0f%%) beside the model's kernels "
          "on other streams; %d on the caller's stream %s" % (
              o["lowbit_us"], o["lowbit_streams"], o["overlapped_us"], 100 * o["share"],
              o["on_caller"], o["caller_stream"]))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(rows))
    return 0


def run(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.profiler import ProfilerActivity, profile

    import lowbit_torch

    import ranks

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # a GPU per rank (NCCL), or ranks sharing one (gloo for DDP, lowbit's node backend)
    device = ranks.init_group(rank, int(os.environ.get("LOCAL_RANK", 0)), world, cuda=True)
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = nn.Sequential(*layers).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index],
                                                    bucket_cap_mb=args.bucket_mb)
    state = lowbit_torch.DDPState(bits=args.bits, crossover=0)
    ddp.register_comm_hook(state, lowbit_torch.ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        ddp(x).square().mean().backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    if rank == 0:
        trace = args.out + ".trace.json"
        prof.export_chrome_trace(trace)
        import json

        with open(trace) as f:
            events = json.load(f).get("traceEvents", [])
        rows = kernels_of_trace(events)
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        print("%d kernels (%d lowbit) -> %s" % (len(rows), sum(r["lowbit"] for r in rows),
                                                args.out), flush=True)
    lowbit_torch.release()  # lowbit borrows the group's communicator: it goes first
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="profile DDP steps with lowbit's hook (under torchrun)")
    r.add_argument("--out", required=True, help="kernels CSV (rank 0)")
    r.add_argument("--layers", type=int, default=8)
    r.add_argument("--width", type=int, default=4096)
    r.add_argument("--batch", type=int, default=8192)
    r.add_argument("--bits", type=int, default=4)
    r.add_argument("--bucket-mb", type=float, default=64.0)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=2)
    d = sub.add_parser("draw", help="overlap figures and an SVG timeline from a kernels CSV")
    d.add_argument("csv")
    d.add_argument("--svg", default="")
    args = ap.parse_args(argv)
    return run(args) if args.cmd == "run" else draw(args)


if __name__ == "__main__":
    sys.exit(main())
