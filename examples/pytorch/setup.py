"""The compiled part, lowbit_torch._C (the package's metadata and entry points are in
pyproject.toml):

    pip install --no-build-isolation examples/pytorch

torch must already be installed: the extension compiles against it. LOWBIT_INCLUDE_DIR
points at lowbit's headers when this directory is not inside the lowbit repository. The
per-instance sources are generated into build/generated/ from the table in
lowbit_torch/_build.py, as the just-in-time build does."""

import importlib.util
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_build():
    """lowbit_torch/_build.py on its own, by path (the package is not importable while
    pip builds it): the same table, sources and flags as the just-in-time build."""
    spec = importlib.util.spec_from_file_location(
        "lowbit_torch_build", os.path.join(HERE, "lowbit_torch", "_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_build = _load_build()
os.environ.update(_build.compilers())  # a compiler that links libstdc++ shared
GENERATED = os.path.join(HERE, "build", "generated")

setup(
    ext_modules=[
        CUDAExtension(
            name="lowbit_torch._C",
            sources=[os.path.relpath(s) for s in _build.sources(GENERATED)],
            include_dirs=[_build.include_dir(), _build.CSRC, GENERATED],
            extra_compile_args={"cxx": _build.cxx_flags(), "nvcc": _build.cuda_flags()},
            libraries=["nccl"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
