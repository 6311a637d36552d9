"""The ``lowbit`` torch.distributed backend without a GPU (lowbit_torch/backend.py and the
host half of csrc/process_group.cpp):

- the options and their errors; init()'s registration with torch.distributed (once; again
  with other options raises; an extension that does not load raises naming its error);
- the pure decisions: the inner backend from the ranks' devices, the lowbit backend beside
  it, the route table and the route of a call (the same rule as the C++ one, compared
  where the C++ module builds);
- torch calls the registered creator for the CUDA half of "cpu:gloo,cuda:lowbit" with its
  extended options (in a fresh process: registration is process-wide);
- the C++ backend forwards every call to its inner backend unchanged: built against this
  torch (CPU-only is enough) from csrc/process_group.cpp alone, over gloo on two
  processes, each collective's result equals gloo's own."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from lowbit_torch import _build, backend  # noqa: E402
from lowbit_torch.backend import Options  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.normpath(os.path.join(_HERE, "..", ".."))


# ------------------------------------------------------------------------------ options

def test_the_defaults_are_4_bits_without_feedback():
    o = Options()
    assert (o.bits, o.feedback, o.block, o.stage2) == (4, "none", 128, False)
    assert o.codec_grid == "zero" and Options(bits=2).codec_grid == "full"
    assert o.rule("all_reduce") == "none" and o.rule("all_gather") is None
    s = Options(feedback="residual", stage2=True)
    assert s.rule("all_reduce") == "residual_stage2" and s.rule("reduce_scatter") == "residual"


@pytest.mark.parametrize("kwargs,names", [
    ({"bits": 3}, "bits"), ({"bits": True}, "bits"), ({"bits": 4.0}, "bits"),
    ({"feedback": "ef21"}, "feedback"), ({"feedback": "residual_stage2"}, "feedback"),
    ({"grid": "half"}, "grid"), ({"rounding": "up"}, "rounding"), ({"seed": -1}, "seed"),
    ({"crossover": -1}, "crossover"), ({"crossover": "auto"}, "crossover"),
    ({"all_gather_bits": 16}, "all_gather_bits"), ({"inner": "mpi"}, "inner"),
    ({"feedback_tensors": 0}, "feedback_tensors"), ({"stage2": 1}, "stage2"),
])
def test_a_bad_option_raises_naming_it(kwargs, names):
    with pytest.raises(ValueError, match=f"lowbit_torch.init: {names} must be"):
        Options(**kwargs)


def test_a_block_other_than_the_compiled_one_raises_saying_which_is():
    with pytest.raises(ValueError, match="block=64: the extension compiles blocks of 128"):
        Options(block=64)


def test_stage2_needs_the_residual():
    with pytest.raises(ValueError, match="stage2=True .* needs feedback='residual'"):
        Options(stage2=True)


# -------------------------------------------------------------------------- init()

class _Registry:
    """Stands for torch's register_backend and for the extension."""

    def __init__(self):
        self.calls = []

    def register_backend(self, name, func, extended_api=False, devices=None):
        self.calls.append((name, func, extended_api, devices))


@pytest.fixture
def registry(monkeypatch):
    reg = _Registry()
    monkeypatch.setattr(backend, "_REGISTERED", None)
    monkeypatch.setattr(_build, "collectives", lambda: object())
    monkeypatch.setattr(dist.Backend, "register_backend", reg.register_backend)
    return reg


def test_init_registers_the_backend_for_cuda_with_the_extended_api(registry):
    got = backend.init(bits=8, feedback="residual")
    assert got == Options(bits=8, feedback="residual") == backend.registered()
    [(name, func, extended, devices)] = registry.calls
    assert (name, extended, devices) == ("lowbit", True, ["cuda"])
    assert callable(func)


def test_init_again_with_the_same_options_does_nothing(registry):
    backend.init(bits=2)
    assert backend.init(Options(bits=2)) == Options(bits=2)
    assert len(registry.calls) == 1


def test_init_again_with_other_options_raises_naming_the_difference(registry):
    backend.init(bits=4)
    with pytest.raises(RuntimeError, match=r"registered already, with other options "
                                           r"\(bits=4 -> 8, feedback='none' -> 'residual'\)"):
        backend.init(bits=8, feedback="residual")
    assert backend.registered() == Options(bits=4) and len(registry.calls) == 1


def test_init_takes_an_options_object_or_keywords_not_both(registry):
    with pytest.raises(TypeError, match="not both"):
        backend.init(Options(), bits=2)
    with pytest.raises(TypeError, match="must be lowbit_torch.backend.Options"):
        backend.init({"bits": 2})
    assert not registry.calls


def test_an_extension_that_does_not_load_raises_naming_its_error(registry, monkeypatch):
    def missing():
        raise ImportError("libnccl.so.2: cannot open shared object file")

    monkeypatch.setattr(_build, "collectives", missing)
    with pytest.raises(ImportError, match="needs the compiled extension .* did not load: "
                                          "ImportError: libnccl.so.2: cannot open") as e:
        backend.init()
    assert isinstance(e.value.__cause__, ImportError)
    assert not registry.calls and backend.registered() is None


def test_init_is_exported_by_the_package():
    import lowbit_torch

    assert lowbit_torch.init is backend.init
    assert lowbit_torch.BackendOptions is Options


# ---------------------------------------------------------------- decisions (pure)

def test_every_rank_on_its_own_gpu_takes_nccl_and_shared_gpus_gloo():
    own = [("h0", "gpu-a"), ("h0", "gpu-b"), ("h1", "gpu-a")]  # a UUID is per host here
    assert backend.choose_inner("auto", own) == "nccl"
    shared = [("h0", "gpu-a"), ("h0", "gpu-a"), ("h0", "gpu-b")]
    assert backend.choose_inner("auto", shared) == "gloo"
    assert backend.choose_inner("gloo", own) == "gloo"
    with pytest.raises(ValueError, match="ranks share a GPU .*ranks \\[0, 1\\] on h0 device "
                                         "gpu-a.*NCCL refuses"):
        backend.choose_inner("nccl", shared)
    with pytest.raises(ValueError, match="inner must be one of"):
        backend.choose_inner("mpi", own)


def test_lowbit_runs_on_nccl_beside_nccl_and_on_the_node_backend_beside_gloo():
    assert backend.lowbit_backend("nccl", [("h0", "a"), ("h1", "a")]) == "nccl"
    assert backend.lowbit_backend("gloo", [("h0", "a"), ("h0", "a")]) == "node"
    with pytest.raises(ValueError, match=r"needs every rank on one host; these ranks are on "
                                         r"\['h0', 'h1'\]"):
        backend.lowbit_backend("gloo", [("h0", "a"), ("h1", "a")])


@pytest.mark.parametrize("lowbit", list(_build.BACKENDS))
def test_the_route_table_is_what_the_extension_compiles(lowbit):
    table = backend.routes(Options(crossover=4096), lowbit)
    for op in backend.OPS:
        assert table[op] == tuple(_build.dtypes(op, lowbit)), op
        assert set(table[op]) <= {"float32", "float16", "bfloat16"}
    assert table["min_bytes"] == 4096
    assert backend.routes(Options(all_gather_bits=None), lowbit)["all_gather"] == ()
    backend.check_compiled(Options(feedback="residual", stage2=True), lowbit)


def test_a_rule_the_backend_does_not_compile_raises(monkeypatch):
    monkeypatch.setitem(_build.BACKENDS, "node", ("lowbit::backend::node", {
        "all_reduce": (("float32",), ("none",)), "reduce_scatter": None, "all_gather": None}))
    with pytest.raises(ValueError, match="all_reduce needs feedback 'residual', which the node "
                                         "backend does not compile"):
        backend.check_compiled(Options(feedback="residual"), "node")


def test_the_route_of_a_call():
    t = {"all_reduce": ("float32", "bfloat16"), "reduce_scatter": ("float32",),
         "all_gather": ("bfloat16",), "min_bytes": 1024}
    assert backend.route(t, "all_reduce", torch.float32, 1024, "sum") == "lowbit"
    assert backend.route(t, "all_reduce", "bfloat16", 4096, "avg") == "lowbit"
    assert backend.route(t, "all_reduce", torch.float32, 1020, "sum") == "inner"  # small
    assert backend.route(t, "all_reduce", torch.float16, 4096, "sum") == "inner"  # dtype
    assert backend.route(t, "all_reduce", torch.int64, 4096, "sum") == "inner"
    assert backend.route(t, "all_reduce", torch.float32, 4096, "other") == "inner"  # MAX
    assert backend.route(t, "reduce_scatter", torch.float32, 4096, "avg") == "lowbit"
    assert backend.route(t, "reduce_scatter", torch.bfloat16, 4096, "avg") == "inner"
    assert backend.route(t, "all_gather", torch.bfloat16, 4096, "none") == "lowbit"
    assert backend.route(t, "all_gather", torch.bfloat16, 4096, "sum") == "inner"
    assert backend.route(dict(t, min_bytes=0), "all_reduce", torch.float32, 0, "sum") == "inner"
    with pytest.raises(ValueError, match="op must be one of"):
        backend.route(t, "broadcast", torch.float32, 4096, "none")


def test_reduce_ops_as_the_route_sees_them():
    R = dist.ReduceOp
    assert backend.reduce_name(R.SUM) == "sum" and backend.reduce_name(R.AVG) == "avg"
    for op in (R.MAX, R.MIN, R.PRODUCT, R.BAND):
        assert backend.reduce_name(op) == "other"


# ------------------------------------------------- torch calls the creator (subprocess)

def _python(code, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_init_process_group_calls_the_creator_for_the_cuda_half():
    r = _python("""
        import torch.distributed as dist
        from lowbit_torch import _build, backend

        _build.collectives = lambda: object()  # no extension needed to register
        seen = {}
        def spy(dist_options, options):
            seen.update(store=dist_options.store, rank=dist_options.group_rank,
                        size=dist_options.group_size, timeout=dist_options.timeout,
                        group=dist_options.group_id, options=options)
            raise RuntimeError("creator reached")
        backend.create_backend = spy
        backend.init(bits=2, crossover=0)
        assert dist.Backend.LOWBIT == "lowbit"
        assert dist.Backend._plugins["LOWBIT"].extended_api
        assert "lowbit" in dist.Backend.backend_list
        try:  # an in-process store: no port to pick
            dist.init_process_group("cpu:gloo,cuda:lowbit", rank=0, world_size=1,
                                    store=dist.HashStore())
        except RuntimeError as e:
            assert "creator reached" in str(e), e
        assert (seen["rank"], seen["size"]) == (0, 1), seen
        assert seen["options"] == backend.Options(bits=2, crossover=0)
        assert isinstance(seen["store"], dist.Store)
        print("OK", seen["timeout"], seen["group"])
    """)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# --------------------------------------- the C++ backend forwarding (built here, gloo)

def _compiler():
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


_HOST_MODULE = "lowbit_torch_process_group_host"


def _build_host(name):
    """csrc/process_group.cpp and a module binding it, built as `name` against this torch
    (cached in torch's extensions folder, $TORCH_EXTENSIONS_DIR or its default); returns
    (the module, the folder holding it)."""
    if _compiler() is None or shutil.which("ninja") is None:
        pytest.skip("no C++ compiler or ninja to build the backend's host half")
    from torch.utils.cpp_extension import get_default_build_root, load

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    build = os.path.join(root, name)
    os.makedirs(build, exist_ok=True)
    with _build.build_environment():
        module = load(name=name,
                      sources=[os.path.join(_build.CSRC, "process_group.cpp"),
                               os.path.join(_HERE, "process_group_module.cpp")],
                      extra_include_paths=[_build.CSRC],
                      extra_cflags=[_build.cxx_standard(), "-O1"], build_directory=build)
    return module, build


@pytest.fixture(scope="module")
def host_module():
    """The backend's host half built as a module of its own: (module, its folder)."""
    return _build_host(_HOST_MODULE)


def test_a_second_module_with_the_backends_classes_imports_beside_the_first(host_module):
    # The extension and the tests' host module both bind process_group.cpp's classes in one
    # process (pytest imports both); pybind11 refuses a second registration of a C++ type
    # unless its binding is module-local, and every later test of the extension would fail.
    twin, _ = _build_host(_HOST_MODULE + "_twin")
    m, _ = host_module
    for mod in (m, twin):
        rt = mod.RouteTable([torch.float32], [], [], 0)
        assert rt.takes("all_reduce", torch.float32, 4, "sum")


def test_the_cpp_route_is_the_python_route(host_module):
    import itertools

    m, _ = host_module
    table = {"all_reduce": ("float32", "bfloat16"), "reduce_scatter": ("float32",),
             "all_gather": ("bfloat16", "float16"), "min_bytes": 512}
    rt = m.RouteTable(*[[getattr(torch, d) for d in table[op]] for op in backend.OPS], 512)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32]
    for op, dtype, nbytes, reduce in itertools.product(backend.OPS, dtypes, [0, 511, 512, 4096],
                                                       ["none", "sum", "avg", "other"]):
        want = backend.route(table, op, dtype, nbytes, reduce) == "lowbit"
        assert rt.takes(op, dtype, nbytes, reduce) == want, (op, dtype, nbytes, reduce)
    with pytest.raises(ValueError, match="op must be"):
        rt.takes("broadcast", torch.float32, 4096, "none")


_FORWARD_RANK = r"""
import os, sys
import torch
import torch.distributed as dist
from datetime import timedelta

name, build, rank, size, port = sys.argv[1:6]
rank, size = int(rank), int(size)
sys.path.insert(0, build)
m = __import__(name)  # the module test_backend.py built

# the test process holds the store's server (bound to a port of the system's choosing)
store = dist.TCPStore("127.0.0.1", int(port), size, False, timeout=timedelta(seconds=60))

def lowbit_cpu(opts, backend_options=None):
    inner = dist.ProcessGroupGloo(dist.PrefixStore("inner/", opts.store), opts.group_rank,
                                  opts.group_size, opts.timeout)
    table = m.RouteTable([torch.float32], [torch.float32], [torch.float32], 0)
    return m.make_process_group(inner, None, table, torch.device("cpu"))

dist.Backend.register_backend("lowbit_cpu", lowbit_cpu, extended_api=True, devices=["cpu"])
dist.init_process_group("lowbit_cpu", store=store, rank=rank, world_size=size)
b = dist.group.WORLD._get_backend(torch.device("cpu"))
assert b.name() == "lowbit", b.name()
gloo = dist.new_group(backend="gloo")

def both(fn, make):
    # the same call through the lowbit backend and through plain gloo: the same result
    a, g = make(), make()
    fn(a, None)
    fn(g, gloo)
    flat = lambda x: torch.cat([t.reshape(-1).float() for t in x]) if isinstance(x, list) else x
    assert torch.equal(flat(a), flat(g)), (fn, a, g)
    return a

def x(n=1000, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed * 10 + rank)
    return (torch.randn(n, generator=g) * 100).to(dtype)

R = dist.ReduceOp
for op in (R.SUM, R.MAX, R.MIN, R.PRODUCT):
    both(lambda t, grp: dist.all_reduce(t, op=op, group=grp), lambda: x())
both(lambda t, grp: dist.all_reduce(t, group=grp), lambda: x(dtype=torch.int64))
w = dist.all_reduce(y := x(), async_op=True)
w.wait()
assert torch.equal(w.get_future().wait()[0], y)
both(lambda t, grp: dist.broadcast(t, src=1, group=grp), lambda: x())
both(lambda t, grp: dist.reduce(t, dst=0, group=grp), lambda: x())
out = both(lambda t, grp: dist.all_gather_into_tensor(t, x(), group=grp),
           lambda: torch.empty(1000 * size))
assert torch.equal(out[1000 * rank:1000 * (rank + 1)], x())
both(lambda t, grp: dist.reduce_scatter_tensor(t, x(1000 * size), group=grp),
     lambda: torch.empty(1000))
both(lambda ts, grp: dist.all_gather(ts, x(), group=grp),
     lambda: [torch.empty(1000) for _ in range(size)])
both(lambda t, grp: dist.all_to_all_single(t, x(1000 * size), group=grp),
     lambda: torch.empty(1000 * size))
both(lambda ts, grp: dist.all_reduce_coalesced(ts, group=grp),
     lambda: [x(10, seed=1), x(20, seed=2)])
if rank == 0:
    dist.send(x(seed=5), dst=1)
else:
    got = torch.empty(1000)
    dist.recv(got, src=0)
    g = torch.Generator().manual_seed(50)
    assert torch.equal(got, torch.randn(1000, generator=g) * 100)
objs = [None] * size
dist.all_gather_object(objs, {"rank": rank})
assert objs == [{"rank": r} for r in range(size)]
dist.barrier()
s = m.process_group_stats(b)
assert s["forwarded_all_reduce"] >= 6 and s["forwarded_all_gather"] >= 1, s
assert s["forwarded_reduce_scatter"] == 1 and s["forwarded_other"] >= 6, s
assert sum(s[f"lowbit_{op}"] for op in ("all_reduce", "reduce_scatter", "all_gather")) == 0, s
assert s["lowbit_backend"] == "none"
dist.destroy_process_group()
print("RANK-OK", rank)
"""


def test_the_cpp_backend_forwards_every_call_unchanged(host_module, tmp_path):
    import torch.distributed as dist

    # The store's server lives here, on port 0 (the system picks a free one as it binds):
    # a port picked, released and bound again by a child could be taken in between.
    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    port = server.port
    script = tmp_path / "rank.py"
    script.write_text(_FORWARD_RANK)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(script), _HOST_MODULE, host_module[1], str(r),
                               "2", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"RANK-OK {r}" in out, out
