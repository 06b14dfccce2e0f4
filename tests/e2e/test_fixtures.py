"""Exact per-block exponents of every bundled fixture (issue 2, item 8)."""

import math

import pytest

EXPECTED = {
    # spec: {block name: q}
    "mamba.py:native": {"layers.0": 5, "layers.1": 5},
    "mamba.py:rmsnorm": {"layers.0": 0, "layers.1": 0},
    "mamba.py:preln": {"layers.0": 0, "layers.1": 0},
    "mamba.py:periln": {"layers.0": 0, "layers.1": 0},
    "mamba.py:linear_growth": {"layers.0": 1, "layers.1": 1},
    "gpt2.py:build_model": {f"h.{i}:{part}": 0 for i in range(2) for part in ("attn", "mlp")},
    "patchtst.py:free": {f"layers.{i}:{part}": 1 for i in range(2) for part in ("attn", "ffn")},
    "patchtst.py:rmsnorm": {f"layers.{i}:{part}": 0 for i in range(2) for part in ("attn", "ffn")},
    "patchtst.py:preln": {f"layers.{i}:{part}": 0 for i in range(2) for part in ("attn", "ffn")},
    "patchtst.py:periln": {f"layers.{i}:{part}": 0 for i in range(2) for part in ("attn", "ffn")},
    "llama.py:with_norm": {f"layers.{i}:{part}": 0 for i in range(2) for part in ("self_attn", "mlp")},
    "llama.py:without_norm": {"layers.0:self_attn": 1, "layers.0:mlp": 2, "layers.1:self_attn": 1, "layers.1:mlp": 2},
    "llama.py:swiglu_block_with_norm": {"SwiGLUResidual": 0},
    "llama.py:swiglu_block_without_norm": {"SwiGLUResidual": 2},
    "hymba.py:build_model": {"layers.0": 0, "layers.1": 0},
    "hymba.py:ssm_unnormed": {"layers.0": 5, "layers.1": 5},
    "toy.py:poly_mlp": {"PolyMLP": 3},
    "toy.py:lipschitz_mlp": {"LipschitzMLP": 1},
    "toy.py:bounded_exp": {"BoundedExpBlock": 1},
}

VERDICT = {0: "certified", 1: "certified", 2: "supercritical", 3: "supercritical", 5: "supercritical"}


@pytest.mark.parametrize("spec", sorted(EXPECTED))
def test_exact_exponent_of_every_block(lint, spec):
    report = lint(spec)
    assert {b.name: b.q for b in report.blocks} == EXPECTED[spec]
    assert report.verdict == VERDICT[max(EXPECTED[spec].values())]
    assert report.max_q == max(EXPECTED[spec].values())
    assert all(b.form == "additive" for b in report.blocks)


@pytest.mark.parametrize(
    ("spec", "tracer"),
    [("mamba.py:native", "export"), ("hymba.py:build_model", "export"), ("gpt2.py:build_model", "symbolic_trace")],
)
def test_python_loops_fall_back_to_export(lint, spec, tracer):
    report = lint(spec)
    assert report.tracer == tracer
    if tracer == "export":
        assert report.extra["trace_attempts"][0].startswith("symbolic_trace:")


def test_mamba_derivation_reads_like_the_paper(lint):
    """Δ q=1 → B̄ = Δ⊙B q=2 → B̄⊙x q=3 → state q=3 → y = C⊙h q=4 → gated q=5."""
    block = lint("mamba.py:native").block("layers.0")
    steps = [(s.primitive, s.q) for s in block.derivation]
    assert steps[0] == ("block input X_k", 1)
    assert ("Softplus", 1) in steps  # Δ = softplus(dt_proj(.))
    rising = [q for _, q in steps]
    assert rising == sorted(rising) and rising[-1] == 5
    assert [q for p, q in steps if p == "Hadamard product"] == [2, 3, 4, 5]
    lines = {s.q: s.source.line for s in block.derivation if s.primitive == "Hadamard product"}
    source = (block.derivation[1].source.file, block.derivation[1].source.line)
    assert source[0].endswith("qlint/zoo/mamba.py")
    text = open(source[0]).read().splitlines()
    assert "softplus" in text[source[1] - 1]
    assert "dBx" in text[lines[2] - 1] and "dBx" in text[lines[3] - 1]
    assert "gate" in text[lines[5] - 1]
    assert block.dominant == "Hadamard product"


def test_supercritical_finding_names_block_q_primitive_and_line(lint):
    report = lint("mamba.py:native")
    finding = report.findings[0]
    assert finding.code == "QL101" and finding.severity == "error"
    assert finding.block == "layers.0"
    assert "q = 5" in finding.message and "Hadamard product" in finding.message
    assert finding.source.file.endswith("qlint/zoo/mamba.py")
    assert "x + self.mixer(x)" in open(finding.source.file).read().splitlines()[finding.source.line - 1]


@pytest.mark.parametrize(
    ("spec", "code", "culprit"),
    [
        ("toy.py:sinh", "QL103", "sinh"),
        ("toy.py:exp_unbounded", "QL103", "exp"),
        ("toy.py:unknown_op", "QL102", "i0"),
    ],
)
def test_superpolynomial_and_unknown_ops_are_never_certified(lint, spec, code, culprit):
    report = lint(spec)
    (block,) = report.blocks
    assert block.status != "ok" and report.verdict != "certified"
    (finding,) = report.findings
    assert finding.code == code and finding.severity == "error" and culprit in finding.message
    if code == "QL103":
        assert math.isinf(block.q)
    else:
        assert block.q is None and any("i0" in op for op in block.unknown_ops)


def test_hymba_parallel_branches_form_one_block(lint):
    report = lint("hymba.py:ssm_unnormed")
    assert [b.name for b in report.blocks] == ["layers.0", "layers.1"]
    # the SSM branch alone is responsible for q = 5
    assert report.block("layers.0").derivation[-1].q == 5


def test_share_of_q1_blocks(lint):
    assert lint("patchtst.py:free").share_q1 == 1.0
    assert lint("llama.py:without_norm").share_q1 == 0.5
    assert lint("gpt2.py:build_model").share_q1 == 0.0
