"""Defaults chosen by measurement (docs/training.md, simulated data parallelism)."""


def gradient_grid(bits):
    """The quantization grid for gradients at ``bits``.

    "zero" from 4 bits up: exact zeros survive (unused embedding rows get no noise); at
    4 bits the two grids trained within noise of each other, and at 8 bits the zero grid
    within noise of bf16. "full" at 2 bits:
    four levels instead of the zero grid's three, which trained better with residual
    feedback (the default) at every evaluated step and seed on 2 and 4 simulated ranks,
    and with every feedback rule at step 1500 on 2. At 1 bit both grids are the sign.
    """
    return "full" if bits <= 2 else "zero"
