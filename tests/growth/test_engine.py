"""engine.analyse_graph (qlint.growth.engine) on one traced graph: each block's velocity exponent, its verdict
against the threshold, the derivation that explains it, and the report's header."""

from __future__ import annotations

import math

import pytest
import torch
from growth_graphs import D, Forward, Residual, example
from torch import nn

from qlint.capture.pipeline import capture
from qlint.growth.engine import Analysis, analyse_graph
from qlint.registry import default as default_registry


class Cubic(nn.Module):
    """x + W2 (W1 x)^3: q = 3"""

    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        return x + self.w2(self.w1(x) ** 3)


class Exponential(nn.Module):
    """x + W2 exp(W1 x): faster than any polynomial"""

    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        return x + self.w2(torch.exp(self.w1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Residual(), Cubic(), Exponential())

    def forward(self, x):
        return self.blocks(x)


def run(threshold: float = 1.0, model: nn.Module | None = None) -> Analysis:
    model, x = (model or Net()).eval(), example()
    registry = default_registry()
    traced = capture(model, (x,), registry, prefer="symbolic_trace")
    return analyse_graph(model, (x,), traced, registry, spec="net", threshold=threshold)


@pytest.fixture(scope="module")
def analysis() -> Analysis:
    torch.manual_seed(0)
    return run()


def test_each_block_gets_its_velocity_exponent_and_verdict(analysis):
    assert [(b.name, b.index, b.q, b.status) for b in analysis.report.blocks] == [
        ("blocks.0", 0, 1.0, "ok"), ("blocks.1", 1, 3.0, "supercritical"), ("blocks.2", 2, math.inf, "supercritical")]
    velocities = {name: v.q for name, v in analysis.velocities.items()}
    assert velocities == {"blocks.0": 1.0, "blocks.1": 3.0, "blocks.2": math.inf}


def test_the_derivation_names_the_op_that_sets_the_exponent(analysis):
    cubic, exponential = analysis.report.blocks[1:]
    assert [(d.node, d.primitive, d.q) for d in cubic.derivation] == [
        ("add", "block input X_k", 1.0), ("linear_1", "Affine layer (Linear)", 1.0),
        ("pow_1", "Polynomial activation x^p", 3.0), ("linear_2", "Affine layer (Linear)", 3.0)]
    assert cubic.dominant == "Polynomial activation x^p"
    assert exponential.dominant == "exp of an argument not bounded above"


def test_the_report_header_says_how_the_graph_was_read(analysis):
    report = analysis.report
    assert (report.spec, report.tracer, report.mode, report.threshold) == ("net", "symbolic_trace", "eval", 1.0)
    assert report.transitions == [] and report.uncovered == []
    assert [b.name for b in analysis.blocks] == ["blocks.0", "blocks.1", "blocks.2"]
    assert analysis.block("blocks.1").join.name == "add_1"


def test_a_higher_threshold_certifies_the_cubic_block_but_not_the_exponential_one():
    torch.manual_seed(0)
    assert [b.status for b in run(threshold=3.0).report.blocks] == ["ok", "ok", "supercritical"]


def test_a_block_through_an_op_without_a_polynomial_bound_is_uncertified():
    model = Forward(lambda m, x: x + m.w(torch.special.bessel_j0(x)), w=nn.Linear(D, D))
    (block,) = run(model=model).report.blocks
    assert (block.name, block.q, block.status) == ("Forward", None, "uncertified")
    assert block.dominant == "`torch.special.bessel_j0` has no polynomial bound (exponential growth)"
