"""How the compiled part is found or built: the installed ``lowbit_torch._C`` when
``pip install`` built it, else a just-in-time build of the same sources with
``torch.utils.cpp_extension.load`` (cached by torch under ``TORCH_EXTENSIONS_DIR``).

``LOWBIT_TORCH_CODEC_ONLY=1`` builds just in time the codec functions alone (``encode``,
``decode``, ``frame_bytes``): a few sources instead of every collective, for
simulations and codec tests that need no communicator."""

import contextlib
import glob
import os
import shutil
import subprocess

_HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(_HERE, "csrc")


def cxx_standard(torch_include=None):
    """``-std=c++17``, lowbit's own standard, unless torch's headers refuse anything older
    than C++20 (newer torch releases do: ATen.h says so in an #error). torch_include:
    torch's header directory (default: the installed torch's)."""
    if torch_include is None:
        from torch.utils.cpp_extension import include_paths

        torch_include = include_paths()[0]
    try:
        with open(os.path.join(torch_include, "ATen", "ATen.h")) as f:
            needs_20 = "C++20 or later" in f.read()
    except OSError:
        needs_20 = False
    return "-std=c++20" if needs_20 else "-std=c++17"


def cuda_flags():
    """nvcc's flags: the standard, and lowbit's constexpr use in device code."""
    return [cxx_standard(), "-O2", "--expt-relaxed-constexpr"]


def cxx_flags():
    return [cxx_standard(), "-O2"]


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


def loaded_libstdcxx(maps="/proc/self/maps"):
    """The libstdc++ this process has loaded (torch loads one), resolved; None when none
    is loaded or the process map cannot be read (not Linux)."""
    try:
        with open(maps) as fh:
            for line in fh:
                path = line.split()[-1] if line.strip() else ""
                if "/libstdc++.so" in path:
                    return os.path.realpath(path)
    except OSError:
        pass
    return None


def compiler_libstdcxx(cxx):
    """The libstdc++ shared library that the C++ compiler `cxx` links, resolved; None when
    it has only the static archive (or cannot say)."""
    try:
        out = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return os.path.realpath(out) if os.path.isabs(out) and os.path.exists(out) else None


def compilers(env=None, loaded=None, fallbacks=(("/usr/bin/g++", "/usr/bin/gcc"),
                                                 ("/usr/bin/c++", "/usr/bin/cc"))):
    """Environment overrides (CXX and CC) for building the extension.

    The module must link the libstdc++ that the Python process runs: a compiler with
    another one (a toolchain of its own under /opt, or one with only the static archive)
    puts a second copy beside it, the two disagree on the locale, and the module's first
    formatted message (any error it raises) crashes the process. So the compiler named by
    CXX, else the default c++, is kept when its libstdc++ is the loaded one; else the
    first fallback whose libstdc++ is, with a message. When the process has loaded none
    (torch not imported yet) nothing is overridden. Raises when no compiler qualifies."""
    env = os.environ if env is None else env
    loaded = loaded_libstdcxx() if loaded is None else loaded
    chosen = env.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not loaded or chosen is None or compiler_libstdcxx(chosen) == loaded:
        return {}
    for cxx, cc in fallbacks:
        if os.path.exists(cxx) and compiler_libstdcxx(cxx) == loaded:
            print(f"lowbit_torch: building with {cxx}, not {chosen}: {chosen} links "
                  f"{compiler_libstdcxx(chosen) or 'a static libstdc++'} where this process "
                  f"runs {loaded}")
            return {"CXX": cxx, "CC": cc}
    raise RuntimeError(
        f"lowbit_torch: the C++ compiler {chosen} links "
        f"{compiler_libstdcxx(chosen) or 'a static libstdc++'}, not the {loaded} this "
        "process runs; the module would crash on its first error message. Set CXX (and CC) "
        "to a compiler of the same libstdc++ (usually the distribution's g++)")


@contextlib.contextmanager
def build_environment():
    """The process environment with compilers() applied, for the length of a build."""
    overrides = compilers()
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
        with build_environment():
            _EXT = load(
                name="lowbit_torch_codec_C" if only else "lowbit_torch_C",
                sources=sources(only),
                extra_include_paths=[include_dir(), CSRC],
                extra_cflags=cxx_flags() + defines,
                extra_cuda_cflags=cuda_flags() + defines,  # arches: $TORCH_CUDA_ARCH_LIST or the GPUs'
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
