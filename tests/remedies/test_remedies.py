"""Remedies: candidates from the paper's procedure, re-checked on the changed graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import qlint
from qlint import remedies
from qlint.analysis import Options, run
from qlint.analysis import run_specs as check
from qlint.ci.render import render_full
from qlint.core.graph import module_path

from conftest import ROOT, load_module


def fixture(name: str):
    """'mamba.py:native' -> (model, example_inputs) from the bundled fixture."""
    file, factory = name.split(":")
    return getattr(load_module(ROOT / "fixtures" / file, f"fixture_{Path(file).stem}"), factory)()


def analysed(name: str):
    model, inputs = fixture(name)
    return run(model, inputs, spec=name, options=Options())


@pytest.fixture(scope="module")
def mamba():
    return analysed("mamba.py:native")


@pytest.fixture(scope="module")
def hymba():
    return analysed("hymba.py:ssm_unnormed")


@pytest.fixture(scope="module")
def swiglu():
    return analysed("llama.py:swiglu_block_without_norm")


@pytest.fixture(scope="module")
def poly():
    return analysed("toy.py:poly_mlp")


def kept(analysis, block):
    return {r.kind: (r.q_after, r.new_params) for r in remedies.propose(analysis, block)}


def test_native_mamba_gets_the_papers_three_remedies(mamba):
    found = kept(mamba, "layers.0")
    assert found["preln"] == (0.0, 32)  # LayerNorm(16): weight and bias
    assert found["periln"] == (0.0, 64)
    assert found["linear_growth"] == (1.0, 0)  # normalization-free, no parameters
    assert "gate_sigmoid" not in found  # q = 4: see below
    ranked = remedies.propose(mamba, "layers.0")
    assert ranked[0].kind == "linear_growth"
    assert [r.rank for r in ranked] == sorted(r.rank for r in ranked)
    assert all(r.q_after <= 1 for r in ranked)


def test_a_candidate_that_does_not_certify_is_dropped(mamba):
    tried = {r.kind: r.q_after for r in remedies.candidates(mamba, "layers.0", kinds=["gate_sigmoid"])}
    assert tried["gate_sigmoid"] == 4.0  # silu -> sigmoid alone removes one factor of five
    with pytest.raises(ValueError, match="does not certify block `layers.0`: q = 4"):
        remedies.apply(mamba, "gate_sigmoid", block="layers.0")


class _TwoPowers(nn.Module):
    """x + w2(w1(x)**3 + w3(x)**2): fixing only the highest-q power leaves q = 2."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return x + self.w2(self.w1(x) ** 3 + self.w3(x) ** 2)


def test_naive_fixes_of_the_top_primitive_are_never_shown():
    torch.manual_seed(0)
    analysis = run(_TwoPowers(), (torch.randn(2, 4, 8),), spec="two", options=Options())
    tried = {r.kind: r.q_after for r in remedies.candidates(analysis, "_TwoPowers")}
    assert tried["norm_primitive"] == 2.0 and tried["lipschitz_activation"] == 2.0
    assert set(kept(analysis, "_TwoPowers")) == {"preln", "periln"}


def test_swiglu_without_norm_gets_pre_norm_and_a_gate_substitution(swiglu):
    found = kept(swiglu, "SwiGLUResidual")
    assert found["preln"] == (0.0, 32)
    assert found["gate_sigmoid"] == (1.0, 0)
    assert "linear_growth" not in found  # no selective parameters in a SwiGLU MLP
    assert remedies.propose(swiglu, "SwiGLUResidual")[0].kind == "gate_sigmoid"


def test_cubic_activation_gets_a_norm_or_a_lipschitz_substitute(poly):
    found = kept(poly, "PolyMLP")
    assert found["lipschitz_activation"] == (1.0, 0)
    assert found["preln"] == (0.0, 16) and found["norm_primitive"] == (0.0, 16)
    substitute = next(r for r in remedies.propose(poly, "PolyMLP") if r.kind == "lipschitz_activation")
    assert substitute.sketch.startswith("h ** 3 → F.gelu(h)")
    line = (ROOT / "qlint/zoo/toy.py").read_text().splitlines().index("        return h ** self.p") + 1
    assert (Path(substitute.source.file).name, substitute.source.line) == ("toy.py", line)


def test_hymba_ssm_branch_gets_a_norm_on_that_branch_only(hymba):
    preln = next(r for r in remedies.propose(hymba, "layers.0") if r.kind == "preln")
    assert preln.q_after == 0.0 and "the `ssm` branch only" in preln.target
    assert "nn.RMSNorm(16)" in preln.sketch  # the model's own norm kind
    remedied = remedies.apply(hymba, "preln", block="layers.0")
    # an RMSNorm applied functionally, its trainable weight held by a new submodule
    norms = [n for n in remedied.graph.nodes if n.op == "call_function" and len(n.args) > 2
             and isinstance(n.args[2], torch.fx.Node) and str(n.args[2].target).startswith("qlint_preln")]
    assert len(norms) == 1 and norms[0].target is torch.nn.functional.rms_norm
    weight = remedied.get_parameter(str(norms[0].args[2].target))
    assert weight.shape == (16,) and weight.requires_grad
    readers = {module_path(user) for user in norms[0].users}
    assert readers and all(path.startswith("layers.0.ssm") for path in readers)


def test_an_unknown_op_gets_no_remedy():
    model, inputs = fixture("toy.py:unknown_op")
    analysis = run(model, inputs, spec="unknown", options=Options())
    tried = remedies.candidates(analysis, "UnknownOpBlock")
    assert tried and all(r.q_after is None for r in tried)  # a norm never certifies an unknown op
    assert remedies.propose(analysis, "UnknownOpBlock") == []


def _trains(remedied: nn.Module, model: nn.Module, inputs: tuple) -> None:
    output = remedied(*inputs)
    assert isinstance(output, torch.Tensor) and output.shape == model(*inputs).shape
    output.square().mean().backward()
    grads = [p.grad for p in remedied.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(
    "kind, q",
    [("preln", 0.0), ("periln", 0.0), ("norm_primitive", 0.0), ("linear_growth", 1.0)],
)
def test_remedied_mamba_trains_and_relints_clean(mamba, kind, q):
    remedied = remedies.apply(mamba, kind)  # every failing block
    _trains(remedied, mamba.model, mamba.inputs)
    report = qlint.analyze(remedied, mamba.inputs)
    assert report.verdict == "certified" and [b.q for b in report.blocks] == [q, q]


@pytest.mark.parametrize(
    "name, kind, q",
    [
        ("llama.py:swiglu_block_without_norm", "preln", 0.0),
        ("llama.py:swiglu_block_without_norm", "gate_sigmoid", 1.0),
        ("toy.py:poly_mlp", "lipschitz_activation", 1.0),
        ("toy.py:poly_mlp", "norm_primitive", 0.0),
        ("toy.py:exp_unbounded", "bounded_exp", 0.0),
    ],
)
def test_qlint_remedy_returns_a_module_that_trains_and_relints_clean(name, kind, q):
    model, inputs = fixture(name)
    remedied = qlint.remedy(model, inputs, kind=kind)
    assert type(remedied).__name__ == type(model).__name__
    assert remedied is not model and sum(p.numel() for p in remedied.parameters()) >= sum(p.numel() for p in model.parameters())
    _trains(remedied, model, inputs)
    report = qlint.analyze(remedied, inputs)
    assert report.verdict == "certified" and report.max_q == q


def test_remedied_hymba_trains_and_relints_clean(hymba):
    remedied = remedies.apply(hymba, "preln")
    _trains(remedied, hymba.model, hymba.inputs)
    assert qlint.analyze(remedied, hymba.inputs).max_q == 0.0


def test_remedy_does_not_touch_the_original_weights(poly):
    remedied = remedies.apply(poly, "lipschitz_activation")
    original = {name: p.detach().clone() for name, p in poly.model.named_parameters()}
    optimizer = torch.optim.SGD(remedied.parameters(), lr=0.1)
    remedied(*poly.inputs).sum().backward()
    optimizer.step()
    assert all(torch.equal(p, original[name]) for name, p in poly.model.named_parameters())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "layernorm"}, "unknown remedy kind 'layernorm'; expected one of preln, periln"),
        ({"kind": "preln", "block": "layers.9"}, "unknown block 'layers.9'; blocks: PolyMLP"),
        ({"kind": "bounded_exp"}, "remedy 'bounded_exp' does not apply to block `PolyMLP`: the highest-q primitive is not an exponential"),
    ],
)
def test_bad_requests_raise_value_error(poly, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        remedies.apply(poly, **kwargs)


def test_a_certified_model_has_nothing_to_remedy():
    model, inputs = fixture("toy.py:lipschitz_mlp")
    with pytest.raises(ValueError, match="every block is already certified"):
        qlint.remedy(model, inputs)


def test_report_json_and_terminal_show_remedies_only_when_asked():
    spec = str(ROOT / "fixtures/toy.py:poly_mlp")
    plain = check([spec]).models[0]
    assert "remedies" not in plain.blocks[0].extra
    assert "--show-remedies" in plain.findings[0].message
    report = qlint.check([spec], remedies=True, isolated=True)
    entries = report.to_dict()["models"][0]["blocks"][0]["remedies"]
    assert [e["kind"] for e in entries] == ["lipschitz_activation", "preln", "norm_primitive", "periln"]
    assert set(entries[0]) == {"kind", "target", "q_after", "new_params", "new_nodes", "sketch", "source"}
    assert (entries[0]["q_after"], entries[0]["new_params"]) == (1.0, 0)
    text = render_full(report, width=200)
    assert "remedy (lipschitz_activation) → q = 1, +0 params: h ** 3 → F.gelu(h)" in text
    assert "toy.py:" in text.split("remedy (lipschitz_activation)")[1].splitlines()[0]
    assert "remedy (" not in render_full(check([spec]), width=200)


def test_an_uncertifiable_block_says_so_in_the_report():
    report = qlint.check([str(ROOT / "fixtures/toy.py:unknown_op")], remedies=True, isolated=True)
    assert report.models[0].blocks[0].extra["remedies"] == []
    assert "no remedy qlint tried certifies UnknownOpBlock" in render_full(report, width=200)


def test_cli_show_remedies():
    from qlint.cli import main

    result = CliRunner().invoke(main, ["check", str(ROOT / "fixtures/llama.py:swiglu_block_without_norm"), "--show-remedies", "--isolated"])
    assert result.exit_code == 1, result.output  # remedies are proposals: the block still fails
    assert "remedy (gate_sigmoid) → q = 1, +0 params" in result.output
    assert "remedy (preln) → q = 0, +32 params" in result.output
