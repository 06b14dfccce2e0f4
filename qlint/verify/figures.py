"""Figure 1 (r_{k+1} = r_k + c r_k^q overflow) and Figures 3/4 (per-cell MSE deviation).

matplotlib is optional (``pip install 'qlint[plot]'``); :func:`overflow_depth` needs
only the standard library.
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

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
            "qlint verify figures need matplotlib: pip install matplotlib (or 'qlint[plot]')"
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


def figure_mse(runs: Iterable[dict[str, Any]], backbone: str, path: str | Path, field: str = "test_mse") -> bool:
    """Figures 3/4: each variant's % deviation of its mean MSE from the per-cell variant
    median, one panel per dataset; ∇ marks cells with a blown-up seed, × cells where all
    seeds blew up (drawn at the top edge). Returns False when ``backbone`` has no runs."""
    from qlint.verify.grid import BACKBONES
    from qlint.verify.tables import BACKBONE_NAMES, VARIANT_NAMES, deviations

    dev = {k: v for k, v in deviations(list(runs), field).items() if k[0] == backbone}
    if not dev:
        return False
    plt = _pyplot()
    datasets = sorted({k[1] for k in dev})
    fig, axes = plt.subplots(len(datasets), 1, figsize=(8, 3.2 * len(datasets)), squeeze=False)
    variants = [v for v in BACKBONES.get(backbone, ()) if any(v in cell for cell in dev.values())]
    colors = {"rmsnorm": "tab:blue", "preln": "tab:green", "periln": "tab:purple", "linear": "tab:orange", "free": "tab:red"}
    for ax, ds in zip(axes[:, 0], datasets):
        cells = sorted(k for k in dev if k[1] == ds)
        labels = [f"H{k[2]}\nL{k[3]}" for k in cells]
        xs = list(range(len(cells)))
        vals = [d["dev_pct"] for k in cells for d in dev[k].values() if d["dev_pct"] is not None]
        top = max([abs(v) for v in vals] + [0.5]) * 1.25
        for j, v in enumerate(variants):
            off = (j - (len(variants) - 1) / 2) * 0.08
            px, py = [], []
            for x, k in zip(xs, cells):
                d = dev[k].get(v)
                if d is None:
                    continue
                if d["dev_pct"] is None:  # all seeds blew up
                    ax.plot([x + off], [top * 0.95], "x", color=colors.get(v, "k"), ms=9, mew=2)
                    continue
                px.append(x + off)
                py.append(d["dev_pct"])
                if d["blown"]:
                    ax.plot([x + off], [d["dev_pct"]], "v", color=colors.get(v, "k"), ms=9, mfc="none")
            ax.plot(px, py, "o-", color=colors.get(v, "k"), ms=4, lw=1,
                    label=f"{VARIANT_NAMES.get(v, v)}" + (" (baseline)" if v == "rmsnorm" else ""))
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_ylim(-top, top)
        ax.set_xlim(-0.5, len(cells) - 0.5)
        ax.set_ylabel("MSE vs cell median (%)")
        ax.set_title(f"{BACKBONE_NAMES.get(backbone, backbone)} on {ds}: {field} deviation from per-cell median"
                     " (∇ some seeds blew up, × all)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=len(variants))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def write_figures(out_dir: str | Path) -> list[Path]:
    """``figure3_mamba.png`` and ``figure4_patchtst.png`` from ``out_dir/runs.jsonl``."""
    from qlint.verify.grid import read_runs
    from qlint.verify.tables import latest

    out_dir = Path(out_dir)
    runs = latest(read_runs(out_dir / "runs.jsonl"))
    written = []
    for backbone, name in (("mamba", "figure3_mamba.png"), ("patchtst", "figure4_patchtst.png")):
        p = out_dir / name
        if figure_mse(runs, backbone, p):
            written.append(p)
    return written
