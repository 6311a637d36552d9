"""A DistributedDataParallel communication hook running lowbit's all-reduce.

    state = lowbit_torch.DDPState(bits=4)
    model.register_comm_hook(state, lowbit_torch.ddp_hook)

Each bucket's flat gradient is averaged over the process group by lowbit's all_reduce,
on the group's own NCCL communicator, enqueued on torch's current stream (the stream
DDP's backward runs on), and the hook returns a completed future: no host wait.
"""

import collections

import torch

from ._build import collectives as extension
from ._build import feedback_rules
from .comm import communicator
from .defaults import gradient_grid

FEEDBACK = feedback_rules("all_reduce")  # the rules compiled (_build.py's table)


class DDPState:
    """Options and per-bucket collectives of the lowbit DDP hook.

    bits: 1, 2, 4 or 8 (may be changed between steps: ``state.bits = 8``).
    grid: "zero" (exact zeros survive) or "full" (all 2^bits levels); None (the default)
        takes ``gradient_grid(bits)`` of the bits given here: "zero" from 4 bits up,
        "full" at 1 and 2. It stays when ``state.bits`` changes later.
    rounding: "nearest" or "stochastic" (keyed by seed, step, rank, index).
    feedback: one of FEEDBACK, the rules compiled (the table in _build.py): "none",
        "residual" (fp32 state), "residual_bf16", "residual_stage2" (residual plus one on
        the shard owner's second quantization, which lowbit's two_phase algorithm makes
        on more than two ranks) or "ef21".
    crossover: "auto" (measured on the group's links on first use, per dtype and
        width), an int (bytes: smaller buckets take NCCL's plain all-reduce), or 0
        (always low-bit). Calls that take the plain path are counted in stats().
    seed: stochastic rounding's seed.

    One lowbit collective per bucket index, with its feedback state (the state belongs
    to the bucket's tensor). When DDP rebuilds its buckets after the first iteration, a
    bucket whose size changed gets a new collective and fresh feedback (counted as a
    rebuild).
    """

    def __init__(self, process_group=None, bits=4, grid=None, rounding="nearest",
                 feedback="residual", crossover="auto", seed=0, calibrate_max_bytes=256 << 20):
        if feedback not in FEEDBACK:
            raise ValueError(f"lowbit_torch.DDPState: feedback must be one of {FEEDBACK}, "
                             f"got {feedback!r}")
        if not (crossover == "auto" or (isinstance(crossover, int) and crossover >= 0)):
            raise ValueError("lowbit_torch.DDPState: crossover must be 'auto' or bytes >= 0, "
                             f"got {crossover!r}")
        self.group = process_group
        self.comm = communicator(process_group)
        self.bits = bits
        self.grid = gradient_grid(bits) if grid is None else grid
        self.rounding = rounding
        self.feedback = feedback
        self.crossover = crossover
        self.seed = seed
        self.calibrate_max_bytes = calibrate_max_bytes
        self._check_bits(bits)
        self._buckets = {}  # bucket index -> AllReduce handle
        self._calibrated = {}  # (dtype, bits) -> (crossover bytes, largest size measured)
        self._stats = collections.Counter()

    @staticmethod
    def _check_bits(bits):
        if bits not in (1, 2, 4, 8):
            raise ValueError(f"lowbit_torch.DDPState: bits must be 1, 2, 4 or 8, got {bits!r}")

    def stats(self):
        """Counters: lowbit_calls / nccl_calls (below the crossover) and their bytes,
        rebuilds, calibrations; and the crossover in use per (dtype, bits)."""
        s = dict(self._stats)
        s["crossover_bytes"] = {f"{d}/{b}": c for (d, b), (c, _) in self._calibrated.items()}
        return s

    def _new_handle(self, dtype, count):
        fixed = 0 if self.crossover == "auto" else self.crossover
        return extension().AllReduce(self.comm, dtype, count, self.grid, self.rounding,
                                     self.feedback, True, self.seed, fixed, "automatic")

    def _handle(self, index, tensor):
        h = self._buckets.get(index)
        if h is not None and h.max_count == tensor.numel() and h.dtype == tensor.dtype:
            return h
        if h is not None:
            self._stats["rebuilds"] += 1
        h = self._buckets[index] = self._new_handle(tensor.dtype, tensor.numel())
        return h

    def _crossover(self, h, tensor):
        """The crossover for this call's dtype and width: measured when 'auto' at the first
        bucket of each (dtype, bits) and again for a larger bucket, up to
        calibrate_max_bytes (collective: every rank reaches the same bucket at the same
        point). It runs on a probe collective of its own, so that no bucket's feedback
        state is touched."""
        if self.crossover != "auto" or self.comm.size == 1 or self.feedback == "ef21":
            return h.crossover_bytes
        key = (tensor.dtype, self.bits)
        nbytes = tensor.numel() * tensor.element_size()
        known = self._calibrated.get(key)
        measurable = min(nbytes, self.calibrate_max_bytes)
        if known is None or measurable > known[1]:
            probe = self._new_handle(tensor.dtype, measurable // tensor.element_size())
            crossover = probe.calibrate(self.bits, measurable)
            del probe
            self._calibrated[key] = (crossover, measurable)
            self._stats["calibrations"] += 1
        return self._calibrated[key][0]

    def all_reduce_(self, index, tensor):
        """Averages ``tensor`` (a CUDA, contiguous float32/float16/bfloat16 tensor) over
        the group in place, enqueued on the current stream."""
        self._check_bits(self.bits)
        if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
            raise ValueError("lowbit_torch: the bucket must be a CUDA tensor")
        if not tensor.is_contiguous():
            raise ValueError("lowbit_torch: the bucket must be contiguous")
        h = self._handle(index, tensor)
        crossover = self._crossover(h, tensor)
        h.crossover_bytes = crossover
        nbytes = tensor.numel() * tensor.element_size()
        plain = nbytes < crossover and self.feedback != "ef21" and self.comm.size > 1
        kind = "nccl" if plain else "lowbit"
        self._stats[f"{kind}_calls"] += 1
        self._stats[f"{kind}_bytes"] += nbytes
        h.run(tensor, tensor, self.bits)
        return tensor

    def worker_state(self, index):
        """A copy of bucket ``index``'s feedback state (residual e or EF21's g_i)."""
        h = self._buckets[index]
        return h.worker_state(h.max_count)


def ddp_hook(state, bucket):
    """DDP communication hook: ``model.register_comm_hook(state, ddp_hook)``."""
    tensor = bucket.buffer()
    state.all_reduce_(bucket.index(), tensor)
    fut = torch.futures.Future(devices=[tensor.device])
    fut.set_result(tensor)
    return fut
