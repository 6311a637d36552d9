"""The node backend's bootstrap over a torch Store (lowbit_torch.comm.StoreAllGather) and
the choice of backend from a process group; no GPU, no extension: ranks are threads
sharing one in-process HashStore, the group a one-rank gloo group."""

import os
import socket
import threading

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from lowbit_torch.comm import StoreAllGather, backend_of  # noqa: E402


def _ranks(P, calls, store, prefix="lowbit/node/test/0"):
    """Runs `calls` all-gathers on P threads; returns each rank's results."""
    got = [None] * P
    errors = []

    def rank(r):
        try:
            ag = StoreAllGather(store, prefix, r, P)
            got[r] = [ag(bytes([r, k, 7]) * 5) for k in range(calls)]
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return got


@pytest.mark.parametrize("P", [1, 2, 3, 8])
def test_every_rank_gets_every_ranks_bytes_in_rank_order_call_after_call(P):
    store = dist.HashStore()
    got = _ranks(P, 5, store)
    for r in range(P):
        for k in range(5):
            assert got[r][k] == b"".join(bytes([p, k, 7]) * 5 for p in range(P))


def test_a_rank_deletes_its_key_of_the_call_before_once_every_rank_is_past_it():
    store = dist.HashStore()
    _ranks(3, 4, store)
    prefix = "lowbit/node/test/0"
    for r in range(3):
        assert store.check([f"{prefix}/3/{r}"])  # the last call's keys stay
        for k in range(3):
            assert not store.check([f"{prefix}/{k}/{r}"])


def test_ranks_that_send_different_sizes_raise_naming_the_call():
    store = dist.HashStore()
    a = StoreAllGather(store, "p", 0, 2)
    b = StoreAllGather(store, "p", 1, 2)
    t = threading.Thread(target=lambda: pytest.raises(RuntimeError, b, b"xyz"))
    t.start()
    with pytest.raises(RuntimeError, match="call 0"):
        a(b"xy")
    t.join(10)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_gloo_group_takes_the_node_backend():
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert backend_of() == "node"
    finally:
        dist.destroy_process_group()
