"""Figure 1 (r_{k+1} = r_k + c r_k^q overflow) and Figures 3/4 (per-cell MSE deviation).

matplotlib comes with the ``verify`` extra (:data:`INSTALL_HINT`); :func:`overflow_depth`
needs only the standard library.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

INSTALL_HINT = "pip install 'torch-qlint[verify]'"

# Largest finite values, exactly (all representable as Python floats).
FP16_MAX = 65504.0  # (2 - 2**-10) * 2**15
BF16_MAX = (2 - 2**-7) * 2.0**127  # 3.3895313892515355e38
FP32_MAX = (2 - 2**-23) * 2.0**127  # 3.4028234663852886e38
LIMITS = {"fp16": FP16_MAX, "bf16": BF16_MAX, "fp32": FP32_MAX}


def overflow_depth(
    q: float, c: float = 1.0, r0: float = 1.0, limit: float = FP16_MAX, max_depth: int = 10_000
) -> Optional[int]:
    """The first depth D with r_D > ``limit`` for r_{k+1} = r_k + c·r_k^q, r_0 = ``r0``.

    Computed in 60-digit decimal arithmetic from the exact binary values of q, c, r0 and
    ``limit`` (integer powers are exact; fractional ones correctly rounded), so the
    comparison at the threshold is not blurred by float rounding. ``None`` when the
    trajectory stays at or below ``limit`` for ``max_depth`` steps.

    With q = 1, c = 1, r0 = 1 the trajectory is 2^D: it first exceeds the fp16 maximum
    65504 at D = 16 (2^16 = 65536; Remark 6 of the paper says 17) and the fp32/bf16
    maxima at D = 128.
    """
    with localcontext() as ctx:
        ctx.prec = 60
        r, cc, lim = Decimal(r0), Decimal(c), Decimal(limit)
        qd = Decimal(q)
        q2 = 2 * qd
        if qd == qd.to_integral_value():
            power = lambda x: x ** int(qd)  # noqa: E731 - exact integer power
        elif q2 == q2.to_integral_value():
            power = lambda x: x.sqrt() ** int(q2)  # noqa: E731 - half-integers: fast sqrt
        else:
            power = lambda x: x**qd  # noqa: E731
        if r > lim:
            return 0
        for k in range(1, max_depth + 1):
            r = r + cc * power(r)
            if r > lim:
                return k
    return None


def trajectory(q: float, c: float = 1.0, r0: float = 1.0, depth: int = 140, cap: float = 1e300) -> list[float]:
    """r_0..r_k in float64, stopping once r exceeds ``cap`` (for plotting)."""
    r = [float(r0)]
    for _ in range(depth):
        x = r[-1]
        try:
            nxt = x + c * x**q
        except OverflowError:
            nxt = float("inf")
        r.append(nxt)
        if not nxt < cap:
            break
    return r


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
f"qlint verify figures need matplotlib: {INSTALL_HINT}"
        ) from exc
    return plt


def figure1(
    path: str | Path,
    cs: Sequence[float] = (1.0,),
    qs: Sequence[float] = (0.5, 1.0, 2.0, 5.0),
    r0: float = 1.0,
    depth: int = 140,
) -> dict[tuple[float, float, str], Optional[int]]:
    """Plot Figure 1 (one panel per c) and return {(c, q, format): overflow depth}."""
    plt = _pyplot()
    colors = {0.5: "tab:green", 1.0: "tab:blue", 2.0: "tab:orange", 5.0: "tab:red"}
    fig, axes = plt.subplots(1, len(cs), figsize=(9.0 * len(cs), 4.6), squeeze=False)
    depths: dict[tuple[float, float, str], Optional[int]] = {}
    for ax, c in zip(axes[0], cs):
        for q in qs:
            r = trajectory(q, c, r0, depth, cap=1e42)
            ks = list(range(len(r)))
            color = colors.get(q)
            ax.plot(ks, [min(x, 1e42) for x in r], "-", color=color, label=f"q = {q:g}", lw=1.6)
            for name, lim in LIMITS.items():
                d = overflow_depth(q, c, r0, lim, max_depth=max(depth, 10_000) if q <= 1 else 10_000)
                depths[(c, q, name)] = d
                if d is not None and d <= depth:
                    ax.plot([d], [min(r[d], 1e42)], "o" if name == "fp16" else "x", color=color, ms=6)
            marks = ", ".join(
                f"{n}:{depths[(c, q, n)] if depths[(c, q, n)] is not None else '>' + str(10_000)}"
                for n in LIMITS
            )
            ax.plot([], [], " ", label=f"   overflow D  {marks}")
        for name, lim, ls in (("fp16 max 65504", FP16_MAX, ":"), ("bf16 max 3.3895e38", BF16_MAX, "--"), ("fp32 max 3.4028e38", FP32_MAX, "-.")):
            ax.axhline(lim, color="gray", ls=ls, lw=1)
            ax.text(depth * 0.99, lim * (3 if "fp16" in name else 0.02 if "bf16" in name else 6), name,
                    ha="right", va="bottom", fontsize=7, color="dimgray")
        ax.set_yscale("log")
        ax.set_ylim(0.5, 1e42)
        ax.set_xlim(0, depth)
        ax.set_xlabel("layer index k")
        ax.set_ylabel(r"$r_k = \|X_k\|$")
        ax.set_title(rf"$r_{{k+1}} = r_k + c\,r_k^q$, $r_0$ = {r0:g}, c = {c:g}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="o fp16, x bf16/fp32 overflow",
                  title_fontsize=7)
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return depths


# With two variants the per-cell median is their mean: each deviation is just ± half their gap.
MIN_VARIANTS = 3
# A deviation more than FAR × the panel's 75th-percentile |deviation| is drawn at the panel's
# edge with its value written beside it, so one far-off variant cannot flatten the others.
FAR = 3.0
COLORS = {"rmsnorm": "tab:blue", "free": "tab:red", "preln": "tab:green", "periln": "tab:purple", "linear": "tab:orange"}
FIGURES = (("mamba", "figure3_mamba.png"), ("patchtst", "figure4_patchtst.png"))


@dataclass
class MseFigure:
    """What one Figure 3/4 drew; marks are (dataset, cell label, variant)."""

    path: Path
    datasets: list[str]
    variants: list[str]
    half_range: dict[str, float] = field(default_factory=dict)  # dataset -> y-axis limit ±, in %
    some_blown: list[tuple[str, str, str]] = field(default_factory=list)  # ∇: a mean over the surviving seeds
    all_blown: list[tuple[str, str, str]] = field(default_factory=list)  # ×: no seed survived
    clipped: list[tuple[str, str, str, float]] = field(default_factory=list)  # (..., deviation %) past the edge


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def _half_range(devs: list[float]) -> float:
    """The ± y-limit: the largest |deviation| within FAR × the 75th-percentile |deviation|,
    with 25 % headroom for the edge marks (at least 0.5 %)."""
    mags = sorted(abs(d) for d in devs)
    if not mags:
        return 1.0
    bulk = mags[round(0.75 * (len(mags) - 1))]
    return max(max(m for m in mags if m <= FAR * bulk) * 1.25, 0.5)


def _cell_label(horizon: int, depth: int) -> str:
    return f"L={depth}\nH{horizon}"


def figure_mse(
    runs: Iterable[dict[str, Any]], backbone: str, path: str | Path, field_name: str = "test_mse",
    log: Callable[[str], None] = _stderr,
) -> Optional[MseFigure]:
    """Figure 3 (Mamba) / 4 (PatchTST) as in the paper: one panel per data set, x the
    categorical (depth, horizon) cells, y each variant's signed % deviation of its mean MSE
    over surviving seeds from the per-cell variant median, one point per variant; ∇ where
    some seeds blew up, × (at the top edge) where all did. None, logged, with fewer than
    :data:`MIN_VARIANTS` variants; None, silently, without runs of ``backbone``."""
    from qlint.core.algebra import format_q
    from qlint.verify.grid import BACKBONES
    from qlint.verify.tables import BACKBONE_NAMES, VARIANT_NAMES, deviations, latest

    runs = [r for r in latest(runs) if r["backbone"] == backbone]
    if not runs:
        return None
    present = {r["variant"] for r in runs}
    known = BACKBONES.get(backbone, ())
    variants = [v for v in known if v in present] + sorted(present - set(known))
    if len(variants) < MIN_VARIANTS:
        log(f"skipped {Path(path).name}: {len(variants)} {BACKBONE_NAMES.get(backbone, backbone)} variant(s) "
            f"({', '.join(variants)}); with fewer than {MIN_VARIANTS} the per-cell median says nothing")
        return None
    qs = {v: max((r["q"] for r in runs if r["variant"] == v and r.get("q") is not None), default=None) for v in variants}
    dev = deviations(runs, field_name)
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    summary = MseFigure(Path(path), datasets, variants)
    plt = _pyplot()
    fig, axes = plt.subplots(len(datasets), 1, figsize=(8.5, 3.4 * len(datasets)), squeeze=False)
    for ax, ds in zip(axes[:, 0], datasets):
        cells = sorted((k for k in dev if k[1] == ds), key=lambda k: (k[3], k[2]))
        labels = [_cell_label(k[2], k[3]) for k in cells]
        half = summary.half_range[ds] = _half_range(
            [d["dev_pct"] for k in cells for d in dev[k].values() if d["dev_pct"] is not None])
        edge = 0.88 * half
        for j, v in enumerate(variants):
            x_off = (j - (len(variants) - 1) / 2) * 0.5 / max(len(variants) - 1, 1)
            color = COLORS.get(v, "black")
            for x, (k, label) in enumerate(zip(cells, labels)):
                d = dev[k].get(v)
                if d is None:
                    continue
                mark = (ds, label.replace("\n", " "), v)
                if d["dev_pct"] is None:
                    if d["blown"] == d["n"]:
                        summary.all_blown.append(mark)
                        ax.plot(x + x_off, edge, "x", color=color, ms=9, mew=2)
                    continue
                y = max(-edge, min(edge, d["dev_pct"]))
                if y != d["dev_pct"]:
                    summary.clipped.append((*mark, d["dev_pct"]))
                    ax.annotate(f"{d['dev_pct']:+.1f}%{'↑' if y > 0 else '↓'}", (x + x_off, y), xytext=(-6, 0),
                                textcoords="offset points", ha="right", va="center", fontsize=7, color=color)
                if d["blown"]:
                    summary.some_blown.append(mark)
                    ax.plot(x + x_off, y, "v", color=color, ms=9, mfc="none", mew=1.5)
                else:
                    ax.plot(x + x_off, y, "o", color=color, ms=5)
        if ds == datasets[0]:  # one legend, beside the top panel
            for v in variants:
                q = "" if qs[v] is None else f", q={format_q(qs[v])}"
                base = " — baseline" if v == "rmsnorm" else ""
                ax.plot([], [], "o", color=COLORS.get(v, "black"), ms=5, label=f"{VARIANT_NAMES.get(v, v)}{q}{base}")
            ax.plot([], [], "v", color="gray", mfc="none", label="∇ some seeds blew up (mean of the rest)")
            ax.plot([], [], "x", color="gray", mew=2, label="× all seeds blew up (top edge)")
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        depths = [k[3] for k in cells]
        for x in range(1, len(cells)):
            if depths[x] != depths[x - 1]:
                ax.axvline(x - 0.5, color="gray", lw=0.8, ls=":")
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xticks(range(len(cells)), labels, fontsize=8)
        ax.set_xlim(-0.5, len(cells) - 0.5)
        ax.set_ylim(-half, half)
        ax.set_ylabel("MSE vs cell median (%)")
        clip_note = f" (beyond ±{edge:.2g}%: at the edge, value written)" if any(c[0] == ds for c in summary.clipped) else ""
        ax.set_title(f"{ds}{clip_note}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{BACKBONE_NAMES.get(backbone, backbone)} variants: signed % deviation of each variant's mean "
                 f"{field_name} (surviving seeds)\nfrom the per-cell variant median (0 % = median, negative = lower error)",
                 fontsize=9.5)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return summary


def write_figures(out_dir: str | Path, log: Callable[[str], None] = _stderr) -> list[Path]:
    """``figure3_mamba.png`` and ``figure4_patchtst.png`` from ``out_dir/runs.jsonl``
    (each only where its backbone has at least :data:`MIN_VARIANTS` variants)."""
    from qlint.verify.grid import read_runs

    out_dir = Path(out_dir)
    runs = read_runs(out_dir / "runs.jsonl")
    drawn = (figure_mse(runs, backbone, out_dir / name, log=log) for backbone, name in FIGURES)
    return [f.path for f in drawn if f is not None]
