"""lowbit's codec as tensor functions, for tests and inspection: the bytes of a frame are
the wire format the collectives send (docs/design.md), identical from a CUDA tensor
(lowbit's kernels) and a CPU tensor (lowbit's host codec)."""

import torch

from ._build import dtypes, extension

_DTYPES = tuple(getattr(torch, name) for name in dtypes("codec"))  # those compiled
BLOCK = 128  # values per codec block: the compiled absmax codecs' block size


def whole_blocks(n):
    """n rounded up to whole codec blocks."""
    return (n + BLOCK - 1) // BLOCK * BLOCK


def encode(x, bits=4, grid="zero", rounding="nearest", seed=0, step=0, rank=0):
    """Encodes the contiguous tensor ``x`` (float32, float16 or bfloat16; CPU or CUDA)
    into a frame: a flat uint8 tensor on x's device. Stochastic rounding is keyed by
    (seed, step, rank, element index), as in the collectives."""
    _check_tensor(x, "encode")
    return extension().encode(x.reshape(-1), bits, grid, rounding, seed, step, rank)


def decode(frame, count, bits=4, grid="zero", dtype=torch.float32, scale=1.0):
    """Decodes a frame of ``count`` values into a flat tensor of ``dtype`` on the frame's
    device, each value times ``scale`` (1/P for an average)."""
    if not isinstance(frame, torch.Tensor):
        raise TypeError(f"lowbit_torch.decode: frame must be a tensor, got {type(frame).__name__}")
    if dtype not in _DTYPES:
        raise TypeError(f"lowbit_torch.decode: dtype must be one of {_DTYPES}, got {dtype}")
    return extension().decode(frame, int(count), bits, grid, dtype, float(scale))


def frame_bytes(count, bits=4, grid="zero"):
    """Bytes of the frame of ``count`` values: what one rank's tensor costs on the wire."""
    return extension().frame_bytes(int(count), bits, grid)


def _check_tensor(x, what):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"lowbit_torch.{what}: expected a tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"lowbit_torch.{what}: dtype must be one of {_DTYPES}, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"lowbit_torch.{what}: the tensor must be contiguous")
