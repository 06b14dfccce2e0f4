"""The mechanisms a certificate rests on, each tried through the command line on an unsafe model
(true exponent above 1) and a safe one (fixtures/soundness.py), and each tried directly with the
input that would break it.

1. coverage is proved on the dataflow graph, not by the block detector;
2. unknown is a value: a rule's result has the op's structure, a tuple is never "no operand";
3. every argument that depends on the input is consumed by the rule's arithmetic;
4. roles are told apart by identity, never by equal facts;
5. a centred moment proves its centring groups;
6. the trace is checked in the grad mode the analysed mode runs in, and under the other modes it can read;
7. the trace covers the shapes the model runs on; reinterpreted bits are not values;
8. a witness measures what is certified (QL107);
9. the state a forward keeps is looked for wherever it lives, and every run of the check takes one path.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.fx as fx
from torch import nn

from conftest import ROOT, load_module, qlint_json
from qlint.analysis import Options, run
from qlint.growth.dataflow import dataflow, stream_carrying
from qlint.growth.stream import Stream
from qlint.core.domain import Growth
from qlint.growth.engine import coverage_gaps
from qlint.core.ops import Call
from qlint.growth.propagate import structure_mismatch
from qlint.registry import default

SPEC = "fixtures/soundness.py"
EscapingSquare = load_module(ROOT / "fixtures" / "examples.py", "rule_examples").EscapingSquare
EXPECTED = {  # factory: (verdict, max q) -- the unsafe ones must not be certified
    # 1. a velocity with one value per token is a velocity; stems and heads of another width are analysed
    "token_energy": ("supercritical", 2.0),
    "token_energy_bounded": ("certified", 0.0),
    "pooled_context": ("supercritical", 2.0),
    "centring": ("certified", 0.0),
    "coupling_squared": ("supercritical", 2.0),  # max q takes the supercritical transition too
    # 2. a rule's tuple for an op returning one tensor is unknown, not a missing operand
    "embedding_bag_product": ("supercritical", 2.0),
    "embedding_bag_scale": ("certified", 1.0),
    # 3. a slope computed from the input is consumed or the result is unknown
    "slope_from_input": ("uncertified", None),
    "slope_constant": ("certified", 1.0),
    # 5. the centred-moment proof checks the base's centring group too
    "revin_typo": ("supercritical", 2.0),
    "revin": ("certified", 1.0),
    # 6. the grad mode of the analysed mode
    "requires_grad_branch": ("failed", None),  # without gradients it computes W(x), not the graph's W(x)^2: refused
    "requires_grad_branch_eval": ("failed", None),  # evaluated with gradients on it computes W(x)^2
    # 7. shapes and bits
    "long_sequence_fast_path": ("supercritical", 2.0),
    "scan_late_square": ("supercritical", 2.0),
    "scan": ("certified", 1.0),
    "reinterpreted_bits": ("uncertified", None),
    "reshaped": ("certified", 1.0),
    # 9. state is found wherever it lives; every run of the check takes the example's path
    "keeps_its_attention": ("certified", 0.0),
    "counted_calls": ("failed", None),
    "version_gated": ("failed", None),
}


@pytest.fixture(scope="module")
def report() -> dict[str, dict]:
    models = qlint_json([f"{SPEC}:{name}" for name in EXPECTED])  # exit 1: findings, and every model analysed
    return {name: model for name, model in zip(EXPECTED, models)}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_verdict_through_the_command_line(report, name):
    verdict, q = EXPECTED[name]
    model = report[name]
    assert (model["verdict"], model["max_q"]) == (verdict, q), json.dumps(model["findings"])[:800]


def test_the_couplings_first_half_is_analysed_where_it_is_computed(report):
    """y1 = x1 + F(x2)^2 feeds the block cat([y1, y2]) as its input: the stretch computing it has q = 2."""
    [transition] = [t for t in report["coupling_squared"]["transitions"] if t["q"] == 2.0]
    assert transition["status"] == "supercritical" and transition["kind"] == "stem"


def test_a_value_that_leaves_a_block_is_bounded_or_reported():
    report = run(EscapingSquare(), (torch.randn(2, 4, 8),), spec="e", options=Options()).report
    assert report.verdict == "uncertified" and [b.status for b in report.blocks] == ["uncertified"]
    assert any("leaves block `EscapingSquare` besides its output and grows with q = 2" in r for r in report.uncovered)


def test_a_scan_says_which_lengths_were_analysed(report):
    shapes = report["scan"]["shapes"]
    assert "a loop over them" in shapes and "(5, 9, 8) float32" in shapes
    assert "the certificate holds for the lengths analysed ((2, 4, 8) float32; (5, 9, 8) float32; (3, 5, 8) float32)" in shapes


def test_the_fast_path_was_traced_at_a_length_past_the_guard(report):
    assert "(2, 17, 8) float32: traced and analysed there too (supercritical)" in report["long_sequence_fast_path"]["shapes"]


# --- 1. coverage, tried without the detector -------------------------------------------------------


class TwoUpdates(nn.Module):
    def __init__(self):
        super().__init__()
        self.f, self.g = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = x + self.f(x)
        return h + self.g(h) ** 2


def test_a_stretch_no_unit_covers_is_a_gap_whatever_the_detector_found():
    """The accounting reads the dataflow graph: drop a block from the stream the detector built and
    every node it computed is reported, by name."""
    analysis = run(TwoUpdates(), (torch.randn(2, 4),), spec="two", options=Options())
    assert analysis.report.verdict == "supercritical"
    second = analysis.stream.blocks[1]
    partial = Stream(blocks=analysis.stream.blocks[:1], transitions=[])
    gaps = coverage_gaps(partial, analysis.graph, analysis.envs, 1.0)
    missing = {gap.node for gap in gaps if gap.node is not None}
    assert second.join in missing and all(n in missing for n in second.region)
    assert all("no block or transition computes it" in gap.reason for gap in gaps)


def test_the_stream_includes_what_is_computed_from_the_stream_input():
    """A condition computed from the input the stream starts from scales with it: it is on the stream."""

    class Injected(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.c, self.f = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.stem(x)
            return h + self.f(h) * self.c(x) ** 2

    analysis = run(Injected(), (torch.randn(2, 4),), spec="i", options=Options())
    condition = next(n for n in analysis.graph.nodes if n.op == "call_function" and "pow" in n.name)
    assert condition in stream_carrying(dataflow(analysis.graph), {b.stream for b in analysis.stream.blocks})
    assert analysis.report.verdict != "certified"


# --- 2. unknown is a value --------------------------------------------------------------------------


def _node(op):
    graph = fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(op, (x,))
    graph.output(node)
    return node


def test_a_result_without_the_ops_structure_is_a_mismatch():
    relu = default().by_id["relu"]
    node = _node(torch.ops.aten.relu.default)
    assert structure_mismatch((Growth(1.0), Growth(1.0)), node, relu) == "gives 2 values for an op that returns one tensor"
    assert structure_mismatch(None, node, relu) == "gave no value (`NoneType`)"
    assert structure_mismatch(Growth(1.0), node, relu) is None
    assert structure_mismatch(Growth(None, culprit="x"), node, relu) is None  # unknown stands for any structure


def test_a_tuple_where_a_rule_reads_one_tensor_is_unknown_not_absent():
    call = Call(None, {"input": (Growth(1.0), Growth(1.0))}, {})
    value = call.growth("input")
    assert value is not None and value.q is None and "holds 2 values" in value.culprit
    assert Call(None, {}, {}).growth("bias") is None  # an absent argument is absent


# --- 3. an argument read but not consumed -------------------------------------------------------------


def test_a_dependent_argument_read_as_a_plain_parameter_makes_the_result_unknown():
    call = Call(None, {"input": Growth(1.0), "negative_slope": Growth(1.0)}, {"negative_slope": 0.01})
    call.growth("input")
    assert call.param("negative_slope") is None
    assert "reads it as a plain parameter" in call.unread()


def test_an_independent_argument_read_as_a_parameter_is_fine():
    call = Call(None, {"input": Growth(1.0), "negative_slope": 0.2}, {"negative_slope": 0.01})
    call.growth("input")
    call.param("negative_slope")
    assert call.unread() is None


# --- 4. identity, not equality ---------------------------------------------------------------------


def test_growths_with_equal_facts_are_different_values():
    a, b = Growth(1.0), Growth(1.0)
    assert a is not b and a != b and b not in [a]


def test_a_recurrent_weight_equal_in_facts_to_the_state_is_still_a_weight():
    """torch.rnn_tanh(x, h0, weights...) with a weight computed from the input: unknown, even when its
    Growth has exactly the facts of h0's."""
    from qlint.registry.transfers.layers import recurrent

    state, weight = Growth(1.0), Growth(1.0)
    call = Call(None, {"input": Growth(1.0), "hx": state, "params": [weight, Growth(0.0, depends=False)]}, {})
    call.op = "rnn_tanh"
    result = recurrent(call, default().by_id["recurrent"])
    assert result.q is None and "weights computed from the input" in result.culprit


class StaticOnly(nn.Module):
    """Refuses symbolic sizes, as code whose size arithmetic sympy cannot solve does (timm's VOLO)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        if not isinstance(x.shape[-2], int):
            raise NotImplementedError("this size arithmetic needs static shapes")
        return x + self.proj(torch.tanh(x))


def test_a_model_that_cannot_be_traced_symbolically_is_traced_at_its_example_shape():
    """The dynamic attempt marks the example tensors; the marks must not make the static trace symbolic too."""
    example = torch.randn(2, 5, 8)
    result = run(StaticOnly().eval(), (example,), spec="StaticOnly", options=Options(tracer="export"))
    assert result.report.verdict == "certified" and result.report.tracer == "export"
    assert not [name for name in vars(example) if "dynamo" in name]


STRIDED_GUARDS = [  # torch.export's guards for a stride-2 stem, a stride-32 stage, a max-pool level, and a fast path
    "L['x'].size()[1] == 3",
    "(1 + (((-1) + L['x'].size()[2]) // 2)) != 1",
    "(1 + (((-1) + L['x'].size()[2]) // 32)) != 1",
    "1 + (((-1) + L['x'].size()[2]) // 16) >= 2",
    "(1 + (((-1) + L['x'].size()[2]) // 64)) == 1",
    "L['x'].size()[2] > 100",
]


def test_the_guards_cut_an_axis_into_regions_and_each_region_is_tried_once():
    from qlint.capture.shapes import Guards, candidates, regions

    example = (torch.zeros(1, 3, 64, 64),)
    guards = Guards(example, ["x"], STRIDED_GUARDS)
    found = regions(guards, {0: {2}})
    assert guards.unread() == []
    assert [(r.describe(), r.representative, r.collapse) for r in found] == [
        ("input 0 axis 2 of size 2", 2, True),
        ("input 0 axis 2 of size 3..16", 16, True),
        ("input 0 axis 2 of size 17..32", 32, True),
        ("input 0 axis 2 of size 65..100", 65, True),
        ("input 0 axis 2 of size 101..", 101, False),  # the fast path: a dispatch, tried first
    ]
    tried = [(tuple(o.inputs[0].shape), o.where, o.collapse) for o in candidates(example, {0: {2}}, {}, guards)]
    assert tried == [  # export's own assumptions last, so a CNN's many size-1 regions cannot crowd out the rest
        ((1, 3, 101, 64), "input 0 axis 2 of size 101..", False),
        ((1, 3, 129, 64), "input 0 axis 2 of size 129", False),  # 2n + 1 (n + 1 = 65 is a region): past the fast path
        ((1, 3, 1, 64), "input 0 axis 2 of size 1", True),  # no guard says 1: first of export's own assumptions
        ((1, 3, 65, 64), "input 0 axis 2 of size 65..100", True),
        ((1, 3, 32, 64), "input 0 axis 2 of size 17..32", True),
        ((1, 3, 16, 64), "input 0 axis 2 of size 3..16", True),
        ((1, 3, 2, 64), "input 0 axis 2 of size 2", True),
    ]


@pytest.mark.parametrize("guard, assumed", [
    ("(1 + (((-1) + L['x'].size()[3]) // 2)) != 1", True),  # an inner size kept above 1
    ("1 + (((-1) + L['x'].size()[2]) // 16) >= 2", True),
    ("(1 + (((-1) + L['x'].size()[2]) // 16)) != (1 + (((-1) + L['x'].size()[2]) // 8))", True),  # duck sizing
    ("((1 + ((L['x'].size()[2]) // 32)) % ((1 + ((L['x'].size()[3]) // 32))*(1 + ((L['x'].size()[2]) // 32)))) != 0", True),
    ("torch.sym_max(1, L['x'].size()[3] // 8) < torch.sym_max(1, L['x'].size()[3] // 8)*torch.sym_max(1, L['x'].size()[2] // 8)", True),
    ("L['x'].size()[1] < 2*L['x'].size()[2]", False),  # a ratio of two sizes, not a size above 1
    ("L['x'].size()[1] % 2 == 0", False),  # the model's own branch on T % 2
    ("L['x'].size()[1] > 64", False),  # a fast path
    ("L['x'].size()[1] == 12", False),
])
def test_export_size_assumptions_are_told_from_the_models_dispatch(guard, assumed):
    from qlint.capture.shapes import _specialisation

    assert _specialisation(guard) is assumed


def _masked_scale(x, mask):
    """PatchTST's scaler: a mean and a variance through an observation mask."""
    count = mask.sum(1, keepdim=True).clamp_min(1.0)
    loc = (x * mask).sum(1, keepdim=True) / count
    variance = (((x - loc) * mask) ** 2).sum(1, keepdim=True) / count
    return (x - loc) / torch.sqrt(variance + 1e-5)


class OnesMasked(nn.Module):
    def forward(self, x):
        return _masked_scale(x, torch.ones_like(x))


class InputMasked(nn.Module):
    def forward(self, x, mask):
        return _masked_scale(x, mask)


@pytest.mark.parametrize("model, inputs, rewrites", [
    (OnesMasked(), (torch.randn(2, 6, 3),), 4),  # two products by ones, two sums over a count of ones
    (InputMasked(), (torch.randn(2, 6, 3), (torch.rand(2, 6, 3) > 0.5).float()), 0),  # a mask's entries are not known
])
def test_an_all_ones_masked_average_is_rewritten_to_the_mean_it_is(model, inputs, rewrites):
    from qlint.growth.canonical import simplify
    from qlint.core.graph import annotate

    module = torch.export.export(model, inputs, strict=False).module()
    annotate(module, default(), model)
    assert simplify(module) == rewrites
    assert torch.allclose(module(*inputs), model(*inputs), atol=1e-6)
    means = [n for n in module.graph.nodes if n.target is torch.ops.aten.mean.dim]
    assert len(means) == (2 if rewrites else 0)


def test_a_dispatch_on_a_product_of_axes_is_found_by_changing_both():
    """B * T == 12 is reached from (5, 5) only by changing both axes: the pair nearest the example is tried."""
    from qlint.capture.shapes import Guards, candidates

    example = (torch.zeros(5, 5, 8),)
    guards = Guards(example, ["x"], ["L['x'].size()[0] * L['x'].size()[1] != 12"])
    tried = [(tuple(o.inputs[0].shape), o.collapse) for o in candidates(example, {0: {0, 1}}, {}, guards)]
    assert tried[0] == ((3, 4, 8), False) or tried[0] == ((4, 3, 8), False)


class FakeQuantised(nn.Module):
    """x + W2 fq(W1 x) * W1 x: bounded codes times a linear value, q 1 -- unless the scale comes from x."""

    def __init__(self, scale):
        super().__init__()
        self.w1, self.w2, self.scale = nn.Linear(8, 8), nn.Linear(8, 8), scale

    def forward(self, x):
        z = self.w1(x)
        scale = z.abs().amax() / 127 if self.scale == "from the input" else self.scale
        return x + self.w2(torch.fake_quantize_per_tensor_affine(z, scale, torch.zeros((), dtype=torch.int32), -128, 127) * z)


@pytest.mark.parametrize("scale, verdict, q", [
    (torch.tensor(0.1), "certified", 1.0),  # |fq(z)| <= 12.8: bounded, times z
    ("from the input", "uncertified", None),  # max|z| / 127 is 0 at z = 0: x / s is NaN there
])
def test_fake_quantization_is_bounded_by_its_scale(scale, verdict, q):
    torch.manual_seed(0)
    report = run(FakeQuantised(scale).eval(), (torch.randn(2, 8),), spec="FakeQuantised", options=Options(tracer="export")).report
    assert (report.verdict, report.blocks[0].q) == (verdict, q)


# --- 8. the witness refutes contradictions, not transitions ------------------------------------------


@pytest.mark.parametrize("velocity, refuted", [
    (lambda x: x * x.norm(), True),  # q = 2
    (lambda x: 1e-3 * x * x.norm() ** 0.5, True),  # q = 1.5 with a small constant
    (lambda x: x * x.norm() ** 2 / (x.norm() ** 2 + 1e11), False),  # q = 1: a gain saturating past 1e5.5 (slope 3 before)
    (lambda x: 1e-13 * x * x.norm() ** 0.3, False),  # rounding-level values: within 1e-6 ||x|| throughout
], ids=["square", "small-constant", "saturating", "negligible"])
def test_the_witness_refutes_growth_not_a_transition_or_rounding(velocity, refuted):
    from qlint.probe.block_witness import _refute

    x = torch.randn(2, 4, 8, dtype=torch.float64)
    x = x / x.norm()
    assert (_refute(velocity, x, 1.0, "v") is not None) == refuted


class WideGain(nn.Module):
    """x + W2 act(W1 x) with weights of 1e17: past float32's range at 1e6 x the example, measured in float32.
    ``act``: relu (q 1), or a square (q 2)."""

    def __init__(self, square):
        super().__init__()
        self.square, self.w1, self.w2 = square, nn.Linear(8, 8), nn.Linear(8, 8)
        with torch.no_grad():
            self.w1.weight.mul_(1e17)
            self.w2.weight.mul_(1e17)

    def forward(self, x):
        h = self.w1(x)
        return x + self.w2(h * h if self.square else torch.relu(h))


@pytest.mark.parametrize("square, refuted", [(False, None), (True, "(in float64)")])
def test_the_witness_tells_a_dtypes_range_from_growth(monkeypatch, square, refuted):
    """A graph too large for a float64 copy is measured in its float32; an inf there is measured again in
    float64 for that block alone: a linear block that only overflows float32 is not refuted, growth still
    is (measured on the wide block: here q 2, forced through the certificate by a declared q 1)."""
    from qlint.probe import block_witness
    from qlint.velocity.field import Trajectory, VelocityField

    monkeypatch.setattr(block_witness, "WIDE_LIMIT", 0)
    torch.manual_seed(0)
    model, x = WideGain(square).eval(), torch.randn(2, 4, 8)
    analysis = run(model, (x,), spec="wide", options=Options(witness=False))
    (residual,) = analysis.stream.blocks
    trajectory = Trajectory(analysis.traced.module, (x,))
    assert not torch.isfinite(VelocityField(trajectory, residual)(1e6 * trajectory.values[residual.stream])).all()
    found = block_witness._refute_block(residual, "as built", trajectory, 1.0)
    assert found is None if refuted is None else refuted in found


class RegrowingTable(nn.Module):
    """Regrows its table of positions for a longer input (as sinusoidal position embeddings do)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("table", torch.zeros(6, 8))

    def forward(self, x):
        if x.shape[1] > self.table.shape[0]:
            self.table = torch.zeros(x.shape[1], 8)
        return x + self.fc(x) + self.table[: x.shape[1]]


def test_a_buffer_the_forward_regrows_at_another_shape_is_put_back():
    """Trying a longer input must not crash the analysis (the table is put back as it was); the
    longer input's own graph cannot be exported (it assigns a module attribute), which is named."""
    model = RegrowingTable()
    report = run(model, (torch.randn(2, 4, 8),), spec="regrow", options=Options()).report
    assert model.table.shape == (6, 8)
    assert report.verdict == "uncertified" and any("on inputs (2, 7, 8) float32" in r for r in report.uncovered)


class Varargs(nn.Module):
    """forward(*args), as keyword adapters around Hugging Face models are written."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, *args):
        x, y = args
        return x + self.fc(x) + y


def test_a_varargs_forward_is_exported_static_and_its_shapes_probed():
    from qlint.capture.shapes import automatic

    inputs = (torch.randn(2, 4, 8), torch.randn(2, 4, 8))
    assert automatic(Varargs(), inputs) is None
    report = run(Varargs(), inputs, spec="varargs", options=Options(tracer="export")).report
    assert report.verdict == "certified" and report.extra["shapes"].startswith("static export")


def test_state_and_another_path_are_refused_by_name(report):
    assert "the forward changes `fn`" in report["counted_calls"]["failure"]
    # here the two paths differ on every input (r12's gated twins, which agree off a set of measure zero, are
    # refused by the path: fixtures/adversarial/r12_version.py)
    assert "_Fn reads a tensor's version counter at" in report["version_gated"]["failure"]
    # a history the forward reads off a tensor (its autograd state) is run, and the path it takes there is named
    assert ("on inputs that require grad runs other ops than the model as analysed (more: pow x1; fewer: none): the "
            "forward reads a tensor's autograd state at" in report["requires_grad_branch_eval"]["failure"])
