"""QL101-QL109: the input-magnitude exponent of each block and transition (paper 000)."""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Union

from qlint.core.algebra import format_q
from qlint.growth.engine import Analysis, dominant_step
from qlint.core.results import Block, Finding, Source, Transition
from qlint.lint.rule import Rule, checker

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
def supercritical(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for kind, part in _parts(analysis):
        if part.q is not None and not math.isinf(part.q) and part.q > analysis.threshold:
            yield rule.finding(part.name, part.source, kind=kind, name=part.name, q=format_q(part.q),
                               threshold=f"{analysis.threshold:g}", dominant=part.dominant, at=_at(part),
                               related=[_dominant_source(part)])


@checker("QL102")
def uncertified(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for kind, part in _parts(analysis):
        if part.q is None:
            yield rule.finding(part.name, part.source, kind=kind, name=part.name, culprit=_culprit(part))


@checker("QL103")
def superpolynomial(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for kind, part in _parts(analysis):
        if part.q is not None and math.isinf(part.q):
            yield rule.finding(part.name, part.source, kind=kind, name=part.name, culprit=part.dominant)


@checker("QL104")
def post_norm(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for residual, block in zip(analysis.stream.blocks, analysis.report.blocks):
        if block.form == "post-norm":
            where = f" at {block.source}" if block.source else ""
            update = "a LN(X) + f(LN(X))" if residual.norm_in is not None else "LN(X + f(X))"
            yield rule.finding(block.name, block.source, name=block.name, update=update,
                               q=format_q(block.q), at=where)


@checker("QL105")
def post_activation(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for block in analysis.report.blocks:
        if block.form == "post-activation":
            yield rule.finding(block.name, block.source, name=block.name, q=format_q(block.q))


@checker("QL106")
def uncovered(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    from qlint.growth.engine import source_of

    by_name: dict[str, Any] = {b.name: b for b in analysis.report.blocks}
    by_name.update({t.name: t for t in analysis.report.transitions})
    for gap in analysis.gaps:
        part = by_name.get(gap.part) if gap.part else None
        source = part.source if part is not None else (source_of(gap.node) if gap.node is not None else None)
        yield rule.finding(gap.part, source, reason=gap.reason)


@checker("QL107")
def witness_refuted(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    witnessed = getattr(analysis, "witness", None)
    if witnessed is None:
        return
    by_name = {b.name: b for b in analysis.report.blocks}
    for refutation in witnessed.refuted:
        block = by_name.get(refutation.block)
        what = f"block `{refutation.block}`" if block is not None else "the model"
        yield rule.finding(refutation.block if block is not None else None, block.source if block else None,
                           what=what, measurement=refutation.measurement)


@checker("QL108")
def parameter_hazard(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    from qlint.growth.engine import source_of

    owners = _units_reading(analysis)
    for node, hazard in analysis.prop.hazards.items():
        owner = owners.get(node)
        yield rule.finding(owner, source_of(node), node=node.name,
                           hazard=hazard.replace(": not finite for every parameter value", ""))


@checker("QL109")
def conditional(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    from qlint.capture.process_state import Condition

    for condition in analysis.report.extra.get("conditions", []):
        read = Condition(**condition)
        yield rule.finding(None, Source(read.file, read.line) if read.line else None, what=read.what,
                           code=read.code or "the line is not available")


def _units_reading(analysis: Analysis) -> dict[Any, Optional[str]]:
    """For each parameter-only node, the first block or transition whose region reads it (through
    other parameter-only values)."""
    graph = analysis.graph
    member: dict[Any, str] = {}
    for part in [*analysis.stream.blocks, *analysis.stream.transitions]:
        for node in part.region:
            member.setdefault(node, part.name)
    owners: dict[Any, Optional[str]] = {}
    for node in analysis.prop.hazards:
        seen, frontier, owner = set(), [node], None
        while frontier and owner is None:
            current = frontier.pop(0)
            for user in current.users:
                if user in member:
                    owner = member[user]
                    break
                if user not in seen and user not in graph.data:
                    seen.add(user)
                    frontier.append(user)
        owners[node] = owner
    return owners
