"""The soundness law: measured q <= static q + tol on random residual architectures.

Architectures come from :mod:`qlint.probe.architectures` (compositions, sums,
Hadamard products, norms, nested residuals, powers, activations); where the
arithmetic is tight (documented there) the measured exponent must reach the
static one. This bounded run is the CI guard against an unsound rule;
``bench/probe_soundness_long.py`` runs the same property for minutes.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from qlint.probe.measure import ProbeSettings, measure_model
from qlint.probe.architectures import Input, NestedResidual, Normalization, Power, Product, architectures, build

SETTINGS = ProbeSettings(random_directions=4)



def check_soundness(expression, seed: int) -> None:
    model, inputs = build(expression, seed)
    blocks = measure_model(model, inputs, SETTINGS)
    assert len(blocks) == 1, f"one residual block expected for {expression!r}"
    (block,) = blocks
    assert block.failed_samples == 0, f"overflowed samples for {expression!r}"
    assert block.agrees, f"UNSOUND: static q = {block.q_static}, measured {block.q_measured_max} for {expression!r}"
    if expression.tight():
        assert block.agreement == "exact", f"static q = {block.q_static} not attained ({block.q_measured_max}) by {expression!r}"


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(architectures())
def test_measured_exponent_never_exceeds_static(architecture):
    check_soundness(*architecture)


@pytest.mark.parametrize(
    "expression, q",
    [
        (Power(Power(Input(), 3), 2), 6.0),  # composition multiplies
        (Product(Power(Input(), 2), Input()), 3.0),  # Hadamard product adds
        (NestedResidual(Input(), Power(Input(), 2)), 2.0),  # h + g(h): max(1, q_g)
        (Product(Normalization(Power(Input(), 3), "layer_norm"), Input()), 1.0),  # a norm resets to 0
    ],
)
def test_tight_structures_reach_their_exponent(expression, q):
    assert expression.tight() and expression.exponent() == q
    model, inputs = build(expression, seed=0)
    (block,) = measure_model(model, inputs, SETTINGS)
    assert block.q_static == q
    assert block.q_measured == pytest.approx(q, abs=0.05)
