"""Tiny models traced and annotated the way :func:`qlint.growth.engine.analyse` prepares a graph, so the
growth passes (relations, propagation, blocks) can be tested one at a time on graphs small enough to
read whole."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch import nn

from qlint.growth import canonical, relations
from qlint.capture.pipeline import capture
from qlint.core.graph import GraphFacts, annotate
from qlint.capture.trace import TracedGraph
from qlint.registry import default as default_registry

D = 8  # the width of every test model


class Forward(nn.Module):
    """forward(x) = fn(self, x): a one-line model; ``members`` become its submodules or parameters."""

    def __init__(self, fn, **members):
        super().__init__()
        self.fn = fn
        for name, value in members.items():
            setattr(self, name, value)

    def forward(self, x):
        return self.fn(self, x)


class Residual(nn.Module):
    """x + W x: the plainest residual block, q = 1."""

    def __init__(self):
        super().__init__()
        self.f = nn.Linear(D, D)

    def forward(self, x):
        return x + self.f(x)


class Stack(nn.Module):
    """Layers applied in turn (``layers.0``, ``layers.1``, ...)."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def example() -> torch.Tensor:
    """A (batch, tokens, D) input, the same on every call."""
    return torch.randn(2, 4, D, generator=torch.Generator().manual_seed(0))


def prepare(model: nn.Module, x: torch.Tensor | None = None) -> tuple[TracedGraph, GraphFacts]:
    """Trace ``model`` with symbolic_trace (checked against the eager model) and annotate it as the
    engine does before propagating: node facts, all-ones averages rewritten, graph facts, relations."""
    x = example() if x is None else x
    registry = default_registry()
    traced = capture(model.eval(), (x,), registry, prefer="symbolic_trace")
    annotate(traced.module, registry, model)
    if canonical.simplify(traced.module):
        annotate(traced.module, registry, model)
    graph = GraphFacts(traced.module, traced.data_inputs)
    graph.example = (x,)
    relations.find(graph.nodes)
    return traced, graph


def named(graph: GraphFacts, name: str) -> fx.Node:
    """The node fx named ``name`` (``add``, ``linear_1``, ...)."""
    matches = [n for n in graph.nodes if n.name == name]
    assert len(matches) == 1, f"no single node {name!r} in {[n.name for n in graph.nodes]}"
    return matches[0]


def output_value(graph: GraphFacts) -> fx.Node:
    """The node the model returns."""
    (output,) = [n for n in graph.nodes if n.op == "output"]
    return output.args[0]
