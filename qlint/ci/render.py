"""The rich terminal report (``--output-format full``, the default)."""

from __future__ import annotations

import functools
import io
import linecache
import os
import sys
from pathlib import Path
from typing import Any, Optional

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from qlint.ci.identity import relative_path
from qlint.core.algebra import format_q
from qlint.core.results import Block, DerivationStep, ModelReport, Report, Source

STATUS_STYLE = {"ok": "green", "supercritical": "bold red", "uncertified": "bold yellow"}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def source_text(step_source) -> str:
    """The user's line of code at a source location, stripped."""
    if step_source is None:
        return ""
    return linecache.getline(step_source.file, step_source.line).strip()


def display_path(file: str) -> str:
    """A path as shown to people: an installed library's file relative to the folder its
    distribution is installed in (``transformers/models/gpt2/modeling_gpt2.py``, also from a
    virtual environment inside the cwd), else relative to the cwd when inside it."""
    return library_path(file) or relative_path(file, Path.cwd().resolve()) or file


def library_path(file: str) -> Optional[str]:
    """``file`` relative to the site-packages (or dist-packages, or standard library) folder
    that holds it, with forward slashes; None when no such folder does."""
    path = Path(os.path.normpath(Path.cwd() / file))
    for candidate in dict.fromkeys((path, path.resolve())):  # lib64 -> lib and other symlinks
        for root in _library_roots():
            if candidate.is_relative_to(root):
                return candidate.relative_to(root).as_posix()
    return None


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[Path, ...]:
    """Where installed distributions live: site-packages / dist-packages (the interpreter's, the
    user's, any on sys.path) and the standard library, the deepest first (a system Python's
    site-packages lies inside its standard library folder)."""
    import site
    import sysconfig

    found: list[str] = []
    try:
        found += site.getsitepackages()
    except AttributeError:  # an old virtualenv's site module
        pass
    try:
        found.append(site.getusersitepackages())
    except AttributeError:
        pass
    paths = sysconfig.get_paths()
    found += [paths[key] for key in ("purelib", "platlib", "stdlib", "platstdlib") if key in paths]
    found += [entry for entry in sys.path if entry and Path(entry).name in ("site-packages", "dist-packages")]
    roots = {Path(os.path.normpath(os.path.abspath(p))) for p in found if p}
    roots |= {root.resolve() for root in roots}
    return tuple(sorted(roots, key=lambda p: len(p.parts), reverse=True))


def shown_source(source: Optional[Source]) -> str:
    """``file:line`` as the text report shows it: a library's file relative to its distribution
    (``transformers/models/gpt2/modeling_gpt2.py:310``), the user's relative to the cwd."""
    return f"{display_path(source.file)}:{source.line}" if source is not None else ""


def block_table(model: ModelReport) -> Table:
    table = Table(title=f"{model.spec}  [dim](tracer: {model.tracer}, mode: {model.mode})[/dim]", title_justify="left",
                  expand=False)
    table.add_column("block")
    table.add_column("q", justify="right")
    table.add_column("status")
    table.add_column("dominant primitive")
    table.add_column("source", style="dim")
    for block in model.blocks:
        status = block.status if block.form == "additive" else f"{block.status} ({block.form})"
        table.add_row(
            block.name,
            format_q(block.q),
            Text(status, style=STATUS_STYLE[block.status]),
            block.dominant,
            shown_source(block.source),
        )
    return fit_cells(table)


def derivation_text(block: Block) -> Text:
    """How the exponent accumulated, one line per step, like the paper's accounting."""
    text = Text()
    text.append(f"derivation of {block.name} (q = {format_q(block.q)}):\n", style="bold")
    for i, step in enumerate(block.derivation):
        arrow = "  " if i == 0 else "→ "
        text.append(f"  {arrow}q = {format_q(step.q):>3}  ", style="bold")
        text.append(f"{step.primitive}", style="magenta")
        if step.why and i:
            text.append(f"  ({step.why})", style="dim")
        text.append("\n")
        code = source_text(step.source)
        if step.source:
            text.append(f"         {shown_source(step.source)}", style="dim")
            text.append(f"  {code}\n" if code else "\n")
    return text


def remedies_text(block: Block) -> Text:
    """The re-checked remedies of a failing block (``--show-remedies``), best first."""
    remedies = block.extra["remedies"]
    text = Text()
    if not remedies:
        text.append(f"no remedy qlint tried certifies {block.name}\n", style="yellow")
        return text
    text.append(f"remedies for {block.name} (each re-checked on the changed graph):\n", style="bold")
    for remedy in remedies:
        source = remedy["source"]
        where = f" @ {shown_source(Source(source['file'], source['line']))}" if source else ""
        text.append(f"  remedy ({remedy['kind']}) → q = {format_q(remedy['q_after'])}, "
                    f"+{remedy['new_params']} params: ", style="bold")
        text.append(f"{remedy['sketch']}{where}\n")
        code = source_text(Source(source["file"], source["line"])) if source else ""
        text.append(f"      {remedy['target']}" + (f"  · {code}" if code else "") + "\n", style="dim")
    return text


def remedies_signature(block: Block) -> str:
    """Equal for blocks whose remedies differ only in module paths (layers.0 vs layers.1): shown once
    (here and in the HTML report)."""
    return repr([{k: v for k, v in r.items() if k != "target"} for r in block.extra["remedies"]])


def _signature(block: Block) -> tuple:
    return (block.q, tuple((s.primitive, s.q, str(s.source)) for s in block.derivation[1:]))


def model_renderable(model: ModelReport, *, show_all_derivations: bool = False) -> Group:
    if model.failure is not None:
        return Group(Text(f"failed: {model.failure_line()}\n", style="bold red"))
    parts: list = [block_table(model)]
    if not model.blocks:
        parts.append(Text("no residual blocks found: nothing to certify", style="yellow"))
    shown: dict[tuple, str] = {}
    remedies_shown: dict[str, str] = {}
    for block in model.blocks:
        if not (show_all_derivations or block.status != "ok") or not block.derivation:
            continue
        signature = _signature(block)
        if signature in shown:
            parts.append(Text(f"derivation of {block.name}: same as {shown[signature]}\n", style="dim"))
        else:
            shown[signature] = block.name
            parts.append(derivation_text(block))
        if "remedies" in block.extra:
            first = remedies_shown.setdefault(remedies_signature(block), block.name)
            parts.append(remedies_text(block) if first == block.name
                         else Text(f"remedies of {block.name}: same as {first}\n", style="dim"))
    for finding in model.findings:
        line = Text()
        line.append(f"{shown_source(finding.source) or model.spec}: ", style="bold")
        line.append(f"{finding.code} ", style=SEVERITY_STYLE[finding.severity])
        line.append(finding.message)
        parts.append(line)
    if model.extra.get("built"):  # a catalogue spec: which config, and what was shrunk
        parts.append(Text(f"built: {model.extra['built']}", style="dim"))
    if model.extra.get("specialised"):  # a certificate for the input values the forward read in Python
        parts.append(Text(f"specialised: {model.extra['specialised']}", style="yellow"))
    if "the certificate holds for" in model.extra.get("shapes", ""):  # a certificate scoped to the shapes analysed
        parts.append(Text(f"shapes: {model.extra['shapes']}", style="yellow"))
    summary = model.verdict
    q = "?" if model.max_q is None and any(b.q is None for b in model.blocks) else format_q(model.max_q)
    share = f", share of q = 1 blocks {model.share_q1:.0%}" if model.share_q1 is not None else ""
    hidden = (f", {len(model.suppressed)} finding(s) suppressed "
              f"({', '.join(sorted({f.suppression or '' for f in model.suppressed}))})" if model.suppressed else "")
    parts.append(
        Text(f"{model.spec}: {_qualified(model)}, max q = {q} over {len(model.blocks)} blocks{share}{hidden}\n",
             style=STATUS_STYLE.get(_status_of(summary), ""))
    )
    linear = sum(1 for block in model.blocks if block.q == 1)
    if summary == "certified" and linear:
        parts.append(Text(f"q <= 1 bounds the exponent, not the constant: the {linear} q = 1 blocks can still "
                          f"multiply the stream by up to (1 + c)^{linear} (Remark 6); qlint.monitor measures c "
                          "during training\n", style="dim"))
    return Group(*parts)


def _qualified(model: ModelReport) -> str:
    """The verdict with what it rests on where that is less than a full check: the process state the
    forward reads ("uncertified: certified for the environment variable FAST (unset here) only", QL109)
    and the checks that did not run (the graph against the model, the witness)."""
    text = model.verdict
    conditions = "; ".join(c["what"] for c in model.conditions)
    if conditions:
        text += f": certified for {conditions} only" if _proved(model) else f" (for {conditions})"
    unchecked = model.unchecked
    if unchecked and _proved(model):
        text += f"; not checked: {', '.join(unchecked)}"
    return text


def _proved(model: ModelReport) -> bool:
    """Every block and transition bounded and covered: certified, or certified but for its conditions."""
    return model.verdict == "certified" or (bool(model.conditions) and model.verdict == "uncertified"
                                            and not model.uncovered
                                            and all(p.status == "ok" for p in [*model.blocks, *model.transitions]))


def _status_of(verdict: str) -> str:
    return {"certified": "ok"}.get(verdict, verdict)


LOG_WIDTH = 200  # table width when the output is not a terminal (CI logs, pipes) and COLUMNS is not set


def make_console(file: Any = None, *, stderr: bool = False, color: Optional[bool] = None,
                 width: Optional[int] = None) -> Console:
    """A console for the reports: as wide as the terminal, else COLUMNS or LOG_WIDTH columns.

    Off a terminal (a CI log, a pipe, a file) messages are never wrapped: rich would break
    a finding mid-sentence at the width, and a log viewer wraps lines itself; tables still
    fit the width by wrapping their cells (:func:`fit_cells`). ``width`` (``--width``) is
    an explicit request: tables and messages are wrapped at it, at word boundaries.
    ``color``: True forces colour, False none, None colours a terminal only.
    """
    target = file if file is not None else (sys.stderr if stderr else sys.stdout)
    off_terminal = not (hasattr(target, "isatty") and target.isatty())
    if width is None and off_terminal:
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else LOG_WIDTH
        soft_wrap = True
    else:
        soft_wrap = False
    return Console(file=file, stderr=stderr, force_terminal=True if color else None,
                   color_system=None if color is False else "auto", width=width, soft_wrap=soft_wrap)


def fit_cells(table: Table) -> Table:
    """Let every cell wrap, folding a word longer than its column, so a narrow console keeps
    every column: rich cuts a ``no_wrap`` cell to an ellipsis and gives a short column
    (a one-letter header) a width of zero once the table does not fit."""
    for column in table.columns:
        column.no_wrap = False
        column.overflow = "fold"
    return table


def print_report(report: Report, console: Optional[Console] = None, *, show_all_derivations: bool = False) -> None:
    console = console or make_console()
    for model in report.models:
        console.print(model_renderable(model, show_all_derivations=show_all_derivations))
    errors, warnings, infos = report.count("error"), report.count("warning"), report.count("info")
    hidden = f", {len(report.suppressed)} suppressed" if report.suppressed else ""
    failed = f" {len(report.failures)} model(s) could not be analysed." if report.failures else ""
    if errors or warnings:
        console.print(Text(f"Found {errors} error(s), {warnings} warning(s), {infos} info{hidden}.{failed}",
                           style="bold red" if errors else "yellow"))
    elif report.failures:
        console.print(Text(f"No findings ({infos} info{hidden}).{failed}", style="bold red"))
    elif any(m.unchecked for m in report.models if m.verdict == "certified"):
        console.print(Text(f"No findings, but not every check ran (see the verdict lines) ({infos} info{hidden}).",
                           style="yellow"))
    else:
        console.print(Text(f"All checks passed ({infos} info{hidden}).", style="bold green"))


def render_full(report: Report, *, show_all_derivations: bool = False, width: Optional[int] = None) -> str:
    """The full report as plain text (for files and tests), laid out as for a CI log."""
    buffer = io.StringIO()
    print_report(report, make_console(buffer, color=False, width=width), show_all_derivations=show_all_derivations)
    return buffer.getvalue()


__all__ = ["DerivationStep", "block_table", "derivation_text", "fit_cells", "make_console", "print_report",
           "render_full"]
