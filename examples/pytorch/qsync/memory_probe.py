"""Where a training step's peak memory goes, for validate.py's cases on one GPU.

    lowbit-qsync-memory-probe [--cases cnn-b1:fp32,cnn-b1:bf16,cnn-b256:fp32]

After three warm steps of validate.py's own step (fused Adam, cuDNN benchmark off) it
runs one more and prints torch.cuda.memory_allocated at its phases (grads freed, after
forward, after backward, after the optimizer), the peak up to each, the parameters and
the optimizer state, and the bytes of cuBLAS workspaces the step keeps (what
torch._C._cuda_clearCublasWorkspaces() releases): lowbit-plan's device profile counts
those as `workspace_mib`, the rest of a peak as weights, gradients, optimizer state,
activations and each op's scratch.
"""

import argparse
import sys

MiB = 2.0**20


def probe(torch, v, ex, case, precision):
    model, forward_loss = v.make_case(torch, case, v.CASES[case], "cuda")
    opt = v.new_optimizer(torch, model)
    context = lambda: ex.precision_context(precision, "cuda")  # noqa: E731
    step = v.training_step(torch, model, opt, forward_loss, context)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warm = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    marks = []

    def mark(what):
        torch.cuda.synchronize()
        marks.append((what, torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()))

    opt.zero_grad(set_to_none=True)
    mark("gradients freed")
    with context():
        loss = forward_loss()
    mark("after forward")
    loss.backward()
    mark("after backward")
    opt.step()
    mark("after the optimizer")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                if torch.is_tensor(t))
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    cublas = before - torch.cuda.memory_allocated()
    print("%s %s: parameters %.1f MiB, optimizer state %.1f MiB, cuBLAS workspaces %.1f MiB, "
          "allocated after the warm steps %.1f MiB" % (
              case, precision, params / MiB, state / MiB, cublas / MiB, warm / MiB))
    for what, now, peak in marks:
        print("    %-22s allocated %9.1f MiB   peak so far %9.1f MiB" % (what, now / MiB, peak / MiB))
    del model, opt, step, loss
    v.free_memory(torch)
    torch._C._cuda_clearCublasWorkspaces()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="cnn-b1:fp32,cnn-b1:bf16,cnn-b256:fp32",
                    help="comma list of CASE:PRECISION (validate.py's cases; fp32, fp16, bf16)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("memory_probe.py: needs a CUDA device", file=sys.stderr)
        return 2
    from . import export as ex
    from . import validate as v

    torch.backends.cudnn.benchmark = False
    for item in args.cases.split(","):
        case, _, precision = item.partition(":")
        if case not in v.CASES or precision not in ex.DTYPES:
            ap.error("unknown case or precision: %r" % item)
        probe(torch, v, ex, case, precision)
    return 0


if __name__ == "__main__":
    sys.exit(main())
