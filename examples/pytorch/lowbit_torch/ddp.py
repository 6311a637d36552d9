"""A DistributedDataParallel communication hook running lowbit's all-reduce.

    state = lowbit_torch.DDPState(bits=4)
    model.register_comm_hook(state, lowbit_torch.ddp_hook)

Each bucket's flat gradient is averaged over the process group by lowbit's all_reduce,
on the group's own NCCL communicator (an NCCL group) or on lowbit's node backend (a gloo
group of ranks on one host, several of which may share one GPU: comm.py).

Overlap: the hook enqueues the collective on a CUDA stream of its own (one per device,
``state.stream(device)``), which first waits for the caller's current stream (the one
DDP's backward filled the bucket on). The caller's stream is never made to wait: the
hook returns a CUDA-aware ``torch.futures.Future`` whose result is set on the hook's
stream, so DDP waits for the bucket only where it waits for the future (when it
finalizes the backward pass), while the backward kernels of later buckets run beside the
collective. No host wait.
"""

import collections
import math

import torch
import torch.distributed as dist

from ._build import collectives as extension
from ._build import feedback_rules as _compiled_rules
from ._state import check_state_options
from .codec import frame_bytes, whole_blocks
from .comm import communicator
from .defaults import gradient_grid
from .plan_bits import FULL_PRECISION_BITS, PlanBits, check_bits, is_plan

FEEDBACK = _compiled_rules("all_reduce")  # the rules compiled (_build.py's table), on NCCL


def feedback_rules(backend="nccl"):
    """The feedback rules DDPState takes on ``backend`` ("nccl" or "node"): those the
    table in _build.py compiles for its all_reduce."""
    return _compiled_rules("all_reduce", backend)


class DDPState:
    """Options and per-bucket collectives of the lowbit DDP hook.

    bits: 1, 2, 4 or 8, or 16 and 32 for the full-precision path (torch.distributed's
        all-reduce of the bucket in its own dtype); may be changed between steps:
        ``state.bits = 8``. Or a QSync plan (what ``lowbit-plan`` writes: a dict or a JSON
        file's path) with ``model``: per-bucket widths, each DDP bucket at the widest of
        its parameters' planned bits; parameters the plan does not name at 32
        (plan_bits.py). ``state.bits`` then holds the PlanBits.
    model: the module (or the DDP) the hook is registered on; needed with a plan only.
    grid: "zero" (exact zeros survive) or "full" (all 2^bits levels); None (the default)
        takes ``gradient_grid(bits)`` of the bits given here: "zero" from 4 bits up,
        "full" at 1 and 2. It stays when ``state.bits`` changes later. With a plan, None
        takes each bucket's ``gradient_grid`` of its bits when its collective is built.
    rounding: "nearest" or "stochastic" (keyed by seed, step, rank, index).
    feedback: one of FEEDBACK, the rules compiled (the table in _build.py): "none",
        "residual" (fp32 state), "residual_bf16", "residual_stage2" (residual plus one on
        the shard owner's second quantization, which lowbit's two_phase algorithm makes
        on more than two ranks) or "ef21". The node backend (a gloo group) compiles fewer:
        ``feedback_rules("node")``.
    crossover: "auto" (measured on the group's links on first use, per dtype and
        width), an int (bytes: smaller buckets take NCCL's plain all-reduce), or 0
        (always low-bit). Calls that take the plain path are counted in stats(). The
        node backend has no plain path: every call is low-bit there.
    seed: stochastic rounding's seed.

    One lowbit collective per bucket index, with its feedback state (the state belongs
    to the bucket's tensor). When DDP rebuilds its buckets after the first iteration,
    each bucket's feedback state follows its parameters into their new buckets
    (``note_layout``, counted as ``layout_rebuilds``).
    """

    def __init__(self, process_group=None, bits=4, grid=None, rounding="nearest",
                 feedback="residual", crossover="auto", seed=0, calibrate_max_bytes=256 << 20,
                 model=None):
        if feedback not in FEEDBACK:
            raise ValueError(f"lowbit_torch.DDPState: feedback must be one of {FEEDBACK}, "
                             f"got {feedback!r}")
        if not (crossover == "auto" or (isinstance(crossover, int) and crossover >= 0)):
            raise ValueError("lowbit_torch.DDPState: crossover must be 'auto' or bytes >= 0, "
                             f"got {crossover!r}")
        self.model = model
        self.bits = bits  # checked (a plan: read and mapped onto the model's parameters)
        self.group = process_group
        self.comm = communicator(process_group)
        self.backend = self.comm.backend  # "nccl" or "node"
        if feedback not in feedback_rules(self.backend):
            raise ValueError(f"lowbit_torch.DDPState: feedback on the {self.backend} backend "
                             f"must be one of {feedback_rules(self.backend)}, got {feedback!r}")
        self.grid = grid if grid is not None or is_plan(bits) else gradient_grid(bits)
        self.rounding = rounding
        self.feedback = feedback
        self.crossover = crossover
        self.seed = seed
        self.calibrate_max_bytes = calibrate_max_bytes
        self._buckets = {}  # bucket index -> AllReduce handle
        self._grids = {}  # bucket index -> its handle's grid
        self._bucket_bits = {}  # bucket index -> its bits at the last call
        self._layouts = {}  # bucket index -> its parameters' shapes, in the bucket's order
        self._loaded = {}  # bucket index -> the layout a loaded state was saved under
        self._params = {}  # bucket index -> its parameters' ids, in order (this process)
        self._carried = {}  # parameter id -> (worker, replicated, stage2, step) at a rebuild
        self._calibrated = {}  # (dtype, bits) -> (crossover bytes, largest size measured)
        self._stats = collections.Counter()
        self._streams = {}  # device index -> the hook's stream
        self.last_streams = None  # (caller's, hook's) cudaStream_t of the last hook call

    @property
    def bits(self):
        """The width of every bucket (an int), or the plan's (a PlanBits)."""
        return self._bits

    @bits.setter
    def bits(self, bits):
        if is_plan(bits):
            self._bits = bits if isinstance(bits, PlanBits) else PlanBits(bits, self.model)
        else:
            check_bits(bits)
            self._bits = bits

    @property
    def plan(self):
        """The PlanBits the widths come from, or None (one width for every bucket)."""
        return self._bits if isinstance(self._bits, PlanBits) else None

    def bucket_bits(self, index, parameters):
        """Bucket ``index``'s bits for this call, recorded for stats() and state_dict():
        ``state.bits``, or with a plan the widest planned bits of ``parameters`` (the
        bucket's, as ``GradBucket.parameters()`` gives them)."""
        plan = self.plan
        bits = self.bits if plan is None else plan.bits_of(parameters, index)
        self._bucket_bits[index] = bits
        return bits

    def _grid(self, bits):
        return gradient_grid(bits) if self.grid is None else self.grid

    def stats(self):
        """Counters: lowbit_calls / nccl_calls (below the crossover) and their input
        bytes (lowbit_bytes / nccl_bytes), rebuilds, calibrations; wire_bytes, the bytes
        this rank sent (the codec's frames, frame headers excluded, plus NCCL's ring
        traffic below the crossover), full_precision_wire_bytes, what a ring all-reduce
        of the same buckets in their own dtype would have sent, and wire_ratio, the
        first over the second; the crossover in use per (dtype, bits); bucket_bits, each
        bucket index's bits at its last call (16 and 32: the full-precision path, whose
        calls are counted as full_precision_calls / full_precision_bytes); with a plan,
        unplanned_parameters, the names of the model's parameters it does not name. At
        DDP's bucket rebuild: layout_rebuilds, feedback_fresh_on_rebuild (parameters with
        no state to carry). A counter appears once it is not zero."""
        s = dict(self._stats)
        s["bucket_bits"] = dict(self._bucket_bits)
        if self.plan is not None:
            s["unplanned_parameters"] = list(self.plan.unplanned)
        s["crossover_bytes"] = {f"{d}/{b}": c for (d, b), (c, _) in self._calibrated.items()}
        full = s.get("full_precision_wire_bytes", 0)
        s["wire_ratio"] = s.get("wire_bytes", 0) / full if full else None
        return s

    def stream(self, device=None):
        """The CUDA stream the hook runs its collectives on, for ``device`` (default: the
        current one); made on first use."""
        index = torch.cuda.current_device() if device is None else torch.device(device).index
        if index is None:
            index = torch.cuda.current_device()
        s = self._streams.get(index)
        if s is None:
            s = self._streams[index] = torch.cuda.Stream(device=index)
        return s

    def _wire_bytes(self, h, count, plain, nbytes, bits, grid):
        """(bytes this rank sends, bytes a full-precision ring all-reduce would send) for a
        call of ``count`` values. One shot sends its frame to every peer; two phase a
        shard's frame to every peer twice (reduce-scatter, then all-gather); shards in
        whole codec blocks, taken as equal here."""
        P = self.comm.size
        full = 2 * (P - 1) * nbytes // P if P > 1 else 0
        if P == 1:
            return 0, 0
        if plain:
            return full, full
        if h.algorithm == "one_shot":
            return (P - 1) * frame_bytes(count, bits, grid), full
        shard = whole_blocks(-(-count // P))
        return 2 * (P - 1) * frame_bytes(shard, bits, grid), full

    def _new_handle(self, dtype, count, grid):
        fixed = 0 if self.crossover == "auto" else self.crossover
        return extension().AllReduce(self.comm, dtype, count, grid, self.rounding,
                                     self.feedback, True, self.seed, fixed, "automatic")

    def _handle(self, index, tensor, bits):
        h = self._buckets.get(index)
        if h is not None and h.max_count == tensor.numel() and h.dtype == tensor.dtype:
            return h  # its grid stays, as self.grid does when the bits change
        if h is not None:
            self._stats["rebuilds"] += 1
        grid = self._grids[index] = self._grid(bits)
        h = self._buckets[index] = self._new_handle(tensor.dtype, tensor.numel(), grid)
        if self._carried:
            self._load_carried(index, h, bits)
        return h

    def _crossover(self, h, tensor, bits):
        """The crossover for this call's dtype and width: measured when 'auto' at the first
        bucket of each (dtype, bits) and again for a larger bucket, up to
        calibrate_max_bytes (collective: every rank reaches the same bucket at the same
        point). It runs on a probe collective of its own, so that no bucket's feedback
        state is touched."""
        if self.backend != "nccl":
            return 0  # the node backend has no plain path
        if self.crossover != "auto" or self.comm.size == 1 or self.feedback == "ef21":
            return h.crossover_bytes
        key = (tensor.dtype, bits)
        nbytes = tensor.numel() * tensor.element_size()
        known = self._calibrated.get(key)
        measurable = min(nbytes, self.calibrate_max_bytes)
        if known is None or measurable > known[1]:
            probe = self._new_handle(tensor.dtype, measurable // tensor.element_size(),
                                     self._grid(bits))
            crossover = probe.calibrate(bits, measurable)
            del probe
            self._calibrated[key] = (crossover, measurable)
            self._stats["calibrations"] += 1
        return self._calibrated[key][0]

    def all_reduce_(self, index, tensor, bits=None):
        """Averages ``tensor`` (a CUDA, contiguous float32/float16/bfloat16 tensor) over
        the group in place, enqueued on the current stream, at ``bits`` (default: bucket
        ``index``'s, bucket_bits(), or ``state.bits``): 16 and 32 through the
        full-precision path, torch.distributed's all-reduce of the tensor as it is."""
        if bits is None:
            bits = self.bits if self.plan is None else self._bucket_bits.get(index)
            if bits is None:
                raise ValueError(f"lowbit_torch.DDPState: bucket {index} has no bits yet: "
                                 "call bucket_bits(index, parameters) first, or pass bits")
        check_bits(bits)
        if bits in FULL_PRECISION_BITS:
            return self._full_precision_(tensor)
        return self._lowbit_(index, tensor, bits)

    def _full_precision_(self, tensor):
        """The plain average: each rank's tensor divided by P, then summed (as DDP's own
        all-reduce hook does), on the group's backend; waited for on the current stream."""
        nbytes = tensor.numel() * tensor.element_size()
        P = self.comm.size
        full = 2 * (P - 1) * nbytes // P if P > 1 else 0
        self._stats["full_precision_calls"] += 1
        self._stats["full_precision_bytes"] += nbytes
        self._stats["wire_bytes"] += full
        self._stats["full_precision_wire_bytes"] += full
        if P > 1:
            tensor.div_(P)
            dist.all_reduce(tensor, group=self.group, async_op=True).wait()
        return tensor

    def _lowbit_(self, index, tensor, bits):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
            raise ValueError("lowbit_torch: the bucket must be a CUDA tensor")
        if not tensor.is_contiguous():
            raise ValueError("lowbit_torch: the bucket must be contiguous")
        h = self._handle(index, tensor, bits)
        crossover = self._crossover(h, tensor, bits)
        h.crossover_bytes = crossover
        nbytes = tensor.numel() * tensor.element_size()
        plain = (self.backend == "nccl" and nbytes < crossover and self.feedback != "ef21"
                 and self.comm.size > 1)
        kind = "nccl" if plain else "lowbit"
        self._stats[f"{kind}_calls"] += 1
        self._stats[f"{kind}_bytes"] += nbytes
        wire, full = self._wire_bytes(h, tensor.numel(), plain, nbytes, bits,
                                      self._grids.get(index, self._grid(bits)))
        self._stats["wire_bytes"] += wire
        self._stats["full_precision_wire_bytes"] += full
        h.run(tensor, tensor, bits)
        return tensor

    def handle(self, index):
        """Bucket ``index``'s collective (its step, algorithm, last_stream...)."""
        return self._buckets[index]

    # The options a checkpoint's feedback state only makes sense under.
    _STATE_OPTIONS = ("grid", "rounding", "feedback", "seed")

    def state_dict(self):
        """What a resume needs to continue bit-identically: per bucket its collective's size,
        dtype, step, grid and feedback state (host copies), the bits (an int, or the plan as
        PlanBits.to_json() gives it), each bucket's bits at its last call (bucket_bits), and
        the crossovers measured. Synchronises with the hook's streams (the state must be
        complete). With "residual_stage2" and "ef21" on more than two ranks each bucket
        also holds the second-stage residual of the shard this rank reduces (stage2): each
        rank saves and loads its own."""
        for s in self._streams.values():
            s.synchronize()
        buckets = {}
        for index, h in self._buckets.items():
            worker = h.worker_state(h.max_count)
            replicated = h.replicated_state(h.max_count)
            buckets[index] = {
                "max_count": h.max_count, "dtype": h.dtype, "step": h.step,
                "layout": self._layouts.get(index), "grid": self._grids.get(index),
                "worker": _host_copy(worker), "replicated": _host_copy(replicated),
                "stage2": _host_copy(h.stage2_state()),
            }
        plan = self.plan
        return {"version": 1, "bits": self.bits if plan is None else plan.to_json(),
                "bucket_bits": dict(self._bucket_bits), "buckets": buckets,
                "calibrated": dict(self._calibrated),
                **{k: getattr(self, k) for k in self._STATE_OPTIONS}}

    def load_state_dict(self, state):
        """Restores a state_dict() taken with the same grid, rounding, feedback and seed on
        a group of the same size (every rank loads its own). Each bucket's collective is
        built at the checkpoint's size, so the first steps after the resume reuse it, as the
        run that was saved would have. A plan's bits need the model (``DDPState(model=...)``).
        """
        check_state_options("DDPState", state, self, this="state")
        self.bits = state["bits"]  # checked; a plan is mapped onto self.model
        self._bucket_bits = dict(state.get("bucket_bits", {}))
        self._calibrated = dict(state["calibrated"])
        self._buckets, self._grids = {}, {}
        device = torch.device("cuda", torch.cuda.current_device())
        empty = torch.empty(0, device=device)
        for index, b in state["buckets"].items():
            grid = b.get("grid") or self.grid
            h = self._new_handle(b["dtype"], b["max_count"], grid)
            worker = empty if b["worker"] is None else b["worker"].to(device)
            replicated = empty if b["replicated"] is None else b["replicated"].to(device)
            h.load_state(worker.contiguous(), replicated.contiguous(), b["step"])
            stage2 = b.get("stage2")
            h.load_stage2_state(empty if stage2 is None else stage2.to(device).contiguous())
            self._buckets[index], self._grids[index] = h, grid
            self._loaded[index] = b.get("layout")
        torch.cuda.current_stream(device).synchronize()  # the copies land before the hook runs

    def note_layout(self, index, parameters):
        """Records which parameters bucket ``index`` holds, in the bucket's order, and its
        layout (their shapes).

        DDP rebuilds its buckets after its first iteration, in the order gradients became
        ready, and may put other parameters at an index of the same size: each bucket's
        feedback state then follows its parameters (``_carry_over``) rather than staying at
        its index, where it would be added to other gradients.

        A state loaded for that index is kept only if it was saved under the same layout:
        DDP's first iteration after a resume buckets by construction order, so an index
        may hold other parameters than when it was saved (the process's parameter objects
        are new, so the shapes are what can be compared). Such a state is dropped (the
        bucket starts with fresh feedback, counted as ``feedback_dropped_on_load``)."""
        ids = [id(p) for p in parameters]
        seen = self._params.get(index)
        if seen is not None and seen != ids:
            self._carry_over()
        self._params[index] = ids
        layout = self._layouts[index] = [tuple(p.shape) for p in parameters]
        if index not in self._loaded:
            return
        saved = self._loaded.pop(index)
        if saved is not None and [tuple(s) for s in saved] != layout:
            self._buckets.pop(index, None)
            self._stats["feedback_dropped_on_load"] += 1

    def _carry_over(self):
        """DDP has rebuilt its buckets: every bucket's feedback state is split into its
        parameters' slices (by the layout its index had) and the collectives forgotten;
        each bucket's new collective is loaded with its parameters' slices (_load_carried),
        wherever DDP has put them. Runs on the hook's stream, after the last collective.
        Without feedback there is nothing to move: the collectives stay at their indices
        (their steps, stochastic rounding's keys, go on)."""
        self._stats["layout_rebuilds"] += 1
        ids_of, self._params = self._params, {}
        if self.feedback == "none":
            return
        stage2 = self._whole_stage2()
        for index, h in self._buckets.items():
            ids, shapes = ids_of.get(index), self._layouts.get(index)
            if ids is None or shapes is None:
                continue
            # fresh copies of the bucket's state: their slices need no copy of their own
            worker = h.worker_state(h.max_count)
            replicated = h.replicated_state(h.max_count)
            offset = 0
            for pid, shape in zip(ids, shapes):
                n = math.prod(shape)
                self._carried[pid] = tuple(
                    None if t is None or t.numel() == 0 else t[offset:offset + n]
                    for t in (worker, replicated, stage2.get(index))) + (h.step,)
                offset += n
        self._buckets.clear()

    def _whole_stage2(self):
        """Each bucket's second-stage residual over the bucket's whole tensor, on every
        rank: {index: tensor}, empty without one. Under two_phase each rank keeps the
        residual of the shard it reduces and re-encodes ("residual_stage2" and "ef21" on
        more than two ranks); after a rebuild a parameter's values may fall in another
        rank's shard, so the shards are summed over the group with zeros elsewhere (exact:
        one rank contributes each value), then carried per parameter like the rest.
        Collective: every rank rebuilds at the same bucket, with the same buckets."""
        if self.feedback not in ("residual_stage2", "ef21") or self.comm.size <= 2:
            return {}
        whole = {}
        for index, h in self._buckets.items():  # created in the same order on every rank
            bits = self._bucket_bits.get(index)
            mine = h.stage2_state() if h.algorithm != "one_shot" else None
            if mine is None or mine.numel() == 0 or bits is None or bits in FULL_PRECISION_BITS:
                continue
            begin, end = h.reduced_shard(h.max_count, bits)
            t = whole[index] = mine.new_zeros(h.max_count)
            t[begin:end] = mine[:end - begin]
        if whole:
            flat = torch.cat(list(whole.values()))
            dist.all_reduce(flat, group=self.group, async_op=True).wait()
            whole = dict(zip(whole, flat.split([t.numel() for t in whole.values()])))
        return whole

    def _load_carried(self, index, h, bits):
        """Loads bucket ``index``'s new collective (whose calls run at ``bits``) with its
        parameters' carried slices (a parameter nothing was carried for starts at zero,
        counted); of the second-stage residual, the part of the shard this rank now
        reduces."""
        ids, shapes = self._params.get(index, []), self._layouts.get(index, [])
        parts = [self._carried.pop(pid, None) for pid in ids]
        found = [c for c in parts if c is not None]
        if not found:
            return
        if sum(math.prod(s) for s in shapes) != h.max_count:  # not DDP's flat layout
            self._stats["feedback_dropped_on_rebuild"] += len(found)
            return
        self._stats["feedback_fresh_on_rebuild"] += len(parts) - len(found)
        like = found[0]
        device = next((t.device for t in like[:3] if t is not None), None)

        def assemble(k):
            if like[k] is None:
                return torch.empty(0, device=device)
            return torch.cat([c[k] if c is not None and c[k] is not None else
                              like[k].new_zeros(math.prod(shape))
                              for c, shape in zip(parts, shapes)]).contiguous()

        h.load_state(assemble(0), assemble(1), max(c[3] for c in found))
        if like[2] is not None:
            begin, end = h.reduced_shard(h.max_count, bits)
            h.load_stage2_state(assemble(2)[begin:end].contiguous())

    def worker_state(self, index):
        """A copy of bucket ``index``'s feedback state (residual e or EF21's g_i)."""
        h = self._buckets[index]
        return h.worker_state(h.max_count)


def _host_copy(state):
    """A host copy of a collective's state tensor; None where it keeps none (the extension
    returns None, or an empty tensor)."""
    return None if state is None or state.numel() == 0 else state.cpu()


def ddp_hook(state, bucket):
    """DDP communication hook: ``model.register_comm_hook(state, ddp_hook)``.

    The collective runs on ``state.stream(device)``, after the caller's current stream
    has reached this point; the returned future's result is set on that stream (a
    CUDA-aware future records an event there), so whoever waits for the future (DDP, when
    it finalizes the backward pass) waits for the collective, and nothing else does."""
    tensor = bucket.buffer()
    device = tensor.device
    caller = torch.cuda.current_stream(device)
    stream = state.stream(device)
    stream.wait_stream(caller)  # the bucket's gradients are complete on the caller's stream
    parameters = list(bucket.parameters())
    with torch.cuda.stream(stream):  # a rebuild's state copies follow the last collective
        state.note_layout(bucket.index(), parameters)
        bits = state.bucket_bits(bucket.index(), parameters)
        state.all_reduce_(bucket.index(), tensor, bits)
        # The bucket was made on the caller's stream; used here too, its memory must not
        # be reused before this stream is done with it.
        tensor.record_stream(stream)
        fut = torch.futures.Future(devices=[device])
        fut.set_result(tensor)  # an event recorded on `stream`; wait() joins it
    state.last_streams = (caller.cuda_stream, stream.cuda_stream)
    return fut
