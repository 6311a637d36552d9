"""The communicator lowbit's collectives run on, from a torch process group:

- an NCCL group (or the NCCL half of ``"cpu:gloo,cuda:nccl"``): the group's own NCCL
  communicator, borrowed (the ``"nccl"`` backend);
- a gloo group whose ranks are processes of one host: lowbit's node backend (CUDA IPC
  between the processes, no NCCL; ``"node"``), bootstrapped over the group's Store. This
  is how several ranks share ONE GPU (``torchrun --nproc-per-node N`` with
  ``init_process_group("gloo")`` and every rank on ``cuda:0``): NCCL refuses two ranks on
  one GPU. Between the GPUs of one node it works too.

Anything else raises, saying what would work."""

import torch
import torch.distributed as dist

from ._build import collectives as extension

_COMMS = {}  # process group -> Communicator; groups live as long as the job
_NODE_COMMS = {}  # group name -> node communicators made for it by this process (their keys)

#: The backends lowbit runs on (lowbit_torch/_build.py's BACKENDS).
BACKENDS = ("nccl", "node")


def backend_of(group=None):
    """The lowbit backend for ``group``: "nccl" when its CUDA tensors go through
    ProcessGroupNCCL, "node" when through gloo; raises ValueError otherwise. It reads the
    backend object torch uses for CUDA tensors, so ``"cpu:gloo,cuda:nccl"`` is NCCL."""
    pg = group if group is not None else dist.group.WORLD
    name = None
    try:
        b = pg._get_backend(torch.device("cuda"))
        nccl_cls = getattr(dist, "ProcessGroupNCCL", None)
        gloo_cls = getattr(dist, "ProcessGroupGloo", None)
        if nccl_cls is not None and isinstance(b, nccl_cls):
            name = "nccl"
        elif gloo_cls is not None and isinstance(b, gloo_cls):
            name = "gloo"
    except (RuntimeError, AttributeError, ValueError):
        name = None
    if name is None:  # older torch or no CUDA backend object: the backend string
        s = str(dist.get_backend(pg))
        parts = dict(p.split(":", 1) for p in s.split(",") if ":" in p)
        name = parts.get("cuda", s)
    if name == "nccl":
        return "nccl"
    if name == "gloo":
        return "node"
    if name == "lowbit":
        raise ValueError("lowbit_torch: the process group's CUDA backend is 'lowbit' (lowbit_torch."
                         "init), whose all-reduce, reduce-scatter and all-gather already run "
                         "lowbit's collectives: use a comm hook or FSDP2 collectives on an NCCL "
                         "or gloo group instead, not on top of it")
    raise ValueError(f"lowbit_torch: the process group's CUDA backend is '{name}'; lowbit runs "
                     "on an NCCL group's communicator, or on a gloo group whose ranks are on one "
                     "host (its node backend, CUDA IPC: several ranks may share one GPU)")


def _store_of(pg):
    """The Store of ``pg`` (its own prefixed one where torch says), else the default."""
    c10d = dist.distributed_c10d
    get = getattr(c10d, "_get_process_group_store", None)
    if get is not None:
        try:
            return get(pg)
        except (KeyError, RuntimeError):
            pass
    return c10d._get_default_store()


class StoreAllGather:
    """An all-gather of bytes over a torch Store, for lowbit's node bootstrap.

    Call k of rank r sets ``<prefix>/<k>/<r>``, waits for every rank's key of call k and
    returns their values concatenated in rank order. Every rank makes the same calls in
    the same order (node_comm's construction, then each collective's windows), so k
    agrees. A rank deletes its key of call k - 1 once it has every key of call k: each
    peer has then read it (a peer writes call k's key only after reading call k - 1's).
    The values are IPC handles, which map GPU memory: they travel only through the
    group's Store, to the group's ranks."""

    def __init__(self, store, prefix, rank, size, timeout=None):
        self.store, self.prefix, self.rank, self.size = store, prefix, rank, size
        self.timeout = timeout
        self.calls = 0

    def _key(self, call, rank):
        return f"{self.prefix}/{call}/{rank}"

    def __call__(self, mine):
        k = self.calls
        self.calls += 1
        self.store.set(self._key(k, self.rank), bytes(mine))
        keys = [self._key(k, r) for r in range(self.size)]
        if self.timeout is None:
            self.store.wait(keys)
        else:
            self.store.wait(keys, self.timeout)
        parts = [bytes(self.store.get(key)) for key in keys]
        if any(len(p) != len(mine) for p in parts):
            raise RuntimeError(f"lowbit_torch: bootstrap call {k} under {self.prefix}: the ranks "
                               f"sent {[len(p) for p in parts]} bytes where this rank sent "
                               f"{len(mine)} (the ranks are building different collectives)")
        if k > 0:
            try:
                self.store.delete_key(self._key(k - 1, self.rank))
            except (RuntimeError, NotImplementedError, AttributeError):
                pass  # a store that cannot delete keeps them (a few hundred bytes each)
        return b"".join(parts)


def _node_communicator(pg):
    if not torch.cuda.is_available():
        raise ValueError("lowbit_torch: a gloo process group runs lowbit's node backend, which "
                         "needs a CUDA device (lowbit's collectives move CUDA tensors)")
    rank, size = pg.rank(), pg.size()
    # Unique per communicator and the same on every rank: the group's name and how many
    # node communicators this process has made for that group (every rank of the group
    # makes them at the same points: communicator() is collective).
    name = getattr(pg, "group_name", "") or "world"
    n = _NODE_COMMS[name] = _NODE_COMMS.get(name, -1) + 1
    return node_communicator(_store_of(pg), f"lowbit/node/{name}/{n}", rank, size)


def node_communicator(store, prefix, rank, size):
    """A node communicator of ``size`` ranks on the current CUDA device, bootstrapped over
    ``store`` under keys starting with ``prefix`` (unique per communicator, the same on
    every rank). Collective: every rank calls it at the same point."""
    allgather = StoreAllGather(store, prefix, rank, size)
    try:
        return extension().Communicator.node(rank, size, allgather)
    except ValueError as e:
        raise ValueError(f"lowbit_torch: the node backend cannot form on this gloo group "
                         f"(rank {rank} of {size}, cuda:{torch.cuda.current_device()}): {e}") from e


def communicator(group=None):
    """lowbit's communicator for ``group`` (one per group, cached), on the backend
    backend_of(group) chooses:

    - NCCL: the group's own NCCL communicator, which torch keeps owning (lowbit never
      creates, splits or destroys it). It must exist when this is called: create the
      process group eagerly (``init_process_group("nccl", device_id=...)``) or run one
      collective on it first.
    - node (a gloo group): a node communicator of the group's ranks on the current CUDA
      device (``torch.cuda.set_device`` first; several ranks may share one GPU),
      bootstrapped over the group's Store. Collective: every rank calls it at the same
      point, and every collective later built on it (DDPState's buckets, FSDP2's
      collectives) is built by every rank in the same order, as DDP and FSDP do."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("lowbit_torch: torch.distributed is not initialised "
                           "(call dist.init_process_group('nccl', device_id=...) first, or "
                           "'gloo' for several ranks on one GPU)")
    pg = group if group is not None else dist.group.WORLD
    if pg in _COMMS:
        return _COMMS[pg]
    backend = backend_of(pg)
    if backend == "node":
        comm = _node_communicator(pg)
    else:
        try:
            ptr = pg._get_backend(torch.device("cuda"))._comm_ptr()
        except RuntimeError as e:
            raise RuntimeError("lowbit_torch: the NCCL communicator does not exist yet (create "
                               "the process group with device_id=... or run one collective "
                               f"first): {e}") from e
        comm = extension().Communicator(int(ptr))
    if comm.size != pg.size() or comm.rank != pg.rank():
        raise RuntimeError(f"lowbit_torch: the communicator is rank {comm.rank} of {comm.size} "
                           f"where the group is rank {pg.rank()} of {pg.size()}")
    _COMMS[pg] = comm
    return comm


def release(group=None):
    """Forgets lowbit's handle on ``group``'s communicator (every group's when None).
    Call it, after dropping the DDPState and FSDP collectives that use the group, before
    ``dist.destroy_process_group()``: lowbit's objects deregister their NCCL windows on
    the communicator when they go, so they must go while it exists (the node backend's
    unmap their IPC windows and need nothing of the group)."""
    if group is None:
        _COMMS.clear()
    else:
        _COMMS.pop(group, None)
