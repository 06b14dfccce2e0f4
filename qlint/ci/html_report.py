"""The HTML report (``--output-format html``; what a notebook shows for a report): one page that
needs nothing else (inline CSS and SVG, no script, no address outside the file).

Per model: the verdict, the block ladder (q per block, coloured by status), then per failing block
its derivation graph (the engine's ``derivation_graph`` record: ops with their exponent and source
line, data flow between them, laid out with networkx), its findings and its remedies (the source
patches of ``--fix`` as coloured diffs when the block has them, else the re-checked remedies of
``--show-remedies``), and, after ``qlint probe``, each block's measured growth curve beside a line
of slope q_static. Everything taken from the model is escaped. :mod:`qlint.ci.formats` registers
the format and the notebook hook; this module only draws.
"""

from __future__ import annotations

import collections
import html
import math
from dataclasses import dataclass
from typing import Any, Optional

from qlint._version import __version__
from qlint.core.algebra import format_q
from qlint.core.results import Block, Finding, ModelReport, Report, Source
from qlint.core.curves import GrowthCurve, curves

STATUS_COLOUR = {"ok": "#2e9d57", "supercritical": "#d1343a", "uncertified": "#e0a526"}  # ladder bars, verdicts
NODE_FILL = {"ok": "#e3f4e8", "supercritical": "#fbe0e1", "uncertified": "#fcf1d6"}  # derivation graph boxes
DOMINANT_FILL = "#7b2cbf"  # the op where the block's q reached its value
CURVE_COLOUR = "#1f6fd1"  # a measured growth curve

EDGE_COLOUR = "#6e6e78"  # the data flow's arrows: readable on the page's own white card

NODE_WIDTH, NODE_HEIGHT, COLUMN, ROW_GAP, LANE, MARGIN, LINE = 250, 44, 270, 30, 14, 16, 15
PARALLEL = 18  # the gap between the edges of one value into two operands of an op (x * x)
OP_CHARACTERS, PLACE_CHARACTERS = 30, 36  # a box's lines of its op and q, and of its source line, wrap past these

CSS = """
.qlint { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; max-width: 1280px;
         background: #ffffff; padding: 12px 16px; border-radius: 6px; color-scheme: light; }
.qlint h1 { font-size: 22px; margin: 0 0 4px; }
.qlint h2 { font-size: 18px; margin: 28px 0 6px; }
.qlint h3 { font-size: 15px; margin: 22px 0 6px; }
.qlint .muted { color: #6b6b70; }
.qlint .verdict { display: inline-block; padding: 1px 9px; border-radius: 10px; color: #fff; font-size: 13px; }
.qlint table { border-collapse: collapse; margin: 6px 0; }
.qlint th, .qlint td { padding: 3px 10px; text-align: left; vertical-align: top; border-bottom: 1px solid #e4e4e8; }
.qlint td.q { text-align: right; font-variant-numeric: tabular-nums; font-weight: 600; }
.qlint .track { position: relative; width: 260px; height: 14px; background: #f0f0f3; border-radius: 3px; }
.qlint .bar { position: absolute; left: 0; top: 0; bottom: 0; border-radius: 3px; }
.qlint .threshold { position: absolute; top: -3px; bottom: -3px; border-left: 2px dashed #333; }
.qlint code, .qlint pre { font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.qlint pre.diff { background: #f6f8fa; padding: 8px 10px; border-radius: 4px; overflow-x: auto; }
.qlint pre.diff span { display: block; min-height: 1.4em; }
.qlint .add { color: #116329; background: #dafbe1; }
.qlint .del { color: #82071e; background: #ffebe9; }
.qlint .hunk { color: #0550ae; }
.qlint .graph { overflow-x: auto; border: 1px solid #e4e4e8; border-radius: 4px; padding: 4px; }
.qlint .curves { display: flex; flex-wrap: wrap; gap: 12px; }
.qlint .error { color: #d1343a; font-weight: 600; }
.qlint .warning { color: #9a6700; font-weight: 600; }
.qlint .info { color: #0550ae; }
"""


def escape(value: Any) -> str:
    """Text from the model (names, messages, source lines) made inert in HTML, quotes included."""
    return html.escape(str(value), quote=True)


def page(report: Report, *, summary: str) -> str:
    """The whole document: what ``--output-format html`` writes."""
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>qlint report</title></head><body>\n{fragment(report, summary=summary)}\n</body></html>\n")


def fragment(report: Report, *, summary: str) -> str:
    """The report as one ``<div>`` carrying its own (scoped) style: the page's body, a notebook's output."""
    models = "\n".join(_model(model, number) for number, model in enumerate(report.models))
    return (f'<div class="qlint"><style>{CSS}</style>\n<h1>qlint report</h1>\n'
            f'<p>{escape(summary)} <span class="muted">qlint {escape(__version__)}</span></p>\n{models}\n</div>')


def _source(source: Optional[Source]) -> str:
    """``file:line`` as the terminal report shows it (imported when drawing: render brings rich)."""
    from qlint.ci.render import shown_source

    return escape(shown_source(source))


def _verdict(verdict: str) -> str:
    colour = STATUS_COLOUR.get({"certified": "ok"}.get(verdict, verdict), "#6b6b70")
    return f'<span class="verdict" style="background:{colour}">{escape(verdict)}</span>'


def _model(model: ModelReport, number: int) -> str:
    parts = [f"<h2><code>{escape(model.spec)}</code> {_verdict(model.verdict)}</h2>"]
    if model.failure is not None:
        parts.append(f'<p class="error">could not be analysed: {escape(model.failure_line())}</p>')
        return "<section>" + "\n".join(parts) + "</section>"
    parts.append(f'<p class="muted">tracer {escape(model.tracer)}, mode {escape(model.mode)}, '
                 f"max q = {escape(_max_q(model))} over {len(model.blocks)} blocks, threshold q &le; "
                 f"{escape(format_q(model.threshold))}</p>")
    parts.append(ladder(model))
    drawn: dict[str, str] = {}  # derivation graph (as written) -> the block it was drawn for
    remedied: dict[str, str] = {}  # remedies (as render.remedies_signature writes them) -> the block shown with them
    shown: set[int] = set()
    for block in model.blocks:
        if block.status != "ok":
            findings = [f for f in model.findings if f.block == block.name]
            shown.update(id(f) for f in findings)
            parts.append(_failing_block(block, findings, drawn, remedied, f"q{number}-{block.index}"))
    rest = [f for f in model.findings if id(f) not in shown]
    if rest:
        parts += ["<h3>Findings</h3>", _findings(rest)]
    if model.suppressed:
        parts.append(f'<p class="muted">{len(model.suppressed)} finding(s) suppressed</p>')
    if model.uncovered:
        parts += ["<h3>Not covered by the analysis</h3>",
                  "<ul>" + "".join(f"<li>{escape(reason)}</li>" for reason in model.uncovered) + "</ul>"]
    measured = curves(model)
    if measured:
        parts += ["<h3>Measured growth (qlint probe)</h3>",
                  '<div class="curves">' + "".join(curve_svg(curve) for curve in measured) + "</div>"]
    return "<section>" + "\n".join(parts) + "</section>"


def _max_q(model: ModelReport) -> str:
    return "?" if model.max_q is None and model.blocks else format_q(model.max_q)


# --- the ladder ----------------------------------------------------------------------------------


def ladder(model: ModelReport) -> str:
    """One row per block in order: its q as a bar coloured by status, the threshold as a dashed line."""
    if not model.blocks:
        return '<p class="warning">no residual blocks found: nothing to certify</p>'
    finite = [b.q for b in model.blocks if b.q is not None and math.isfinite(b.q)]
    top = max([2 * model.threshold, *finite])
    rows = []
    for block in model.blocks:
        known = block.q is not None and math.isfinite(block.q)
        width = max(2.0, 100 * block.q / top) if known else 100.0  # type: ignore[operator]
        status = block.status if block.form == "additive" else f"{block.status} ({block.form})"
        rows.append(
            f"<tr><td>{block.index}</td><td><code>{escape(block.name)}</code></td>"
            f'<td class="q">{escape(format_q(block.q))}</td>'
            f'<td><div class="track"><div class="bar" style="width:{width:.1f}%;'
            f'background:{STATUS_COLOUR[block.status]}"></div>'
            f'<div class="threshold" style="left:{100 * model.threshold / top:.1f}%"></div></div></td>'
            f"<td>{escape(status)}</td><td>{escape(block.dominant)}</td>"
            f'<td class="muted">{_source(block.source)}</td></tr>')
    return ('<table class="ladder"><tr><th>#</th><th>block</th><th>q</th><th>growth exponent</th><th>status</th>'
            "<th>dominant primitive</th><th>source</th></tr>" + "".join(rows) + "</table>")


# --- a failing block -----------------------------------------------------------------------------


def _failing_block(block: Block, findings: list[Finding], drawn: dict[str, str], remedied: dict[str, str],
                   ids: str) -> str:
    """Its derivation graph, findings and remedies; a graph or remedies already shown for another
    block (the same layer repeated) are named, not drawn again."""
    from qlint.ci.render import remedies_signature

    parts = [f"<h3><code>{escape(block.name)}</code>: q = {escape(format_q(block.q))} {_verdict(block.status)}</h3>"]
    record = block.extra.get("derivation_graph")
    if record is not None:
        key = repr(record)
        if key in drawn:
            parts.append(f'<p class="muted">derivation graph: the same as <code>{escape(drawn[key])}</code>\'s</p>')
        else:
            drawn[key] = block.name
            parts.append(f'<div class="graph">{derivation_svg(record, ids)}</div>')
    shown = bool(block.extra.get("patches")) or "remedies" in block.extra
    if findings:
        parts.append(_findings(findings, remedies_shown=shown))
    if block.extra.get("patches"):
        key, draw = repr(block.extra["patches"]), _patches
    elif "remedies" in block.extra:
        key, draw = remedies_signature(block), _remedies
    else:
        return "\n".join(parts)
    first = remedied.setdefault(key, block.name)
    parts.append(draw(block) if first == block.name
                 else f'<p class="muted">remedies: the same as <code>{escape(first)}</code>\'s</p>')
    return "\n".join(parts)


# QL101's hint (rules/checks/exponent.toml), said differently on a page that shows the remedies
REMEDY_HINT = "; run with --show-remedies for fixes qlint has re-checked"


def _findings(findings: list[Finding], remedies_shown: bool = False) -> str:
    def message(finding: Finding) -> str:
        return finding.message.replace(REMEDY_HINT, "; the remedies qlint re-checked follow") if remedies_shown \
            else finding.message

    rows = "".join(f'<tr><td class="{escape(f.severity)}">{escape(f.code)}</td><td class="muted">'
                   f"{_source(f.source)}</td><td>{escape(message(f))}</td></tr>" for f in findings)
    return f'<table class="findings">{rows}</table>'


def diff_html(diff: str) -> str:
    """A unified diff with its added, removed and hunk lines coloured."""
    kinds = {"+": "add", "-": "del", "@": "hunk"}
    lines = []
    for line in diff.splitlines():  # one block per line, so a coloured line spans the width
        kind = "context" if line.startswith(("+++", "---")) else kinds.get(line[:1], "context")
        lines.append(f'<span class="{kind}">{escape(line)}</span>')
    return '<pre class="diff">' + "".join(lines) + "</pre>"


def _patches(block: Block) -> str:
    parts = ["<p><b>Source patches</b>, each re-checked:</p>"]
    for patch in block.extra["patches"]:
        parts.append(f"<p>{escape(patch['kind'])} &rarr; q = {escape(format_q(patch.get('q_after')))} "
                     f"<code class=\"muted\">{escape(patch['path'])}</code></p>{diff_html(patch['diff'])}")
    return "\n".join(parts)


def _remedies(block: Block) -> str:
    remedies = block.extra["remedies"]
    if not remedies:
        return f'<p class="warning">no remedy qlint tried certifies {escape(block.name)}</p>'
    rows = []
    for remedy in remedies:
        source = remedy["source"]
        where = _source(Source(source["file"], source["line"])) if source else ""
        rows.append(f"<tr><td>{escape(remedy['kind'])}</td><td class=\"q\">q = {escape(format_q(remedy['q_after']))}"
                    f"</td><td>+{escape(remedy['new_params'])} params</td><td><code>{escape(remedy['sketch'])}</code>"
                    f'<br><span class="muted">{escape(remedy["target"])} {where}</span></td></tr>')
    return "<p><b>Remedies</b>, each re-checked on the changed graph:</p><table>" + "".join(rows) + "</table>"


# --- the derivation graph ------------------------------------------------------------------------


def _layers(record: dict[str, Any]) -> list[list[int]]:
    """The nodes by topological generation, top to bottom (networkx's generations; no layout routine,
    whose numpy a plain install need not have)."""
    import networkx as nx

    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(record["nodes"])))
    dag.add_edges_from(tuple(edge) for edge in record["edges"])
    return [sorted(members) for members in nx.topological_generations(dag)]


def _wrapped(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces, slashes or anywhere."""
    lines, rest = [], text
    while len(rest) > width:
        cut = max(rest.rfind(" ", 0, width + 1), rest.rfind("/", 0, width) + 1)
        cut = cut if cut > width // 2 else width
        lines.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    return lines + [rest]


@dataclass(frozen=True)
class _Box:
    x: float  # centre
    top: float
    height: float
    title: list[str]
    place: list[str]

    @property
    def bottom(self) -> float:
        return self.top + self.height


def _boxes(record: dict[str, Any]) -> tuple[list[list[int]], dict[int, _Box]]:
    """Each node's box: full labels wrapped (the op and its q, then its source line), one row per generation
    as tall as its tallest box, each row centred."""
    layers = _layers(record)
    texts = {}
    for number, node in enumerate(record["nodes"]):
        source = node["source"]
        where = f'{source["file"]}:{source["line"]}' if source else ""
        repeated = f" ×{node['count']}" if node["count"] > 1 else ""
        texts[number] = (_wrapped(f'{node["op"]} · q={node["q"]}', OP_CHARACTERS),
                         _wrapped(where + repeated, PLACE_CHARACTERS) if where or repeated else [])
    widest = max(len(members) for members in layers)
    boxes, top = {}, float(MARGIN)
    for members in layers:
        height = max(NODE_HEIGHT + LINE * (len(t) - 1 + max(len(p) - 1, 0)) for t, p in (texts[n] for n in members))
        indent = (widest - len(members)) * COLUMN / 2
        for i, number in enumerate(members):
            boxes[number] = _Box(MARGIN + NODE_WIDTH / 2 + indent + i * COLUMN, top, height, *texts[number])
        top += height + ROW_GAP
    return layers, boxes


def _edge_paths(record: dict[str, Any], layers: list[list[int]], boxes: dict[int, _Box]) -> list[str]:
    """SVG path data of each edge. One between neighbouring rows is a straight line through the gap
    between them (a value's edges into two operands of one op side by side); a longer one (the skip
    X_k -> join) leaves its source's right part through the gap below, runs down a lane of its own right of
    every box and enters its target's right part through the gap above: no edge crosses a box."""
    row = {number: layer for layer, members in enumerate(layers) for number in members}
    right = max(box.x + NODE_WIDTH / 2 for box in boxes.values())
    copies = collections.Counter(tuple(edge) for edge in record["edges"])
    paths, lanes, drawn = [], 0, collections.Counter()
    for source, target in record["edges"]:
        a, b = boxes[source], boxes[target]
        if row[target] == row[source] + 1:  # x * x: one line per operand, side by side
            shift = (drawn[source, target] - (copies[source, target] - 1) / 2) * PARALLEL
            drawn[source, target] += 1
            paths.append(f"M{a.x + shift:.1f},{a.bottom:.1f} L{b.x + shift:.1f},{b.top:.1f}")
            continue
        lanes += 1
        lane = right + LANE * lanes
        below = a.bottom + ROW_GAP / 2 + (lanes % 3 - 1) * 4
        above = b.top - ROW_GAP / 2 + (lanes % 3 - 1) * 4
        side = NODE_WIDTH / 2 - 16 - 6 * (lanes % 4)  # off the centre, where the straight edges meet the box
        paths.append(f"M{a.x + side:.1f},{a.bottom:.1f} V{below:.1f} H{lane:.1f} V{above:.1f} H{b.x + side:.1f} "
                     f"V{b.top:.1f}")
    return paths


def derivation_svg(record: dict[str, Any], ids: str) -> str:
    """The derivation graph as SVG: rounded boxes "op · q" over "file:line", arrows for the data flow
    (routed around the boxes), boxes filled by status and the dominant op (where q reached the block's
    value) in purple."""
    nodes = record["nodes"]
    if not nodes:
        return ""
    layers, boxes = _boxes(record)
    paths = _edge_paths(record, layers, boxes)
    lanes = sum(1 for p in paths if " H" in p)
    width = max(box.x for box in boxes.values()) + NODE_WIDTH / 2 + LANE * (lanes + 1) + MARGIN
    height = max(box.bottom for box in boxes.values()) + MARGIN
    parts = [(f'<svg width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
              f'aria-label="derivation graph"><defs><marker id="{ids}-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
              f'markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
              f'fill="{EDGE_COLOUR}"/></marker></defs>')]
    parts += [f'<path class="edge" d="{d}" fill="none" stroke="{EDGE_COLOUR}" stroke-width="1.4" '
              f'marker-end="url(#{ids}-arrow)"/>' for d in paths]
    for number, node in enumerate(nodes):
        box = boxes[number]
        dominant = number == record.get("dominant")
        fill = DOMINANT_FILL if dominant else NODE_FILL[node["status"]]
        ink = "#ffffff" if dominant else "#1d1d1f"
        lines = [f'<tspan x="{box.x:.1f}" dy="{0 if i == 0 else LINE}">{escape(t)}</tspan>'
                 for i, t in enumerate(box.title)]
        places = [f'<tspan x="{box.x:.1f}" dy="{0 if i == 0 else LINE}">{escape(t)}</tspan>'
                  for i, t in enumerate(box.place)]
        left = box.x - NODE_WIDTH / 2
        parts.append(
            f'<g><title>{escape(node["op"])}: q = {escape(node["q"])}</title>'
            f'<rect x="{left:.1f}" y="{box.top:.1f}" width="{NODE_WIDTH}" height="{box.height:.1f}" rx="8" '
            f'fill="{fill}" stroke="{STATUS_COLOUR[node["status"]]}" stroke-width="1.5"/>'
            f'<text x="{box.x:.1f}" y="{box.top + 18:.1f}" text-anchor="middle" font-size="12.5" font-weight="600" '
            f'fill="{ink}">{"".join(lines)}</text>'
            f'<text x="{box.x:.1f}" y="{box.top + 35 + LINE * (len(box.title) - 1):.1f}" text-anchor="middle" '
            f'font-size="11" fill="{ink}" font-family="monospace">{"".join(places)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


# --- measured growth -----------------------------------------------------------------------------


def curve_svg(curve: GrowthCurve, width: int = 340, height: int = 240) -> str:
    """A log-log plot of the measured velocity norm against the input norm (solid), with the line of
    slope q_static through its largest-scale sample (dashed)."""
    reference = curve.reference()
    points = [*curve.points, *(reference or ())]
    x_low, x_high = min(p[0] for p in points), max(p[0] for p in points)
    y_low, y_high = min(p[1] for p in points), max(p[1] for p in points)
    left, right, top, bottom = 52, 12, 26, 36
    inner_w, inner_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + inner_w * (x - x_low) / ((x_high - x_low) or 1)

    def py(y: float) -> float:
        return top + inner_h * (1 - (y - y_low) / ((y_high - y_low) or 1))

    def polyline(line: list[tuple[float, float]], style: str) -> str:
        return f'<polyline points="{" ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in line)}" fill="none" {style}/>'

    parts = [(f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
              f'aria-label="growth of {escape(curve.block)}">'),
             (f'<text x="{left}" y="16" font-size="12.5" font-weight="600">{escape(curve.block)}: measured, and '
              f"slope q = {escape(format_q(curve.q_static))}</text>"),
             f'<rect x="{left}" y="{top}" width="{inner_w}" height="{inner_h}" fill="none" stroke="#c8c8cc"/>']
    parts += [f'<text x="{px(d):.1f}" y="{height - bottom + 14}" font-size="10" text-anchor="middle">1e{d}</text>'
              for d in _decades(x_low, x_high)]
    parts += [f'<text x="{left - 4}" y="{py(d) + 3:.1f}" font-size="10" text-anchor="end">1e{d}</text>'
              for d in _decades(y_low, y_high)]
    parts.append(f'<text x="{left + inner_w / 2:.0f}" y="{height - 4}" font-size="11" text-anchor="middle">'
                 "input norm ||x||; up: velocity norm ||v(x)||</text>")
    if reference is not None:
        parts.append(polyline(list(reference), 'stroke="#6b6b70" stroke-dasharray="5,4" stroke-width="1.3"'))
    parts.append(polyline(list(curve.points), f'stroke="{CURVE_COLOUR}" stroke-width="2"'))
    parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{CURVE_COLOUR}"/>' for x, y in curve.points]
    parts.append("</svg>")
    return "".join(parts)


def _decades(low: float, high: float, most: int = 6) -> list[int]:
    """Whole decades in [low, high], thinned to at most ``most`` labels."""
    decades = list(range(math.ceil(low), math.floor(high) + 1))
    step = max(1, math.ceil(len(decades) / most))
    return decades[::step]


__all__ = ["derivation_svg", "diff_html", "escape", "fragment", "ladder", "page"]
