"""The NCCL communicator a torch process group already has, borrowed for lowbit."""

import torch
import torch.distributed as dist

from ._build import collectives as extension

_COMMS = {}  # process group -> Communicator; groups live as long as the job


def communicator(group=None):
    """lowbit's handle on ``group``'s own NCCL communicator (one per group, cached).

    torch keeps owning it: lowbit never creates, splits or destroys it. It must exist when
    this is called: create the process group eagerly
    (``init_process_group("nccl", device_id=torch.device("cuda", local_rank))``) or run one
    collective on it first."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("lowbit_torch: torch.distributed is not initialised "
                           "(call dist.init_process_group('nccl', device_id=...) first)")
    pg = group if group is not None else dist.group.WORLD
    if pg in _COMMS:
        return _COMMS[pg]
    backend = dist.get_backend(pg)
    if backend != "nccl":
        raise ValueError(f"lowbit_torch: the process group's backend is '{backend}'; lowbit "
                         "runs on an NCCL process group's communicator")
    try:
        ptr = pg._get_backend(torch.device("cuda"))._comm_ptr()
    except RuntimeError as e:
        raise RuntimeError("lowbit_torch: the NCCL communicator does not exist yet (create the "
                           "process group with device_id=... or run one collective first): "
                           f"{e}") from e
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
    the communicator when they go, so they must go while it exists."""
    if group is None:
        _COMMS.clear()
    else:
        _COMMS.pop(group, None)
