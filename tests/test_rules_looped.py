"""QL301-QL303: looped (weight-shared) recurrences h <- Ā ⊙ h + f(h, e) (source 003)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qlint.analysis import Options, load_model, run
from qlint.lint.looped import carry_problem, find_loops

TRACERS = ["symbolic_trace", "export"]
FIXTURES = ["constrained", "free_carry", "identity_increment", "unit_carry"]
EXPECTED = {  # fixture -> the QL3xx codes it triggers
    "constrained": [],
    "constrained_high_carry": [],
    "free_carry": ["QL301"],
    "identity_increment": ["QL302"],
    "unit_carry": ["QL303"],
}


def analysis_of(spec, **options):
    loaded = load_model(f"fixtures/{spec}", Options(**options))
    return run(loaded.model, loaded.inputs, spec=spec, options=Options(**options))


def looped_codes(report):
    return [f.code for f in report.findings if f.code.startswith("QL3")]


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_rule_fires_on_its_fixture_only(lint, name, tracer):
    report = lint(f"looped.py:{name}", tracer=tracer)
    assert report.tracer == tracer
    assert looped_codes(report) == EXPECTED[name]


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", FIXTURES)
def test_the_loop_is_found_with_its_body_and_iterations(name, tracer):
    [loop] = find_loops(analysis_of(f"looped.py:{name}", tracer=tracer))
    assert loop.path == "block"
    assert loop.iterations == 8
    assert loop.form == ("h <- h + f(h)" if name == "unit_carry" else "h <- Ā⊙h + f(h)")
    assert loop.step.identity == (1 if name == "identity_increment" else 0)
    assert all(step.weights == loop.step.weights for step in loop.steps)


def test_messages_name_the_module_path_and_the_problem(lint):
    [free] = [f for f in lint("looped.py:free_carry").findings if f.code == "QL301"]
    assert free.severity == "error" and free.block == "block"
    assert free.message == (
        "looped recurrence `block` (8 iterations of h <- Ā⊙h + f(h)): the carry `carry.A` is a free parameter: "
        "nothing keeps it in (0, 1) (now in [0.3, 0.3]); use Ā = exp(-Δ·exp(log_A))"
    )
    [identity] = [f for f in lint("looped.py:identity_increment").findings if f.code == "QL302"]
    assert identity.severity == "error"
    assert "`block`" in identity.message and "carried by Ā + I (expansive)" in identity.message
    [unit] = [f for f in lint("looped.py:unit_carry").findings if f.code == "QL303"]
    assert unit.severity == "warning" and "the carry is I (rho = 1)" in unit.message
    assert unit.source.file.endswith("qlint/zoo/looped.py")


@pytest.mark.parametrize("spec", ["gpt2.py:build_model", "placement.py:deep_unscaled", "patchtst.py:free"])
def test_stacks_of_distinct_blocks_are_not_loops(spec):
    assert find_loops(analysis_of(spec)) == []


class TinyLoop(nn.Module):
    """h <- carry(a) ⊙ h + W·LN(h), three times, with ``carry`` a function of one parameter vector."""

    def __init__(self, carry, iterations=3):
        super().__init__()
        self.carry, self.iterations = carry, iterations
        self.a = nn.Parameter(torch.zeros(8))
        self.norm, self.proj = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        h = x
        for _ in range(self.iterations):
            h = self.carry(self.a) * h + self.proj(self.norm(h))
        return h


@pytest.mark.parametrize(
    "carry,problem",
    [
        (lambda a: torch.exp(-F.softplus(a) * torch.exp(a)), None),
        (lambda a: torch.exp(-torch.exp(a)), None),
        (torch.sigmoid, None),
        (torch.tanh, None),
        (lambda a: torch.sigmoid(a) * torch.exp(-torch.exp(a)), None),
        (lambda a: 0.5, None),
        (lambda a: 1.5, "the constant carry 1.5 is not in [0, 1)"),
        (lambda a: a, "the carry `a` is a free parameter: nothing keeps it in (0, 1)"),
        (lambda a: a.view(8), "the carry `a` is a free parameter: nothing keeps it in (0, 1)"),
        (lambda a: torch.exp(a), "the carry is exp of an argument qlint cannot show is <= 0"),
        (lambda a: F.softplus(a), "qlint cannot show the carry (`torch.nn.functional.softplus`) stays in (0, 1)"),
    ],
)
def test_carry_parameterizations(carry, problem):
    model = TinyLoop(carry)
    analysis = run(model, (torch.randn(2, 8),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    assert loop.iterations == 3 and loop.path == "TinyLoop"
    assert carry_problem(loop.step.carry, analysis) == problem


def test_two_iterations_are_a_loop_one_is_not():
    for iterations, expected in ((1, 0), (2, 1)):
        analysis = run(TinyLoop(torch.sigmoid, iterations), (torch.randn(2, 8),), spec="tiny", options=Options())
        assert len(find_loops(analysis)) == expected


class SharedLayerStack(nn.Module):
    """ALBERT-style: one pre-LN layer applied four times, h <- h + mlp(LN(h))."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x):
        for _ in range(4):
            x = x + self.layer(x)
        return x


def test_weight_shared_residual_stack_is_a_unit_carry_loop():
    analysis = run(SharedLayerStack(), (torch.randn(2, 8),), spec="albert", options=Options())
    [loop] = find_loops(analysis)
    assert (loop.path, loop.iterations, loop.form) == ("layer", 4, "h <- h + f(h)")
    assert [f.code for f in analysis.report.findings if f.code.startswith("QL3")] == ["QL303"]
