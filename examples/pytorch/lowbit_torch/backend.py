"""The ``lowbit`` torch.distributed backend:

    lowbit_torch.init(bits=4)               # once per process, before the process group
    dist.init_process_group("cpu:gloo,cuda:lowbit")
    model = DistributedDataParallel(model, device_ids=[device])   # no comm hook

A c10d Backend (csrc/process_group.cpp) for CUDA tensors. all_reduce (SUM, AVG),
reduce_scatter_tensor and all_gather_into_tensor of a floating dtype the extension compiles,
at least ``crossover`` bytes, one contiguous tensor on the group's device, run lowbit's
collectives (the handles the DDP hook and the FSDP2 collectives build). Every other call
(broadcast, MAX/MIN/PRODUCT and integer reductions, smaller tensors, barrier, all_to_all,
send/recv, list all-gathers, coalesced calls, anything inside a coalescing region) goes
unchanged to an inner backend the creator builds over the same Store:

- NCCL's (``ProcessGroupNCCL``) when every rank has a GPU of its own; lowbit then borrows
  its communicator;
- gloo's (``ProcessGroupGloo``) when ranks share a GPU (NCCL refuses two ranks on one
  GPU): gloo stages CUDA tensors through host memory and takes the calls it has a CUDA
  implementation for (those it has none for raise gloo's error); lowbit runs its node
  backend (CUDA IPC between the ranks' processes of one host).

Work of the lowbit path: the collective runs on a stream of the backend's own, after the
caller's current stream has reached the call; ``wait()`` makes the caller's current stream
wait for it (no host wait), ``get_future()`` completes with the output tensors.

Error feedback is off by default. Where it is on (``feedback="residual"``) its state is
kept per tensor, keyed by data pointer, size and dtype (at most ``feedback_tensors`` of
them, the least recently used dropped): right for DDP's gradient buckets, which are the
same tensors every step, wrong for a tensor whose memory later holds other data. The DDP
hook (``DDPState``) is the better vehicle where the training loop can be edited: its state
belongs to a bucket index, survives bucket reallocation, is checkpointed with
``state_dict()``, its crossover is measured, and nothing but the gradients goes through it.
"""

import dataclasses
import socket

from . import _build
from .codec import BLOCK
from .defaults import gradient_grid

#: The name init_process_group takes ("cpu:gloo,cuda:lowbit").
NAME = "lowbit"

#: The operations the backend may run through lowbit (csrc/process_group.h's lowbit_op).
OPS = ("all_reduce", "reduce_scatter", "all_gather")

#: The inner backend's choices: "auto" (NCCL when every rank has a GPU of its own, else
#: gloo), "nccl", "gloo".
INNER = ("auto", "nccl", "gloo")

#: The feedback rules the backend offers (stage2=True turns "residual" into the all-reduce's
#: "residual_stage2").
FEEDBACK = ("none", "residual")

_WIDTHS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Options:
    """What the backend runs lowbit's collectives with (``lowbit_torch.init``'s keywords).

    bits: 1, 2, 4 or 8, the width of all_reduce and reduce_scatter.
    feedback: "none" (the default) or "residual", per tensor (the module's docstring says
        when that is right).
    block: values per codec block; the extension compiles BLOCK (128) only.
    stage2: with feedback="residual", a second residual on the all-reduce's re-quantized
        reduced shard (lowbit's two_phase algorithm, more than two ranks).
    grid: "zero" or "full"; None takes ``gradient_grid(bits)``.
    rounding: "nearest" or "stochastic" (keyed by seed, step, rank, index).
    seed: stochastic rounding's seed.
    crossover: bytes; smaller tensors are forwarded to the inner backend. A default, not
        a measured optimum (``DDPState(crossover="auto")`` measures one on the links).
    all_gather_bits: the width of all_gather_into_tensor (lossy: every rank gets every
        shard quantized, as FSDP2's AllGather); None forwards every all-gather.
    inner: "auto", "nccl" or "gloo" (INNER).
    feedback_tensors: how many tensors keep feedback state at once.
    """

    bits: int = 4
    feedback: str = "none"
    block: int = BLOCK
    stage2: bool = False
    grid: str = None
    rounding: str = "nearest"
    seed: int = 0
    crossover: int = 1 << 16
    all_gather_bits: int = 8
    inner: str = "auto"
    feedback_tensors: int = 64

    def __post_init__(self):
        def bad(name, want):
            raise ValueError(f"lowbit_torch.init: {name} must be {want}, got "
                             f"{getattr(self, name)!r}")

        if not _is_int(self.bits) or self.bits not in _WIDTHS:
            bad("bits", "1, 2, 4 or 8")
        if self.feedback not in FEEDBACK:
            bad("feedback", " or ".join(repr(f) for f in FEEDBACK))
        if not _is_int(self.block) or self.block != BLOCK:
            raise ValueError(f"lowbit_torch.init: block={self.block!r}: the extension compiles "
                             f"blocks of {BLOCK} values only")
        if not isinstance(self.stage2, bool):
            bad("stage2", "True or False")
        if self.stage2 and self.feedback != "residual":
            raise ValueError("lowbit_torch.init: stage2=True is a second residual: it needs "
                             f"feedback='residual', got feedback={self.feedback!r}")
        if self.grid not in (None, "zero", "full"):
            bad("grid", "'zero', 'full' or None")
        if self.rounding not in ("nearest", "stochastic"):
            bad("rounding", "'nearest' or 'stochastic'")
        if not _is_int(self.seed) or self.seed < 0:
            bad("seed", "an int >= 0")
        if not _is_int(self.crossover) or self.crossover < 0:
            bad("crossover", "bytes >= 0")
        if self.all_gather_bits is not None and (not _is_int(self.all_gather_bits)
                                                 or self.all_gather_bits not in _WIDTHS):
            bad("all_gather_bits", "1, 2, 4, 8 or None")
        if self.inner not in INNER:
            bad("inner", " or ".join(repr(i) for i in INNER))
        if not _is_int(self.feedback_tensors) or self.feedback_tensors < 1:
            bad("feedback_tensors", "an int >= 1")

    @property
    def codec_grid(self):
        """The grid the reductions use."""
        return gradient_grid(self.bits) if self.grid is None else self.grid

    def rule(self, op):
        """The feedback rule (_build.FEEDBACK's name) ``op`` is built with."""
        if op == "all_reduce":
            return "residual_stage2" if self.stage2 else self.feedback
        return self.feedback if op == "reduce_scatter" else None


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


# ------------------------------------------------------------ decisions (pure functions)

def choose_inner(inner, peers):
    """The inner backend, "nccl" or "gloo", for ranks whose devices are ``peers`` (one
    (host, device) pair per rank, in rank order): "auto" takes NCCL when no two ranks share
    a device, else gloo. Asking for NCCL where ranks share a device raises."""
    if inner not in INNER:
        raise ValueError(f"lowbit_torch: inner must be one of {INNER}, got {inner!r}")
    shared = len(set(peers)) < len(peers)
    if inner == "nccl" and shared:
        raise ValueError("lowbit_torch: inner='nccl', but ranks share a GPU ("
                         f"{_shared(peers)}), which NCCL refuses: use inner='gloo' or 'auto'")
    if inner == "auto":
        return "gloo" if shared else "nccl"
    return inner


def _shared(peers):
    seen = {}
    for rank, p in enumerate(peers):
        seen.setdefault(p, []).append(rank)
    return "; ".join(f"ranks {r} on {p[0]} device {p[1]}" for p, r in seen.items() if len(r) > 1)


def lowbit_backend(inner, peers):
    """The backend lowbit's collectives run on beside ``inner``: "nccl" (the inner NCCL
    communicator, borrowed) or "node" (beside gloo: CUDA IPC, every rank on one host)."""
    if inner == "nccl":
        return "nccl"
    hosts = sorted({h for h, _ in peers})
    if len(hosts) > 1:
        raise ValueError("lowbit_torch: the lowbit backend over gloo runs lowbit's node backend, "
                         f"which needs every rank on one host; these ranks are on {hosts} (give "
                         "each rank a GPU of its own for NCCL)")
    return "node"


def check_compiled(options, backend):
    """Raises unless the extension's table compiles the feedback rules ``options`` needs
    on ``backend`` ("nccl" or "node")."""
    for op in ("all_reduce", "reduce_scatter"):
        rule = options.rule(op)
        rules = _build.feedback_rules(op, backend)
        if rule not in rules:
            raise ValueError(f"lowbit_torch: the lowbit backend's {op} needs feedback '{rule}', "
                             f"which the {backend} backend does not compile ({', '.join(rules)}; "
                             "lowbit_torch/_build.py's table)")


def routes(options, backend):
    """The route table: per operation (OPS) the dtype names that take the lowbit path on
    ``backend`` (those the extension compiles there; none for all_gather when
    all_gather_bits is None), and min_bytes, the crossover."""
    table = {op: tuple(_build.dtypes(op, backend)) for op in OPS}
    if options.all_gather_bits is None:
        table["all_gather"] = ()
    table["min_bytes"] = options.crossover
    return table


def reduce_name(op):
    """A torch.distributed.ReduceOp as the route sees it: "sum", "avg", or "other"."""
    import torch.distributed as dist

    if op == dist.ReduceOp.SUM:
        return "sum"
    if op == dist.ReduceOp.AVG:
        return "avg"
    return "other"


def route(table, op, dtype, nbytes, reduce):
    """Where a call goes: "lowbit" or "inner". ``op`` is one of OPS; ``dtype`` a torch dtype
    or its name; ``nbytes`` the whole tensor's bytes (the all-reduced tensor, the
    reduce-scatter's input, the all-gather's output); ``reduce`` "none" (all-gather),
    "sum", "avg" or "other". The same rule as csrc/process_group.cpp's
    route_table::takes; the backend also forwards calls whose tensors are not one dense
    contiguous tensor on its device (and output on the same dtype, a reduce-scatter's
    input size() times its output, an all-gather's output size() times its input, input
    and output of distinct storage) and every call inside a coalescing region."""
    if op not in OPS:
        raise ValueError(f"lowbit_torch: op must be one of {OPS}, got {op!r}")
    name = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    reduce_ok = reduce == "none" if op == "all_gather" else reduce in ("sum", "avg")
    takes = (reduce_ok and nbytes > 0 and nbytes >= table["min_bytes"]
             and name in table[op])
    return "lowbit" if takes else "inner"


# ------------------------------------------------------------------------ registration

_REGISTERED = None  # the Options the backend was registered with in this process


def registered():
    """The Options ``init`` registered the backend with (None before)."""
    return _REGISTERED


def _extension():
    """The compiled module, or an ImportError naming why it did not load."""
    try:
        return _build.collectives()
    except Exception as e:  # noqa: BLE001 - any failure to build or load, named below
        raise ImportError("lowbit_torch: the 'lowbit' torch.distributed backend needs the "
                          "compiled extension (lowbit_torch._C), which did not load: "
                          f"{type(e).__name__}: {e}") from e


def init(options=None, **kwargs):
    """Registers the ``lowbit`` backend with torch.distributed (once per process, before
    ``init_process_group("cpu:gloo,cuda:lowbit")`` or ``new_group(backend=...)``); returns
    its Options. ``options``: an Options, or keywords of Options (bits, feedback, block,
    stage2, grid, rounding, seed, crossover, all_gather_bits, inner, feedback_tensors).
    Calling it again with the same options does nothing; with others raises (the groups
    made already run the first ones). Loads (or builds) the extension, raising ImportError
    with its error when it does not load."""
    global _REGISTERED
    if options is not None and kwargs:
        raise TypeError("lowbit_torch.init: pass an Options or keywords, not both")
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"lowbit_torch.init: options must be lowbit_torch.backend.Options, "
                        f"got {type(options).__name__}")
    opts = options if options is not None else Options(**kwargs)
    if _REGISTERED is not None:
        if opts != _REGISTERED:
            changed = ", ".join(f"{f.name}={getattr(_REGISTERED, f.name)!r} -> "
                                f"{getattr(opts, f.name)!r}"
                                for f in dataclasses.fields(Options)
                                if getattr(opts, f.name) != getattr(_REGISTERED, f.name))
            raise RuntimeError("lowbit_torch.init: the 'lowbit' backend is registered already, "
                               f"with other options ({changed}); a process registers it once "
                               "(pass Options(...) as pg_options for one group's own)")
        return opts
    _extension()
    import torch.distributed as dist

    if NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        raise RuntimeError(f"lowbit_torch.init: torch.distributed has a backend named "
                           f"'{NAME}' registered by something else")
    dist.Backend.register_backend(NAME, _creator(opts), extended_api=True, devices=["cuda"])
    _REGISTERED = opts
    return opts


def _creator(registered_options):
    def create(dist_options, backend_options=None):
        opts = backend_options if isinstance(backend_options, Options) else registered_options
        return create_backend(dist_options, opts)

    return create


# ------------------------------------------------------------------------ the creator

def _device_id(device):
    """This rank's device as the ranks compare them: the GPU's UUID where torch says it."""
    import torch

    try:
        return str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):
        return f"cuda:{device.index}"


def _exchange(store, key, rank, size, mine, timeout):
    """Every rank's ``mine`` (a str), in rank order, through ``store``."""
    store.set(f"{key}/{rank}", mine)
    keys = [f"{key}/{r}" for r in range(size)]
    store.wait(keys, timeout)
    return [bytes(store.get(k)).decode() for k in keys]


def _inner_nccl(store, rank, size, timeout, name, global_ranks, device):
    import torch
    import torch.distributed as dist

    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    if global_ranks and hasattr(opts, "global_ranks_in_group"):
        opts.global_ranks_in_group = list(global_ranks)
    if hasattr(opts, "group_name"):
        opts.group_name = name
    pg = dist.ProcessGroupNCCL(store, rank, size, opts)
    # NCCL makes its communicator on the first collective; lowbit borrows it.
    pg.allreduce([torch.zeros(1, device=device)]).wait()
    return pg


def create_backend(dist_options, options):
    """The backend of one process group (the creator torch calls, with its
    DistributedBackendOptions: store, group_rank, group_size, timeout, group_id)."""
    import torch
    import torch.distributed as dist

    from .comm import node_communicator

    ext = _extension()
    if not torch.cuda.is_available():
        raise RuntimeError("lowbit_torch: the 'lowbit' backend moves CUDA tensors and this "
                           "process sees no CUDA device")
    store, rank, size = dist_options.store, dist_options.group_rank, dist_options.group_size
    timeout = dist_options.timeout
    name = str(getattr(dist_options, "group_id", "") or "default")
    device = torch.device("cuda", torch.cuda.current_device())
    peers = [tuple(p.split("|", 1)) for p in _exchange(
        store, "lowbit/devices", rank, size, f"{socket.gethostname()}|{_device_id(device)}",
        timeout)]
    inner_kind = choose_inner(options.inner, peers)
    backend = lowbit_backend(inner_kind, peers)
    check_compiled(options, backend)
    inner_store = dist.PrefixStore("lowbit/inner/", store)
    if inner_kind == "nccl":
        inner = _inner_nccl(inner_store, rank, size, timeout, f"{name}/lowbit_inner",
                            getattr(dist_options, "global_ranks_in_group", None), device)
        comm = ext.Communicator(int(inner._comm_ptr()))
    else:
        inner = dist.ProcessGroupGloo(inner_store, rank, size, timeout)
        comm = node_communicator(store, "lowbit/node", rank, size)
    if (comm.rank, comm.size) != (rank, size):
        raise RuntimeError(f"lowbit_torch: the communicator is rank {comm.rank} of {comm.size} "
                           f"where the group is rank {rank} of {size}")
    lowbit = ext.make_lowbit_collectives(
        comm, options.bits, options.codec_grid, options.rounding, options.rule("all_reduce"),
        options.rule("reduce_scatter"), options.all_gather_bits or 8, "full", options.seed,
        options.feedback_tensors)
    table = routes(options, backend)
    dtypes = {op: [getattr(torch, d) for d in table[op]] for op in OPS}
    rt = ext.RouteTable(dtypes["all_reduce"], dtypes["reduce_scatter"], dtypes["all_gather"],
                        table["min_bytes"])
    return ext.make_process_group(inner, lowbit, rt, device)


# -------------------------------------------------------------------------- inspection

def _backend_object(group):
    import torch
    import torch.distributed as dist

    pg = group if group is not None else dist.group.WORLD
    return pg._get_backend(torch.device("cuda"))


def stats(group=None):
    """The lowbit backend's counters on ``group`` (default: the world): per operation the
    calls that took the lowbit path (``lowbit_all_reduce``...) and those forwarded
    (``forwarded_all_reduce``...; ``forwarded_other``: every other call), the collectives
    built (``built_all_reduce``...), ``feedback_tensors`` (tensors holding feedback state)
    and ``feedback_dropped``; ``lowbit_backend``: "nccl" or "node"."""
    return _extension().process_group_stats(_backend_object(group))


def inner(group=None):
    """The inner backend (a c10d Backend: ProcessGroupNCCL or ProcessGroupGloo) that takes
    ``group``'s forwarded calls."""
    return _extension().process_group_inner(_backend_object(group))
