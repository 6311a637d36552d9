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
import re
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


#: lowbit's kernel launchers compiled once for the whole module, in sources of their own
#: (kernels_<dtype>_<grid>.cu: every width and rounding of one grid), and declared
#: `extern template` in every other generated source (shared_kernels.h), which then
#: compiles none of their kernels: the decoders and the reductions are the same for every
#: feedback rule, backend and operation, and each instance used to compile its own copy.
#: Per launcher (a function template of lowbit::kernels that launches a kernel): its
#: template arguments after the codec ({T}: the element type, {Fb}: a feedback ref) and
#: its parameters, exactly as lowbit declares them; per launcher the element types and
#: feedback refs instantiated ("all": every dtype of the instances compiled, plus float
#: where the reductions sum in fp32).
_KP = "lowbit::kernels::"
SHARED_KERNELS = {
    # decode, decode_accumulate: the decode kernel (decode_kernel<Codec, T>)
    "decode": (_KP + "decode", "{T}", None,
               "const std::byte*, std::size_t, {T}*, float, cudaStream_t, "
               "const " + _KP + "launch_policy&, const " + _KP + "header_check&"),
    "decode_accumulate": (_KP + "decode_accumulate", "{T}", None,
                          "const std::byte*, std::size_t, int, std::size_t, {T}*, float, "
                          "cudaStream_t, const " + _KP + "header_check&"),
    # encode without feedback and with the fp32 residual (encode_kernel<Codec, T, Fb>)
    "encode": (_KP + "encode", "{T}, {Fb}", ("none", "residual"),
               "const {T}*, std::size_t, std::byte*, const lowbit::rng_key&, std::uint64_t, "
               "{Fb}, cudaStream_t, const " + _KP + "launch_policy&, const " + _KP +
               "header_stamp&"),
    # the all-reduce's middle: decode-accumulate-encode, with no second-stage feedback or
    # the stage-2 residual (reduce_kernel<Codec, T, Fb>)
    "reduce": (_KP + "detail::launch_reduce", "{Fb}, {T}", ("none", "residual"),
               "const std::byte*, std::size_t, int, std::size_t, std::byte*, "
               "const lowbit::rng_key&, std::uint64_t, {Fb}, {T}*, float, bool, cudaStream_t, "
               "const " + _KP + "launch_policy&, const char*, const " + _KP + "framing&"),
}
#: The feedback refs SHARED_KERNELS names (the kernels' view of a rule's state).
_FEEDBACK_REFS = {"none": "lowbit::feedback::none_ref",
                  "residual": "lowbit::feedback::residual_ref<float>"}
#: The widths and roundings every codec choice spans (core.h's with_bits, with_rounding).
_WIDTHS = (1, 2, 4, 8)
_ROUNDINGS = ("lowbit::round::nearest", "lowbit::round::stochastic")


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


def _instance_source(op, dtype, rule, backend=None, grids=None, shared=True):
    header, text = _INSTANTIATION[op]
    what = (f"{op} for {dtype}" + (f" with feedback '{rule}'" if rule else "")
            + (f" on the {backend} backend" if backend else "")
            + (f", {' and '.join(grids)} grid" + ("s" if len(grids) > 1 else "") if grids else ""))
    body = "\n".join(text.format(T=DTYPES[dtype], F=FEEDBACK[rule][0] if rule else "",
                                 B=BACKENDS[backend][0] if backend else "", G=GRIDS.get(g, ""))
                     for g in (grids or (None,)))
    extern = "#include \"shared_kernels.h\"\n" if shared else ""
    return (f"{_GENERATED_BY}// One instance: {what}.\n#include \"{header}\"\n{extern}\n"
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


def shared_dtypes(ops=None):
    """The element types the shared kernels are compiled for: those of the instances of
    `ops` (default: every operation chosen), and float (the reductions' fp32 sums)."""
    used = {t for _, t, _, _ in instances(ops)} | {"float32"}
    return tuple(t for t in DTYPES if t in used)


def _codec_type(bits, grid, rounding):
    return (f"lowbit::codec<lowbit::quant::absmax<{bits}, lowbit_torch::codec_block, "
            f"{GRIDS[grid]}>, {rounding}>")


def shared_kernel_lines(dtype, grid, prefix):
    """The declarations (prefix "extern template") or definitions ("template") of every
    SHARED_KERNELS launcher at `dtype` and `grid`: one line each."""
    t = DTYPES[dtype]
    lines = []
    for name, args, refs, params in SHARED_KERNELS.values():
        for fb in (refs or (None,)):
            ref = _FEEDBACK_REFS[fb] if fb else ""
            for bits in _WIDTHS:
                for rounding in _ROUNDINGS:
                    targs = args.format(T=t, Fb=ref)
                    lines.append(f"{prefix} void {name}<{_codec_type(bits, grid, rounding)}, "
                                 f"{targs}>({params.format(T=t, Fb=ref)});")
    return lines


def shared_kernels_header(ops=None):
    """shared_kernels.h: every shared launcher declared extern template (instantiated in
    the kernels_<dtype>_<grid>.cu sources alone)."""
    body = [line for t in shared_dtypes(ops) for g in GRIDS
            for line in shared_kernel_lines(t, g, "extern template")]
    return (_GENERATED_BY + "// The kernel launchers instantiated once, in "
            "kernels_<dtype>_<grid>.cu (SHARED_KERNELS):\n// every other source includes "
            "this after lowbit's headers and compiles none of their kernels.\n#pragma once\n\n"
            "#include \"core.h\"\n#include \"lowbit/kernels/kernels.cuh\"\n\n"
            + "\n".join(body) + "\n")


def _shared_kernels_source(dtype, grid):
    lines = shared_kernel_lines(dtype, grid, "template")
    return (_GENERATED_BY + f"// The shared kernel launchers (SHARED_KERNELS) for {dtype}, "
            f"{grid} grid: {len(lines)} instantiations.\n#include \"core.h\"\n"
            "#include \"lowbit/kernels/kernels.cuh\"\n\n" + "\n".join(lines) + "\n")


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
    codec's) into `directory`, and (but for codec_only, whose few sources compile their
    own kernels) shared_kernels.h and the sources of the shared kernels, one per element
    type and grid; returns the sources' paths."""
    os.makedirs(directory, exist_ok=True)
    _write_if_changed(os.path.join(directory, "instances.h"), instances_header())
    shared = not codec_only
    paths = []
    if shared:
        _write_if_changed(os.path.join(directory, "shared_kernels.h"), shared_kernels_header())
        for t in shared_dtypes():
            for g in GRIDS:
                paths.append(os.path.join(directory, f"kernels_{t}_{g}.cu"))
                _write_if_changed(paths[-1], _shared_kernels_source(t, g))
    for op, t, rule, backend in instances(_CODEC_ONLY if codec_only else None):
        for grids in source_parts(op):
            paths.append(os.path.join(directory, _source_name(op, t, rule, backend, grids)))
            _write_if_changed(paths[-1], _instance_source(op, t, rule, backend, grids, shared))
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


#: lowbit's headers as this package ships them (setup.py copies include/lowbit here into a
#: wheel and an sdist): what an installed copy builds just in time against.
PACKAGED_INCLUDE = os.path.join(_HERE, "include")
#: The repository's headers, when this package sits in a lowbit checkout.
REPO_INCLUDE = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "include"))


def include_dir(env=None, candidates=None):
    """lowbit's headers: $LOWBIT_INCLUDE_DIR, else the copy this package ships
    (PACKAGED_INCLUDE: an installed copy, an sdist), else the repository this package sits
    in (REPO_INCLUDE)."""
    env = os.environ if env is None else env
    if candidates is None:
        candidates = [env.get("LOWBIT_INCLUDE_DIR"), PACKAGED_INCLUDE, REPO_INCLUDE]
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "lowbit", "lowbit.hpp")):
            return c
    raise RuntimeError(
        "lowbit_torch: lowbit's headers were not found (looked in "
        + ", ".join(c for c in candidates if c) + "); set LOWBIT_INCLUDE_DIR to the directory "
        "holding lowbit/lowbit.hpp (e.g. <prefix>/include after cmake --install)")


def header_files(include):
    """The files of lowbit's headers under `include` (include/lowbit/...), relative to it:
    what a wheel or an sdist ships as lowbit_torch/include."""
    root = os.path.join(include, "lowbit")
    return sorted(os.path.relpath(os.path.join(d, f), include)
                  for d, _, files in os.walk(root) for f in files
                  if f.endswith((".hpp", ".cuh", ".h")))


def copy_headers(dest, include=None):
    """Copies lowbit's headers (header_files of `include`, default include_dir()) into
    `dest` (a package's include/); nothing when they are already there. Returns the
    files written."""
    include = include_dir() if include is None else include
    if os.path.realpath(include) == os.path.realpath(dest):
        return []
    written = []
    for rel in header_files(include):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(include, rel), target)
        written.append(target)
    return written


# ------------------------------------------------------------------------ torch and NCCL

#: The oldest torch this package runs on: ProcessGroupNCCL._comm_ptr() (how the
#: collectives borrow an NCCL group's communicator) is torch 2.8's, and
#: FSDPModule.set_custom_reduce_scatter / set_custom_all_gather (the FSDP2 collectives)
#: are torch 2.9's. pyproject.toml's dependencies say the same.
MIN_TORCH = (2, 9)


def torch_release(version):
    """(major, minor) of a torch version string ("2.11.0+cu130", "2.9.0a0+git1234"); None
    when it cannot be read."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_too_old(version):
    """The message for a torch older than MIN_TORCH; None for one recent enough (or one
    whose version cannot be read: the imports then tell)."""
    have = torch_release(version)
    if have is None or have >= MIN_TORCH:
        return None
    return (f"lowbit_torch needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (ProcessGroupNCCL."
            "_comm_ptr from 2.8, FSDPModule.set_custom_reduce_scatter from 2.9); this is torch "
            f"{version}: upgrade torch")


def nccl_version_of_code(code):
    """NCCL_VERSION_CODE (or ncclGetVersion's int) as (major, minor, patch): X*10000 + Y*100
    + Z from 2.9 on, X*1000 + Y*100 + Z before (nccl.h's NCCL_VERSION)."""
    code = int(code)
    if code >= 10000:
        return (code // 10000, code % 10000 // 100, code % 100)
    return (code // 1000, code % 1000 // 100, code % 100)


def nccl_header_version(include):
    """(major, minor, patch) of `include`/nccl.h (its NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    None when it cannot be read."""
    try:
        with open(os.path.join(include, "nccl.h")) as f:
            text = f.read()
    except OSError:
        return None
    got = {k: re.search(rf"#define\s+NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")}
    if all(got.values()):
        return tuple(int(got[k].group(1)) for k in ("MAJOR", "MINOR", "PATCH"))
    code = re.search(r"#define\s+NCCL_VERSION_CODE\s+(\d+)", text)
    return nccl_version_of_code(code.group(1)) if code else None


def _version_text(v):
    return ".".join(str(x) for x in v) if v else "unknown"


class NcclLocation:
    """An NCCL installation: `include` (holding nccl.h), `lib` (holding libnccl.so or
    libnccl.so.2), its header's version (or None) and where it was found (`origin`)."""

    def __init__(self, include, lib, origin):
        self.include, self.lib, self.origin = include, lib, origin
        self.version = nccl_header_version(include)

    def library(self):
        """The library's name for the linker: "nccl" where libnccl.so is there, else the
        versioned file itself (torch's NCCL wheel ships libnccl.so.2 alone)."""
        if self.lib and os.path.exists(os.path.join(self.lib, "libnccl.so")):
            return "nccl"
        return ":libnccl.so.2"

    def rpath(self):
        """Whether the module records `lib` as its run path (a wheel's directory, which no
        loader searches by default; torch loads the same library first anyway)."""
        return self.origin == WHEEL_ORIGIN

    def ldflags(self):
        flags = [f"-L{self.lib}"] if self.lib else []
        flags.append(f"-l{self.library()}")
        if self.rpath():
            flags.append(f"-Wl,-rpath,{self.lib}")
        return flags

    def __repr__(self):
        return (f"NCCL {_version_text(self.version)} ({self.origin}: {self.include}, "
                f"{self.lib})")


WHEEL_ORIGIN = "torch's NCCL wheel (nvidia-nccl-cu*)"


def _nccl_lib(dirs):
    for d in dirs:
        if d and any(os.path.exists(os.path.join(d, n)) for n in ("libnccl.so", "libnccl.so.2")):
            return d
    return None


def nccl_candidates(env=None, cuda_home=None, search_path=None):
    """The NCCL installations this machine has, in order of preference: the system's (the
    CUDA Toolkit's include/ and lib64/, then /usr and /usr/local), then torch's own NCCL
    wheel (nvidia/nccl/include and lib in a sys.path entry: the nvidia-nccl-cu* package
    pip installs with a CUDA torch). $LOWBIT_NCCL_HOME (its include/ and lib/) replaces
    them all."""
    env = os.environ if env is None else env
    home = env.get("LOWBIT_NCCL_HOME")
    if home:
        return [NcclLocation(os.path.join(home, "include"),
                             _nccl_lib([os.path.join(home, "lib"), os.path.join(home, "lib64")]),
                             "LOWBIT_NCCL_HOME")]
    if cuda_home is None:
        cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda"
    system = [(os.path.join(cuda_home, "include"),
               [os.path.join(cuda_home, "lib64"), os.path.join(cuda_home, "lib")]),
              ("/usr/include", ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                                "/usr/lib64", "/usr/lib"]),
              ("/usr/local/include", ["/usr/local/lib64", "/usr/local/lib"])]
    found = []
    for include, libs in system:
        lib = _nccl_lib(libs)
        if os.path.isfile(os.path.join(include, "nccl.h")) and lib:
            found.append(NcclLocation(include, lib, "the system's"))
    import sys

    for entry in (sys.path if search_path is None else search_path):
        root = os.path.join(entry or ".", "nvidia", "nccl")
        if os.path.isfile(os.path.join(root, "include", "nccl.h")):
            lib = _nccl_lib([os.path.join(root, "lib")])
            if lib:
                found.append(NcclLocation(os.path.join(root, "include"), lib, WHEEL_ORIGIN))
                break
    return found


def torch_nccl_version():
    """(major, minor, patch) of the NCCL torch runs (torch.cuda.nccl.version()); None for a
    torch without NCCL (a CPU build)."""
    try:
        import torch.cuda.nccl

        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - no NCCL in this torch, or no torch
        return None
    return tuple(v[:3]) if isinstance(v, tuple) else nccl_version_of_code(v)


def nccl_mismatch(header, runtime, what="torch's NCCL"):
    """("error" or "warning", message) when NCCL's header version `header` and a runtime
    version `runtime` (what="torch's NCCL", or the module's) disagree; None when they agree
    on major.minor or either is unknown. A major version apart is an error (another ABI);
    a minor version apart a warning: a newer header may declare functions the library
    lacks (the module then fails to load, naming the symbol), an older one is compatible."""
    if not header or not runtime or tuple(header[:2]) == tuple(runtime[:2]):
        return None
    text = (f"lowbit_torch: NCCL's header is {_version_text(header)} but {what} is "
            f"{_version_text(runtime)}")
    if header[0] != runtime[0]:
        return "error", text + ": another major version. Point LOWBIT_NCCL_HOME at the NCCL " \
                               "torch runs (its nvidia/nccl folder in site-packages)"
    return "warning", text + (": the module may call functions that library lacks. "
                              if tuple(header) > tuple(runtime) else ". ") + \
        "LOWBIT_NCCL_HOME picks the NCCL to build against (torch's: nvidia/nccl in site-packages)"


def nccl_location(env=None, runtime=None, candidates=None, warn=None):
    """The NCCL the extension builds against: the first of nccl_candidates() whose header
    has the major.minor of `runtime` (default: torch_nccl_version()), else the first. Raises
    when there is none, or when the chosen header is another major version than the
    runtime's; warns (`warn`, default warnings.warn) on another minor version."""
    if candidates is None:
        candidates = nccl_candidates(env)
    if not candidates:
        raise RuntimeError(
            "lowbit_torch: NCCL's header (nccl.h) and library were found neither in the CUDA "
            "Toolkit, /usr nor /usr/local, nor in torch's NCCL wheel (nvidia/nccl in "
            "site-packages: pip install nvidia-nccl-cu12 or -cu13, the one torch names); set "
            "LOWBIT_NCCL_HOME to a folder with include/nccl.h and lib/libnccl.so*")
    if runtime is None:
        runtime = torch_nccl_version()
    chosen = next((c for c in candidates
                   if runtime and c.version and c.version[:2] == tuple(runtime[:2])),
                  candidates[0])
    problem = nccl_mismatch(chosen.version, runtime)
    if problem and problem[0] == "error":
        raise RuntimeError(f"{problem[1]} ({chosen!r})")
    if problem:
        import warnings

        (warn or warnings.warn)(f"{problem[1]} ({chosen!r})")
    return chosen


def check_nccl_runtime(compiled, module_runtime, torch_runtime, warn=None):
    """Checks a loaded module's NCCL: the header it was compiled with (`compiled`), the
    library it calls (`module_runtime`, ncclGetVersion) and torch's (`torch_runtime`), each
    (major, minor, patch) or None. Another major version raises; another minor version
    warns. Two different library versions mean two NCCLs in one process: an NCCL group's
    communicator must not pass from one to the other. Returns the messages."""
    messages = []
    if module_runtime:
        problem = nccl_mismatch(compiled, module_runtime, "the NCCL library it calls")
    else:
        problem = nccl_mismatch(compiled, torch_runtime)
    if problem and problem[0] == "error":
        raise RuntimeError(problem[1])
    if problem:
        messages.append(problem[1])
    if module_runtime and torch_runtime and tuple(module_runtime) != tuple(torch_runtime):
        messages.append(
            f"lowbit_torch: the module calls NCCL {_version_text(module_runtime)} but torch "
            f"runs NCCL {_version_text(torch_runtime)}: two NCCL libraries in one process, "
            "and an NCCL group's communicator must not pass between them. Rebuild against "
            "torch's (LOWBIT_NCCL_HOME=<site-packages>/nvidia/nccl)")
    import warnings

    for m in messages:
        (warn or warnings.warn)(m)
    return messages


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


def jit_build(only=False, env=None):
    """What the just-in-time build compiles and how (torch.utils.cpp_extension.load's
    keyword arguments), from wherever this package is: its csrc/, lowbit's headers
    (include_dir()) and NCCL (nccl_location()). Writes the generated sources. Raises
    ImportError when csrc/ is not here."""
    if not os.path.isdir(CSRC):
        raise ImportError(
            "lowbit_torch: the compiled extension lowbit_torch._C is not installed and "
            f"its sources ({CSRC}) are not here to build it just in time: install with "
            "pip install --no-build-isolation examples/pytorch, or put examples/pytorch "
            "of a lowbit checkout on PYTHONPATH")
    name = build_name(only)
    generated = jit_generated_dir(name)
    nccl = nccl_location(env)
    defines = ["-DLOWBIT_TORCH_CODEC_ONLY"] if only else []
    return dict(
        name=name,
        sources=sources(generated, only),
        extra_include_paths=[include_dir(env), CSRC, generated, nccl.include],
        extra_cflags=cxx_flags() + defines,
        extra_cuda_cflags=cuda_flags() + defines,  # arches: $TORCH_CUDA_ARCH_LIST or the GPUs'
        extra_ldflags=nccl.ldflags(),
        verbose=os.environ.get("LOWBIT_TORCH_VERBOSE") == "1",
    )


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
        ext = _C
    else:
        from torch.utils.cpp_extension import load

        with build_environment():
            ext = load(**jit_build(only))
    if hasattr(ext, "nccl_version"):
        compiled, runtime = ext.nccl_version()
        check_nccl_runtime(nccl_version_of_code(compiled) if compiled else None,
                           nccl_version_of_code(runtime) if runtime else None,
                           torch_nccl_version())
    _EXT = ext
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
