"""The choice of C++ compiler for building the extension (no torch needed: CI runs this
with `python3 -m unittest`). A module linked against another libstdc++ than the one the
Python process runs crashes on its first formatted error message, so the build must pick
a compiler whose libstdc++ is the loaded one."""

import importlib.util
import os
import stat
import tempfile
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "lowbit_torch_build", os.path.join(_HERE, "..", "lowbit_torch", "_build.py"))
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

if __name__ == "__main__":
    unittest.main()
