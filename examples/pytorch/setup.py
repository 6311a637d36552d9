"""pip install --no-build-isolation examples/pytorch  (torch must already be installed:
the extension compiles against it). LOWBIT_INCLUDE_DIR points at lowbit's headers when
this directory is not inside the lowbit repository."""

import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lowbit_torch"))
import _build  # noqa: E402  (the same source list and flags as the just-in-time build)

os.environ.update(_build.compilers())  # a compiler that links libstdc++ shared

setup(
    name="lowbit_torch",
    version="0.1.0",
    description="lowbit's low-bit collectives for PyTorch DDP and FSDP2",
    packages=["lowbit_torch"],
    ext_modules=[
        CUDAExtension(
            name="lowbit_torch._C",
            sources=[os.path.relpath(s) for s in _build.sources()],
            include_dirs=[_build.include_dir(), _build.CSRC],
            extra_compile_args={"cxx": _build.cxx_flags(), "nvcc": _build.cuda_flags()},
            libraries=["nccl"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
