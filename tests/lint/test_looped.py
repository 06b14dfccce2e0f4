"""QL301-QL303: looped (weight-shared) recurrences h <- Ā ⊙ h + f(h, e) (source 003)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qlint.analysis import Options, load_model, run
from qlint.lint.looped import check_carry, find_loops

TRACERS = ["symbolic_trace", "export"]
FIXTURES = ["constrained", "free_carry", "identity_increment", "unit_carry"]
EXPECTED = {  # fixture -> the QL3xx codes it triggers
    "constrained": [],
    "constrained_high_carry": [],
    "free_carry": ["QL301"],
    "clamped_carry": [],
    "forget_gate_carry": [],
    "buffer_carry": [],
    "frozen_carry_above_one": ["QL301"],
    "tanh_carry": ["QL306"],
    "identity_increment": ["QL302"],
    "unit_carry": ["QL303"],
    "post_ln_loop": ["QL307"],
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
        "nothing keeps it in [0, 1) (at `carry.A` = 1 it is 1) (now in [0.3, 0.3]); use Ā = exp(-Δ·exp(log_A))"
    )
    [frozen] = [f for f in lint("looped.py:frozen_carry_above_one").findings if f.code == "QL301"]
    assert "the tensor `carry.A` (requires_grad=False: a constant, checked by value), holds 1.2 (|Ā| >= 1)" in frozen.message
    [tanh] = [f for f in lint("looped.py:tanh_carry").findings if f.code == "QL306"]
    assert tanh.severity == "warning"
    assert "the carry `torch.tanh` lies in (-1, 1): |Ā| < 1" in tanh.message and "flips the state's sign" in tanh.message
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
    "carry,verdict,problem",
    [
        (lambda a: torch.exp(-F.softplus(a) * torch.exp(a)), "proved", ""),
        (lambda a: torch.exp(-torch.exp(a)), "proved", ""),
        (torch.sigmoid, "proved", ""),
        (lambda a: 1 - torch.sigmoid(a), "proved", ""),  # the forget-gate spelling: open bounds through 1 - x
        (lambda a: torch.clamp(a, 0, 0.99), "proved", ""),
        (lambda a: torch.minimum(torch.sigmoid(a), torch.tensor(0.5)), "proved", ""),
        (lambda a: torch.maximum(torch.clamp(a, 0.1, 0.9), torch.sigmoid(a)), "proved", ""),
        (lambda a: 0.99 * torch.sigmoid(a), "proved", ""),
        (lambda a: torch.sigmoid(a) * torch.exp(-torch.exp(a)), "proved", ""),
        (lambda a: torch.exp(-torch.abs(a) - 0.01), "proved", ""),
        (lambda a: 0.5, "proved", ""),
        (lambda a: 1.5, "shown", "the constant carry 1.5 is not in [0, 1)"),
        (lambda a: -0.5, "negative", "the constant carry -0.5 is not in [0, 1)"),
        (lambda a: a, "shown", "the carry `a` is a free parameter: nothing keeps it in [0, 1) (at `a` = 1 it is 1)"),
        (lambda a: a.view(8), "shown", "the carry `a` is a free parameter: nothing keeps it in [0, 1) (at `a` = 1 it is 1)"),
        (lambda a: torch.exp(a), "shown", "the carry `torch.exp` holds 1 (|Ā| >= 1)"),  # a = 0 at init
        (lambda a: torch.exp(a - 1), "shown", "the carry `torch.exp` reaches 1 (|Ā| >= 1) at `a` = 1"),
        (lambda a: torch.clamp(a, 0, 1.5), "shown", "the carry `torch.clamp` reaches 1 (|Ā| >= 1) at `a` = 1"),
        (lambda a: 2 * torch.sigmoid(a), "shown", "the carry `operator.mul` holds 1 (|Ā| >= 1)"),
        (lambda a: 1.5 * torch.sigmoid(a - 2), "shown", "the carry `operator.mul` reaches 1.1 (|Ā| >= 1) at `a` = 3"),
        (lambda a: torch.exp(-a * a), "shown", "the carry `torch.exp` holds 1 (|Ā| >= 1)"),
        (lambda a: F.softplus(a), "shown", "the carry `torch.nn.functional.softplus` reaches 1.31 (|Ā| >= 1) at `a` = 1"),
        (torch.tanh, "negative", "the carry `torch.tanh` lies in (-1, 1): |Ā| < 1"),
        (lambda a: 0.9 * torch.cos(a) ** 2, "proved", ""),  # a power of a bounded parameter expression keeps its range
        (lambda a: 0.5 * (torch.sin(a) ** 2 + torch.cos(a) ** 2), "unproved",  # always 0.5; intervals give [0, 1]
         "qlint cannot show the carry `operator.mul` stays in [0, 1)"),
    ],
)
def test_carry_parameterizations(carry, verdict, problem):
    """Proved in [0, 1) by the value domain, shown out by a witness, or neither (QL306)."""
    model = TinyLoop(carry)
    analysis = run(model, (torch.randn(2, 8),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    assert loop.iterations == 3 and loop.path == "TinyLoop"
    check = check_carry(loop.step.carry, analysis)
    assert check.verdict == verdict and check.problem.startswith(problem), check


class ConstantCarryLoop(TinyLoop):
    """The carry is a buffer or a requires_grad=False tensor: a constant, checked by value."""

    def __init__(self, value, kind):
        super().__init__(lambda a: a)
        if kind == "buffer":
            self.register_buffer("c", torch.full((8,), value))
        else:
            self.c = nn.Parameter(torch.full((8,), value), requires_grad=False)
        self.carry = lambda a: self.c


@pytest.mark.parametrize("kind", ["buffer", "frozen"])
@pytest.mark.parametrize("value,verdict", [(0.9, "proved"), (0.0, "proved"), (1.0, "shown"), (-1.2, "shown"), (-0.4, "negative")])
def test_constant_carries_are_checked_by_value(kind, value, verdict):
    analysis = run(ConstantCarryLoop(value, kind), (torch.randn(2, 8),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    check = check_carry(loop.step.carry, analysis)
    assert check.verdict == verdict
    if verdict != "proved":
        assert ("the buffer `c` (a constant" if kind == "buffer" else "the tensor `c` (requires_grad=False") in check.problem


class SpelledLoop(TinyLoop):
    """TinyLoop with the step spelled by ``step(h, f, a)``: the carry may be spread over several terms."""

    def __init__(self, step):
        super().__init__(torch.sigmoid)
        self.step = step
        self.b = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        h = x
        for _ in range(self.iterations):
            h = self.step(self, h, self.proj(self.norm(h)))
        return h


@pytest.mark.parametrize(
    "step,verdict,spelled",
    [
        (lambda m, h, f: torch.sigmoid(m.a) * h + torch.sigmoid(m.b) * h + f, "shown", "torch.sigmoid + torch.sigmoid"),  # in (0, 2)
        (lambda m, h, f: f - torch.sigmoid(m.a) * h, "negative", "-torch.sigmoid"),  # the sign of a carry term counts
        (lambda m, h, f: -(torch.sigmoid(m.a) * h) + f, "negative", "-torch.sigmoid"),
        (lambda m, h, f: h - 2 * torch.sigmoid(m.a) * h + f, "negative", "1 - operator.mul"),  # 1 - 2σ, not a carry 2σ plus I
        (lambda m, h, f: torch.sigmoid(m.a) * h * 2 + f, "shown", "2·torch.sigmoid"),  # nested factors
        (lambda m, h, f: 0.5 * (torch.sigmoid(m.a) * h) + 0.5 * torch.sigmoid(m.b) * h + f, "proved", None),
    ],
)
def test_a_carry_is_every_term_of_the_state_with_its_sign(step, verdict, spelled):
    analysis = run(SpelledLoop(step), (torch.randn(2, 8),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    assert loop.step.identity == 0
    check = check_carry(loop.step.carry, analysis)
    assert check.verdict == verdict
    if spelled:
        assert f"the carry `{spelled}`" in check.problem


def test_rounding_never_proves_a_carry_that_reaches_one():
    """clamp(a, 0, 49) / 49 is 1 at a = 49: 49 · fl(1/49) < 1 must not prove it (the domain rounds outward)."""
    analysis = run(TinyLoop(lambda a: torch.clamp(a, 0, 49) / 49), (torch.randn(2, 8),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    assert check_carry(loop.step.carry, analysis).verdict == "unproved"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_float_saturation_is_no_witness(dtype):
    """1 / (1 + e^(-20a)) is below 1 in real arithmetic (proved), though float32 rounds it to 1.0 at a = 1."""
    model = TinyLoop(lambda a: 1 / (1 + torch.exp(-20 * a))).to(dtype)
    analysis = run(model, (torch.randn(2, 8, dtype=dtype),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    assert check_carry(loop.step.carry, analysis).verdict == "proved"


def test_a_trainable_plain_tensor_is_free_not_a_constant():
    model = TinyLoop(lambda a: model.P)
    model.__dict__["P"] = torch.full((8,), 0.5, requires_grad=True)  # an optimizer given P trains it
    analysis = run(model, (torch.randn(2, 8),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    check = check_carry(loop.step.carry, analysis)
    assert check.verdict == "shown" and "is a free parameter" in check.problem


class PreLNLoopThenNorm(nn.Module):
    """A pre-LN loop of three iterations, then one norm after it (shared with the loop, or weight-free)."""

    def __init__(self, shared):
        super().__init__()
        self.shared = shared
        self.a = nn.Parameter(torch.zeros(8))
        self.norm, self.proj = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        h = x
        for _ in range(3):
            h = torch.sigmoid(self.a) * h + self.proj(self.norm(h))
        return self.norm(h) if self.shared else F.layer_norm(h, (8,))


class FunctionalPostLNLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = x
        for _ in range(3):
            h = F.layer_norm(h + self.proj(h), (8,))
        return h


@pytest.mark.parametrize("shared", [True, False])
def test_a_norm_after_a_pre_ln_loop_is_not_a_post_ln_iteration(shared):
    analysis = run(PreLNLoopThenNorm(shared), (torch.randn(2, 8),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    assert (loop.iterations, loop.form) == (3, "h <- Ā⊙h + f(h)")
    assert [f.code for f in analysis.report.findings if f.code.startswith("QL3")] == []


def test_a_weight_free_post_ln_loop_is_one_loop():
    analysis = run(FunctionalPostLNLoop(), (torch.randn(2, 8),), spec="tiny", options=Options())
    [loop] = find_loops(analysis)
    assert (loop.iterations, loop.form) == (3, "h <- LN(h + f(h))")
    assert [f.code for f in analysis.report.findings if f.code.startswith("QL3")] == ["QL307"]


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


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_post_ln_loop_is_found_through_its_norm(tracer):
    [loop] = find_loops(analysis_of("looped.py:post_ln_loop", tracer=tracer))
    assert (loop.iterations, loop.form, loop.step.post_norm) == (6, "h <- LN(h + f(h))", True)
    assert {"f.0", "f.2", "norm"} <= {w.rsplit(".", 1)[0] for w in loop.step.weights} or {"f.0", "f.2", "norm"} <= loop.step.weights


def test_weight_shared_residual_stack_is_a_unit_carry_loop():
    analysis = run(SharedLayerStack(), (torch.randn(2, 8),), spec="albert", options=Options())
    [loop] = find_loops(analysis)
    assert (loop.path, loop.iterations, loop.form) == ("layer", 4, "h <- h + f(h)")
    assert [f.code for f in analysis.report.findings if f.code.startswith("QL3")] == ["QL303"]
