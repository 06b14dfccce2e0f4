"""QL101-QL106: the input-magnitude exponent of each block and transition (paper 000)."""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Union

from qlint.core.algebra import format_q
from qlint.core.engine import Analysis, dominant_step
from qlint.core.results import Block, Finding, Source, Transition
from qlint.lint.rule import checker, rule

Part = Union[Block, Transition]


def _parts(analysis: Analysis) -> Iterable[tuple[str, Part]]:
    for block in analysis.report.blocks:
        yield "block", block
    for transition in analysis.report.transitions:
        yield "transition", transition


def _dominant_source(part: Part) -> Optional[Source]:
    step = dominant_step(part)  # type: ignore[arg-type]
    return step.source if step else None


def _at(part: Part) -> str:
    source = _dominant_source(part)
    return f" at {source}" if source else ""


def _culprit(part: Part) -> str:
    return part.extra.get("culprit") or ", ".join(part.unknown_ops) or "an op qlint cannot bound"


@checker("QL101")
def supercritical(analysis: Analysis) -> Iterable[Finding]:
    for kind, part in _parts(analysis):
        if part.q is not None and not math.isinf(part.q) and part.q > analysis.threshold:
            yield rule("QL101").finding(part.name, part.source, kind=kind, name=part.name, q=format_q(part.q),
                                        threshold=f"{analysis.threshold:g}", dominant=part.dominant, at=_at(part),
                                        related=[_dominant_source(part)])


@checker("QL102")
def uncertified(analysis: Analysis) -> Iterable[Finding]:
    for kind, part in _parts(analysis):
        if part.q is None:
            yield rule("QL102").finding(part.name, part.source, kind=kind, name=part.name, culprit=_culprit(part))


@checker("QL103")
def superpolynomial(analysis: Analysis) -> Iterable[Finding]:
    for kind, part in _parts(analysis):
        if part.q is not None and math.isinf(part.q):
            yield rule("QL103").finding(part.name, part.source, kind=kind, name=part.name, culprit=part.dominant)


@checker("QL104")
def post_norm(analysis: Analysis) -> Iterable[Finding]:
    for block in analysis.report.blocks:
        if block.form == "post-norm":
            where = f" at {block.source}" if block.source else ""
            yield rule("QL104").finding(block.name, block.source, name=block.name, at=where)


@checker("QL105")
def post_activation(analysis: Analysis) -> Iterable[Finding]:
    for block in analysis.report.blocks:
        if block.form == "post-activation":
            yield rule("QL105").finding(block.name, block.source, name=block.name, q=format_q(block.q))


@checker("QL106")
def uncovered(analysis: Analysis) -> Iterable[Finding]:
    stream = analysis.stream
    if not stream.blocks:
        yield rule("QL106").finding(None, None, reason=analysis.report.uncovered[0])
        return
    by_name: dict[str, Any] = {b.name: b for b in analysis.report.blocks}
    by_name.update({t.name: t for t in analysis.report.transitions})
    for part in [*stream.blocks, *stream.transitions]:
        if not part.older:
            continue
        result = by_name[part.name]
        kind = "block" if part in stream.blocks else "transition"
        values = ", ".join(f"`{_value_name(u, analysis)}`" for u in part.older)
        yield rule("QL106").finding(
            part.name,
            result.source,
            reason=f"{kind} `{part.name}` reads {values}, an older value of its own stream, besides its input: "
                   "a dense or long skip is outside the per-block analysis",
        )


def _value_name(node: Any, analysis: Analysis) -> str:
    from qlint.core.engine import source_of

    source = source_of(node)
    return f"{node.name}" + (f" ({source})" if source else "")
