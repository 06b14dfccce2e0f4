"""``qlint verify``: reproduce the paper's training experiments (Section 5).

Train the reference Mamba and PatchTST variants of :mod:`qlint.zoo` on long-horizon
forecasting data, count blow-ups per configuration cell (Table 2), compare MSE across
variants (Figures 3/4), and set each variant's observed blow-up rate beside the growth
exponent q that ``qlint.analyze`` predicts statically. Figure 1 (the overflow depth of
r_{k+1} = r_k + c r_k^q) is :func:`qlint.verify.figures.figure1`.

Modules: ``data`` (CSV loaders, split protocol, synthetic series), ``train`` (one run,
blow-up criteria), ``grid`` (scales, resume, shards, workers), ``ray_backend`` (the grid
as Ray tasks), ``tables`` (Table 2, summary), ``figures`` (Figures 1, 3, 4).
"""

from qlint.verify.figures import overflow_depth
from qlint.verify.train import BLOWUP_FACTOR, RunConfig, classify_blowup

__all__ = ["BLOWUP_FACTOR", "RunConfig", "classify_blowup", "overflow_depth"]
