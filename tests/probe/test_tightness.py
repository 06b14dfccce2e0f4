"""Where the exponent algebra is tight, the static q is attained: the model grows exactly that fast.

Soundness (measured <= static) is the differential law of tests/probe/test_differential.py;
this is its other half for the five operations of Theorem 9, on the probe's witness
(graph and eager, worst-case directions, parameters as built): composition multiplies,
a Hadamard product adds, a sum takes the max, a nested residual gives max(1, q), and an
outer normalization resets to 0.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qlint.probe.measure import ProbeSettings, measure_model

D = 6
SETTINGS = ProbeSettings(random_directions=4, perturb=False)


class Velocity(nn.Module):
    """x + expression(x), the expression written with three linear maps of the input."""

    def __init__(self, expression):
        super().__init__()
        self.w, self.u, self.out = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.expression = expression

    def forward(self, x):
        return x + self.out(self.expression(self, x))


CASES = {
    "composition multiplies: ((W x)^3)^2": (lambda m, x: (m.w(x) ** 3) ** 2, 6.0),
    "Hadamard product adds: (W x)^2 * (U x)": (lambda m, x: m.w(x) ** 2 * m.u(x), 3.0),
    "sum takes the max: (W x)^2 + tanh(U x)": (lambda m, x: m.w(x) ** 2 + torch.tanh(m.u(x)), 2.0),
    "nested residual: h + (W h)^2, h = U x": (lambda m, x: m.u(x) + m.w(m.u(x)) ** 2, 2.0),
    "outer norm resets: LN((W x)^3) * (U x)": (lambda m, x: m.norm(m.w(x) ** 3) * m.u(x), 1.0),
}


@pytest.mark.parametrize("label", CASES)
def test_static_exponent_is_attained(label):
    expression, q = CASES[label]
    torch.manual_seed(0)
    (block,) = measure_model(Velocity(expression), (torch.randn(2, 3, D),), SETTINGS)
    assert block.q_static == q
    assert block.q_measured == pytest.approx(q, abs=0.05)
    assert block.agreement == "exact" and block.eager_module == ""
