"""The measured growth of each block's velocity as a curve, read the same way by every picture of it.

``qlint probe`` records one curve per block in the block's JSON (``growth_curve``: the median over
the random directions as built of log10 ||v(alpha x)|| against log10 ||alpha x||); the HTML report
(:mod:`qlint.ci.html_report`) draws it as SVG and ``qlint probe --plot`` (:mod:`qlint.probe.plot`) as a PNG,
both from :func:`curves`, each beside a reference line of slope q_static. Nothing here imports torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from qlint.core.results import ModelReport

Point = tuple[float, float]


def record(fits: Iterable[Any]) -> dict[str, list[float]]:
    """The ``growth_curve`` of a block from its direction fits (``samples``: (alpha, ln||v||) on one
    grid of alphas, ``norm``: ||x||): the median over the fits at each alpha, in decades; a scale where
    no fit has a finite, nonzero sample is left out."""
    fits = list(fits)
    columns: dict[float, list[float]] = {}
    for fit in fits:
        for alpha, logarithm in fit.samples:
            if logarithm is not None and math.isfinite(logarithm):
                columns.setdefault(alpha * fit.norm, []).append(logarithm / math.log(10))
    scales = sorted(columns)
    return {"log10_x": [round(math.log10(x), 4) for x in scales],
            "log10_v": [round(statistics.median(columns[x]), 4) for x in scales]}


@dataclass(frozen=True)
class GrowthCurve:
    """One block's measured velocity norm against its input norm, both in decades."""

    block: str
    q_static: Optional[float]
    points: tuple[Point, ...]

    def reference(self) -> Optional[tuple[Point, Point]]:
        """The line of slope q_static through the largest-scale sample, over the measured range: the
        measured curve runs parallel to it where the static exponent is attained."""
        if self.q_static is None or not math.isfinite(self.q_static) or len(self.points) < 2:
            return None
        (x0, _), (x1, y1) = self.points[0], self.points[-1]
        return (x0, y1 - self.q_static * (x1 - x0)), (x1, y1)


def curves(model: ModelReport) -> list[GrowthCurve]:
    """The curves of the blocks ``qlint probe`` measured, in block order (none before a probe)."""
    found = []
    for block in model.blocks:
        curve = block.extra.get("growth_curve")
        if curve and len(curve["log10_x"]) >= 2:
            found.append(GrowthCurve(block.name, block.q, tuple(zip(curve["log10_x"], curve["log10_v"]))))
    return found


__all__ = ["GrowthCurve", "curves", "record"]
