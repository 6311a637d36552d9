"""lowbit_torch: lowbit's low-bit collectives in PyTorch training.

- DDP: ``model.register_comm_hook(DDPState(bits=4), ddp_hook)``
- FSDP2: ``module.set_custom_reduce_scatter(ReduceScatter(bits=4))``,
  ``module.set_custom_all_gather(AllGather(bits=8))``, or ``apply_fsdp(model, ...)``
- the codec: ``encode``, ``decode``, ``frame_bytes``

Everything runs on the process group's own NCCL communicator, on torch's current stream.
"""

from .codec import BLOCK, decode, encode, frame_bytes, whole_blocks
from .comm import communicator, release
from .ddp import DDPState, ddp_hook
from .defaults import gradient_grid
from .fsdp import AllGather, ReduceScatter, apply_fsdp


def load():
    """Builds (first time) or loads the compiled extension; returns it."""
    from ._build import extension

    return extension()


def __getattr__(name):
    # The exception class lives in the compiled module, built on first use.
    if name == "AgreementError":
        return load().AgreementError
    raise AttributeError(f"module 'lowbit_torch' has no attribute {name!r}")


__all__ = ["AgreementError", "AllGather", "DDPState", "ReduceScatter", "apply_fsdp", "communicator", "ddp_hook",
           "decode", "encode", "frame_bytes", "load", "release"]
