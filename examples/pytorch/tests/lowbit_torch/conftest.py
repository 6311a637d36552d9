"""Fixtures of the extension's tests: the extension (built once per session) where a CUDA
device is, a one-rank NCCL process group on cuda:0 (the way to test the torch path on a
single GPU), and FSDP2 with lowbit's collectives. torch is imported inside the fixtures
only: the build tests beside need none."""

import os
import socket

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torch_with_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (scripts/gpu-check runs these tests on one)")
    return torch


@pytest.fixture(scope="session")
def ext():
    """The compiled module: the installed one, else built just in time (nvcc, NCCL)."""
    _torch_with_cuda()
    import lowbit_torch

    return lowbit_torch.load()


@pytest.fixture(scope="session")
def cuda():
    torch = _torch_with_cuda()
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


@pytest.fixture(scope="session")
def one_rank_group(cuda, ext):
    """A 1-rank NCCL process group with its communicator created eagerly."""
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=cuda)
    yield dist.group.WORLD
    # The process group is left to torch's exit handling: destroying it while lowbit
    # objects that borrow its communicator are alive would leave them dangling.


@pytest.fixture
def fully_shard_with_lowbit():
    """fully_shard on each Linear and on the model, then lowbit's collectives on every
    FSDP module (4-bit reduce-scatter, 8-bit all-gather; ``reduce_scatter``: other
    ReduceScatter options); returns how many modules were set."""
    import torch
    from torch.distributed.fsdp import fully_shard

    import lowbit_torch

    def apply(model, **reduce_scatter):
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        return lowbit_torch.apply_fsdp(model, reduce_scatter={"bits": 4, **reduce_scatter},
                                       all_gather={"bits": 8})

    return apply
