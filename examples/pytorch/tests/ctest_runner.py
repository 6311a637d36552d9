"""Runs test files of this tree for CTest (test/CMakeLists.txt registers one entry per
file) and says, by its exit status, what happened:

    python3 tests/ctest_runner.py [--skip-code 77] tests/qsync/test_qsync_model.py ...

0 when tests ran and passed, SKIP_CODE (CTest's SKIP_RETURN_CODE) when none ran (every
test skipped, or none collected) with the reasons printed, 1 on a failure. It runs
pytest where it is installed, else unittest (CI's python3 has no pytest): the files
written for pytest then skip, saying so. Either way examples/pytorch and
examples/pytorch/train are put on the path first, as pyproject.toml's pytest settings
do when pytest runs on its own."""

import argparse
import importlib.util
import os
import sys
import unittest

PYTORCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = (PYTORCH, os.path.join(PYTORCH, "train"))  # pyproject.toml's pythonpath


class Outcomes:
    """What ran: passed, failed and skipped tests, and the skips' reasons."""

    def __init__(self):
        self.passed = self.failed = 0
        self.skipped = []  # (test, reason)

    def summary(self):
        return (f"{self.passed} passed, {self.failed} failed, {len(self.skipped)} skipped")


class _PytestOutcomes(Outcomes):
    """A pytest plugin counting outcomes (a module skipped at import counts as one)."""

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped.append((report.nodeid, _reason(report)))
        elif report.when == "call":
            self.passed += 1

    def pytest_collectreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped.append((report.nodeid, _reason(report)))


def _reason(report):
    r = report.longrepr
    return r[2] if isinstance(r, tuple) and len(r) == 3 else str(r)


def run_pytest(files):
    import pytest

    outcomes = _PytestOutcomes()
    rc = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "--rootdir", PYTORCH, *files],
                     plugins=[outcomes])
    if rc not in (0, 5):  # 5: no test collected, a skip below
        outcomes.failed = max(outcomes.failed, 1)
    return outcomes


def _load(path):
    """The test module at `path`, or the reason it skips as a whole."""
    name = os.path.splitext(os.path.relpath(path, PYTORCH))[0].replace(os.sep, ".")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except unittest.SkipTest as e:
        return None, str(e)
    except ModuleNotFoundError as e:
        if e.name == "pytest":
            return None, "written for pytest, which is not installed"
        raise
    return module, None


def run_unittest(files):
    outcomes = Outcomes()
    suite = unittest.TestSuite()
    for path in files:
        module, reason = _load(path)
        if module is None:
            outcomes.skipped.append((path, reason))
        else:
            suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(module))
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=1).run(suite)
    outcomes.failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    outcomes.skipped += [(t.id(), reason) for t, reason in result.skipped]
    outcomes.passed = (result.testsRun - outcomes.failed - len(result.skipped)
                       - len(result.expectedFailures))
    for test, reason in outcomes.skipped:
        print(f"SKIPPED {test}: {reason}")
    return outcomes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-code", type=int, default=77,
                    help="the exit status when no test ran (CTest's SKIP_RETURN_CODE)")
    ap.add_argument("--runner", choices=("auto", "pytest", "unittest"), default="auto")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    files = [os.path.abspath(f) for f in args.files]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        PATHS + tuple(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p))
    sys.path[:0] = [p for p in PATHS if p not in sys.path]
    runner = args.runner
    if runner == "auto":
        runner = "pytest" if importlib.util.find_spec("pytest") else "unittest"
    outcomes = run_pytest(files) if runner == "pytest" else run_unittest(files)
    print(f"ctest_runner ({runner}): {outcomes.summary()}")
    if outcomes.failed:
        return 1
    if outcomes.passed == 0:
        print("ctest_runner: no test ran; reported to CTest as skipped")
        return args.skip_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
