"""Packaging a user can trust (lowbit_torch/_build.py, setup.py, pyproject.toml; no GPU,
torch only where a test says so):

- an installed copy finds its own csrc/ and lowbit's headers (shipped as
  lowbit_torch/include) to build just in time;
- the compiled module's own import error is the one raised;
- a torch older than MIN_TORCH is refused by name, and pyproject.toml states the same;
- NCCL is taken from the system, else torch's NCCL wheel, preferring the one whose
  version torch runs, and header, module and torch versions are checked."""

import importlib.util
import os
import re
import sys
import tempfile
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_PYTORCH = os.path.normpath(os.path.join(_HERE, "..", ".."))
_spec = importlib.util.spec_from_file_location(
    "lowbit_torch_build", os.path.join(_PYTORCH, "lowbit_torch", "_build.py"))
_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build)


def _have_torch():
    return importlib.util.find_spec("torch") is not None


def _touch(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def _nccl_h(major, minor, patch):
    return (f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n"
            f"#define NCCL_PATCH {patch}\n#define NCCL_SUFFIX \"\"\n")


class HeadersTest(unittest.TestCase):
    def setUp(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        self.root = d.name

    def _include(self, name):
        inc = os.path.join(self.root, name)
        _touch(os.path.join(inc, "lowbit", "lowbit.hpp"))
        _touch(os.path.join(inc, "lowbit", "kernels", "decode.cuh"))
        _touch(os.path.join(inc, "lowbit", "notes.txt"))
        return inc

    def test_the_environment_then_the_packaged_copy_then_the_repository(self):
        env, packaged, repo = (self._include(n) for n in ("env", "packaged", "repo"))
        missing = os.path.join(self.root, "missing")
        order = lambda e: [e.get("LOWBIT_INCLUDE_DIR"), packaged, repo]  # noqa: E731
        self.assertEqual(_build.include_dir({"LOWBIT_INCLUDE_DIR": env},
                                            order({"LOWBIT_INCLUDE_DIR": env})), env)
        self.assertEqual(_build.include_dir({}, order({})), packaged)
        self.assertEqual(_build.include_dir({}, [None, missing, repo]), repo)
        with self.assertRaisesRegex(RuntimeError, "LOWBIT_INCLUDE_DIR"):
            _build.include_dir({}, [None, missing])

    def test_the_default_order_names_the_packaged_copy_first(self):
        self.assertEqual(_build.PACKAGED_INCLUDE,
                         os.path.join(os.path.dirname(_build.CSRC), "include"))
        self.assertTrue(os.path.isfile(os.path.join(_build.REPO_INCLUDE, "lowbit", "lowbit.hpp")))

    def test_the_headers_are_copied_whole_and_only_headers(self):
        src = self._include("src")
        dest = os.path.join(self.root, "pkg", "include")
        written = _build.copy_headers(dest, src)
        self.assertEqual(sorted(os.path.relpath(p, dest) for p in written),
                         [os.path.join("lowbit", "kernels", "decode.cuh"),
                          os.path.join("lowbit", "lowbit.hpp")])
        self.assertEqual(_build.copy_headers(src, src), [])  # an sdist's own copy

    def test_the_repositorys_headers_are_all_shipped(self):
        """Every header under include/lowbit is a header_files() entry: a wheel built from
        the repository ships all that csrc/ can reach."""
        files = _build.header_files(_build.REPO_INCLUDE)
        on_disk = [os.path.relpath(os.path.join(d, f), _build.REPO_INCLUDE)
                   for d, _, fs in os.walk(os.path.join(_build.REPO_INCLUDE, "lowbit"))
                   for f in fs if not f.startswith(".")]
        self.assertEqual(sorted(files), sorted(on_disk))

    def test_the_package_data_covers_csrc_and_the_headers(self):
        with open(os.path.join(_PYTORCH, "pyproject.toml")) as f:
            text = f.read()
        data = re.search(r"\[tool\.setuptools\.package-data\]\s*lowbit_torch = \[(.*?)\]",
                         text, re.S).group(1)
        globs = re.findall(r'"([^"]+)"', data)
        exts = {os.path.splitext(n)[1] for n in os.listdir(_build.CSRC)}
        for ext in exts:
            self.assertIn(f"csrc/*{ext}", globs)
        for ext in (".hpp", ".cuh", ".h"):
            self.assertIn(f"include/lowbit/**/*{ext}", globs)
        # qsync's fused fp8 cast, built just in time from an installed copy too
        qsync = re.search(r"^qsync = \[(.*?)\]", text, re.M | re.S).group(1)
        qsync_globs = re.findall(r'"([^"]+)"', qsync)
        qsync_csrc = os.path.join(_PYTORCH, "qsync", "csrc")
        for ext in {os.path.splitext(n)[1] for n in os.listdir(qsync_csrc)}:
            self.assertIn(f"csrc/*{ext}", qsync_globs)


class TorchVersionTest(unittest.TestCase):
    def test_older_than_min_torch_is_refused_naming_both(self):
        self.assertEqual(_build.MIN_TORCH, (2, 9))
        message = _build.torch_too_old("2.8.1+cu128")
        self.assertIn("torch >= 2.9", message)
        self.assertIn("2.8.1+cu128", message)
        self.assertIsNotNone(_build.torch_too_old("1.13.0"))
        for ok in ("2.9.0", "2.11.0+cu130", "2.10.0.dev20251001", "2.9.0a0+git1234", "3.0"):
            self.assertIsNone(_build.torch_too_old(ok), ok)
        self.assertIsNone(_build.torch_too_old("unknown"))

    def test_pyproject_states_the_same_minimum(self):
        with open(os.path.join(_PYTORCH, "pyproject.toml")) as f:
            text = f.read()
        dep = re.search(r'dependencies = \["torch>=(\d+)\.(\d+)"\]', text)
        self.assertIsNotNone(dep)
        self.assertEqual((int(dep.group(1)), int(dep.group(2))), _build.MIN_TORCH)

    @unittest.skipUnless(_have_torch(), "torch is not installed")
    def test_the_package_refuses_an_old_torch_on_import(self):
        import lowbit_torch

        with self.assertRaisesRegex(ImportError, r"needs torch >= 2\.9.*this is torch 2\.6\.0"):
            lowbit_torch._check_torch("2.6.0")
        lowbit_torch._check_torch("2.11.0+cu130")


class NcclTest(unittest.TestCase):
    def setUp(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        self.root = d.name

    def _cuda(self, version, libs=("libnccl.so", "libnccl.so.2")):
        cuda = os.path.join(self.root, "cuda")
        _touch(os.path.join(cuda, "include", "nccl.h"), _nccl_h(*version))
        for lib in libs:
            _touch(os.path.join(cuda, "lib64", lib))
        return cuda

    def _wheel(self, version):
        site = os.path.join(self.root, "site-packages")
        _touch(os.path.join(site, "nvidia", "nccl", "include", "nccl.h"), _nccl_h(*version))
        _touch(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so.2"))
        return site

    def test_versions_are_read_from_the_header_and_from_codes(self):
        cuda = self._cuda((2, 28, 9))
        self.assertEqual(_build.nccl_header_version(os.path.join(cuda, "include")), (2, 28, 9))
        self.assertEqual(_build.nccl_version_of_code(22809), (2, 28, 9))
        self.assertEqual(_build.nccl_version_of_code(23007), (2, 30, 7))
        self.assertEqual(_build.nccl_version_of_code(2804), (2, 8, 4))  # before 2.9
        only_code = _touch(os.path.join(self.root, "old", "nccl.h"),
                           "#define NCCL_VERSION_CODE 21803\n")
        self.assertEqual(_build.nccl_header_version(os.path.dirname(only_code)), (2, 18, 3))
        self.assertIsNone(_build.nccl_header_version(self.root))

    def test_torchs_wheel_where_the_system_has_none(self):
        site = self._wheel((2, 30, 7))
        got = _build.nccl_candidates({}, cuda_home=os.path.join(self.root, "none"),
                                     search_path=[os.path.join(self.root, "x"), site])
        wheel = [c for c in got if c.origin == _build.WHEEL_ORIGIN]
        self.assertEqual(len(wheel), 1)
        c = wheel[0]
        self.assertEqual(c.include, os.path.join(site, "nvidia", "nccl", "include"))
        self.assertEqual(c.version, (2, 30, 7))
        # the wheel has libnccl.so.2 alone: linked by file name, found again by run path
        self.assertEqual(c.library(), ":libnccl.so.2")
        lib = os.path.join(site, "nvidia", "nccl", "lib")
        self.assertEqual(c.ldflags(), [f"-L{lib}", "-l:libnccl.so.2", f"-Wl,-rpath,{lib}"])
        chosen = _build.nccl_location(runtime=(2, 30, 7), candidates=[c])
        self.assertIs(chosen, c)

    def test_the_system_first_unless_only_the_wheel_matches_torch(self):
        cuda = self._cuda((2, 28, 9))
        site = self._wheel((2, 30, 7))
        got = _build.nccl_candidates({}, cuda_home=cuda, search_path=[site])
        self.assertEqual(got[0].origin, "the system's")
        self.assertEqual(got[0].ldflags(), [f"-L{os.path.join(cuda, 'lib64')}", "-lnccl"])
        self.assertEqual(got[-1].origin, _build.WHEEL_ORIGIN)
        self.assertIs(_build.nccl_location(runtime=(2, 28, 3), candidates=got), got[0])
        self.assertIs(_build.nccl_location(runtime=(2, 30, 7), candidates=got), got[-1])
        self.assertIs(_build.nccl_location(runtime=(), candidates=got), got[0])  # unknown

    def test_a_minor_version_apart_warns_a_major_raises(self):
        c = [_build.NcclLocation(os.path.join(self._cuda((2, 28, 9)), "include"), None, "t")]
        warned = []
        _build.nccl_location(runtime=(2, 30, 7), candidates=c, warn=warned.append)
        self.assertEqual(len(warned), 1)
        self.assertIn("NCCL's header is 2.28.9 but torch's NCCL is 2.30.7", warned[0])
        self.assertIn("LOWBIT_NCCL_HOME", warned[0])
        with self.assertRaisesRegex(RuntimeError, "another major version"):
            _build.nccl_location(runtime=(3, 0, 1), candidates=c)

    def test_lowbit_nccl_home_replaces_the_search(self):
        home = os.path.join(self.root, "nccl")
        _touch(os.path.join(home, "include", "nccl.h"), _nccl_h(2, 27, 3))
        _touch(os.path.join(home, "lib", "libnccl.so"))
        got = _build.nccl_candidates({"LOWBIT_NCCL_HOME": home}, cuda_home=self._cuda((2, 28, 9)))
        self.assertEqual([c.origin for c in got], ["LOWBIT_NCCL_HOME"])
        self.assertEqual(got[0].version, (2, 27, 3))

    def test_no_nccl_at_all_says_where_it_looked(self):
        with self.assertRaisesRegex(RuntimeError, "nvidia/nccl.*LOWBIT_NCCL_HOME"):
            _build.nccl_location(runtime=(), candidates=[])

    def test_the_loaded_modules_versions_are_checked(self):
        warned = []
        self.assertEqual(_build.check_nccl_runtime((2, 30, 7), (2, 30, 7), (2, 30, 7),
                                                   warned.append), [])
        _build.check_nccl_runtime((2, 28, 9), (2, 30, 7), (2, 30, 7), warned.append)
        self.assertEqual(len(warned), 1)
        self.assertIn("the NCCL library it calls is 2.30.7", warned[0])
        warned.clear()
        _build.check_nccl_runtime((2, 28, 9), (2, 28, 9), (2, 30, 7), warned.append)
        self.assertTrue(any("two NCCL libraries in one process" in w for w in warned), warned)
        with self.assertRaisesRegex(RuntimeError, "another major version"):
            _build.check_nccl_runtime((3, 0, 0), (2, 30, 7), (2, 30, 7), warned.append)
        self.assertEqual(_build.check_nccl_runtime((2, 30, 7), None, None, warned.append), [])


class LoadTest(unittest.TestCase):
    """extension(): the installed module's own import error; the just-in-time build's
    sources from wherever the package is."""

    def setUp(self):
        if not _have_torch():
            self.skipTest("torch is not installed")
        from lowbit_torch import _build as b

        self.b = b
        self.saved = (b._EXT, b._installed_module_exists, b.CSRC)
        self.addCleanup(self._restore)

    def _restore(self):
        self.b._EXT, self.b._installed_module_exists, self.b.CSRC = self.saved
        sys.modules.pop("lowbit_torch._C", None)

    def test_the_installed_modules_import_error_is_shown(self):
        self.b._EXT = None
        self.b._installed_module_exists = lambda: True
        sys.modules["lowbit_torch._C"] = None  # its import fails, as a missing library would
        with self.assertRaises(ImportError) as ctx:
            self.b.extension()
        text = str(ctx.exception)
        self.assertIn("the installed extension lowbit_torch._C does not import", text)
        self.assertIn("lowbit_torch._C", str(ctx.exception.__cause__))
        self.assertIn(str(ctx.exception.__cause__), text)  # the original error, verbatim
        self.assertIsNone(self.b._EXT)

    def test_without_sources_the_just_in_time_build_says_so(self):
        self.b.CSRC = os.path.join(tempfile.gettempdir(), "lowbit-torch-no-csrc")
        with self.assertRaisesRegex(ImportError, "sources .* are not here"):
            self.b.jit_build()

    def test_the_just_in_time_build_takes_this_packages_sources(self):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, TORCH_EXTENSIONS_DIR=d)
            saved = os.environ.get("TORCH_EXTENSIONS_DIR")
            os.environ["TORCH_EXTENSIONS_DIR"] = d
            try:
                site = os.path.join(d, "site")
                _touch(os.path.join(site, "nvidia", "nccl", "include", "nccl.h"), _nccl_h(2, 30, 7))
                _touch(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so.2"))
                env["LOWBIT_NCCL_HOME"] = os.path.join(site, "nvidia", "nccl")
                kw = self.b.jit_build(env=env)
            finally:
                if saved is None:
                    os.environ.pop("TORCH_EXTENSIONS_DIR", None)
                else:
                    os.environ["TORCH_EXTENSIONS_DIR"] = saved
        self.assertIn(self.b.CSRC, kw["extra_include_paths"])
        self.assertIn(os.path.join(site, "nvidia", "nccl", "include"), kw["extra_include_paths"])
        self.assertIn("-l:libnccl.so", "".join(kw["extra_ldflags"]))
        cpp = [s for s in kw["sources"] if s.endswith(".cpp")]
        self.assertTrue(cpp and all(s.startswith(self.b.CSRC) for s in cpp))
        self.assertTrue(any(os.path.basename(s).startswith("kernels_") for s in kw["sources"]))


if __name__ == "__main__":
    unittest.main()
