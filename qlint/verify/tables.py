"""Table 2 (blow-ups per cell), per-cell MSE, and the q-vs-blow-up summary from runs.jsonl.

Table 2 layout (as in the paper): one row per backbone / variant / q / depth L, one
column per (dataset, horizon), then Σ. A cell reads ``k/n (m/n)``: k of its n
seed-level runs blew up by the paper's rule (non-finite or > 1e3 at the end), m had a
non-finite validation MSE at some evaluation (see :mod:`qlint.verify.train`).

Records written before both counts were stored (``blew_up`` only, which meant the
any-evaluation rule) still render: the paper's count is derived from the recorded
reason where the old harness's early stop leaves it determined, and is "n/a" otherwise.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional

from qlint.ci.files import write_text
from qlint.core.algebra import format_q
from qlint.verify.grid import BACKBONES, lint_key, read_runs
from qlint.verify.train import BLOWUP_FACTOR, run_key

BACKBONE_NAMES = {"mamba": "Mamba", "patchtst": "PatchTST"}
VARIANT_NAMES = {
    "free": "free velocity",
    "rmsnorm": "RMSNorm",
    "preln": "Pre-LN",
    "periln": "Peri-LN",
    "linear": "linear growth",
}


def _order(backbone: str, variant: str) -> tuple:
    bb = list(BACKBONES)
    b = bb.index(backbone) if backbone in bb else len(bb)
    vs = BACKBONES.get(backbone, ())
    v = vs.index(variant) if variant in vs else len(vs)
    return (b, backbone, v, variant)


NA = "n/a"

# blowup_reason prefixes of the old harness that mean "non-finite or > 1e3 at the end": it
# stopped on a non-finite training loss (the next Adam step makes the parameters NaN for
# good), or measured the final val MSE. Its other early stop, at a non-finite mid-training
# evaluation, leaves the end unknown.
_OLD_FINAL_REASONS = ("non-finite training loss", "final val MSE")
_OLD_FINAL_VAL_REASON = "non-finite validation loss"


def blew_up_any(run: dict[str, Any]) -> bool:
    """Non-finite val MSE at any evaluation, or blown up by the paper's rule."""
    return bool(run.get("blew_up_any", run.get("blew_up")))


def blew_up_final(run: dict[str, Any]) -> Optional[bool]:
    """The paper's rule; None where an old record does not determine it."""
    if "blew_up_final" in run:
        return bool(run["blew_up_final"])
    if not run.get("blew_up"):
        return False  # finite at every evaluation, so at the end
    reason = run.get("blowup_reason") or ""
    if reason.startswith(_OLD_FINAL_REASONS) or reason == _OLD_FINAL_VAL_REASON:
        return True
    return None


def excluded(run: dict[str, Any]) -> bool:
    """Left out of the MSE averages: blown up by the paper's rule (by the any rule where unknown)."""
    final = blew_up_final(run)
    return blew_up_any(run) if final is None else final


def _counts(runs: list[dict[str, Any]]) -> tuple[Optional[int], int, int]:
    """(blown by the paper's rule or None if any is unknown, blown at any evaluation, runs)."""
    finals = [blew_up_final(r) for r in runs]
    k_final = None if None in finals else sum(finals)
    return k_final, sum(blew_up_any(r) for r in runs), len(runs)


def blowup_step(run: dict[str, Any]) -> Optional[int]:
    """The first step whose training loss was non-finite or above 1e3, as recorded (``blowup_step``).

    Otherwise (a record from before it was recorded, or a run whose training loss stayed below 1e3) the
    earliest step the record determines: the first evaluation whose val MSE was non-finite or above 1e3,
    the step where the run stopped on non-finite parameters, or the end of a run that blew up by the
    paper's rule; None for a run that did none of these.
    """
    if run.get("blowup_step") is not None:
        return run["blowup_step"]
    every = run.get("eval_every") or 100
    steps = [(i + 1) * every for i, v in enumerate(run.get("val_history") or ())
             if v is None or not v <= BLOWUP_FACTOR]  # NaN compares False
    if ((run.get("blowup_reason") or "").startswith("non-finite parameters") or blew_up_final(run)) and "steps" in run:
        steps.append(run["steps"])
    return min(steps, default=None)


def _blew_up_in_training(run: dict[str, Any]) -> bool:
    """Blown up by the training-loss rule or by any rule the record states (the Table 2 counts' too)."""
    return blowup_step(run) is not None or blew_up_any(run)


def warning_step(run: dict[str, Any], *, static: bool = True) -> Optional[int]:
    """qlint.monitor's first warning: recorded (``monitor_first_warning_step``), or for records from before
    it was, recomputed from the run's telemetry (:func:`qlint.monitor.stream.first_warning`, in its dtype).

    The recomputation gives each record the fact the live monitor has (``static_q``): in a model qlint
    certified, every block's exponent is at most the model's q. ``static=False`` leaves it out (the
    measurement alone).
    """
    if "monitor_first_warning_step" in run:
        return run["monitor_first_warning_step"]
    import torch

    from qlint.monitor.stream import first_warning
    from qlint.verify.train import amp_dtype

    telemetry = run.get("telemetry") or ()
    if static and run.get("verdict") == "certified" and run.get("q") is not None:
        telemetry = [{"static_q": run["q"], **record} for record in telemetry]
    return first_warning(telemetry, amp_dtype(run.get("amp") or "fp32") or torch.float32)


def _warned(runs: list[dict[str, Any]]) -> str:
    """``"a/b · f/n"``: a of the b blown-up runs warned strictly before their blow-up step; f of the n runs
    that stayed finite warned at some step (false warnings where q <= 1)."""
    blown = [r for r in runs if _blew_up_in_training(r)]
    ahead = sum(1 for r in blown if None not in (w := warning_step(r), b := blowup_step(r)) and w < b)
    finite = [r for r in runs if not _blew_up_in_training(r)]
    warned = sum(1 for r in finite if warning_step(r) is not None)
    return f"{ahead}/{len(blown)} · {warned}/{len(finite)}"


def warning_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """One row per run that blew up or was warned: its blow-up step, first warning and lead (steps)."""
    header = ["Backbone", "Variant", "q", "L", "dataset", "H", "seed", "blow-up step", "first warning", "lead"]
    rows = []
    for r in sorted(latest(runs), key=lambda r: (_order(r["backbone"], r["variant"]), r["depth"], r["horizon"],
                                                 r["seed"])):
        blow, warn = blowup_step(r), warning_step(r)
        if not _blew_up_in_training(r) and warn is None:
            continue
        lead = "–" if blow is None or warn is None else str(blow - warn)
        rows.append(_row_label([r], r["backbone"], r["variant"], r["depth"])
                    + [r["dataset"], str(r["horizon"]), str(r["seed"]), _or_dash(blow), _or_dash(warn), lead])
    return header, rows


def _or_dash(value: Optional[int]) -> str:
    return "–" if value is None else str(value)


def _fmt_counts(runs: list[dict[str, Any]]) -> str:
    """``"2/6 (3/6)"``: the paper's count, then the any-evaluation count."""
    k_final, k_any, n = _counts(runs)
    return f"{NA if k_final is None else f'{k_final}/{n}'} ({k_any}/{n})"


def latest(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per run key (the last one written wins)."""
    by_key: dict[tuple, dict[str, Any]] = {}
    for r in runs:
        by_key[run_key(r)] = r
    return list(by_key.values())


def fill_q(runs: list[dict[str, Any]], lint: Optional[dict[str, dict]] = None) -> list[dict[str, Any]]:
    """Fill a missing ``q`` from lint.json (key backbone/variant/L<depth>/d<d_model>)."""
    if not lint:
        return runs
    out = []
    for r in runs:
        if r.get("q") is None:
            entry = lint.get(lint_key(r))
            if entry and entry.get("q") is not None:
                r = {**r, "q": entry["q"]}
        out.append(r)
    return out


def _columns(runs: list[dict[str, Any]]) -> list[tuple[str, int]]:
    datasets: list[str] = []
    for r in runs:
        if r["dataset"] not in datasets:
            datasets.append(r["dataset"])
    return [
        (d, h)
        for d in datasets
        for h in sorted({r["horizon"] for r in runs if r["dataset"] == d})
    ]


def _row_keys(runs: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    keys = {(r["backbone"], r["variant"], r["depth"]) for r in runs}
    return sorted(keys, key=lambda k: (_order(k[0], k[1]), k[2]))


def _row_q(runs: list[dict[str, Any]], backbone: str, variant: str, depth: int) -> Optional[float]:
    qs = {r.get("q") for r in runs if (r["backbone"], r["variant"], r["depth"]) == (backbone, variant, depth)}
    qs.discard(None)
    return max(qs) if qs else None


def table2(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of Table 2: blow-ups ``k/n (m/n)`` per (dataset, horizon) cell and Σ
    (k by the paper's rule, m at any evaluation), then qlint.monitor's record (:func:`_warned`)."""
    runs = latest(runs)
    cols = _columns(runs)
    header = ["Backbone", "Variant", "q", "L"] + [f"{d} H{h}" for d, h in cols] + ["Σ", "warned ahead · finite"]
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        cells[(r["backbone"], r["variant"], r["depth"], r["dataset"], r["horizon"])].append(r)
    rows = []
    for backbone, variant, depth in _row_keys(runs):
        row = _row_label(runs, backbone, variant, depth)
        in_row: list[dict[str, Any]] = []
        for d, h in cols:
            cell = cells.get((backbone, variant, depth, d, h), [])
            row.append(_fmt_counts(cell) if cell else "–")
            in_row += cell
        row += [_fmt_counts(in_row), _warned(in_row)]
        rows.append(row)
    return header, rows


def _row_label(runs: list[dict[str, Any]], backbone: str, variant: str, depth: int) -> list[str]:
    """The leading cells of a Table 2 row: backbone, variant, qlint's q, depth."""
    return [
        BACKBONE_NAMES.get(backbone, backbone),
        VARIANT_NAMES.get(variant, variant),
        format_q(_row_q(runs, backbone, variant, depth)),
        str(depth),
    ]


def mse_table(runs: list[dict[str, Any]], field: str = "test_mse") -> tuple[list[str], list[list[str]]]:
    """Mean ``field`` over the surviving seeds of each cell (``×`` where all blew up; see :func:`excluded`)."""
    runs = latest(runs)
    cols = _columns(runs)
    header = ["Backbone", "Variant", "q", "L"] + [f"{d} H{h}" for d, h in cols]
    rows = []
    for backbone, variant, depth in _row_keys(runs):
        row = _row_label(runs, backbone, variant, depth)
        for d, h in cols:
            sel = [
                r for r in runs
                if (r["backbone"], r["variant"], r["depth"], r["dataset"], r["horizon"])
                == (backbone, variant, depth, d, h)
            ]
            ok = [r[field] for r in sel if not excluded(r) and r.get(field) is not None]
            row.append(f"{statistics.fmean(ok):.4f}" if ok else ("×" if sel else "–"))
        rows.append(row)
    return header, rows


def deviations(runs: list[dict[str, Any]], field: str = "test_mse") -> dict[tuple, dict[str, dict[str, Any]]]:
    """Figures 3/4: per cell (backbone, dataset, horizon, depth), each variant's signed %
    deviation of its mean MSE (surviving seeds) from the median over variants; ``blown``
    counts the seeds left out (:func:`excluded`)."""
    runs = latest(runs)
    groups: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        groups[(r["backbone"], r["dataset"], r["horizon"], r["depth"])][r["variant"]].append(r)
    out: dict[tuple, dict[str, dict[str, Any]]] = {}
    for cell, by_var in groups.items():
        means = {}
        for v, rs in by_var.items():
            ok = [r[field] for r in rs if not excluded(r) and r.get(field) is not None]
            if ok:
                means[v] = statistics.fmean(ok)
        med = statistics.median(means.values()) if means else None
        out[cell] = {
            v: {
                "mean": means.get(v),
                "dev_pct": (100.0 * (means[v] / med - 1.0)) if v in means and med else None,
                "blown": sum(excluded(r) for r in rs),
                "n": len(rs),
            }
            for v, rs in by_var.items()
        }
    return out


def _by_depth(runs: list[dict[str, Any]]) -> tuple[str, str]:
    """Per-depth counts, paper's rule and any-evaluation rule: ("L=3: 2/6, L=8: 5/6", "L=3: 3/6, ...")."""
    depths = sorted({r["depth"] for r in runs})
    per = {d: _counts([r for r in runs if r["depth"] == d]) for d in depths}
    final = ", ".join(f"L={d}: {NA if kf is None else kf}/{n}" for d, (kf, _, n) in per.items())
    anyev = ", ".join(f"L={d}: {ka}/{n}" for d, (_, ka, n) in per.items())
    return final, anyev


def summary_lines(runs: list[dict[str, Any]]) -> list[str]:
    """"Mamba free velocity: q=5, blew up 7/12 (58%; L=3: 2/6, L=8: 5/6); by the stricter
    rule 8/12 (L=3: 3/6, L=8: 5/6)" per variant."""
    runs = latest(runs)
    per: dict[tuple, list] = defaultdict(list)
    for r in runs:
        per[(r["backbone"], r["variant"])].append(r)
    lines = []
    for backbone, variant in sorted(per, key=lambda k: _order(*k)):
        rs = per[(backbone, variant)]
        k_final, k_any, n = _counts(rs)
        qs = {r.get("q") for r in rs} - {None}
        q = format_q(max(qs)) if qs else "?"
        final_by_depth, any_by_depth = _by_depth(rs)
        share = "" if k_final is None else f"{100.0 * k_final / n:.0f}%; "
        lines.append(
            f"{BACKBONE_NAMES.get(backbone, backbone)} {VARIANT_NAMES.get(variant, variant)}: "
            f"q={q}, blew up {NA if k_final is None else k_final}/{n} ({share}{final_by_depth}); "
            f"by the stricter rule {k_any}/{n} ({any_by_depth})"
        )
    return lines


def pattern_check(runs: list[dict[str, Any]]) -> list[str]:
    """Does the paper's pattern hold (by its rule)? No blow-ups at q <= 1; q > 1 blowing up
    more at the largest depth than at the smallest."""
    runs = latest(runs)
    sub = [r for r in runs if r.get("q") is not None and r["q"] <= 1]
    sup = [r for r in runs if r.get("q") is not None and r["q"] > 1]
    unk = [r for r in runs if r.get("q") is None]
    lines = []
    k_sub, k_sub_any, n_sub = _counts(sub)
    verdict = (
        " (paper: 0 — no runs to test it)" if not sub
        else " (paper: 0 — cannot tell from these records)" if k_sub is None
        else " (paper: 0 — holds)" if k_sub == 0 else " (paper: 0 — does NOT hold)"
    )
    lines.append(
        f"q <= 1 variants: {NA if k_sub is None else k_sub}/{n_sub} runs blew up by the paper's rule"
        f"{verdict}; {k_sub_any}/{n_sub} by the stricter rule"
    )
    if sup:
        k_sup, k_sup_any, n_sup = _counts(sup)
        final_by_depth, any_by_depth = _by_depth(sup)
        lines.append(
            f"q > 1 variants: {NA if k_sup is None else k_sup}/{n_sup} runs blew up by the paper's rule "
            f"({final_by_depth}); {k_sup_any}/{n_sup} by the stricter rule ({any_by_depth})"
        )
        depths = sorted({r["depth"] for r in sup})
        if len(depths) >= 2:
            lo = _counts([r for r in sup if r["depth"] == depths[0]])
            hi = _counts([r for r in sup if r["depth"] == depths[-1]])
            if k_sup == 0:
                lines.append("no supercritical run blew up at this scale: the paper's q > 1 divergence is NOT "
                             "reproduced here")
            elif k_sup is not None:
                more = hi[0] / max(hi[2], 1) > lo[0] / max(lo[2], 1)
                lines.append(
                    f"blow-up rate rises with depth (L={depths[0]} -> L={depths[-1]}): {'yes' if more else 'no'}"
                )
    if unk:
        lines.append(f"{len(unk)} runs have no q (lint unavailable)")
    return lines


def to_markdown(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    out.write("| " + " | ".join(header) + " |\n")
    out.write("|" + "|".join(":---" if i < 2 else "---:" for i in range(len(header))) + "|\n")
    for row in rows:
        out.write("| " + " | ".join(row) + " |\n")
    return out.getvalue()


def to_csv(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return out.getvalue()


def load_lint(out_dir: str | Path) -> dict[str, dict]:
    p = Path(out_dir) / "lint.json"
    if p.exists():
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError:
            return {}
    return {}


def write_tables(out_dir: str | Path, title: str = "") -> str:
    """Write ``table2.md``, ``table2.csv`` and ``summary.txt`` from ``out_dir/runs.jsonl``;
    return the markdown."""
    out_dir = Path(out_dir)
    runs = fill_q(latest(read_runs(out_dir / "runs.jsonl")), load_lint(out_dir))
    header, rows = table2(runs)
    write_text(out_dir / "table2.csv", to_csv(header, rows))  # each file whole (qlint.ci.files): never half a table
    summary = summary_lines(runs)
    checks = pattern_check(runs)
    mh, mrows = mse_table(runs)
    md = io.StringIO()
    md.write(f"# Table 2 — blow-ups per cell{(' (' + title + ')') if title else ''}\n\n")
    md.write(
        f"{len(runs)} runs. Cell = **k/n (m/n)** of the cell's n seed-level runs: **k blew up by "
        "the paper's rule** — the validation MSE at the end was non-finite or above 1e3 × "
        "Var(z-scored target) = 1e3, or a parameter turned non-finite (it stays so to the end) — "
        "and, in parentheses, **m blew up by the stricter rule**: by the paper's rule, or with a "
        f"non-finite validation MSE at any periodic evaluation (m ≥ k). {NA} = an old record that does not say how the "
        "run ended. "
        "q = qlint's static growth exponent of the model's worst block. **warned ahead · finite** = "
        "a/b · f/n: of the b runs whose training loss turned non-finite or passed 1e3 (blow-up step), "
        "a got qlint.monitor's warning strictly before that step; of the n runs that never did, f got "
        "a warning (a false warning where q ≤ 1).\n\n"
    )
    md.write(to_markdown(header, rows))
    md.write("\n## Summary\n\n")
    for line in summary + checks:
        md.write(f"- {line}\n")
    md.write("\n## Test MSE (mean over surviving seeds; × = all seeds blew up)\n\n")
    md.write(to_markdown(mh, mrows))
    wh, wrows = warning_rows(runs)
    md.write("\n## qlint.monitor's warnings (runs that blew up or were warned; lead = blow-up step − warning "
             "step)\n\n")
    md.write(to_markdown(wh, wrows) if wrows else "No run blew up or was warned.\n")
    text = md.getvalue()
    write_text(out_dir / "table2.md", text)
    write_text(out_dir / "summary.txt", "\n".join(summary + checks) + "\n")
    return text
