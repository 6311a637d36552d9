"""FSDP2 (``fully_shard``) reduce-scatter and all-gather backed by lowbit.

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_reduce_scatter(lowbit_torch.ReduceScatter(bits=4))
    # optional, lossy for the weights every rank computes with:
    #       module.set_custom_all_gather(lowbit_torch.AllGather(bits=8))

(or ``lowbit_torch.apply_fsdp(model, ...)``). Give each FSDP module its own object: its
error-feedback state belongs to that module's gradients.

FSDP lays a flat buffer out as P equal per-rank chunks; lowbit shards in whole codec
blocks (128 values). When a chunk is not a whole number of blocks, the chunks are
copied into block-padded staging buffers around the call (one extra pass over the
data, the padding zero so that it cannot change a block's scale), taken from torch's
caching allocator on the current stream for the call alone; a chunk of a multiple of
128 values goes straight through. Residual feedback keeps fp32 state of the unsharded
size on every rank, per module.
"""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

try:  # torch's protocol classes, where this torch has them
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:  # pragma: no cover
    _AllGatherBase = _ReduceScatterBase = object

from ._build import collectives as extension
from .comm import communicator
from .codec import whole_blocks
from .defaults import gradient_grid


def _padded_chunks(x, world, chunk, padded):
    """x's `world` chunks of `chunk` values, each followed by zeros up to `padded`."""
    out = torch.empty(world, padded, dtype=x.dtype, device=x.device)
    out[:, chunk:].zero_()
    out[:, :chunk].copy_(x.view(world, chunk))
    return out.view(-1)


class _Handles:
    """What both collectives share: FSDP's allocate(), one lowbit collective per buffer
    shape (made on first use) and a call counter."""

    def _setup(self):
        self._handles = {}
        self.calls = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def _handle(self, key, make):
        h = self._handles.get(key)
        if h is None:
            h = self._handles[key] = make()
        self.calls += 1
        return h


class ReduceScatter(_Handles, _ReduceScatterBase):
    """lowbit's reduce_scatter for ``FSDPModule.set_custom_reduce_scatter``.

    bits 1, 2, 4 or 8; grid "zero", "full" or None (``gradient_grid(bits)``: "zero" from
    4 bits up, "full" at 1 and 2); rounding "nearest" or "stochastic"; feedback "none" or
    "residual" (fp32 state). float32 and bfloat16 gradients
    (FSDP's reduce_dtype). op: AVG, or SUM (FSDP's pre-divided path); other ops raise.
    """

    def __init__(self, bits=4, grid=None, rounding="nearest", feedback="residual", seed=0):
        self.grid = gradient_grid(bits) if grid is None else grid
        self.bits, self.rounding = bits, rounding
        self.feedback, self.seed = feedback, seed
        self._setup()  # a collective per (count, dtype, average)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        average = _average(op)
        world = group.size()
        count = input_tensor.numel()
        if count % world != 0 or output_tensor.numel() != count // world:
            raise ValueError(f"lowbit_torch.ReduceScatter: input of {count} values and output of "
                             f"{output_tensor.numel()} do not form {world} equal chunks")
        chunk = count // world
        padded = whole_blocks(chunk)  # lowbit shards in whole blocks
        h = self._handle((padded * world, input_tensor.dtype, average),
                         lambda: extension().ShardCollective.reduce_scatter(
                             communicator(group), input_tensor.dtype, padded * world, self.bits,
                             self.grid, self.rounding, self.feedback, average, self.seed))
        if padded == chunk:
            h.run(input_tensor, output_tensor)
            return None
        src = _padded_chunks(input_tensor, world, chunk, padded)
        dst = torch.empty(padded, dtype=input_tensor.dtype, device=input_tensor.device)
        h.run(src, dst)
        output_tensor.copy_(dst[:chunk])
        return None


class AllGather(_Handles, _AllGatherBase):
    """lowbit's all_gather for ``FSDPModule.set_custom_all_gather``: each rank's shard is
    encoded once and every rank decodes every shard (its own too), so all ranks hold the
    same unsharded weights. Lossy: the forward and backward passes see quantized weights
    (8 bits by default). float32 and bfloat16 parameters."""

    def __init__(self, bits=8, grid="full", rounding="nearest", seed=0):
        self.bits, self.grid, self.rounding, self.seed = bits, grid, rounding, seed
        self._setup()  # a collective per (count, dtype)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        world = group.size()
        chunk = input_tensor.numel()
        if output_tensor.numel() != chunk * world:
            raise ValueError(f"lowbit_torch.AllGather: output has {output_tensor.numel()} values, "
                             f"expected {world} x {chunk}")
        padded = whole_blocks(chunk)  # lowbit shards in whole blocks
        h = self._handle((padded * world, input_tensor.dtype),
                         lambda: extension().ShardCollective.all_gather(
                             communicator(group), input_tensor.dtype, padded * world, self.bits,
                             self.grid, self.rounding, self.seed))
        if padded == chunk:
            h.run(input_tensor, output_tensor)
            return None
        src = _padded_chunks(input_tensor, 1, chunk, padded)
        dst = torch.empty(padded * world, dtype=input_tensor.dtype, device=input_tensor.device)
        h.run(src, dst)
        output_tensor.view(world, chunk).copy_(dst.view(world, padded)[:, :chunk])
        return None


def _average(op):
    if op == dist.ReduceOp.AVG:
        return True
    if op == dist.ReduceOp.SUM:
        return False
    raise ValueError(f"lowbit_torch.ReduceScatter: reduce op {op} is not supported (AVG or SUM; "
                     "FSDP uses a pre-multiplied sum when gradient_divide_factor is set: leave "
                     "it unset)")


def apply_fsdp(model, reduce_scatter=None, all_gather=None):
    """Gives every FSDP module of ``model`` its own lowbit collectives: ``reduce_scatter``
    and ``all_gather`` are dicts of keyword arguments for ReduceScatter / AllGather
    (None leaves FSDP's own). Returns the number of modules set."""
    n = 0
    for m in model.modules():
        if isinstance(m, FSDPModule):
            if reduce_scatter is not None:
                m.set_custom_reduce_scatter(ReduceScatter(**reduce_scatter))
            if all_gather is not None:
                m.set_custom_all_gather(AllGather(**all_gather))
            n += 1
    return n
