"""Figure 1 (r_{k+1} = r_k + c r_k^q overflow), Figures 3/4 (per-cell MSE deviation) and the
stream telemetry of a blown-up run beside its controls.

matplotlib comes with the ``verify`` extra (:data:`INSTALL_HINT`); :func:`overflow_depth`
needs only the standard library.
"""

from __future__ import annotations

import math
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


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            f"qlint verify figures need the [verify] extra (matplotlib is not installed): {INSTALL_HINT}"
        ) from exc
    return plt


def figure1(
    path: str | Path,
    cs: Sequence[float] = (0.01, 0.1, 1.0),
    qs: Sequence[float] = (0.0, 1.0, 2.0, 5.0),
    r0: float = 1.0,
    depth: int = 60,
) -> dict[tuple[float, float, str], int | None]:
    """Plot Figure 1 and return {(c, q, format): overflow depth} (:func:`overflow_depth`, None past 10 000).

    One log-y panel, r_k = ||X_k|| against the layer k <= ``depth`` for r_{k+1} = r_k + c·r_k^q
    (:func:`qlint.velocity.bounds.step`): a colour per q, a line style per c, the fp16 and bf16/fp32
    maxima as horizontal lines, a marker and the layer number where a curve first exceeds one of
    them; a curve past the top of the axes is clipped there (▲). Beside it a linear-y panel of
    the first layers at the smallest c: the "tame at initialisation" view, in which q > 1 cannot
    be told from q <= 1 until it takes off.
    """
    from qlint.velocity.bounds import BlockConstants, step

    plt = _pyplot()
    top = 1e45  # the y-axis ceiling: seven decades above the fp32 maximum
    palette = {0.0: "tab:green", 0.5: "tab:olive", 1.0: "tab:blue", 2.0: "tab:orange", 5.0: "tab:red"}
    spare = iter(("tab:purple", "tab:brown", "tab:pink", "tab:cyan", "tab:gray"))
    colors = {q: palette.get(q) or next(spare, "black") for q in qs}
    cs_sorted = sorted(cs)
    line_styles = (":", "--", "-", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (3, 1, 1, 1)))
    styles = {c: line_styles[i % len(line_styles)] for i, c in enumerate(cs_sorted)}
    widths = {c: (2.4, 1.8)[i] if i < 2 else 1.5 for i, c in enumerate(cs_sorted)}

    def path_of(q: float, c: float) -> list[float]:
        block, r = BlockConstants(q, c, 0.0), [float(r0)]
        while len(r) <= depth and r[-1] <= top:
            r.append(step(r[-1], block))
        return r

    depths: dict[tuple[float, float, str], int | None] = {}
    for c in cs:
        for q in qs:
            for name, lim in LIMITS.items():
                depths[(c, q, name)] = overflow_depth(q, c, r0, lim, max_depth=10_000)

    fig, (zoom, ax) = plt.subplots(1, 2, figsize=(15.5, 6.4), gridspec_kw={"width_ratios": [1, 2.3]})
    crossings: dict[str, list[tuple[float, float, str, int]]] = {"fp16": [], "fp32": []}  # (x, y, colour, k)
    for c in cs:
        for q in qs:
            r = path_of(q, c)
            ys = [min(x, top) for x in r]
            d16, dbf, d32 = (depths[(c, q, n)] for n in ("fp16", "bf16", "fp32"))

            def say(d: int | None) -> str:
                if d is None:
                    return "> 10000"
                return f"{d}" if d <= depth else f"{d} (off plot)"

            wide = f"bf16 {say(dbf)}, fp32 {say(d32)}" if dbf != d32 else f"bf16/fp32 {say(d32)}"
            color = colors[q]
            ax.plot(range(len(ys)), ys, ls=styles[c], lw=widths[c], color=color,
                    label=f"q={q:g}, c={c:g}: fp16 {say(d16)}, {wide}")
            if r[-1] > top:
                ax.plot([len(ys) - 1], [top], "^", color=color, ms=8, clip_on=False)
            for name, lim in (("fp16", FP16_MAX), ("fp32", FP32_MAX)):
                d = depths[(c, q, name)]
                if d is None or not 0 < d <= depth or d >= len(ys):
                    continue
                # where the drawn (log-y) segment from layer d - 1 to d meets the line
                lo, hi = math.log(ys[d - 1]), math.log(ys[d])
                frac = min(max((math.log(lim) - lo) / (hi - lo), 0.0), 1.0) if hi > lo else 1.0
                crossings[name].append((d - 1 + frac, lim, color, d))
    for name, marker in (("fp16", "o"), ("fp32", "s")):
        last, above = -math.inf, True
        for x, y, color, d in sorted(crossings[name]):
            near = x - last < 2.5  # a near neighbour: a smaller marker inside, the label on the other side
            above = near and not above
            ax.plot([x], [y], marker, color=color, ms=4.5 if near else 8, mfc="white", mew=1.8, zorder=6 if near else 5)
            ax.annotate(f"k={d}", (x, y), xytext=(5, 5 if above else -5), textcoords="offset points", fontsize=8,
                        color=color, fontweight="bold", ha="left", va="bottom" if above else "top", zorder=7,
                        bbox={"fc": "white", "ec": "none", "alpha": 0.75, "pad": 0.5})
            last = x
    ax.axhline(FP16_MAX, color="black", ls=(0, (1, 2)), lw=1)
    ax.axhline(BF16_MAX, color="black", ls=(0, (4, 2)), lw=1)
    ax.axhline(FP32_MAX, color="black", ls=(0, (4, 2)), lw=1)
    ax.text(depth * 0.995, FP16_MAX * 2.5, "fp16 max 6.55e4", fontsize=9, ha="right", va="bottom")
    ax.text(depth * 0.995, FP32_MAX * 2.5, "bf16 max 3.39e38 ≈ fp32 max 3.40e38", fontsize=9, ha="right",
            va="bottom")
    ax.set_yscale("log")
    ax.set_ylim(0.5, top)
    ax.set_xlim(0, depth)
    ax.set_xlabel("layer k")
    ax.set_ylabel(r"$\|X_k\| = r_k$ (log)")
    ax.set_title(rf"$r_{{k+1}} = r_k + c\,r_k^q$, $r_0$ = {r0:g}: the layer where each curve first exceeds a format",
                 fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.plot([], [], "o", color="gray", mfc="white", mew=1.8, label="k = first layer > fp16 max")
    ax.plot([], [], "s", color="gray", mfc="white", mew=1.8, label="k = first layer > bf16/fp32 max")
    ax.plot([], [], "^", color="gray", label="clipped at the top of the axes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              title="overflow layer k per (q, c)", title_fontsize=8)

    c0 = cs_sorted[0]
    zoom_top = 4.0
    for q in qs:
        r = path_of(q, c0)
        ks = list(range(len(r)))
        zoom.plot(ks, [min(x, zoom_top * 10) for x in r], ls=styles[c0], lw=2.2, color=colors[q], label=f"q = {q:g}")
    zoom.set_ylim(0.9, zoom_top)
    zoom.set_xlim(0, depth)
    zoom.set_xlabel("layer k")
    zoom.set_ylabel(r"$\|X_k\|$ (linear)")
    zoom.set_title(f"small c = {c0:g} (as at initialisation), linear y", fontsize=10)
    zoom.grid(True, alpha=0.3)
    zoom.legend(fontsize=8, loc="upper right")
    arrow = " → ".join(f"{c:g}" for c in cs_sorted)
    story = [f"first layer > fp16 max\nas c grows {arrow}:"] + [
        f"q = {q:g}:  " + " → ".join(str(depths[(c, q, "fp16")] or "> 10⁴") for c in cs_sorted) for q in qs
    ]
    zoom.text(0.03, 0.97, "\n".join(story), transform=zoom.transAxes, ha="left", va="top", fontsize=8,
              bbox={"fc": "white", "ec": "lightgray"})
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return depths


# With two variants the per-cell median is their mean: each deviation is just ± half their gap.
MIN_VARIANTS = 3
# A deviation more than FAR × the panel's 75th-percentile |deviation| is drawn at the panel's
# edge with its value written beside it, so one far-off variant cannot flatten the others.
FAR = 3.0
COLORS = {"rmsnorm": "tab:blue", "free": "tab:red", "preln": "tab:green", "periln": "tab:purple",
          "linear": "tab:orange"}
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
    qs = {v: max((r["q"] for r in runs if r["variant"] == v and r.get("q") is not None), default=None)
          for v in variants}
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
        clip_note = (f" (beyond ±{edge:.2g}%: at the edge, value written)" if any(c[0] == ds for c in summary.clipped)
                     else "")
        ax.set_title(f"{ds}{clip_note}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{BACKBONE_NAMES.get(backbone, backbone)} variants: signed % deviation of each variant's mean "
                 f"{field_name} (surviving seeds)\nfrom the per-cell variant median (0 % = median, negative = lower "
                 "error)",
                 fontsize=9.5)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return summary


STREAM_FIGURE = "figure_stream.png"


@dataclass
class StreamFigure:
    """What the stream figure drew: the blown-up run's key and its controls' variants."""

    path: Path
    run: tuple  # run_key of the blown-up run
    controls: list[str]
    blew_up_at: int  # the step training stopped at (or the run's last step)


def _telemetry_series(run: dict[str, Any], value: Callable[[dict], Optional[float]]) -> tuple[list[int], list[float]]:
    """(steps, the largest finite value over the blocks at each measured step)."""
    by_step: dict[int, list[float]] = {}
    for record in run.get("telemetry") or ():
        v = value(record)
        if v is not None and math.isfinite(v):
            by_step.setdefault(record["step"], []).append(v)
    steps = sorted(by_step)
    return steps, [max(by_step[s]) for s in steps]


def _stream_subject(runs: list[dict[str, Any]]) -> Optional[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The blown-up run (paper's rule) with the longest telemetry, deepest first, then canonical
    order; and its controls: the runs of the same backbone and cell (data set, horizon, depth,
    seed) with q <= 1 that did not blow up."""
    from qlint.verify.tables import blew_up_final

    def measured_steps(run):
        return len({r["step"] for r in run.get("telemetry") or ()})

    def cell(run):
        return (run["backbone"], run["dataset"], run["horizon"], run["depth"], run["seed"])

    candidates = []
    for run in runs:
        if not blew_up_final(run) or measured_steps(run) < 2:
            continue
        controls = [c for c in runs if cell(c) == cell(run) and c.get("q") is not None and c["q"] <= 1
                    and blew_up_final(c) is False and measured_steps(c) >= 2]
        if controls:
            candidates.append((run, controls))
    if not candidates:
        return None
    return max(candidates, key=lambda rc: (rc[0]["depth"], measured_steps(rc[0])))  # the first of equals


def figure_stream(runs: Iterable[dict[str, Any]], path: str | Path) -> Optional[StreamFigure]:
    """Item 3 of the verify harness: a blown-up run's stream telemetry beside its q <= 1
    controls in the same cell. Three panels over the training steps, each the largest value
    over the blocks: the stream norm max ||X_k|| on the fixed batch, and the gains
    ||v(sX_k)|| / ||sX_k|| at s = 1 and s = 4 (log axes); a dashed line at the blown-up run's
    last step (where training stopped on non-finite parameters, or the end of its budget).
    None when no blown-up run with recorded telemetry has a control."""
    from qlint.core.algebra import format_q
    from qlint.verify.tables import BACKBONE_NAMES, VARIANT_NAMES, latest
    from qlint.verify.train import run_key

    runs = latest(runs)
    subject = _stream_subject(runs)
    if subject is None:
        return None
    run, controls = subject
    plt = _pyplot()
    panels = (("max$_k$ $\\|X_k\\|$ (fixed batch)", lambda r: r["stream_norm"]),
              ("max$_k$ gain at s = 1", lambda r: r["gain"].get("1")),
              ("max$_k$ gain at s = 4", lambda r: r["gain"].get("4")))
    fig, axes = plt.subplots(1, len(panels), figsize=(13.0, 3.8))
    for ax, (title, value) in zip(axes, panels):
        for r in [run, *controls]:
            steps, ys = _telemetry_series(r, value)
            label = f"{VARIANT_NAMES.get(r['variant'], r['variant'])}, q={format_q(r['q'])}"
            blown = r is run
            ax.plot(steps, ys, "-o" if blown else "-", color=COLORS.get(r["variant"], "black"), lw=2 if blown else 1.2,
                    ms=4, label=label + (" (blew up)" if blown else ""))
        ax.axvline(run["steps"], color="tab:red", ls="--", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    ended = "stopped" if run["steps"] < run.get("steps_budget", run["steps"]) else "trained to"
    axes[0].annotate(f"{ended} step {run['steps']}", (run["steps"], 0.02), xycoords=("data", "axes fraction"),
                     xytext=(-4, 0), textcoords="offset points", ha="right", fontsize=7, color="tab:red")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{BACKBONE_NAMES.get(run['backbone'], run['backbone'])} on {run['dataset']} H{run['horizon']}, "
                 f"L={run['depth']}, seed {run['seed']}: the blown-up run ({run.get('blowup_reason') or 'blew up'}) "
                 "beside its q <= 1 controls", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return StreamFigure(Path(path), run_key(run), [c["variant"] for c in controls], run["steps"])


def write_figures(out_dir: str | Path, log: Callable[[str], None] = _stderr) -> list[Path]:
    """``figure3_mamba.png`` and ``figure4_patchtst.png`` from ``out_dir/runs.jsonl`` (each only
    where its backbone has at least :data:`MIN_VARIANTS` variants), and :data:`STREAM_FIGURE`
    where a blown-up run has telemetry and a control."""
    from qlint.verify.grid import read_runs

    out_dir = Path(out_dir)
    runs = read_runs(out_dir / "runs.jsonl")
    drawn = [figure_mse(runs, backbone, out_dir / name, log=log) for backbone, name in FIGURES]
    drawn.append(figure_stream(runs, out_dir / STREAM_FIGURE))
    return [f.path for f in drawn if f is not None]
