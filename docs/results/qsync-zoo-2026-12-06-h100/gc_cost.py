"""What one collection costs with the zoo's libraries imported, before and after the
objects alive are frozen (validate.settle_heap), and after a second model is built.
Run from the repository root: PYTHONPATH=examples/pytorch python3 <this file>."""
import gc
import time

import timm  # noqa: F401  (the zoo's libraries, imported as a zoo run has them)
import torch  # noqa: F401
import torchvision  # noqa: F401
import transformers  # noqa: F401

from qsync import validate, zoo


def collect_ms():
    t = time.perf_counter()
    gc.collect()
    return 1000.0 * (time.perf_counter() - t)


model, forward_loss = zoo.make("hf-gpt2", 2, tiny=True)
forward_loss().backward()
print("%d objects tracked: a collection %.1f ms, %.1f ms" % (len(gc.get_objects()), collect_ms(),
                                                              collect_ms()))
validate.settle_heap()
print("settled (%d frozen): a collection %.3f ms, %.3f ms" % (gc.get_freeze_count(),
                                                               collect_ms(), collect_ms()))
model2, forward_loss2 = zoo.make("hf-bart", 2, tiny=True)
forward_loss2().backward()
print("a second model built, %d objects tracked: a collection %.2f ms, %.2f ms"
      % (len(gc.get_objects()), collect_ms(), collect_ms()))
