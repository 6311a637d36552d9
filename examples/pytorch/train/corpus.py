"""A byte-level text corpus every machine with Python has: the standard library's own
sources, in sorted path order; the last 5% is the held-out split."""

import glob
import os
import sysconfig

import numpy as np
import torch


def stdlib_bytes():
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
                   if "site-packages" not in f and "test" not in os.path.relpath(f, root).split(os.sep)[0])
    chunks = []
    for f in files:
        with open(f, "rb") as fh:
            chunks.append(fh.read())
    return np.frombuffer(b"\n".join(chunks), dtype=np.uint8)


def to_device(t, device):
    """t on device without waiting for the stream (a blocking copy would make the process
    wait for its queued GPU work on every batch)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class Corpus:
    """Train and validation splits on a device, and batches drawn by a seeded generator
    (the same seed gives the same data order in every run)."""

    def __init__(self, device, seq, val_fraction=0.05):
        data = torch.from_numpy(stdlib_bytes().copy()).to(device)
        cut = int(len(data) * (1 - val_fraction))
        self.train, self.val = data[:cut], data[cut:]
        self.seq = seq
        self.device = device

    def batch(self, gen, n, split="train"):
        """n sequences of seq + 1 bytes at offsets drawn from the CPU generator gen."""
        data = self.train if split == "train" else self.val
        starts = torch.randint(0, len(data) - self.seq - 1, (n,), generator=gen)
        idx = to_device(starts, self.device)[:, None] + torch.arange(self.seq + 1,
                                                                   device=self.device)
        return data[idx].long()

    def val_batches(self, n, batch):
        """A fixed validation set: n sequences, in batches."""
        gen = torch.Generator().manual_seed(1234)
        return [self.batch(gen, batch, "val") for _ in range(n // batch)]
