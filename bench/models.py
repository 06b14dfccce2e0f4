"""Models the speed benchmark needs beyond the fixtures."""

from qlint.zoo import example_inputs, mamba


def mamba_unrolled():
    """The native Mamba forecaster, 8 blocks, its scan unrolled over 96 steps (a 6.5k-node graph)."""
    return mamba.build("free", d_model=16, seq_len=96, horizon=96, depth=8), example_inputs(seq_len=96)
