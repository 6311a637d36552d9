"""The codec functions: CUDA (lowbit's kernels) and CPU (lowbit's host codec) write the
same bytes; decoding is within the codec's bound; bad input raises."""

import itertools

import pytest

torch = pytest.importorskip("torch")

import lowbit_torch  # noqa: E402
from lowbit_torch import _build  # noqa: E402

DTYPES = [getattr(torch, name) for name in _build.dtypes("codec")]  # those compiled
CASES = list(itertools.product(DTYPES, [1, 2, 4, 8], ["zero", "full"], ["nearest", "stochastic"]))


def _data(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 3, n)[torch.randperm(n, generator=g)]
    x[::37] = 0.0  # exact zeros: the zero grid keeps them
    return x.to(dtype)


@pytest.mark.parametrize("dtype,bits,grid,rounding", CASES)
def test_cuda_and_host_frames_are_identical(ext, cuda, dtype, bits, grid, rounding):
    n = 128 * 37 + 45  # a partial last block and group
    x = _data(n, dtype, seed=bits)
    host = lowbit_torch.encode(x, bits, grid, rounding, seed=7, step=3, rank=1)
    dev = lowbit_torch.encode(x.to(cuda), bits, grid, rounding, seed=7, step=3, rank=1)
    assert host.dtype == torch.uint8 and host.numel() == lowbit_torch.frame_bytes(n, bits, grid)
    assert torch.equal(host, dev.cpu())
    y_host = lowbit_torch.decode(host, n, bits, grid, dtype)
    y_dev = lowbit_torch.decode(dev, n, bits, grid, dtype)
    assert torch.equal(y_host.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       y_dev.cpu().view(torch.int16 if dtype != torch.float32 else torch.int32))


@pytest.mark.parametrize("bits,grid", [(2, "zero"), (4, "zero"), (4, "full"), (8, "zero")])
def test_decode_is_within_one_step(ext, bits, grid):
    n = 128 * 64
    x = _data(n, torch.float32, seed=11)
    y = lowbit_torch.decode(lowbit_torch.encode(x, bits, grid), n, bits, grid)
    blocks = x.view(-1, 128).abs().amax(dim=1, keepdim=True)
    levels = 2 ** (bits - 1) - (1.0 if grid == "zero" else 0.5)
    step = blocks / levels
    # half a step, plus the rounding of q * step to float
    assert ((y.view(-1, 128) - x.view(-1, 128)).abs() <= step / 2 + blocks * 2.0**-22).all()
    if grid == "zero":
        assert (y[x == 0] == 0).all()


def test_stochastic_rounding_is_reproducible_and_keyed(ext, cuda):
    x = _data(4096, torch.float32, seed=3).to(cuda)
    a = lowbit_torch.encode(x, 2, "zero", "stochastic", seed=1, step=5, rank=0)
    b = lowbit_torch.encode(x, 2, "zero", "stochastic", seed=1, step=5, rank=0)
    c = lowbit_torch.encode(x, 2, "zero", "stochastic", seed=1, step=6, rank=0)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_scale_and_empty(ext):
    x = _data(256, torch.float32, seed=5)
    f = lowbit_torch.encode(x, 8)
    assert torch.equal(lowbit_torch.decode(f, 256, 8, scale=0.5), lowbit_torch.decode(f, 256, 8) * 0.5)
    e = lowbit_torch.encode(torch.empty(0), 4)
    assert e.numel() == 0 and lowbit_torch.decode(e, 0, 4).numel() == 0


def test_bad_input_raises(ext):
    x = torch.randn(256)
    with pytest.raises(ValueError, match="bits"):
        lowbit_torch.encode(x, 3)
    with pytest.raises(ValueError, match="grid"):
        lowbit_torch.encode(x, 4, grid="half")
    with pytest.raises(TypeError, match="dtype"):
        lowbit_torch.encode(torch.arange(256), 4)
    with pytest.raises(ValueError, match="contiguous"):
        lowbit_torch.encode(torch.randn(16, 32).t(), 4)
    f = lowbit_torch.encode(x, 4)
    with pytest.raises(ValueError, match="bytes"):
        lowbit_torch.decode(f[:-16], 256, 4)
    with pytest.raises(ValueError, match="aligned"):
        lowbit_torch.encode(torch.randn(300)[1:257], 4)
