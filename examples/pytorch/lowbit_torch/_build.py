"""How the compiled part is built and found: the table of what it compiles, the sources
generated from that table, the compiler and its flags, and the module itself (the
installed ``lowbit_torch._C`` when ``pip install`` built it, else a just-in-time build of
the same sources with ``torch.utils.cpp_extension.load``, cached by torch under
``TORCH_EXTENSIONS_DIR``).

``LOWBIT_TORCH_CODEC_ONLY=1`` builds just in time the codec functions alone (``encode``,
``decode``, ``frame_bytes``): a few sources instead of every collective, for
simulations and codec tests that need no communicator. ``LOWBIT_TORCH_BACKENDS=node`` (a
comma list of BACKENDS' names) compiles the collectives of those backends only, under a
module name of its own (``build_name``): real ranks on one GPU need the node backend
alone, a third of the whole build's instances (examples/pytorch/README.md's "Build times"
gives each kind of source's CPU-seconds).

This file imports nothing but the standard library at the top (torch only inside the
functions that build), so setup.py and the build tests load it by path."""

import contextlib
import os
import shutil
import subprocess

_HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(_HERE, "csrc")

# --------------------------------------------------------------------------- the table
# What the extension compiles, written once. generate() writes from it one source per
# instance (they compile in parallel) and instances.h, the run-time dispatch from
# Python's choices onto those instances; the Python side takes its choices from it too
# (DDPState's feedback rules, the codec's dtypes, the tests' parameters).

#: Element types: torch's dtype name -> the C++ type.
DTYPES = {
    "float32": "float",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
}

#: Error-feedback rules: Python's name -> (lowbit's policy, other names accepted).
FEEDBACK = {
    "none": ("lowbit::feedback::none", ()),
    # fp32 state
    "residual": ("lowbit::feedback::residual<float>", ("residual_fp32",)),
    "residual_bf16": ("lowbit::feedback::residual<__nv_bfloat16>", ()),
    # the residual, plus one on the shard owner's second quantization (two_phase, more
    # than two ranks)
    "residual_stage2": ("lowbit::feedback::residual<float, true>", ()),
    "ef21": ("lowbit::feedback::ef21<float>", ()),
}

#: Per operation, the element types and feedback rules compiled: one instance per
#: (dtype, rule) pair; None where the operation takes no feedback. The collectives are
#: compiled per backend too (BACKENDS).
COMPILED = {
    "codec": (("float32", "float16", "bfloat16"), None),
    "all_reduce": (("float32", "float16", "bfloat16"), tuple(FEEDBACK)),
    # FSDP2 reduces in float32 or bfloat16 (its reduce_dtype)
    "reduce_scatter": (("float32", "bfloat16"), ("none", "residual")),
    "all_gather": (("float32", "bfloat16"), None),
}

#: The collectives' backends: Python's name -> (lowbit's backend tag, per operation what
#: is compiled for it: None for all of COMPILED's dtypes and rules, else a (dtypes,
#: rules) subset of them). "nccl": an NCCL process group's own communicator; "node": the
#: ranks of one node as processes mapping each other's memory with CUDA IPC, no NCCL
#: (lowbit/collective/node.cuh), bootstrapped over the process group's Store: how a gloo
#: group of several ranks on one GPU runs lowbit (NCCL refuses two ranks on one GPU).
#: The node backend compiles fewer instances (the build's time grows with each): the
#: dtypes DDP and FSDP2 reduce in and the rules the multi-rank tests and the accuracy
#: runs use.
BACKENDS = {
    "nccl": ("lowbit::backend::nccl",
             {"all_reduce": None, "reduce_scatter": None, "all_gather": None}),
    "node": ("lowbit::backend::node",
             {"all_reduce": (("float32", "bfloat16"), ("none", "residual", "residual_stage2")),
              "reduce_scatter": None, "all_gather": None}),
}

#: The quantization grids: Python's name -> lowbit's tag (the codec choice's grid).
GRIDS = {
    "zero": "lowbit::quant::grid::zero",
    "full": "lowbit::quant::grid::full",
}

#: Operations whose instances are each compiled as one source per grid (the instance's
#: two halves compile in parallel): the all-reduce, whose instance is by far the heaviest
#: (every width, rounding and algorithm of a grid; see examples/pytorch/README.md's build
#: times).
SPLIT_BY_GRID = ("all_reduce",)

# Per operation: the header defining its templates, and the explicit instantiation of
# one instance ({T}: the C++ element type, {F}: the feedback policy, {B}: the backend tag,
# {G}: a grid tag, for the operations whose factory takes the grid). The headers are
# torch-free (csrc/core.h): the generated sources never include torch's.
_ARGS = "const communicator&, std::size_t, const codec_choice&, const collective_config&"
_INSTANTIATION = {
    "codec": ("codec_impl.cuh", "template struct codec_core<{T}>;"),
    "all_reduce": ("collectives_impl.cuh",
                   "template std::unique_ptr<all_reduce_core>\n"
                   "make_all_reduce_core<{B}, {T}, {F}, {G}>(%s);" % _ARGS),
    "reduce_scatter": ("collectives_impl.cuh",
                       "template std::unique_ptr<shard_collective_core>\n"
                       "make_reduce_scatter_core<{B}, {T}, {F}>(%s);" % _ARGS),
    "all_gather": ("collectives_impl.cuh",
                   "template std::unique_ptr<shard_collective_core>\n"
                   "make_all_gather_core<{B}, {T}>(%s);" % _ARGS),
}
_TAKES_GRID = ("all_reduce",)  # the factories with a {G}: the glue dispatches the grid
_CODEC_ONLY = ("codec",)  # the operations of the codec-only build
_GENERATED_BY = ("// Generated by lowbit_torch/_build.py from its table (DTYPES, FEEDBACK, "
                 "COMPILED, BACKENDS):\n// edit the table, not this file.\n")


def chosen_backends(env=None):
    """The backends this build compiles: ``LOWBIT_TORCH_BACKENDS`` (a comma list of
    BACKENDS' names, e.g. ``node`` for real ranks on one GPU, whose build then takes about
    a third of the whole one's instances), else all of them."""
    env = os.environ if env is None else env
    text = env.get("LOWBIT_TORCH_BACKENDS", "").strip()
    if not text:
        return tuple(BACKENDS)
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise ValueError(f"LOWBIT_TORCH_BACKENDS={text!r}: expected a comma list of "
                         f"{', '.join(BACKENDS)}")
    return names


def backends(op):
    """The backends `op` is compiled for (empty for the codec, which needs none)."""
    chosen = chosen_backends()
    return tuple(b for b, (_, ops) in BACKENDS.items() if op in ops and b in chosen)


def build_name(only=False):
    """The just-in-time module's name: one per build (codec-only, or the backends chosen),
    so that builds of different contents never share a cache."""
    if only:
        return "lowbit_torch_codec_C"
    chosen = chosen_backends()
    return "lowbit_torch_C" if chosen == tuple(BACKENDS) else "lowbit_torch_C_" + "_".join(chosen)


def _subset(op, backend):
    if backend is None:
        return COMPILED[op]
    chosen = BACKENDS[backend][1][op]
    return COMPILED[op] if chosen is None else chosen


def dtypes(op, backend=None):
    """The torch dtype names `op` is compiled for (on `backend`; None: COMPILED's)."""
    return _subset(op, backend)[0]


def feedback_rules(op, backend=None):
    """The feedback rules `op` is compiled with (Python's names; empty when it takes none),
    on `backend` (None: COMPILED's)."""
    return _subset(op, backend)[1] or ()


def instances(ops=None):
    """(op, dtype, rule or None, backend or None) of every compiled instance, in the
    table's order."""
    return [(op, t, f, b) for op in (ops or COMPILED) for b in (backends(op) or (None,))
            for t in dtypes(op, b) for f in (feedback_rules(op, b) or (None,))]


def source_parts(op):
    """The grids of each source an instance of `op` compiles as: one source per grid for
    SPLIT_BY_GRID's operations, else one source (of every grid where the factory takes one,
    of None where it does not)."""
    if op not in _TAKES_GRID:
        return [None]
    if op in SPLIT_BY_GRID:
        return [(g,) for g in GRIDS]
    return [tuple(GRIDS)]


def _source_name(op, dtype, rule, backend=None, grids=None):
    split = grids if grids and len(grids) == 1 else ()
    return "_".join(x for x in (op, backend, dtype, rule, *split) if x) + ".cu"


def _instance_source(op, dtype, rule, backend=None, grids=None):
    header, text = _INSTANTIATION[op]
    what = (f"{op} for {dtype}" + (f" with feedback '{rule}'" if rule else "")
            + (f" on the {backend} backend" if backend else "")
            + (f", {' and '.join(grids)} grid" + ("s" if len(grids) > 1 else "") if grids else ""))
    body = "\n".join(text.format(T=DTYPES[dtype], F=FEEDBACK[rule][0] if rule else "",
                                 B=BACKENDS[backend][0] if backend else "", G=GRIDS.get(g, ""))
                     for g in (grids or (None,)))
    return (f"{_GENERATED_BY}// One instance: {what}.\n#include \"{header}\"\n\n"
            f"namespace lowbit_torch {{\n{body}\n}}  // namespace lowbit_torch\n")


def _quoted_list(names):
    q = [f"'{n}'" for n in names]
    return q[0] if len(q) == 1 else ", ".join(q[:-1]) + " or " + q[-1]


def _plain_list(names):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _kind(rule):
    return f"feedback_kind::{rule}"


def _visit_cases(op):
    """The body of visit(): one branch per compiled instance of `op` (matching the backend
    too where `op` has backends), calling f with its tags; then the struct's end."""
    lines = []
    for _, t, rule, b in instances([op]):
        cond = f"t == scalar_type_of<{DTYPES[t]}>()"
        call = f"tag<{DTYPES[t]}>{{}}"
        if b:
            cond = f"b == backend_kind::{b} && " + cond
            call = f"tag<{BACKENDS[b][0]}>{{}}, " + call
        if rule:
            cond += f" && k == {_kind(rule)}"
            call += f", tag<{FEEDBACK[rule][0]}>{{}}"
        lines += [f"    if ({cond}) {{", f"      f({call});", "      return true;", "    }"]
    return lines + ["    return false;", "  }", "};"]


def _visit(op):
    """The C++ struct of `op`'s instances (see instances.h's comment)."""
    if backends(op):
        return _visit_per_backend(op)
    rules = feedback_rules(op)
    lines = [f"struct {op}_instances {{",
             f"  static constexpr const char* dtypes = \"{_plain_list(dtypes(op))}\";"]
    if rules:
        lines.append(f"  static constexpr const char* feedback = \"{_quoted_list(rules)}\";")
    lines.append("  static bool has_dtype(at::ScalarType t) {")
    lines.append("    return " + " || ".join(f"t == scalar_type_of<{DTYPES[t]}>()"
                                             for t in dtypes(op)) + ";")
    lines.append("  }")
    lines.append("  template <class F>")
    if rules:
        lines.append("  static bool visit(at::ScalarType t, feedback_kind k, F&& f) {")
    else:
        lines.append("  static bool visit(at::ScalarType t, F&& f) {")
    return "\n".join(lines + _visit_cases(op))


def _visit_per_backend(op):
    """The C++ struct of a collective's instances, per backend: dtypes(b) and feedback(b)
    for messages, has_dtype(b, t), visit(b, t, [k,] f) calling f(tag<Backend>{}, tag<T>{}
    [, tag<Feedback>{}])."""
    takes_rules = bool(feedback_rules(op))
    lines = [f"struct {op}_instances {{",
             "  static bool has_backend(backend_kind b) {",
             "    return " + " || ".join(f"b == backend_kind::{b}" for b in backends(op)) + ";",
             "  }",
             "  static const char* dtypes(backend_kind b) {"]
    for b in backends(op):
        lines.append(f"    if (b == backend_kind::{b}) return \"{_plain_list(dtypes(op, b))}\";")
    lines += ["    return \"no\";", "  }"]
    if takes_rules:
        lines.append("  static const char* feedback(backend_kind b) {")
        for b in backends(op):
            lines.append(f"    if (b == backend_kind::{b}) "
                         f"return \"{_quoted_list(feedback_rules(op, b))}\";")
        lines += ["    return \"none compiled\";", "  }"]
    lines.append("  static bool has_dtype(backend_kind b, at::ScalarType t) {")
    for b in backends(op):
        lines.append(f"    if (b == backend_kind::{b}) return "
                     + " || ".join(f"t == scalar_type_of<{DTYPES[t]}>()"
                                   for t in dtypes(op, b)) + ";")
    lines += ["    return false;", "  }", "  template <class F>"]
    if takes_rules:
        lines.append("  static bool visit(backend_kind b, at::ScalarType t, feedback_kind k, "
                     "F&& f) {")
    else:
        lines.append("  static bool visit(backend_kind b, at::ScalarType t, F&& f) {")
    return "\n".join(lines + _visit_cases(op))


def instances_header():
    """instances.h: the feedback rules as a C++ enum with their Python names, and per
    operation the dispatch onto its compiled instances."""
    names = []
    for rule, (_, aliases) in FEEDBACK.items():
        cond = " || ".join(f"name == \"{n}\"" for n in (rule,) + tuple(aliases))
        names += [f"  if ({cond}) {{", f"    kind = {_kind(rule)};", "    return true;", "  }"]
    parts = [
        _GENERATED_BY + "// What the extension compiles: the feedback rules, and per operation "
        "the\n// instances of the run-time choices (one source each).\n#pragma once\n\n"
        "#include <string>\n\n#include \"common.h\"\n#include \"lowbit/collective/types.hpp\"\n"
        "#include \"lowbit/feedback/state.hpp\"\n\n"
        "namespace lowbit_torch {\n",
        "/// Error feedback chosen at run time: one per rule.",
        f"enum class feedback_kind {{ {', '.join(FEEDBACK)} }};\n",
        "/// Every rule's Python name, for messages.",
        f"inline constexpr const char* feedback_names = \"{_quoted_list(list(FEEDBACK))}\";\n",
        "/// The rule of a Python name (its own or an alias); false for an unknown name.",
        "inline bool feedback_of(const std::string& name, feedback_kind& kind) {",
        *names, "  return false;", "}\n",
        "/// Per operation: the dtypes (and feedback rules) compiled, for messages; has_dtype;",
        "/// visit(dtype, [feedback,] f) calls f(tag<T>{}[, tag<Feedback>{}]) with the compiled",
        "/// instance of the choice and returns true, or returns false where none is compiled.",
        "/// The collectives' take the backend first (common.h's backend_kind, BACKENDS in the",
        "/// table): has_backend(b), dtypes(b), feedback(b), has_dtype(b, dtype) and",
        "/// visit(b, dtype, [feedback,] f) calling f(tag<Backend>{}, tag<T>{}[, tag<Feedback>{}]).",
    ]
    parts += [_visit(op) + "\n" for op in COMPILED]
    parts.append("}  // namespace lowbit_torch\n")
    return "\n".join(parts)


def _write_if_changed(path, text):
    """Writes `text` to `path` unless it holds it already (so a build tool sees an
    unchanged file as unchanged); atomic, for processes that build side by side."""
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def generate(directory, codec_only=False):
    """Writes instances.h and one source per compiled instance (with codec_only, the
    codec's) into `directory`; returns the sources' paths."""
    os.makedirs(directory, exist_ok=True)
    _write_if_changed(os.path.join(directory, "instances.h"), instances_header())
    paths = []
    for op, t, rule, backend in instances(_CODEC_ONLY if codec_only else None):
        for grids in source_parts(op):
            paths.append(os.path.join(directory, _source_name(op, t, rule, backend, grids)))
            _write_if_changed(paths[-1], _instance_source(op, t, rule, backend, grids))
    return paths


def sources(generated_dir, codec_only=False):
    """The extension's sources: the bindings in csrc/ (with codec_only, those of the codec
    functions), then those generate() writes into `generated_dir`. The bindings come first:
    each includes torch's headers, so they are among the longest to compile, and a parallel
    build that starts them first ends sooner."""
    if codec_only:
        written = [os.path.join(CSRC, f) for f in ("codec_bindings.cpp", "bindings.cpp")]
    else:
        written = sorted(os.path.join(CSRC, f) for f in os.listdir(CSRC) if f.endswith(".cpp"))
    return written + generate(generated_dir, codec_only)


# ------------------------------------------------------------------ compiler and flags

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


def jit_generated_dir(name):
    """Where the just-in-time build of module `name` has its generated sources: beside
    torch's own build folders ($TORCH_EXTENSIONS_DIR, else torch's default root)."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return os.path.join(root, name + "_generated")


_EXT = None


def extension():
    """The compiled module, loading or building it once per process."""
    global _EXT
    if _EXT is not None:
        return _EXT
    only = codec_only()
    if not only and _installed_module_exists():
        # Built by pip install: its import error is the one to see (a missing library,
        # an ABI mismatch with this torch), not a just-in-time build's.
        try:
            from lowbit_torch import _C
        except ImportError as e:
            raise ImportError(f"lowbit_torch: the installed extension lowbit_torch._C does not "
                              f"import: {e} (rebuild it against this torch: pip install "
                              "--no-build-isolation examples/pytorch)") from e
        _EXT = _C
    else:
        if not os.path.isdir(CSRC):
            raise ImportError(
                "lowbit_torch: the compiled extension lowbit_torch._C is not installed and "
                f"its sources ({CSRC}) are not here to build it just in time: install with "
                "pip install --no-build-isolation examples/pytorch, or put examples/pytorch "
                "of a lowbit checkout on PYTHONPATH")
        from torch.utils.cpp_extension import load

        name = build_name(only)
        generated = jit_generated_dir(name)
        defines = ["-DLOWBIT_TORCH_CODEC_ONLY"] if only else []
        with build_environment():
            _EXT = load(
                name=name,
                sources=sources(generated, only),
                extra_include_paths=[include_dir(), CSRC, generated],
                extra_cflags=cxx_flags() + defines,
                extra_cuda_cflags=cuda_flags() + defines,  # arches: $TORCH_CUDA_ARCH_LIST or the GPUs'
                extra_ldflags=["-lnccl"],
                verbose=os.environ.get("LOWBIT_TORCH_VERBOSE") == "1",
            )
    return _EXT


def _installed_module_exists():
    """Whether a compiled lowbit_torch._C sits beside this file (pip install built it)."""
    import importlib.machinery

    return any(os.path.exists(os.path.join(_HERE, "_C" + suffix))
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def collectives():
    """The compiled module, which must hold the collectives (not the codec-only build)."""
    ext = extension()
    if not hasattr(ext, "Communicator"):
        raise RuntimeError("lowbit_torch: this process uses the codec-only build "
                           "(LOWBIT_TORCH_CODEC_ONLY=1), which has no collectives; unset it")
    return ext
