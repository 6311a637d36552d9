"""How the compiled part is found or built: the installed ``lowbit_torch._C`` when
``pip install`` built it, else a just-in-time build of the same sources with
``torch.utils.cpp_extension.load`` (cached by torch under ``TORCH_EXTENSIONS_DIR``).

``LOWBIT_TORCH_CODEC_ONLY=1`` builds just in time the codec functions alone (``encode``,
``decode``, ``frame_bytes``): a few sources instead of every collective, for
simulations and codec tests that need no communicator."""

import glob
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(_HERE, "csrc")

# nvcc flags: C++17 as lowbit requires, lowbit's constexpr use in device code.
CUDA_FLAGS = ["-std=c++17", "-O2", "--expt-relaxed-constexpr"]
CXX_FLAGS = ["-std=c++17", "-O2"]


def sources(codec_only=False):
    """The extension's sources: one per element type and feedback, so they compile in
    parallel; with codec_only, those of the codec functions."""
    if codec_only:
        return (sorted(glob.glob(os.path.join(CSRC, "codec_*.cu"))) +
                [os.path.join(CSRC, f) for f in ("codec_bindings.cpp", "bindings.cpp")])
    return (sorted(glob.glob(os.path.join(CSRC, "*.cu"))) +
            sorted(glob.glob(os.path.join(CSRC, "*.cpp"))))


def codec_only():
    """Whether this process uses the codec-only build (LOWBIT_TORCH_CODEC_ONLY=1)."""
    return os.environ.get("LOWBIT_TORCH_CODEC_ONLY") == "1"


def include_dir():
    """lowbit's headers: $LOWBIT_INCLUDE_DIR, else the repository this package sits in."""
    env = os.environ.get("LOWBIT_INCLUDE_DIR")
    candidates = [env] if env else []
    candidates.append(os.path.normpath(os.path.join(_HERE, "..", "..", "..", "include")))
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "lowbit", "lowbit.hpp")):
            return c
    raise RuntimeError(
        "lowbit_torch: lowbit's headers were not found; set LOWBIT_INCLUDE_DIR to the "
        "directory holding lowbit/lowbit.hpp (e.g. <prefix>/include after cmake --install)")


_EXT = None


def extension():
    """The compiled module, loading or building it once per process."""
    global _EXT
    if _EXT is not None:
        return _EXT
    only = codec_only()
    try:
        if only:
            raise ImportError("the codec-only build is always built just in time")
        from lowbit_torch import _C  # built by pip install

        _EXT = _C
    except ImportError:
        from torch.utils.cpp_extension import load

        defines = ["-DLOWBIT_TORCH_CODEC_ONLY"] if only else []
        _EXT = load(
            name="lowbit_torch_codec_C" if only else "lowbit_torch_C",
            sources=sources(only),
            extra_include_paths=[include_dir(), CSRC],
            extra_cflags=CXX_FLAGS + defines,
            extra_cuda_cflags=CUDA_FLAGS + defines,  # arches: $TORCH_CUDA_ARCH_LIST or the GPUs'
            extra_ldflags=["-lnccl"],
            verbose=os.environ.get("LOWBIT_TORCH_VERBOSE") == "1",
        )
    return _EXT


def collectives():
    """The compiled module, which must hold the collectives (not the codec-only build)."""
    ext = extension()
    if not hasattr(ext, "Communicator"):
        raise RuntimeError("lowbit_torch: this process uses the codec-only build "
                           "(LOWBIT_TORCH_CODEC_ONLY=1), which has no collectives; unset it")
    return ext
