"""Values computed from shapes and literals alone are bounded by their entries (qlint.growth.propagate).

T5's relative-position buckets take log(0) = -inf and select past it with ``where``: the
buckets are finite, so the per-op hazard of the log must not reach the block. Only a value
with no input, no parameter or buffer and no random draw in its cone is evaluated; one
that is inf or NaN, or cannot be read (meta), stays unbounded.
"""

import pytest
import torch
from torch import nn

from qlint.analysis import Options, run

WIDTH = 8


class LogOfPositions(nn.Module):
    """x + fc(x) * g, g from log(arange): ``masked`` selects past the -inf at position 0."""

    def __init__(self, source="arange", masked=True):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.source, self.masked = source, masked

    def positions(self, x):
        if self.source == "arange":
            return torch.arange(WIDTH, dtype=x.dtype, device=x.device)
        if self.source == "rand":
            return torch.rand(WIDTH, device=x.device)
        return self.fc.bias.abs()  # a parameter: log of it is not finite for every value

    def forward(self, x):
        pos = self.positions(x)
        g = torch.log(pos)
        if self.masked:
            g = torch.where(pos > 0, g, torch.zeros_like(g))
        return x + self.fc(x) * g


def verdict(model, tracer, device="cpu"):
    inputs = (torch.randn(2, WIDTH, device=device),)
    report = run(model.to(device), inputs, spec="m", options=Options(tracer=tracer)).report
    return [(b.q, b.status) for b in report.blocks], [f.message for f in report.findings if f.code == "QL102"]


@pytest.mark.parametrize("tracer", ["export", "make_fx"])
def test_a_masked_log_of_positions_is_a_finite_constant(tracer):
    assert verdict(LogOfPositions(), tracer) == ([(1.0, "ok")], [])


@pytest.mark.parametrize("tracer", ["export", "make_fx", "symbolic_trace"])
def test_an_unmasked_log_of_zero_stays_unbounded(tracer):
    blocks, reasons = verdict(LogOfPositions(masked=False), tracer)
    assert blocks == [(None, "uncertified")] and len(reasons) == 1


def test_a_random_draw_is_not_a_fixed_value():
    blocks, reasons = verdict(LogOfPositions(source="rand"), "export")
    assert blocks == [(None, "uncertified")]
    assert reasons and "random draw" in reasons[0]


def test_the_log_of_a_parameter_is_a_hazard_not_growth():
    """log(|b|) is -inf where a bias entry is 0: a hazard at those parameter values (QL108), and a
    constant coefficient at every other, so the block keeps q = 1."""
    report = run(LogOfPositions(source="parameter"), (torch.randn(2, WIDTH),), spec="m", options=Options(tracer="export")).report
    assert [(b.q, b.status) for b in report.blocks] == [(1.0, "ok")]
    [hazard] = [f for f in report.findings if f.code == "QL108"]
    assert "of a parameter expression that may be <= 0" in hazard.message


def test_a_fixed_value_on_meta_cannot_be_read_and_stays_unbounded():
    blocks, _ = verdict(LogOfPositions(), "export", device="meta")
    assert blocks == [(None, "uncertified")]


class ScaledBySize(nn.Module):
    """DeBERTa's ``key / sqrt(tensor(size) * factor)``: the divisor is a tensor made from a shape."""

    def __init__(self, factor):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.factor = factor

    def forward(self, x):
        scale = torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * self.factor)
        return x + self.fc(x) / scale


@pytest.mark.parametrize("tracer", ["export", "make_fx"])
def test_a_divisor_made_from_a_shape_is_bounded_away_from_zero(tracer):
    assert verdict(ScaledBySize(2), tracer) == ([(1.0, "ok")], [])


def test_a_divisor_made_from_a_shape_that_is_zero_stays_unbounded():
    blocks, reasons = verdict(ScaledBySize(0), "export")
    assert blocks == [(None, "uncertified")] and len(reasons) == 1


class DividedByUninitialised(nn.Module):
    """x + fc(x) / (empty(8) + 1): uninitialised memory has no one value to evaluate."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc(x) / (torch.empty(WIDTH, device=x.device) + 1)


@pytest.mark.parametrize("tracer", ["export", "make_fx"])
def test_uninitialised_memory_is_never_evaluated_by_value(tracer):
    from qlint.capture.trace import TraceFailure

    try:
        blocks, _ = verdict(DividedByUninitialised(), tracer)
    except TraceFailure:
        return  # the graph check saw two calls differ: refused, also not certified
    assert blocks == [(None, "uncertified")]


def test_random_draws_and_uninitialised_memory_are_indeterminate():
    from qlint.core.graph import indeterminate

    def node(target):
        return type("N", (), {"target": target})()

    aten = torch.ops.aten
    assert all(indeterminate(node(t)) for t in (aten.empty.memory_format, aten.empty_like.default, aten.rand.default,
                                                aten.randn_like.default, aten.bernoulli.p, torch.rand, torch.empty, "normal_"))
    assert not any(indeterminate(node(t)) for t in (aten.arange.default, aten.zeros.default, aten.full.default, torch.arange))
