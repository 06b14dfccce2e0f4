"""``qlint probe --plot FILE.png``: the measured growth curves (:mod:`qlint.core.curves`) as a figure,
one log-log panel per block with the line of slope q_static, the same curves the HTML report draws.
matplotlib comes with the ``plot`` extra; it is imported here only, when a figure is asked for."""

from __future__ import annotations

import io
import math
import os

from qlint.ci.files import write_bytes
from qlint.core.curves import GrowthCurve

COLUMNS = 3  # panels per row


def write_png(curves: list[tuple[str, GrowthCurve]], path: str | os.PathLike[str]) -> None:
    """One panel per (model spec, curve), written whole to ``path`` (raises ImportError without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(1, math.ceil(len(curves) / COLUMNS))
    columns = min(COLUMNS, max(1, len(curves)))
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    for panel, (spec, curve) in zip(axes.flat, curves):
        panel.loglog([10 ** x for x, _ in curve.points], [10 ** y for _, y in curve.points], "o-", color="#1f6fd1",
                     markersize=3, label="measured ||v(x)||")
        reference = curve.reference()
        if reference is not None:
            panel.loglog([10 ** x for x, _ in reference], [10 ** y for _, y in reference], "--", color="#6b6b70",
                         label=f"slope q = {curve.q_static:g}")
        panel.set_title(f"{spec}  {curve.block}" if len(curves) > 1 else curve.block, fontsize=9)
        panel.set_xlabel("input norm ||x||")
        panel.set_ylabel("velocity norm")
        panel.grid(True, which="major", alpha=0.3)
        panel.legend(fontsize=8, loc="upper left")
    for panel in list(axes.flat)[len(curves):]:
        panel.axis("off")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    write_bytes(path, buffer.getvalue(), what="the growth plot")


__all__ = ["write_png"]
