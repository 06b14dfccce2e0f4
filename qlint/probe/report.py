"""The rich terminal report of ``qlint probe`` (``--format full``)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from qlint.ci.render import fit_cells, make_console
from qlint.core.algebra import format_q
from qlint.probe.measure import BlockProbe, ModelProbe
from qlint.velocity.bounds import FLOAT_FORMATS, StackBounds
from qlint.probe.init import InitDiagnostics
from qlint.probe import logs as init_logs

AGREEMENT_STYLE = {"exact": "green", "below": "cyan", "VIOLATION": "bold red", "n/a": "yellow"}


def number(value: Optional[float], digits: int = 3) -> str:
    """Compact numbers: 3 significant digits, '-' for none, ∞ past float64."""
    if value is None:
        return "-"
    if isinstance(value, int) and abs(value) < 10**6:
        return str(value)
    if math.isinf(value):
        return "∞"
    return f"{float(value):.{digits}g}"


def exponent_table(result: ModelProbe) -> Table:
    """Static against measured exponent per block, the constants and the cost."""
    report = result.report
    title = f"{report.spec}  [dim](tracer: {report.tracer}, mode: {report.mode}, float64)[/dim]"
    table = Table(title=title, title_justify="left")
    table.add_column("block")
    for column in ("q", "measured", "spread", "agreement", "c", "b", "L", "cost"):
        table.add_column(column, justify="left" if column == "agreement" else "right")
    for block in result.blocks:
        measured = "-"
        if block.q_measured is not None:
            measured = f"{round(block.q_measured, 3) + 0.0:.3f}" + ("" if block.asymptotic else "*")
        table.add_row(
            block.name,
            format_q(block.q_static),
            measured,
            number(block.spread, 2),
            Text(block.agreement, style=AGREEMENT_STYLE[block.agreement]),
            number(block.c),
            number(block.b),
            number(block.lipschitz),
            f"{block.seconds:.1f}s/{block.evaluations}",
        )
    return fit_cells(table)


def block_notes(blocks: Sequence[BlockProbe]) -> list[Text]:
    notes = []
    if any(not block.asymptotic for block in blocks):
        notes.append(Text("* the last two decades disagree: the slope is not yet asymptotic at the largest scale",
                          style="dim"))
    for block in blocks:
        if block.failed_samples and block.agrees is not False:
            notes.append(Text(f"{block.name}: {block.failed_samples} sample(s) gave inf, nan or an isolated zero "
                              "and were left out of the fit", style="yellow"))
        if block.lipschitz_error:
            notes.append(Text(f"{block.name}: no Jacobian norm: {block.lipschitz_error}", style="yellow"))
        if block.agrees is False:
            notes.append(Text(f"SOUNDNESS BUG: {block.name} {_witnessed(block)} but its static exponent is "
                              f"q = {format_q(block.q_static)}; a rule in the derivation is unsound, please report it",
                              style="bold red"))
    return notes


def _witnessed(block: BlockProbe) -> str:
    worst = block.worst()
    where = "" if worst is None else f" (direction {worst.label}, parameters {worst.perturbation}, {worst.source})"
    if block.nonfinite_samples and worst is not None:
        return f"is inf or nan at α = {worst.nonfinite[0]:g}{where}"
    return f"grows like α^{block.q_measured_max:.3f}{where}"


def bounds_text(bounds: StackBounds) -> Text:
    text = Text()
    text.append("forward bound  ", style="bold")
    if bounds.forward is None:
        text.append(bounds.note or "none", style="yellow")
    else:
        text.append(f"||X_D|| <= {number(bounds.forward)}  ({bounds.forward_rule}; ||X_0|| = {number(bounds.x0_norm)}, "
                    f"D = {bounds.depth}, Δt = {bounds.dt:g})")
    text.append("\nbackward bound ", style="bold")
    if bounds.backward is None:
        text.append("none (a block has no Jacobian norm)", style="yellow")
    else:
        text.append(f"||J_0:D|| <= ∏(1 + L_k Δt) = {number(bounds.backward)} "
                    f"<= exp(Σ L_k Δt) = {number(bounds.backward_exp)}  (eq. 39)")
    text.append("\noverflow depth ", style="bold")
    depths = "  ".join(
        f"{name} {'never' if bounds.overflow_depths[name] is None else number(bounds.overflow_depths[name])}"
        for name in FLOAT_FORMATS
    )
    text.append(f"{depths}  (first depth at which the bound exceeds the format's largest finite value, "
                "the stack repeated)")
    text.append("\n               c_k, b_k, L_k are estimated from the sampled directions, not certified", style="dim")
    if bounds.note and bounds.forward is not None:
        text.append(f"\n               {bounds.note}", style="yellow")
    return text


def init_tables(init: InitDiagnostics) -> list:
    """RMS through the stack, branch scaling, layer gains and the flags."""
    stack = Table(title="init: RMS through the stack (unit-variance input and cotangent)", title_justify="left")
    stack.add_column("block")
    for column in ("activation in → out", "gradient in ← out", "out-proj std vs 1/√2L"):
        stack.add_column(column, justify="right")
    branches = {branch.block: branch for branch in init.branches}
    for layer in init.stack:
        branch = branches.get(layer.name)
        scale = "-"
        if branch is not None and branch.relative_std is not None:
            scale = f"{branch.relative_std:.2f} vs {branch.expected:.2f} {'scaled' if branch.scaled else 'unscaled'}"
        stack.add_row(
            layer.name,
            f"{number(layer.rms_in)} → {number(layer.rms_out)}",
            f"{number(layer.grad_rms_in)} ← {number(layer.grad_rms_out)}",
            scale,
        )
    gains = Table(title="init: layer gains (n_in·σ_w² / gain(φ)², 1 at criticality)", title_justify="left")
    gains.add_column("layer")
    for column in ("n_in·σ_w²", "φ", "gain(φ)", "effective"):
        gains.add_column(column, justify="left" if column == "φ" else "right")
    for gain in init.gains:
        source = "" if gain.gain_source == "calculate_gain" else "ᵉ"
        gains.add_row(gain.name, number(gain.gain), gain.nonlinearity, f"{gain.nonlinearity_gain:.3f}{source}",
                      number(gain.effective))
    parts: list = [fit_cells(stack), fit_cells(gains)]
    if any(gain.gain_source != "calculate_gain" for gain in init.gains):
        parts.append(Text("ᵉ not in torch.nn.init.calculate_gain: 1/sqrt(E[φ(z)²]) for z ~ N(0, 1)", style="dim"))
    parts.extend(Text(flag, style="yellow") for flag in init.flags)
    return parts


def logs_parts(result: ModelProbe) -> list:
    """The init logs (QL401-QL405) measured and their thresholds, then the findings past them."""
    logs = result.report.extra.get("init_logs")
    if not logs:
        return []
    table = Table(title="init logs (001 Parts III, VI, XII; 003 §5.4, §6)", title_justify="left")
    for column in ("log", "where", "measured", "flagged when"):
        table.add_column(column, justify="right" if column == "measured" else "left")
    for log in logs["attention"]:
        table.add_row("max |attention logit|", log["name"], number(log["max_logit"]), f"> {init_logs.MAX_LOGIT:g}")
        table.add_row("attention entropy / log n", log["name"], number(log["normalised_entropy"]),
                      f"< {init_logs.ENTROPY_FLOOR:g}")
    for log in logs["token_spread"]:
        table.add_row(f"min token {log['statistic']} / RMS", log["name"], number(log["ratio"]),
                      f"< {init_logs.SPREAD_FLOOR:g}")
    for log in logs["carry"]:
        table.add_row("max carry Ā", log["loop"], f"{number(log['max'], 4)} (mean {number(log['mean'])})",
                      f"≥ {init_logs.CARRY_CEILING:g}")
    stream = logs["stream_growth"]
    if stream is not None:
        table.add_row("stream RMS out / in", f"{stream['blocks']} blocks", number(stream["final"]),
                      f"> 2·√L = {number(stream['threshold'])}")
    parts: list = [fit_cells(table)] if table.row_count else []
    for finding in result.report.findings:
        if finding.code in init_logs.CODES:
            where = f" ({finding.source})" if finding.source else ""
            parts.append(Text(f"{finding.code} {finding.message}{where}", style="yellow"))
    return parts


def model_renderable(result: ModelProbe) -> Group:
    parts: list = [exponent_table(result)]
    if not result.blocks:
        parts.append(Text("no residual blocks found: nothing to probe", style="yellow"))
    parts.extend(block_notes(result.blocks))
    if result.blocks:
        parts.append(bounds_text(result.bounds))
        parts.extend(init_tables(result.init))
    parts.extend(logs_parts(result))
    parts.extend(Text(f"SOUNDNESS BUG: {mismatch}", style="bold red") for mismatch in result.graph_mismatches)
    if result.violations:
        verdict = Text(f"{len(result.violations)} block(s) grow faster than their static exponent: soundness bug",
                       style="bold red")
    elif result.graph_mismatches:
        verdict = Text("the traced graph is not the eager model: soundness bug", style="bold red")
    else:
        verdict = Text("every measured exponent is within its static bound", style="green")
    summary = Text(f"{result.report.spec}: probed {len(result.blocks)} blocks in {result.seconds:.1f} s; ")
    parts.append(summary.append_text(verdict).append("\n"))
    return Group(*parts)


def print_probe(results: Sequence[ModelProbe], console: Optional[Console] = None) -> None:
    console = console or make_console()
    for result in results:
        console.print(model_renderable(result))
