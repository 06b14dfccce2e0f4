"""Which ops a model uses, and which ops of torch's IR the primitive registry knows.

:func:`model_coverage` lists every op kind of one analysed model with the registry
entry that bounds it. An unknown op matters only where it can change a verdict: in
a residual block's region *and* computed from X_k. Elsewhere (masks, positions, the
embedding or the head) it is listed but harmless.

:func:`registry_coverage` measures the registry against the IR it targets: the core
ATen op set (ops with an overload tagged ``torch.Tag.core``, what torch.export
graphs decompose to) and the ``torch.nn.functional`` functions fx records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx as fx

from qlint.core.graph import facts
from qlint.core.ops import describe
from qlint.growth.relations import Normalisation
from qlint.registry import Registry

Status = str  # "known" | "declared" | "unknown"


@dataclass
class OpUse:
    """One op kind of a model: how often it occurs and what bounds it."""

    op: str
    count: int = 0
    status: Status = "known"
    entries: list[str] = field(default_factory=list)  # the registry entries (or patterns) that bound it
    blocks: list[str] = field(default_factory=list)  # residual blocks where it is unknown and depends on X_k

    @property
    def blocking(self) -> bool:
        return bool(self.blocks)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "count": self.count, "status": self.status, "entries": self.entries,
                "blocks": self.blocks}


@dataclass
class ModelCoverage:
    spec: str
    tracer: str
    ops: list[OpUse]

    @property
    def blocking(self) -> list[OpUse]:
        """Unknown ops that leave a residual block uncertified."""
        return [use for use in self.ops if use.blocking]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "tracer": self.tracer,
            "ops": [use.to_dict() for use in self.ops],
            "unknown": sorted(use.op for use in self.ops if use.status == "unknown"),
            "unknown_in_blocks": [use.op for use in self.blocking],
        }


def op_kind(node: fx.Node, module: Optional[torch.nn.Module]) -> str:
    """The op of a node as the registry keys it: a function, ``Tensor.method`` or a module class."""
    if node.op == "call_module":
        cls = type(module)
        return f"{cls.__module__}.{cls.__qualname__}"
    return describe(node)


def model_coverage(analysis: Any) -> ModelCoverage:
    """Every op kind in ``analysis``'s graph, how the registry treats it, and where it blocks."""
    module = analysis.traced.module
    blocks_of: dict[fx.Node, list[str]] = {}
    for residual in analysis.stream.blocks:
        for node in residual.region:
            info = facts(node)
            if (info.primitive is None or info.primitive.unbounded) and info.declared is None:
                blocks_of.setdefault(node, []).append(residual.name)
    uses: dict[str, OpUse] = {}
    for node in module.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        submodule = module.get_submodule(node.target) if node.op == "call_module" else None
        use = uses.setdefault(op_kind(node, submodule), OpUse(op_kind(node, submodule)))
        use.count += 1
        status, entry = _status(node)
        if _STATUS_ORDER.index(status) > _STATUS_ORDER.index(use.status):
            use.status = status
        if entry and entry not in use.entries:
            use.entries.append(entry)
        for name in blocks_of.get(node, ()):
            if name not in use.blocks:
                use.blocks.append(name)
    order = {status: i for i, status in enumerate(reversed(_STATUS_ORDER))}
    ops = sorted(uses.values(), key=lambda u: (not u.blocking, order[u.status], u.op))
    return ModelCoverage(analysis.report.spec, analysis.traced.tracer, ops)


_STATUS_ORDER = ("known", "declared", "unknown")  # a kind takes its worst status


def _status(node: fx.Node) -> tuple[Status, str]:
    info = facts(node)
    if info.declared is not None:
        return "declared", info.declared_class
    if isinstance(info.relation, Normalisation):  # x * rsqrt(mean(x^2) + eps): proved on the graph
        return "known", info.relation.description
    if info.primitive is None or info.primitive.unbounded:
        return "unknown", ""
    return "known", info.primitive.name


# --- the registry against torch's IR ----------------------------------------------------


@dataclass
class OpSet:
    """How much of one op set the registry covers."""

    name: str
    ops: list[str]
    covered: list[str]

    @property
    def missing(self) -> list[str]:
        covered = set(self.covered)
        return [op for op in self.ops if op not in covered]

    @property
    def share(self) -> float:
        return len(self.covered) / len(self.ops) if self.ops else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "total": len(self.ops), "covered": len(self.covered), "share": round(self.share, 4),
                "missing": self.missing}


def core_aten_ops() -> list[str]:
    """Names of the ATen ops with at least one overload tagged ``core`` (the export IR)."""
    names = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        overloads = getattr(packet, "overloads", None)
        if overloads is None:
            continue
        if any(torch.Tag.core in getattr(packet, overload).tags for overload in overloads()):
            names.append(name)
    return sorted(names)


def functional_ops() -> list[str]:
    """The ``torch.nn.functional`` functions that ``__torch_function__`` (and so fx) records."""
    import torch.nn.functional as F
    from torch.overrides import get_overridable_functions

    return sorted(f.__name__ for f in get_overridable_functions().get(F, ()) if hasattr(F, f.__name__))


def _is_loss(name: str) -> bool:
    return (name.endswith("_loss")
            or name in {"cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
                        "linear_cross_entropy"})


def registry_coverage(registry: Registry) -> list[OpSet]:
    """The share of core ATen ops and of torch.nn.functional that the registry bounds.

    Backward ops and losses are counted in the full sets and left out of the second
    figure of each: they never occur in a forward graph's residual block.
    """
    import torch.nn.functional as F

    aten = core_aten_ops()
    aten_covered = [n for n in aten if registry.knows("call_function", getattr(torch.ops.aten, n))]
    forward = [n for n in aten if not n.endswith("_backward")]
    functional = functional_ops()
    functional_covered = [n for n in functional if registry.knows("call_function", getattr(F, n))]
    layers = [n for n in functional if not _is_loss(n)]
    return [
        OpSet("core ATen ops (torch.Tag.core)", aten, aten_covered),
        OpSet("core ATen ops, forward only", forward, [n for n in aten_covered if n in forward]),
        OpSet("torch.nn.functional (overridable)", functional, functional_covered),
        OpSet("torch.nn.functional, losses excluded", layers, [n for n in functional_covered if n in layers]),
    ]
