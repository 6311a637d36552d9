"""lowbit_torch: lowbit's low-bit collectives in PyTorch training.

- DDP: ``model.register_comm_hook(DDPState(bits=4), ddp_hook)``
- FSDP2: ``module.set_custom_reduce_scatter(ReduceScatter(bits=4))``,
  ``module.set_custom_all_gather(AllGather(bits=8))``, or ``apply_fsdp(model, ...)``;
  ``fsdp_state_dict(model)`` / ``load_fsdp_state_dict(model, state)`` checkpoint feedback
- the codec: ``encode``, ``decode``, ``frame_bytes``
- a torch.distributed backend: ``lowbit_torch.init(bits=4)`` then
  ``dist.init_process_group("cpu:gloo,cuda:lowbit")`` (backend.py)

The collectives run on the process group's own NCCL communicator (an NCCL group) or on
lowbit's node backend (a gloo group of ranks on one host, several of which may share one
GPU: comm.py). The DDP hook runs them on a stream of its own; the FSDP2 collectives on
the stream FSDP calls them on.

Requires torch >= 2.6 (MIN_TORCH; ``torch.distributed.fsdp.FSDPModule`` is public from
it); the FSDP2 collectives need a torch whose FSDPModule has set_custom_reduce_scatter.
"""

MIN_TORCH = (2, 6)


def _check_torch():
    import torch

    v = torch.__version__.split("+")[0].split(".")
    try:
        have = (int(v[0]), int(v[1]))
    except (ValueError, IndexError):
        return  # a version string we cannot read: let the imports below tell
    if have < MIN_TORCH:
        raise ImportError(f"lowbit_torch needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, this is "
                          f"torch {torch.__version__}")


_check_torch()

from .backend import Options as BackendOptions
from .backend import init
from .codec import BLOCK, decode, encode, frame_bytes, whole_blocks
from .comm import backend_of, communicator, release
from .ddp import DDPState, ddp_hook
from .defaults import gradient_grid
from .fsdp import (AllGather, ReduceScatter, apply_fsdp, feedback_bytes, fsdp_state_dict,
                   load_fsdp_state_dict)


def load():
    """Builds (first time) or loads the compiled extension; returns it."""
    from ._build import extension

    return extension()


def __getattr__(name):
    # The exception class lives in the compiled module, built on first use.
    if name == "AgreementError":
        return load().AgreementError
    raise AttributeError(f"module 'lowbit_torch' has no attribute {name!r}")


__all__ = ["AgreementError", "AllGather", "BackendOptions", "DDPState", "MIN_TORCH",
           "ReduceScatter", "apply_fsdp", "backend_of", "communicator", "ddp_hook",
           "decode", "encode", "feedback_bytes", "frame_bytes", "fsdp_state_dict", "init",
           "load", "load_fsdp_state_dict", "release"]
