"""The compiled part, lowbit_torch._C (the package's metadata and entry points are in
pyproject.toml):

    pip install --no-build-isolation examples/pytorch

torch (>= _build.MIN_TORCH) must already be installed: the extension compiles against
it. The wheel (and an sdist) ship csrc/ and lowbit's headers (include/lowbit, copied into
lowbit_torch/include), so an installed copy can still build the module just in time.
LOWBIT_INCLUDE_DIR points at lowbit's headers when this directory is not inside the
lowbit repository; LOWBIT_NCCL_HOME at an NCCL (else the CUDA Toolkit's or the system's,
else torch's own NCCL wheel: _build.nccl_location). LOWBIT_TORCH_SKIP_BUILD=1 installs
the package without compiling: the first use builds the module just in time. The
per-instance sources are generated into build/generated/ from the table in
lowbit_torch/_build.py, as the just-in-time build does."""

import importlib.util
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

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


class BuildPy(build_py):
    """Also copies lowbit's headers into the built package's include/ (from the repository
    or LOWBIT_INCLUDE_DIR; an sdist already has them there, as package data)."""

    def run(self):
        super().run()
        _build.copy_headers(os.path.join(self.build_lib, "lowbit_torch", "include"))


class Sdist(sdist):
    """Also puts lowbit's headers into the sdist, as lowbit_torch/include."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        _build.copy_headers(os.path.join(base_dir, "lowbit_torch", "include"))


def _extensions():
    if os.environ.get("LOWBIT_TORCH_SKIP_BUILD") == "1":
        print("lowbit_torch: LOWBIT_TORCH_SKIP_BUILD=1: the extension is not compiled now; "
              "the first use builds it just in time from the installed sources")
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CUDAExtension
    except ImportError as e:
        if not any(c in sys.argv for c in ("bdist_wheel", "build_ext", "build", "install",
                                           "develop", "editable_wheel")):
            return [], {}  # an sdist or metadata alone needs no torch
        sys.exit(f"lowbit_torch: torch must be installed before this package ({e}): install "
                 "torch, then pip install --no-build-isolation examples/pytorch (without "
                 "--no-build-isolation pip builds in an environment without torch)")
    too_old = _build.torch_too_old(torch.__version__)
    if too_old:
        sys.exit(too_old)
    os.environ.update(_build.compilers())  # a compiler that links libstdc++ shared
    nccl = _build.nccl_location()
    print(f"lowbit_torch: building against {nccl!r}")
    generated = os.path.join(HERE, "build", "generated")
    ext = CUDAExtension(
        name="lowbit_torch._C",
        sources=[os.path.relpath(s) for s in _build.sources(generated)],
        include_dirs=[_build.include_dir(), _build.CSRC, generated, nccl.include],
        extra_compile_args={"cxx": _build.cxx_flags(), "nvcc": _build.cuda_flags()},
        library_dirs=[nccl.lib] if nccl.lib else [],
        libraries=[nccl.library()],
        runtime_library_dirs=[nccl.lib] if nccl.rpath() else [],
    )
    return [ext], {"build_ext": BuildExtension}


_ext_modules, _ext_commands = _extensions()

setup(
    ext_modules=_ext_modules,
    cmdclass={"build_py": BuildPy, "sdist": Sdist, **_ext_commands},
)
