"""The build helper, lowbit_torch/_build.py (no torch needed: it is loaded by path, as
setup.py loads it):

- the choice of C++ compiler: a module linked against another libstdc++ than the one the
  Python process runs crashes on its first formatted error message, so the build must
  pick a compiler whose libstdc++ is the loaded one;
- the C++ standard torch's headers demand;
- the sources generated from the table: one per compiled instance (one per grid for
  SPLIT_BY_GRID's operations), torch-free, and a run-time dispatch (instances.h) onto
  exactly those instances, with every choice the Python side offers among them."""

import importlib.util
import inspect
import os
import re
import stat
import tempfile
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.join(_HERE, "..", "..", "lowbit_torch")
_spec = importlib.util.spec_from_file_location("lowbit_torch_build",
                                               os.path.join(_PACKAGE, "_build.py"))
_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build)


class CompilerChoiceTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        self.system_lib = self._file("system/libstdc++.so.6.0.33")
        self.other_lib = self._file("opt/libstdc++.so.6.0.34")

    def tearDown(self):
        self.dir.cleanup()

    def _file(self, rel):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        return os.path.realpath(path)

    def _compiler(self, name, prints):
        """A fake compiler driver answering -print-file-name=libstdc++.so with `prints`."""
        path = os.path.join(self.root, "bin", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(f"#!/bin/sh\necho '{prints}'\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        return path

    def test_a_compiler_of_the_loaded_libstdcxx_is_kept(self):
        cxx = self._compiler("g++", self.system_lib)
        self.assertEqual(_build.compilers({"CXX": cxx}, self.system_lib, fallbacks=()), {})

    def test_a_compiler_of_another_libstdcxx_gives_way_to_the_system_one(self):
        opt = self._compiler("opt-g++", self.other_lib)
        sys_cxx = self._compiler("sys-g++", self.system_lib)
        got = _build.compilers({"CXX": opt}, self.system_lib,
                               fallbacks=((sys_cxx, "/usr/bin/gcc"),))
        self.assertEqual(got, {"CXX": sys_cxx, "CC": "/usr/bin/gcc"})

    def test_a_static_only_compiler_gives_way(self):
        static = self._compiler("static-g++", "libstdc++.so")  # bare name: no shared library
        sys_cxx = self._compiler("sys-g++", self.system_lib)
        got = _build.compilers({"CXX": static}, self.system_lib,
                               fallbacks=((sys_cxx, "cc"),))
        self.assertEqual(got["CXX"], sys_cxx)

    def test_no_compiler_that_qualifies_raises_naming_cxx(self):
        opt = self._compiler("opt-g++", self.other_lib)
        with self.assertRaisesRegex(RuntimeError, "Set CXX"):
            _build.compilers({"CXX": opt}, self.system_lib, fallbacks=((opt, "cc"),))

    def test_nothing_is_overridden_before_a_libstdcxx_is_loaded(self):
        opt = self._compiler("opt-g++", self.other_lib)
        self.assertEqual(_build.compilers({"CXX": opt}, "", fallbacks=()), {})

    def test_the_loaded_libstdcxx_is_read_from_the_process_map(self):
        maps = os.path.join(self.root, "maps")
        with open(maps, "w") as fh:
            fh.write("7f00-7f10 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n\n")
            fh.write(f"7f20-7f30 r-xp 00000000 08:01 2 {self.system_lib}\n")
        self.assertEqual(_build.loaded_libstdcxx(maps), self.system_lib)
        self.assertIsNone(_build.loaded_libstdcxx(os.path.join(self.root, "absent")))



class StandardTest(unittest.TestCase):
    """torch's headers decide between lowbit's C++17 and the C++20 newer torch demands."""

    def _include(self, aten_h):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        os.makedirs(os.path.join(d.name, "ATen"))
        with open(os.path.join(d.name, "ATen", "ATen.h"), "w") as f:
            f.write(aten_h)
        return d.name

    def test_cxx17_where_torch_accepts_it(self):
        self.assertEqual(_build.cxx_standard(self._include("#pragma once\n")), "-std=c++17")

    def test_cxx20_where_torch_demands_it(self):
        h = ("#if !defined(__cplusplus) || __cplusplus < 202002L\n"
             "#error C++20 or later compatible compiler is required to use ATen.\n#endif\n")
        self.assertEqual(_build.cxx_standard(self._include(h)), "-std=c++20")

    def test_cxx17_without_torch_headers(self):
        self.assertEqual(_build.cxx_standard("/nonexistent"), "-std=c++17")


def _have_torch():
    return importlib.util.find_spec("torch") is not None


class _WholeTable(unittest.TestCase):
    """Runs with LOWBIT_TORCH_BACKENDS unset (the whole table), restoring it after: the
    GPU machine's node-only builds set it for the process."""

    def setUp(self):
        self.saved = os.environ.pop("LOWBIT_TORCH_BACKENDS", None)

    def tearDown(self):
        os.environ.pop("LOWBIT_TORCH_BACKENDS", None)
        if self.saved is not None:
            os.environ["LOWBIT_TORCH_BACKENDS"] = self.saved


class GeneratedSourcesTest(_WholeTable):
    """What generate() writes from the table (DTYPES, FEEDBACK, COMPILED)."""

    def setUp(self):
        super().setUp()
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.sources = _build.sources(self.dir.name)
        with open(os.path.join(self.dir.name, "instances.h")) as f:
            self.header = f.read()

    def instantiated(self):
        """(op, C++ type, feedback policy or None, backend tag or None, grid tag or None) of
        each explicit instantiation in the generated .cu sources."""
        found = []
        for path in self.sources:
            if not path.endswith(".cu") or os.path.basename(path).startswith("kernels_"):
                continue
            with open(path) as f:
                text = f.read()
            got = []
            for m in re.finditer(r"make_(all_reduce)_core<([\w:]+), (\w+), (.+), "
                                 r"(lowbit::quant::grid::\w+)>\(", text):
                got.append((m.group(1), m.group(3), m.group(4), m.group(2), m.group(5)))
            for m in re.finditer(r"make_(reduce_scatter)_core<([\w:]+), (\w+), (.+)>\(", text):
                got.append((m.group(1), m.group(3), m.group(4), m.group(2), None))
            for m in re.finditer(r"make_(all_gather)_core<([\w:]+), (\w+)>\(", text):
                got.append((m.group(1), m.group(3), None, m.group(2), None))
            for m in re.finditer(r"template struct codec_core<(\w+)>;", text):
                got.append(("codec", m.group(1), None, None, None))
            self.assertTrue(got, path)
            found += got
        return found

    def dispatched(self):
        """(op, C++ type, feedback policy or None, backend tag or None) of each case of
        instances.h's visits."""
        found = []
        for op, body in re.findall(r"struct (\w+)_instances \{(.*?)\n\};", self.header, re.S):
            for call in re.findall(r"f\((tag<.*?>\{\}(?:, tag<.*>\{\})*)\);", body):
                tags = re.findall(r"tag<(.*?)>\{\}(?:,|$)", call)
                if tags[0].startswith("lowbit::backend::"):
                    found.append((op, tags[1], tags[2] if len(tags) > 2 else None, tags[0]))
                else:
                    found.append((op, tags[0], tags[1] if len(tags) > 1 else None, None))
        return found

    def expected(self):
        """The table's instances, each at every grid where its factory takes one."""
        grids = {"all_reduce": list(_build.GRIDS.values())}
        return [(op, _build.DTYPES[t], _build.FEEDBACK[f][0] if f else None,
                 _build.BACKENDS[b][0] if b else None, g)
                for op, t, f, b in _build.instances() for g in grids.get(op, [None])]

    def test_one_source_per_instance_of_the_table(self):
        nccl = 3 * 5 + 2 * 2 + 2
        node = 2 * 3 + 2 * 2 + 2
        self.assertEqual(len(_build.instances()), 3 + nccl + node)
        cu = [os.path.basename(p) for p in self.sources
              if p.endswith(".cu") and not os.path.basename(p).startswith("kernels_")]
        self.assertEqual(len(cu), len(set(cu)))
        self.assertEqual(sorted(self.instantiated()), sorted(self.expected()))

    def test_an_all_reduce_instance_is_one_source_per_grid(self):
        """SPLIT_BY_GRID: the heaviest instances compile in halves, in parallel."""
        self.assertIn("all_reduce", _build.SPLIT_BY_GRID)
        all_reduce = [p for p in self.sources if os.path.basename(p).startswith("all_reduce_")]
        self.assertEqual(len(all_reduce), 2 * (3 * 5 + 2 * 3))
        self.assertTrue(os.path.exists(os.path.join(self.dir.name,
                                                    "all_reduce_nccl_float32_none_zero.cu")))
        cu = [p for p in self.sources if p.endswith(".cu")]
        shared = len(_build.shared_dtypes()) * len(_build.GRIDS)
        self.assertEqual(len(cu), len(_build.instances()) + 3 * 5 + 2 * 3 + shared)

    def test_the_generated_sources_include_no_torch(self):
        """Every header a generated .cu includes from csrc/ (transitively) is torch-free:
        torch's headers would cost each instance most of its compile time."""
        torch_like = re.compile(r"#include\s*[<\"](torch|ATen|c10|pybind11|Python)[/.]")
        local = re.compile(r'#include\s*"([\w.]+)"')
        for path in self.sources:
            if not path.endswith(".cu"):
                continue
            seen, todo = set(), [path]
            while todo:
                p = todo.pop()
                if p in seen:
                    continue
                seen.add(p)
                with open(p) as f:
                    text = f.read()
                self.assertIsNone(torch_like.search(text), f"{p}, included by {path}")
                for name in local.findall(text):
                    for d in (_build.CSRC, self.dir.name):
                        if os.path.exists(os.path.join(d, name)):
                            todo.append(os.path.join(d, name))
            self.assertIn(os.path.join(_build.CSRC, "core.h"), seen, path)

    def test_the_dispatch_reaches_exactly_the_instances_compiled(self):
        self.assertEqual(sorted(self.dispatched()),
                         sorted({i[:4] for i in self.instantiated()}))

    def test_the_feedback_names_are_the_tables(self):
        accepted = re.findall(r'name == "(\w+)"', self.header)
        want = [n for rule, (_, aliases) in _build.FEEDBACK.items() for n in (rule, *aliases)]
        self.assertEqual(accepted, want)
        enum = re.search(r"enum class feedback_kind \{ (.*) \};", self.header).group(1)
        self.assertEqual(enum.split(", "), list(_build.FEEDBACK))
        for op in _build.COMPILED:
            self.assertTrue(set(_build.feedback_rules(op)) <= set(_build.FEEDBACK), op)
            self.assertTrue(set(_build.dtypes(op)) <= set(_build.DTYPES), op)
            for b in _build.backends(op):  # a backend's subset of COMPILED's
                self.assertTrue(set(_build.feedback_rules(op, b)) <= set(_build.feedback_rules(op)))
                self.assertTrue(set(_build.dtypes(op, b)) <= set(_build.dtypes(op)))

    def test_the_backends_and_dtypes_are_core_hs(self):
        """core.h's backend_kind names the table's BACKENDS, and its dtype_kind the table's
        DTYPES, in order (the generated dispatch compares against their values)."""
        with open(os.path.join(_build.CSRC, "core.h")) as f:
            text = f.read()
        enum = re.search(r"enum class backend_kind \{ (.*) \};", text).group(1)
        self.assertEqual(enum.split(", "), list(_build.BACKENDS))
        enum = re.search(r"enum class dtype_kind \{ (.*) \};", text).group(1)
        self.assertEqual(enum.split(", "), list(_build.DTYPES))
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            self.assertEqual(_build.backends(op), ("nccl", "node"), op)
        self.assertEqual(_build.backends("codec"), ())

    def test_nothing_else_spells_the_instances(self):
        """csrc/ holds no hand-written instance and names no feedback policy: the table
        and what is generated from it are the only list."""
        for name in os.listdir(_build.CSRC):
            self.assertFalse(name.endswith(".cu"), name)
            with open(os.path.join(_build.CSRC, name)) as f:
                text = f.read()
            for policy, _ in _build.FEEDBACK.values():
                if policy != "lowbit::feedback::none":  # all_gather's, by definition
                    self.assertNotIn(policy, text, name)
            for rule in _build.FEEDBACK:
                if rule != "none":
                    self.assertNotIn(f'"{rule}"', text, name)

    def test_the_shared_kernels_are_one_table_declared_and_defined_once(self):
        """SHARED_KERNELS: shared_kernels.h declares extern exactly what the kernels_*.cu
        sources instantiate, each once; every instance source includes it after its
        header, so none of them compiles those kernels."""
        with open(os.path.join(self.dir.name, "shared_kernels.h")) as f:
            declared = re.findall(r"^extern template (.*)$", f.read(), re.M)
        kernels = [p for p in self.sources if os.path.basename(p).startswith("kernels_")]
        self.assertEqual(len(kernels), len(_build.shared_dtypes()) * len(_build.GRIDS))
        self.assertEqual(set(_build.shared_dtypes()), set(_build.DTYPES))
        defined = []
        for path in kernels:
            with open(path) as f:
                defined += re.findall(r"^template (.*)$", f.read(), re.M)
        self.assertEqual(len(defined), len(set(defined)))
        self.assertEqual(sorted(declared), sorted(defined))
        per_dtype_grid = sum(4 * 2 * len(refs or (None,))
                             for _, _, refs, _ in _build.SHARED_KERNELS.values())
        self.assertEqual(len(defined), per_dtype_grid * len(kernels))
        for path in self.sources:
            name = os.path.basename(path)
            if not path.endswith(".cu") or name.startswith("kernels_"):
                continue
            with open(path) as f:
                text = f.read()
            self.assertRegex(text, r'#include "\w+_impl\.cuh"\n#include "shared_kernels\.h"\n',
                             name)

    def test_the_codec_only_build_compiles_its_own_kernels(self):
        with tempfile.TemporaryDirectory() as d:
            for path in _build.sources(d, codec_only=True):
                if path.endswith(".cu"):
                    with open(path) as f:
                        self.assertNotIn("shared_kernels.h", f.read(), path)

    def test_the_codec_only_build_is_the_codec_and_its_bindings(self):
        with tempfile.TemporaryDirectory() as d:
            got = [os.path.basename(p) for p in _build.sources(d, codec_only=True)]
        self.assertEqual(got, ["codec_bindings.cpp", "bindings.cpp", "codec_float32.cu",
                               "codec_float16.cu", "codec_bfloat16.cu"])

    def test_unchanged_sources_are_not_rewritten(self):
        generated = [p for p in self.sources if p.startswith(self.dir.name)]
        before = {p: os.stat(p).st_mtime_ns for p in generated}
        os.utime(generated[0], ns=(1, 1))  # an old file whose content is still right
        self.assertEqual(_build.sources(self.dir.name), self.sources)
        self.assertEqual(os.stat(generated[0]).st_mtime_ns, 1)
        for p in generated[1:]:
            self.assertEqual(os.stat(p).st_mtime_ns, before[p], p)

    @unittest.skipUnless(_have_torch(), "torch is not installed")
    def test_every_choice_of_the_python_side_is_compiled(self):
        """The choices lowbit_torch offers (DDPState's feedback rules and the dtypes it
        takes, the codec's dtypes, FSDP's defaults) are instances the table compiles."""
        import torch

        import lowbit_torch
        from lowbit_torch import codec, ddp, fsdp

        compiled = set(_build.instances())
        for b in _build.backends("all_reduce"):
            for t in _build.dtypes("all_reduce", b):
                for rule in ddp.feedback_rules(b):
                    self.assertIn(("all_reduce", t, rule, b), compiled)
        self.assertIn(inspect.signature(ddp.DDPState).parameters["feedback"].default,
                      ddp.feedback_rules("node"))
        names = {getattr(torch, t): t for t in _build.DTYPES}
        for dtype in codec._DTYPES:
            self.assertIn(("codec", names[dtype], None, None), compiled)
        self.assertIn(fsdp.ReduceScatter().feedback, fsdp.FEEDBACK)
        for b in _build.backends("reduce_scatter"):
            for t in _build.dtypes("reduce_scatter", b):
                # FSDP's feedback runs in torch around a collective built without any
                self.assertIn(("reduce_scatter", t, "none", b), compiled)
                self.assertIn(("all_gather", t, None, b), compiled)
        self.assertTrue(callable(lowbit_torch.ddp_hook))




class BackendSubsetTest(_WholeTable):
    """LOWBIT_TORCH_BACKENDS builds a subset of the backends, under a name of its own."""

    def test_all_backends_by_default(self):
        self.assertEqual(_build.chosen_backends(), tuple(_build.BACKENDS))
        self.assertEqual(_build.build_name(), "lowbit_torch_C")
        self.assertEqual({b for _, _, _, b in _build.instances() if b}, set(_build.BACKENDS))

    def test_a_subset_compiles_only_its_instances_under_its_own_name(self):
        os.environ["LOWBIT_TORCH_BACKENDS"] = "node"
        self.assertEqual(_build.chosen_backends(), ("node",))
        self.assertEqual(_build.build_name(), "lowbit_torch_C_node")
        self.assertEqual(_build.build_name(only=True), "lowbit_torch_codec_C")
        got = _build.instances()
        self.assertEqual({b for _, _, _, b in got if b}, {"node"})
        self.assertTrue(any(op == "codec" for op, _, _, _ in got))  # the codec stays
        header = _build.instances_header()
        self.assertNotIn("backend_kind::nccl", header)
        self.assertIn("backend_kind::node", header)

    def test_an_unknown_backend_is_refused_by_name(self):
        os.environ["LOWBIT_TORCH_BACKENDS"] = "node,gloo"
        with self.assertRaisesRegex(ValueError, "LOWBIT_TORCH_BACKENDS='node,gloo'"):
            _build.chosen_backends()
