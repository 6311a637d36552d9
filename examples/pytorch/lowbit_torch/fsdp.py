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
128 values goes straight through.

Error feedback costs memory FSDP exists to save, so the default keeps it to the shard:
feedback="shard" holds fp32 feedback for the chunk this rank owns (its shard numel x 4
bytes per module); feedback="residual" holds it for every chunk the rank sends (the
unsharded numel x 4 bytes, P times more); "none" holds nothing (ReduceScatter says why
no shard-size state can correct the other chunks). "residual" is lowbit's own
reduce_scatter with feedback::residual (the state lives in the collective, which applies
the rule as it encodes); "shard" is applied in torch around a collective without feedback
(lowbit's collective has no rule for the own chunk alone). Either way ``state_dict()`` and
``load_state_dict()`` save and restore the state with each buffer's step (the
collective's, stochastic rounding's key), so a resume is bit-identical, and ``stats()``
reports the bytes held. ``lowbit_torch.fsdp_state_dict(model)`` gathers the state of
every module apply_fsdp set.
"""

import collections

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

try:  # torch's protocol classes, where this torch has them
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:  # pragma: no cover
    _AllGatherBase = _ReduceScatterBase = object

from ._build import collectives as extension
from ._state import check_state_options
from .comm import communicator
from .codec import decode, encode, frame_bytes, whole_blocks
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


FEEDBACK = ("none", "shard", "residual")  # ReduceScatter's feedback modes
_STATE_BYTES = 4  # feedback state is fp32: bytes per value


def feedback_numel(feedback, world, chunk):
    """Values of feedback state one rank holds for a reduce-scatter buffer of ``world``
    chunks of ``chunk`` values: none ("none"), its own chunk in whole codec blocks
    ("shard", FSDP's shard size), every chunk it sends ("residual", the unsharded size)."""
    if world == 1:
        return 0  # one rank copies its input: nothing is quantized, nothing to feed back
    padded = whole_blocks(chunk)
    return {"none": 0, "shard": padded, "residual": world * padded}[feedback]


def feedback_bytes(feedback, world, chunk):
    """Bytes of feedback state (fp32) one rank holds for such a buffer."""
    return _STATE_BYTES * feedback_numel(feedback, world, chunk)


class _Buffer:
    """The feedback state of one reduce-scatter buffer shape on this rank, with the
    buffer's collective (``handle``), whose step (the calls made on it) keys stochastic
    rounding. ``residual``: the shard's residual held in torch ("shard": fp32, the padded
    chunk), else None; ``in_collective``: the collective holds the residual of every
    value sent ("residual" on more than one rank: fp32, feedback_numel values)."""

    def __init__(self, key, rank, handle, device, residual=None, in_collective=False):
        self.key, self.rank, self.handle, self.device = key, rank, handle, device
        self.residual, self.in_collective = residual, in_collective

    @property
    def step(self):
        return self.handle.step

    def state(self):
        """The feedback state now, on the buffer's device (None for none): the shard's
        tensor itself, or a copy of the collective's (on the current stream)."""
        if self.in_collective:
            return self.handle.worker_state(self.handle.max_count)
        return self.residual

    def bytes(self):
        if self.in_collective:
            return self.handle.max_count * _STATE_BYTES
        return 0 if self.residual is None else self.residual.numel() * _STATE_BYTES


def _key_dict(key):
    world, padded, dtype, average = key
    return {"world": world, "padded": padded, "dtype": str(dtype).replace("torch.", ""),
            "average": average}


def _key_of(d):
    return (d["world"], d["padded"], getattr(torch, d["dtype"]), d["average"])


class ReduceScatter(_Handles, _ReduceScatterBase):
    """lowbit's reduce_scatter for ``FSDPModule.set_custom_reduce_scatter``.

    bits 1, 2, 4 or 8; grid "zero", "full" or None (``gradient_grid(bits)``: "zero" from
    4 bits up, "full" at 1 and 2); rounding "nearest" or "stochastic"; float32 and
    bfloat16 gradients (FSDP's reduce_dtype). op: AVG, or SUM (FSDP's pre-divided path);
    other ops raise.

    feedback (fp32 state, per buffer shape; ``feedback_bytes`` gives its size):
      "shard" (the default): classic error feedback on the chunk this rank owns, the one
          it quantizes for its own output: its shard numel x 4 bytes. Nearest rounding.
      "residual": classic error feedback on every chunk this rank sends: the unsharded
          numel x 4 bytes (P times the shard), as plain data parallelism would keep.
          lowbit's own residual rule, inside the collective: c = x + e in fp32, the
          frame is Q(c) (c itself, not c rounded to the gradient's dtype), e = c - D(Q(c));
          a block that is not finite leaves its e as it was.
      "none": no state.
    Each rank quantizes all P chunks of its input; classic feedback needs the error of
    each, so only "residual" corrects every quantization, at a memory cost that cancels
    FSDP's saving on the gradients. The owner of a chunk never re-quantizes it (the output
    is the exact sum of the decoded frames), so there is no owner-side error to feed back.

    ``state_dict()`` / ``load_state_dict()`` carry the feedback state and step of every
    buffer; ``stats()`` counts calls, wire bytes and the feedback bytes held.
    """

    def __init__(self, bits=4, grid=None, rounding="nearest", feedback="shard", seed=0):
        if feedback not in FEEDBACK:
            raise ValueError(f"lowbit_torch.ReduceScatter: feedback must be one of {FEEDBACK}, "
                             f"got {feedback!r}")
        if feedback == "shard" and rounding != "nearest":
            # The collective keys a stochastic draw by the element's index in the whole
            # buffer; the codec functions that recompute this rank's chunk count from 0.
            raise ValueError("lowbit_torch.ReduceScatter: feedback='shard' needs "
                             "rounding='nearest' (use feedback='residual' or 'none' with "
                             "stochastic rounding)")
        self.grid = gradient_grid(bits) if grid is None else grid
        self.bits, self.rounding = bits, rounding
        self.feedback, self.seed = feedback, seed
        self.layout = None  # the module's parameter shapes (apply_fsdp), checked on load
        self._buffers = {}  # key -> _Buffer
        self._loaded = {}  # key -> a loaded state's buffer entry, not yet claimed by a call
        self._stats = collections.Counter()
        self._setup()  # a collective per (world, padded chunk, dtype, average)

    # -- the call ---------------------------------------------------------------------

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        average = _average(op)
        world, rank = group.size(), group.rank()
        count = input_tensor.numel()
        if count % world != 0 or output_tensor.numel() != count // world:
            raise ValueError(f"lowbit_torch.ReduceScatter: input of {count} values and output of "
                             f"{output_tensor.numel()} do not form {world} equal chunks")
        chunk = count // world
        padded = whole_blocks(chunk)  # lowbit shards in whole blocks
        key = (world, padded, input_tensor.dtype, average)
        h = self._handle(key, lambda: self._new_collective(group, key))
        buf = self._buffer(key, rank, h, input_tensor.device)
        staged = padded != chunk
        src = _padded_chunks(input_tensor, world, chunk, padded) if staged else input_tensor
        dst = (torch.empty(padded, dtype=input_tensor.dtype, device=input_tensor.device)
               if staged else output_tensor)
        restore = self._shard_feedback(buf, src, rank, padded, in_place_ok=staged)
        h.run(src, dst)
        if restore is not None:
            restore()
        if staged:
            output_tensor.copy_(dst[:chunk])
        self._count(world, chunk, padded, input_tensor.element_size())
        return None

    def _collective_feedback(self, world):
        """The feedback rule the collective of a buffer on ``world`` ranks is built with:
        lowbit's residual for "residual" (the collective holds and applies it), none
        otherwise ("shard" is applied in torch; one rank quantizes nothing)."""
        return "residual" if self.feedback == "residual" and world > 1 else "none"

    def _new_collective(self, group, key):
        """The lowbit collective of a buffer shape (max_count: the padded buffer)."""
        world, padded, dtype, average = key
        return extension().ShardCollective.reduce_scatter(
            communicator(group), dtype, padded * world, self.bits, self.grid, self.rounding,
            self._collective_feedback(world), average, self.seed)

    def _roundtrip(self, x, step, rank):
        """decode(encode(x)) in fp32: what a receiver of x's frame adds, the same kernels
        and keys (seed, step, rank, index from x's first value) as the collective's."""
        frame = encode(x, self.bits, self.grid, self.rounding, seed=self.seed, step=step,
                       rank=rank)
        return decode(frame, x.numel(), self.bits, self.grid, torch.float32)

    def _shard_feedback(self, buf, src, rank, padded, in_place_ok):
        """"shard"'s feedback, in torch, on this rank's own chunk of src before the
        collective sends it: c = x + e; send Q(c); e = c - D(Q(c)), c rounded to src's
        dtype (what the collective quantizes). Returns a function that restores FSDP's
        input after the call, or None. Nothing for "none" and "residual" (the collective's
        own rule) or on one rank (which quantizes nothing)."""
        if buf.residual is None:
            return None
        own = src[rank * padded:(rank + 1) * padded]
        kept = None if in_place_ok else own.clone()  # a shard-size copy to restore FSDP's input
        c = own.float() + buf.residual
        own.copy_(c)  # rounded to src's dtype: what the collective quantizes
        buf.residual.copy_(c - self._roundtrip(own, buf.step, rank))
        return None if kept is None else (lambda: own.copy_(kept))

    # -- state --------------------------------------------------------------------------

    def _buffer(self, key, rank, handle, device):
        """The feedback state of ``key`` on this rank, made (zero) on first use, or taken
        from a loaded state_dict when one was saved for the same buffer shape and rank:
        its residual and step go into ``handle``, the collective (on the current stream,
        before the call that follows) or into torch ("shard")."""
        buf = self._buffers.get(key)
        if buf is not None:
            return buf
        saved = self._loaded.pop(key, None)
        if saved is not None and saved["rank"] != rank:
            saved = None  # another rank's chunk: its residual is not this rank's error
            self._stats["feedback_dropped_on_load"] += 1
        if saved is None and self._loaded:
            # FSDP gives a module one buffer shape (per reduce dtype): a call of a shape
            # the checkpoint has no state for means the parameters or the world differ
            # from the saved run's. Drop what was loaded rather than keep it for a shape
            # that may never come.
            self._stats["feedback_dropped_on_load"] += len(self._loaded)
            self._loaded.clear()
        world, padded, _, _ = key
        n = feedback_numel(self.feedback, world, padded)
        in_collective = n > 0 and self._collective_feedback(world) == "residual"
        held = n > 0 and not in_collective  # "shard": torch's
        buf = _Buffer(key, rank, handle, device,
                      torch.zeros(n, device=device) if held else None, in_collective)
        if saved is not None:
            if in_collective:
                empty = torch.empty(0, device=device)
                handle.load_state(saved["residual"].to(device, torch.float32).contiguous(),
                                  empty, saved["step"])
            else:
                if held:
                    buf.residual.copy_(saved["residual"])
                handle.step = saved["step"]
            self._stats["feedback_loaded"] += 1
        self._buffers[key] = buf
        return buf

    def _count(self, world, chunk, padded, element_size):
        self._stats["lowbit_calls"] += 1
        self._stats["lowbit_bytes"] += world * chunk * element_size
        if world > 1:  # every rank sends one frame of a padded chunk to each peer
            self._stats["wire_bytes"] += (world - 1) * frame_bytes(padded, self.bits, self.grid)
            self._stats["full_precision_wire_bytes"] += (world - 1) * chunk * element_size

    def stats(self):
        """Counters: lowbit_calls and their input bytes (lowbit_bytes); wire_bytes, the
        bytes this rank sent (the codec's frames, headers excluded), and
        full_precision_wire_bytes, what a reduce-scatter in the buffer's own dtype would
        have sent, and wire_ratio, the first over the second; feedback_bytes, the bytes of
        feedback state held now (fp32: ``feedback_bytes(feedback, world, chunk)`` per
        buffer shape); feedback_loaded / feedback_dropped_on_load, loaded buffer states
        taken and dropped."""
        s = dict(self._stats)
        s["feedback_bytes"] = sum(b.bytes() for b in self._buffers.values())
        full = s.get("full_precision_wire_bytes", 0)
        s["wire_ratio"] = s.get("wire_bytes", 0) / full if full else None
        return s

    # The options a checkpoint's feedback state only makes sense under.
    _STATE_OPTIONS = ("bits", "grid", "rounding", "feedback", "seed")

    def state_dict(self):
        """What a resume needs to continue bit-identically: per buffer shape (world size,
        padded chunk, dtype, average) this rank's index, the calls made (the collective's
        step) and the feedback state (a host copy; None for "none"), the options, and the
        module's parameter shapes (``layout``). Synchronises the device: the state is
        written on the stream FSDP runs its reduce-scatter on."""
        if any(b.bytes() and b.device.type == "cuda" for b in self._buffers.values()):
            torch.cuda.synchronize()  # before the copies: the state is complete
        buffers = []
        for b in self._buffers.values():
            state = b.state()
            buffers.append(dict(_key_dict(b.key), rank=b.rank, step=b.step,
                                residual=None if state is None else state.cpu()))
        buffers += list(self._loaded.values())  # loaded, not yet called: kept as they came
        return {"version": 1, "kind": "lowbit_torch.ReduceScatter", "buffers": buffers,
                "layout": self.layout,
                **{k: getattr(self, k) for k in self._STATE_OPTIONS}}

    def load_state_dict(self, state):
        """Restores a state_dict() saved with the same options (every rank loads its own).
        A buffer's state is taken at the first call of the same shape on the same rank;
        one saved under other parameter shapes (``layout``), for another rank, or of a
        shape this module does not call with, is dropped and counted
        (``stats()["feedback_dropped_on_load"]``): that buffer starts with fresh feedback
        rather than another one's residual."""
        check_state_options("ReduceScatter", state, self, kind="lowbit_torch.ReduceScatter")
        if self._buffers:
            raise RuntimeError("lowbit_torch.ReduceScatter.load_state_dict: load before the "
                               "first call (this object already holds feedback state)")
        self._loaded = {_key_of(b): b for b in state["buffers"]}
        if _layout_differs(state.get("layout"), self.layout):
            self._stats["feedback_dropped_on_load"] += len(self._loaded)
            self._loaded = {}


def _layout_differs(saved, mine):
    if saved is None or mine is None:
        return False
    return [tuple(s) for s in saved] != [tuple(s) for s in mine]


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
    (None leaves FSDP's own). Returns the number of modules set. Each ReduceScatter
    records its module's parameter shapes (its ``layout``, checked when a state is
    loaded) and is kept on the module for fsdp_state_dict()."""
    n = 0
    for m in model.modules():
        if isinstance(m, FSDPModule):
            if reduce_scatter is not None:
                rs = ReduceScatter(**reduce_scatter)
                rs.layout = [tuple(p.shape) for p in m.parameters()]
                m.set_custom_reduce_scatter(rs)
                m._lowbit_reduce_scatter = rs
            if all_gather is not None:
                m.set_custom_all_gather(AllGather(**all_gather))
            n += 1
    return n


def reduce_scatters(model):
    """(module name, ReduceScatter) of every FSDP module apply_fsdp gave one, in
    ``model.named_modules()`` order."""
    return [(name, m._lowbit_reduce_scatter) for name, m in model.named_modules()
            if isinstance(getattr(m, "_lowbit_reduce_scatter", None), ReduceScatter)]


def fsdp_state_dict(model):
    """Every ReduceScatter's state_dict() (apply_fsdp's), by module name: this rank's part
    of a checkpoint (save one per rank, beside the model's and optimizer's)."""
    return {name: rs.state_dict() for name, rs in reduce_scatters(model)}


def load_fsdp_state_dict(model, state):
    """Loads fsdp_state_dict()'s output into the ReduceScatters apply_fsdp gave ``model``,
    by module name, before the first backward pass. A module without a saved state starts
    with fresh feedback; a saved module that no longer exists raises."""
    mine = dict(reduce_scatters(model))
    missing = sorted(set(state) - set(mine))
    if missing:
        raise ValueError(f"lowbit_torch.load_fsdp_state_dict: the checkpoint has state for "
                         f"modules this model has no ReduceScatter on: {missing}")
    for name, s in state.items():
        mine[name].load_state_dict(s)
