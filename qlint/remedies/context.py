"""What a remedy needs to know about one block: its offending terms, branch, gates, projections.

The plans (:mod:`qlint.remedies.plans`) ask these questions of a block and its analysis;
none of them changes the graph.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.fx as fx
from torch import nn

from qlint.core import algebra
from qlint.core.algebra import Exponent
from qlint.growth.stream import StreamBlock
from qlint.growth.engine import Analysis, dominant_parent
from qlint.core.graph import facts, module_path
from qlint.core.ops import op_name
from qlint.growth.propagate import leading
from qlint.core.results import Block
from qlint.remedies.surgery import NotApplicable, main_input, model_norm_class, tensor_meta


class BlockContext:
    """One block of an analysis and the graph facts its remedies need."""

    def __init__(self, analysis: Analysis, name: str, base: fx.GraphModule) -> None:
        matches = [(r, b) for r, b in zip(analysis.stream.blocks, analysis.report.blocks) if b.name == name]
        if not matches:
            raise ValueError(f"unknown block {name!r}")
        self.analysis = analysis
        pair: tuple[StreamBlock, Block] = matches[0]
        self.residual, self.block = pair
        self.env = analysis.envs[name]
        self.nodes = {n.name: n for n in analysis.traced.graph.nodes}
        self.submodules = dict(analysis.traced.module.named_modules())
        self.norm = model_norm_class(analysis.model).__name__
        self.shapes = {n.name: tensor_meta(n) for n in base.graph.nodes}

    def q(self, node: fx.Node) -> Exponent:
        return leading(self.env[node]).q if node in self.env else 0.0

    def depends(self, node: Any) -> bool:
        return isinstance(node, fx.Node) and node in self.env and leading(self.env[node]).depends

    def offending_terms(self) -> list[fx.Node]:
        """Velocity terms above the threshold (all dependent terms of a certified block)."""
        threshold = self.analysis.options.threshold
        dependent = [t.node for t in self.residual.terms if self.depends(t.node)]
        failing = [t for t in dependent if not algebra.is_certified(self.q(t), threshold)]
        return failing or dependent

    def branch_cone(self) -> set[fx.Node]:
        """The cone nodes that feed an offending term: other branches stay untouched."""
        seen: set[fx.Node] = set()
        stack = list(self.offending_terms())
        while stack:
            node = stack.pop()
            if node in seen or node not in self.residual.region_set:
                continue
            seen.add(node)
            stack.extend(node.all_input_nodes)
        return seen

    def stream_readers(self) -> list[fx.Node]:
        cone = self.branch_cone()
        return [user for user in self.residual.stream.users if user in cone]

    def sum_nodes(self) -> list[fx.Node]:
        """The residual join and the sums folded into it (``x + a(x) + b(x)``)."""
        terms = [self.residual.skip, *self.residual.terms]
        return list(dict.fromkeys([self.residual.join] + [node for term in terms for node, _ in term.path]))

    def dominant(self) -> fx.Node:
        """The highest-q primitive: the derivation step where q reached its final value."""
        for step in self.block.derivation[1:]:
            if step.q == self.block.q and step.node in self.nodes and not facts(self.nodes[step.node]).plumbing:
                return self.nodes[step.node]
        raise NotApplicable("no primitive raises the exponent")

    def is_hadamard(self, node: fx.Node) -> bool:
        return facts(node).op == "mul" and len(self.factors(node)) >= 2

    def factors(self, node: fx.Node) -> list[fx.Node]:
        """The operands of a product that grow with the input (q > 0)."""
        return [a for a in node.all_input_nodes if self.depends(a) and self.q(a) != 0]

    def top_hadamard(self) -> fx.Node:
        """The last Hadamard product along the derivation (the gate of a gated block)."""
        for step in reversed(self.block.derivation):
            node = self.nodes.get(step.node)
            if node is not None and self.is_hadamard(node):
                return node
        raise NotApplicable("no Hadamard product raises the exponent")

    def through_plumbing(self, node: fx.Node) -> fx.Node:
        """The value a view/cast/selection of it carries (``x[..., None]`` -> ``x``)."""
        while node in self.env and facts(node).plumbing:
            parent = dominant_parent(node, self.env, self.analysis.graph)
            if parent is None:
                break
            node = parent
        return node

    def module_of(self, node: fx.Node) -> Optional[nn.Module]:
        return self.submodules.get(str(node.target)) if node.op == "call_module" else None

    def is_silu(self, node: fx.Node) -> bool:
        return op_name(node) in ("silu", "silu_") or isinstance(self.module_of(node), nn.SiLU)

    def is_linear(self, node: fx.Node) -> bool:
        return op_name(node) == "linear" or isinstance(self.module_of(node), nn.Linear)

    def gates(self) -> list[fx.Node]:
        """SiLU factors of the highest Hadamard product."""
        gates = [g for g in (self.through_plumbing(f) for f in self.factors(self.top_hadamard())) if self.is_silu(g)]
        if not gates:
            raise NotApplicable("the highest Hadamard product has no SiLU gate")
        return gates

    def nearest_linear(self, node: fx.Node) -> Optional[fx.Node]:
        """Walk back along single-input ops (views, activations) to a Linear layer."""
        while node is not self.residual.stream:
            if self.is_linear(node):
                return node
            inputs = [a for a in node.all_input_nodes if self.depends(a)]
            if len(inputs) != 1:
                return None
            node = inputs[0]
        return None

    def selective_projection(self) -> fx.Node:
        """The Linear that computes input-dependent parameters (Mamba's x_proj: Δ, B, C).

        Selectivity is a product ``P(s) ⊙ s``: parameters projected from a signal that
        is itself a factor. Among Linears that produce Hadamard factors and read such a
        signal, the one producing the most factors.
        """
        cone = self.branch_cone()
        factors = [f for n in self.residual.region if n in cone and self.is_hadamard(n) for f in self.factors(n)]
        signals = {self.through_plumbing(f) for f in factors}
        produced: dict[fx.Node, int] = {}
        for factor in factors:
            linear = self.nearest_linear(factor)
            if linear is not None and self.through_plumbing(main_input(linear)) in signals:
                produced[linear] = produced.get(linear, 0) + 1
        if not produced:
            raise NotApplicable("no selective-parameter projection (a Linear of a signal it multiplies)")
        order = {n: i for i, n in enumerate(self.residual.region)}
        return max(produced, key=lambda n: (produced[n], -order[n]))

    def where(self, node: fx.Node) -> str:
        return module_path(node) or self.block.name

    def size(self, node: fx.Node) -> str:
        meta = self.shapes.get(node.name)
        return str(meta[0][-1]) if meta and len(meta[0]) else "d"

    def branch_name(self) -> str:
        """The child module that computes the offending branch (``ssm``), or ``f``."""
        block_path = module_path(self.residual.join)
        prefix = f"{block_path}." if block_path else ""
        names = set()
        for term in self.offending_terms():
            path = module_path(term)
            relative = path[len(prefix) :].split(".") if path.startswith(prefix) else []
            names.add(relative[0] if len(relative) >= 2 else "f")
        return names.pop() if len(names) == 1 else "f"
