"""Defaults chosen by measurement (docs/training.md, simulated data parallelism)."""


def gradient_grid(bits):
    """The quantization grid for gradients at ``bits``.

    "zero" from 4 bits up: exact zeros survive (unused embedding rows get no noise); at
    4 bits the two grids trained within noise of each other, and at 8 bits the zero grid
    within noise of bf16. "full" at 2 bits: four levels instead of the zero grid's
    three, which trained a GPT with AdamW better with residual feedback (the default): at
    every evaluated step and seed of a 4-layer GPT on 2 and 4 simulated ranks, in 16 of 18
    (seed, step) pairs of a 6-layer one. With SGD (a CNN) the zero grid trained better
    at 2 bits (with the residual, ahead in 17 of 18 pairs): pass grid="zero" there. At 1
    bit both grids are the sign.
    """
    return "full" if bits <= 2 else "zero"
