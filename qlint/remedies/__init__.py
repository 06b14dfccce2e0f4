"""Remedies qlint has re-checked: from "q = 5" to a change that certifies the block.

For a failing block, candidate changes follow the paper's procedure (000, Section
4.2 step 3: wrap the highest-q primitive with a normalization, or replace it by a
Lipschitz substitute) and its Mamba example (Section 5: the linear-growth
modification). Each candidate is applied to a copy of the traced graph (a
GraphModule that runs), the analysis is re-run on it, and only candidates after
which the block certifies (q <= threshold) are kept: a remedy is never shown on
the strength of the arithmetic alone. Kept remedies are ranked by new trainable
parameters, then new graph nodes, then the exponent reached.

The kinds (``qlint.remedy(..., kind=...)``, :data:`KINDS`) are the planners registered
with ``@plan("kind")`` (:mod:`qlint.remedies.registry`) in the modules of this package,
all imported here: :mod:`qlint.remedies.plans` documents each. The graph facts a
planner reads are in :mod:`qlint.remedies.context`, the edits in :mod:`qlint.remedies.surgery`.
"""

from __future__ import annotations

import copy
import importlib
import math
import pkgutil
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import torch
import torch.fx as fx
from torch import nn

from qlint.analysis import Options, run
from qlint.core import algebra
from qlint.core.algebra import Exponent
from qlint.growth.engine import Analysis
from qlint.core.results import Block, Source
from qlint.capture.trace import TracedGraph
from qlint.remedies.context import BlockContext
from qlint.remedies.registry import PLANS, Plan, make_plan
from qlint.remedies.surgery import NotApplicable, Surgery, light_copy, model_norm_class


def _discover_kinds() -> tuple[str, ...]:
    """Import every module of the package, so that each ``@plan`` registers its kind; the kinds in that order."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return tuple(PLANS)


KINDS = _discover_kinds()


@dataclass(frozen=True)
class Remedy:
    """A change qlint applied to a copy of the graph and re-checked."""

    kind: str
    block: str
    target: str
    source: Optional[Source]
    sketch: str
    q_after: Exponent
    new_params: int
    new_nodes: int

    @property
    def rank(self) -> tuple:
        return (self.new_params, self.new_nodes, math.inf if self.q_after is None else self.q_after)

    def to_dict(self) -> dict[str, Any]:
        finite = self.q_after is not None and not math.isinf(self.q_after)
        return {
            "kind": self.kind,
            "target": self.target,
            "q_after": self.q_after if finite else None,
            "new_params": self.new_params,
            "new_nodes": self.new_nodes,
            "sketch": self.sketch,
            "source": self.source.to_dict() if self.source else None,
        }


# --- public API ---------------------------------------------------------------------------


def remedy(
    model: nn.Module,
    example_inputs: Optional[tuple] = None,
    *,
    block: Optional[str] = None,
    kind: str = "preln",
    mode: Optional[str] = None,
    tracer: Optional[str] = None,
    threshold: float = 1.0,
) -> nn.Module:
    """The model with one remedy applied, as a GraphModule that trains like any module.

    ``block=None`` applies ``kind`` to every failing block. Raises ValueError when the
    block or kind is unknown, when the kind does not apply, or when the result does
    not certify every remedied block.

    >>> fixed = qlint.remedy(model, (x,), block="layers.0", kind="preln")
    >>> fixed(x).sum().backward()
    """
    _check_kind(kind)
    options = Options(mode=mode, tracer=tracer, threshold=threshold)
    return apply(run(model, example_inputs, spec=type(model).__name__, options=options), kind, block=block)


def apply(analysis: Analysis, kind: str, *, block: Optional[str] = None) -> nn.Module:
    """:func:`remedy` for a model already analysed (build several variants from one trace)."""
    _check_kind(kind)
    names = _targets(analysis.report.blocks, block)
    base = base_module(analysis)
    plans = []
    for name in names:
        try:
            plans.append(make_plan(BlockContext(analysis, name, base), kind))
        except NotApplicable as exc:
            raise ValueError(f"remedy {kind!r} does not apply to block `{name}`: {exc}") from None
    surgery, checked = _apply(analysis, base, plans)
    _runs(surgery.module, analysis.inputs, kind)
    for name in names:
        q = checked.get(name)
        if not algebra.is_certified(q, analysis.options.threshold):
            raise ValueError(
                f"remedy {kind!r} does not certify block `{name}`: q = {algebra.format_q(q)} after the change")
    copied = copy.deepcopy(surgery.module)  # independent of the analysed model's weights
    remedied = fx.GraphModule(copied, copied.graph, class_name=type(analysis.model).__name__)
    remedied.train(copied.training)
    _restore_outputs(remedied, analysis.model, analysis.inputs)
    return remedied


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown remedy kind {kind!r}; expected one of {', '.join(KINDS)}")


def _runs(module: nn.Module, inputs: Optional[tuple], kind: str) -> None:
    """The remedied module must run on the example inputs (skipped without weights)."""
    parameter = next(iter(module.parameters()), None)
    if inputs is None or (parameter is not None and parameter.device.type == "meta"):
        return
    try:
        with torch.no_grad():
            module(*inputs)
    except Exception as exc:
        raise ValueError(f"remedy {kind!r} produced a graph that does not run: {exc}") from exc


def propose(analysis: Analysis, name: str, base: Optional[fx.GraphModule] = None) -> list[Remedy]:
    """The remedies that certify block ``name``, best first."""
    threshold = analysis.options.threshold
    kept = [r for r in candidates(analysis, name, base) if algebra.is_certified(r.q_after, threshold)]
    return sorted(kept, key=lambda r: r.rank)


def candidates(
    analysis: Analysis, name: str, base: Optional[fx.GraphModule] = None, kinds: Sequence[str] = KINDS
) -> list[Remedy]:
    """Every applicable candidate of ``kinds`` for block ``name``, re-checked; certifying or not."""
    base = base if base is not None else base_module(analysis)
    context = BlockContext(analysis, name, base)
    results = []
    for kind in kinds:
        _check_kind(kind)
        try:
            plan = make_plan(context, kind)
        except NotApplicable:
            continue
        try:
            surgery, checked = _apply(analysis, base, [plan])
        except NotApplicable:  # e.g. a size the norm needs is unknown
            continue
        results.append(
            Remedy(plan.kind, name, plan.target, plan.source, plan.sketch, checked.get(name), surgery.new_params,
                   surgery.new_nodes)
        )
    return results


def attach(analysis: Analysis) -> None:
    """``block.extra["remedies"]`` for every failing block (``--show-remedies``)."""
    failing = [b for b in analysis.report.blocks if b.status != "ok"]
    if not failing:
        return
    base = base_module(analysis)
    for block in failing:
        block.extra["remedies"] = [r.to_dict() for r in propose(analysis, block.name, base)]


def _targets(blocks: list[Block], name: Optional[str]) -> list[str]:
    if name is not None:
        if name not in {b.name for b in blocks}:
            known = ", ".join(b.name for b in blocks) or "none"
            raise ValueError(f"unknown block {name!r}; blocks: {known}")
        return [name]
    failing = [b.name for b in blocks if b.status != "ok"]
    if not failing:
        raise ValueError("every block is already certified: nothing to remedy (name a block to change it anyway)")
    return failing


# --- applying and re-checking -----------------------------------------------------------------


def base_module(analysis: Analysis) -> fx.GraphModule:
    """A copy of the traced graph whose tensor nodes carry shapes (norms need sizes)."""
    base = light_copy(analysis.traced.module, type(analysis.model).__name__)
    exported = any("val" in n.meta for n in base.graph.nodes)  # torch.export / make_fx record shapes
    if not exported and analysis.inputs is not None:
        from torch.fx.passes.shape_prop import ShapeProp

        try:
            with torch.no_grad():
                ShapeProp(base).propagate(*analysis.inputs)
        except Exception:  # shapes stay unknown: the norm remedies then do not apply
            pass
    return base


def _apply(analysis: Analysis, base: fx.GraphModule, plans: Sequence[Plan]) -> tuple[Surgery, dict[str, Exponent]]:
    """Edit a copy of ``base`` with every plan and re-analyse it: block name -> q."""
    surgery = Surgery(base, model_norm_class(analysis.model))
    for plan in plans:
        plan.edit(surgery)
    surgery.finish()
    mode = "train" if analysis.model.training else "eval"
    options = replace(analysis.options, remedies=False, mode=mode)
    traced = TracedGraph(surgery.module, tracer=analysis.traced.tracer)
    checked = run(surgery.module, analysis.inputs, spec=analysis.report.spec, options=options, traced=traced)
    return surgery, {b.name: b.q for b in checked.report.blocks}


def _restore_outputs(module: fx.GraphModule, model: nn.Module, inputs: Optional[tuple]) -> None:
    """Return what the model returns (a tensor), not the flat tuple the tracer recorded."""
    codegen = module.graph._codegen
    info = getattr(codegen, "pytree_info", None)
    if info is None or inputs is None:
        return
    from torch.utils import _pytree as pytree

    with torch.no_grad():
        leaves, spec = pytree.tree_flatten(model(*inputs))
    if spec.num_leaves == info.out_spec.num_leaves and all(isinstance(x, torch.Tensor) for x in leaves):
        codegen.pytree_info = info._replace(out_spec=spec)
        module._out_spec = spec
        module.recompile()
