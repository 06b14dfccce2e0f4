"""qlint probe: velocity evaluation, measured exponents, bounds, init diagnostics, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from qlint.analysis import Options
from qlint.cli import main
from qlint.loader import load
from qlint.probe.measure import (
    ProbeSettings,
    measure_block,
    measure_model,
    probe_model,
    trace_float64,
)
from qlint.velocity.field import Trajectory, VelocityField
from qlint.probe.spectral import log_norm, operator_norm, stable_norm
from qlint.probe.init import nonlinearity_gain
from qlint.zoo import toy

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FEW_DIRECTIONS = ProbeSettings(random_directions=2, power_iterations=10)



def spec(name: str) -> str:
    return str(FIXTURES / name)


def loaded(name: str):
    fixture = load(spec(name))
    return fixture.model, fixture.inputs


@pytest.fixture(scope="module")
def native_mamba():
    """The float64 trace of the native Mamba fixture (export: the slowest trace here)."""
    model, inputs = loaded("mamba.py:native")
    return trace_float64(model, inputs, spec="native", options=Options())


# --- the velocity as a function -------------------------------------------------------


def _check_reproduces_forward(analysis, trajectory: Trajectory) -> None:
    assert analysis.stream.blocks
    for residual in analysis.stream.blocks:
        field = VelocityField(trajectory, residual)
        stream = trajectory.values[residual.stream]
        expected = trajectory.values[residual.join] - stream
        assert stream.dtype == torch.float64
        torch.testing.assert_close(field(stream), expected, rtol=1e-12, atol=1e-12)


def test_velocity_reproduces_the_forward_pass_of_an_exported_graph(native_mamba):
    _check_reproduces_forward(*native_mamba)


def test_velocity_reproduces_the_forward_pass_with_token_ids():
    model, inputs = loaded("gpt2.py:build_model")
    analysis, trajectory = trace_float64(model, inputs, spec="gpt2", options=Options())
    assert trajectory.values[next(n for n in analysis.traced.graph.nodes if n.op == "placeholder")].dtype == torch.int64
    _check_reproduces_forward(analysis, trajectory)


def test_velocity_is_a_function_of_the_stream_alone(native_mamba):
    analysis, trajectory = native_mamba
    field = VelocityField(trajectory, analysis.stream.blocks[1])
    x = field.stream
    assert not torch.equal(field(2 * x), 2 * field(x))  # q = 5: not homogeneous of degree 1
    torch.testing.assert_close(field(x), field(x.clone()))


# --- measured exponents on the fixtures -----------------------------------------------


def test_native_mamba_measures_five(native_mamba):
    analysis, trajectory = native_mamba
    for index, (residual, block) in enumerate(zip(analysis.stream.blocks, analysis.report.blocks)):
        probe = measure_block(trajectory, residual, block.q, ProbeSettings(random_directions=4), index)
        assert probe.q_static == 5.0
        assert probe.q_measured == pytest.approx(5.0, abs=0.05)
        assert probe.agrees and probe.agreement == "exact" and probe.asymptotic
        assert probe.failed_samples == 0
        labels = [fit.label for fit in probe.fits]
        assert labels[:4] == ["random 0", "random 1", "random 2", "random 3"] and len(probe.slopes) == len(labels)
        assert {"ones", "alternating", "rows_equal", "one entry zero", "single token", "null0[:1]"} <= set(labels)


@pytest.mark.parametrize(
    "name, q",
    [
        ("mamba.py:linear_growth", 1.0),
        ("mamba.py:rmsnorm", 0.0),
        ("llama.py:swiglu_block_without_norm", 2.0),
        ("llama.py:swiglu_block_with_norm", 0.0),
        ("gpt2.py:build_model", 0.0),
        ("toy.py:poly_mlp", 3.0),
    ],
)
def test_measured_exponent_matches_static(name, q):
    blocks = measure_model(*loaded(name), FEW_DIRECTIONS)
    assert blocks
    for block in blocks:
        assert block.q_static == q
        assert block.q_measured == pytest.approx(q, abs=0.05)
        assert block.agreement == "exact"


def test_unbounded_velocity_fails_samples_instead_of_fitting():
    (block,) = measure_model(*loaded("toy.py:sinh"), FEW_DIRECTIONS)
    assert block.q_static == math.inf
    assert block.failed_samples > 0 and block.q_measured is None
    assert block.agrees is True and block.agreement == "n/a"


def test_misdeclared_primitive_is_a_violation(tmp_path):
    """A user declaration that is wrong (x^3 declared bounded) is what the probe catches."""
    module = tmp_path / "misdeclared.py"
    module.write_text(
        "import torch\nfrom torch import nn\nimport qlint\n"
        "class Cube(nn.Module):\n    def forward(self, x):\n        return x ** 3\n"
        "qlint.register(Cube, q=0, why='deliberately wrong')\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.w1, self.cube, self.w2 = nn.Linear(6, 6), Cube(), nn.Linear(6, 6)\n"
        "    def forward(self, x):\n        return x + self.w2(self.cube(self.w1(x)))\n"
        "def build_model():\n    torch.manual_seed(0)\n    return Block(), (torch.randn(2, 3, 6),)\n"
    )
    result = CliRunner().invoke(main, ["probe", f"{module}:build_model", "--format", "json", "--directions", "2", "--iterations", "2"])
    assert result.exit_code == 1, result.output
    model = json.loads(result.stdout)["models"][0]
    (block,) = model["blocks"]
    assert block["q"] == 0.0 and block["agrees"] is False and block["agreement"] == "VIOLATION"
    assert block["q_measured"] == pytest.approx(3.0, abs=0.05)
    assert model["soundness_violations"] == [{"block": "Block", "q": 0.0, "q_measured_max": pytest.approx(3.0, abs=0.05)}]
    full = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["probe", f"{module}:build_model", "--directions", "2", "--iterations", "2"])
    assert full.exit_code == 1 and "SOUNDNESS BUG: Block grows like α^3.0" in full.stdout


def _probe_json(tmp_path, source: str, *extra: str) -> tuple[int, dict]:
    module = tmp_path / "witness_case.py"
    module.write_text("import torch\nfrom torch import nn\nimport qlint\n" + source)
    result = CliRunner().invoke(main, ["probe", f"{module}:build_model", "--format", "json", "--directions", "2", "--iterations", "2", *extra])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)["models"][0]


_BLOCK = (
    "class Block(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n        self.inner = Inner()\n"
    "    def forward(self, x):\n        return x + self.inner(x)\n"
    "def build_model():\n    torch.manual_seed(0)\n    return Block(), (torch.randn(2, 3, 6),)\n"
)


def test_overflow_under_a_finite_bound_is_a_violation(tmp_path):
    """exp declared bounded: the samples overflow to inf; that is a violation, never agreement."""
    code, model = _probe_json(
        tmp_path,
        "class Inner(nn.Module):\n    def forward(self, x):\n        return torch.exp(x)\n"
        "qlint.register(Inner, q=0, why='deliberately wrong')\n" + _BLOCK,
    )
    (block,) = model["blocks"]
    assert code == 1 and block["q"] == 0.0 and block["agreement"] == "VIOLATION"
    assert block["nonfinite_samples"] > 0 and block["worst"]["nonfinite_at"] is not None


def test_null_space_direction_witnesses_a_gate_that_stops_closing(tmp_path):
    """x * exp(-(w.x)^2) decays along random directions but is the identity on w's null space."""
    code, model = _probe_json(
        tmp_path,
        "class Inner(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.w = nn.Linear(6, 1, bias=False)\n"
        "    def forward(self, x):\n        return x * torch.exp(-self.w(x) ** 2)\n"
        "qlint.register(Inner, q=0, why='deliberately wrong: bounded only off the null space of w')\n" + _BLOCK,
        "--no-perturb",
    )
    (block,) = model["blocks"]
    assert code == 1 and block["agreement"] == "VIOLATION"
    assert block["directions"]["random 0"] is None  # v -> 0: no power law along a random direction
    assert block["directions"]["null0[:1]"] == pytest.approx(1.0, abs=0.05)
    assert block["worst"]["direction"].startswith("null0")


def test_parameter_perturbation_witnesses_a_zero_initialised_branch(tmp_path):
    """g * x with g = 0 at init declared bounded: as built v = 0; redrawn, v grows linearly."""
    source = (
        "class Inner(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.g = nn.Parameter(torch.zeros(6))\n"
        "    def forward(self, x):\n        return self.g * x\n"
        "qlint.register(Inner, q=0, why='deliberately wrong: zero only at init')\n" + _BLOCK
    )
    code, model = _probe_json(tmp_path, source)
    (block,) = model["blocks"]
    assert code == 1 and block["agreement"] == "VIOLATION"
    assert block["perturbations"]["redrawn"] == pytest.approx(1.0, abs=0.05)
    assert "as built" not in block["perturbations"]  # v = 0 everywhere: no slope as built
    assert block["eager_module"] == ""  # the root module is the block; `inner` returns the update alone
    code, model = _probe_json(tmp_path, source, "--no-perturb")
    assert code == 0 and model["blocks"][0]["agreement"] == "n/a"


_DISGUISED = (
    "def tracing():\n    return torch.fx._symbolic_trace.is_fx_tracing() or torch.compiler.is_exporting()\n"
    "class Block(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n        self.w = nn.Linear(6, 6)\n"
    "    def forward(self, x):\n"
    "        h = self.w(x)\n"
    "        if tracing():\n            return x + torch.tanh(h)\n"
    "        return x + torch.where(h.abs() < 100, torch.tanh(h), h * h)  # the same at unit scale\n"
    "def build_model():\n    torch.manual_seed(0)\n    return Block(), (torch.randn(2, 3, 6),)\n"
)


@pytest.mark.parametrize("nested", [False, True])
def test_a_model_that_disguises_itself_when_traced_is_refused(tmp_path, nested):
    """The traced graph says q = 0, the model grows like x^2 beyond |h| = 100: the eager model runs ops
    (abs, where, mul) the graph does not, and the graph is compared with the model at inputs scaled by
    1e3, before anything is analysed; so check and probe both refuse it (exit 2), with or without a
    submodule for the block."""
    source = _DISGUISED
    if nested:
        source = source.replace("class Block(nn.Module):", "class Inner(nn.Module):").replace(
            "def build_model():", "class Outer(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.inner = Inner()\n"
            "    def forward(self, x):\n        return self.inner(x) * 1.0\ndef build_model():"
        ).replace("return Block()", "return Outer()")
    spec = _write(tmp_path, source)
    for args in (["check", spec, "--isolated"], ["probe", spec, "--directions", "1", "--iterations", "2", "--no-perturb"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert "could not trace" in result.stderr
        assert "the model runs ops on the example that the graph does not (`abs` x1" in result.stderr


def _write(tmp_path, source: str) -> str:
    module = tmp_path / "disguised.py"
    module.write_text("import torch\nfrom torch import nn\n" + source)
    return f"{module}:build_model"


# --- norms and power iteration --------------------------------------------------------


def test_norms_are_overflow_safe():
    huge = torch.full((100,), 1e300, dtype=torch.float64)
    assert torch.isinf(huge.norm())
    assert log_norm(huge) == pytest.approx(math.log(1e300) + math.log(10.0))
    assert stable_norm(huge) == pytest.approx(1e301)  # finite where torch's norm overflowed
    assert stable_norm(torch.full((100,), 1e308, dtype=torch.float64)) == math.inf
    assert log_norm(torch.zeros(3)) == -math.inf
    assert log_norm(torch.tensor([1.0, math.inf])) is None and math.isnan(stable_norm(torch.tensor([math.nan])))
    assert stable_norm(torch.tensor([3.0, 4.0])) == pytest.approx(5.0)


def test_operator_norm_is_the_largest_singular_value():
    torch.manual_seed(0)
    left, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    right, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    matrix = left[:, :4] @ torch.diag(torch.tensor([3.0, 1.0, 0.5, 0.1], dtype=torch.float64)) @ right.T
    x = torch.randn(4, dtype=torch.float64)
    assert operator_norm(lambda v: matrix @ v, x, iters=50) == pytest.approx(3.0, rel=1e-6)
    assert operator_norm(lambda v: torch.tanh(v), torch.zeros(4, dtype=torch.float64)) == pytest.approx(1.0)


# --- model level: bounds, init diagnostics, CLI ---------------------------------------


def test_gpt2_bounds_and_overflow_depths():
    result = probe_model(*loaded("gpt2.py:build_model"), spec="gpt2", settings=FEW_DIRECTIONS)
    bounds = result.bounds
    assert bounds.forward_rule == "eq. 38" and bounds.depth == 4
    assert bounds.forward == pytest.approx(bounds.x0_norm + sum(block.b for block in result.blocks))  # q = 0: ||X_0|| + sum b_k
    assert bounds.backward == pytest.approx(math.prod(1 + block.lipschitz for block in result.blocks))
    assert all(block.c == 0.0 and block.b > 0 and block.lipschitz > 0 for block in result.blocks)
    depths = bounds.overflow_depths
    assert 1000 < depths["float16"] < depths["bfloat16"] < depths["float32"]
    assert [layer.name for layer in result.init.stack] == ["h.0:attn", "h.0:mlp", "h.1:attn", "h.1:mlp"]
    assert [branch.projection for branch in result.init.branches] == ["h.0.attn.out_proj", "h.0.mlp.2", "h.1.attn.out_proj", "h.1.mlp.2"]
    assert not any(branch.scaled for branch in result.init.branches)  # default init: not 1/sqrt(2L)
    gains = {gain.name: gain for gain in result.init.gains}
    assert gains["h.0.mlp.0"].nonlinearity == "gelu" and gains["h.0.attn.q_proj"].nonlinearity == "linear"


def test_exploding_block_is_flagged_by_name():
    torch.manual_seed(0)
    model = toy.StackOf(toy.LipschitzMLP, 3, 16)
    with torch.no_grad():
        model.layers[1].w2.weight.mul_(30.0)
    result = probe_model(model, (torch.randn(4, 5, 16),), spec="stack", settings=FEW_DIRECTIONS)
    assert result.init.flags and result.init.flags[0].startswith("layers.1: activation RMS x")
    assert "(exploding)" in result.init.flags[0]
    assert not any(flag.startswith("layers.0") for flag in result.init.flags)


class ReluMLP(toy.ToyBlock):
    def act(self, h: torch.Tensor) -> torch.Tensor:
        return torch.relu(h)


def test_branch_scaling_and_layer_gain_at_criticality():
    torch.manual_seed(0)
    model = toy.StackOf(ReluMLP, 4, 256)
    for layer in model.layers:
        nn.init.kaiming_normal_(layer.w1.weight, nonlinearity="relu")
        nn.init.normal_(layer.w2.weight, std=1.0 / math.sqrt(256) / math.sqrt(4))  # 1/sqrt(2L), 2L = 4 branches
    result = probe_model(model, (torch.randn(2, 3, 256),), spec="relu", settings=ProbeSettings(random_directions=1, power_iterations=2))
    assert all(branch.scaled for branch in result.init.branches)
    gain = next(g for g in result.init.gains if g.name == "layers.0.w1")
    assert gain.nonlinearity == "relu" and gain.gain_source == "calculate_gain"
    assert gain.nonlinearity_gain == pytest.approx(math.sqrt(2.0))
    assert gain.effective == pytest.approx(1.0, abs=0.05)


def test_nonlinearity_gain_outside_calculate_gain_is_the_gaussian_moment():
    z = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gain, source = nonlinearity_gain("gelu")
    assert source == "E[phi(z)^2]"
    assert gain == pytest.approx(float(torch.nn.functional.gelu(z).pow(2).mean().rsqrt()), rel=2e-3)
    assert nonlinearity_gain("tanh") == (pytest.approx(5.0 / 3.0), "calculate_gain")


def test_cli_json_carries_probe_keys():
    result = CliRunner().invoke(main, ["probe", spec("gpt2.py:build_model"), "--format", "json", "--directions", "2", "--seed", "3"])
    assert result.exit_code == 0, result.output
    model = json.loads(result.stdout)["models"][0]
    for block in model["blocks"]:
        assert block["q"] == 0.0 and block["q_measured"] == pytest.approx(0.0, abs=0.05)
        assert block["agrees"] is True and block["q_measured_spread"] < 0.05
        assert block["cost"]["evaluations"] > 0 and block["lipschitz"] > 0
    assert model["bounds"]["forward_rule"] == "eq. 38" and model["bounds"]["forward"] > model["bounds"]["x0_norm"]
    assert set(model["overflow_depth"]) == {"float16", "bfloat16", "float32"}
    assert model["soundness_violations"] == []
    assert [layer["name"] for layer in model["init"]["stack"]] == ["h.0:attn", "h.0:mlp", "h.1:attn", "h.1:mlp"]


def test_cli_full_output_prints_bounds():
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["probe", spec("gpt2.py:build_model"), "--directions", "1", "--iterations", "3"])
    assert result.exit_code == 0, result.output
    for text in ("forward bound  ||X_D|| <=", "(eq. 38;", "backward bound ||J_0:D|| <=", "overflow depth float16", "every measured exponent is within"):
        assert text in result.stdout


def test_meta_models_are_refused_in_one_line():
    result = CliRunner().invoke(main, ["probe", spec("gpt2.py:build_model"), "--device", "meta"])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("qlint: error: probe evaluates the model, but it was built on the meta device")


def test_models_without_inputs_are_refused(tmp_path):
    module = tmp_path / "bare.py"
    module.write_text("from torch import nn\nmodel = nn.Linear(3, 3)\n")
    result = CliRunner().invoke(main, ["probe", f"{module}:model"])
    assert result.exit_code == 2 and result.stderr.startswith("qlint: error: probe needs example inputs")


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, q",
    [
        ("mamba.py:native", 5.0),
        ("mamba.py:linear_growth", 1.0),
        ("mamba.py:rmsnorm", 0.0),
        ("mamba.py:preln", 0.0),
        ("mamba.py:periln", 0.0),
        ("llama.py:with_norm", 0.0),
        ("hymba.py:build_model", 0.0),
        ("hymba.py:ssm_unnormed", 5.0),
        ("patchtst.py:free", 1.0),
        ("patchtst.py:rmsnorm", 0.0),
        ("patchtst.py:preln", 0.0),
        ("patchtst.py:periln", 0.0),
        ("toy.py:lipschitz_mlp", 1.0),
        ("toy.py:bounded_exp", 1.0),
    ],
)
def test_every_fixture_agrees(name, q):
    for block in measure_model(*loaded(name), FEW_DIRECTIONS):
        assert block.q_static == q and block.q_measured == pytest.approx(q, abs=0.05) and block.agreement == "exact"


@pytest.mark.slow
def test_llama_without_norm_mixes_exponents():
    blocks = measure_model(*loaded("llama.py:without_norm"), FEW_DIRECTIONS)
    assert [(b.name, b.q_static) for b in blocks] == [("layers.0:self_attn", 1.0), ("layers.0:mlp", 2.0), ("layers.1:self_attn", 1.0), ("layers.1:mlp", 2.0)]
    assert all(b.agreement == "exact" for b in blocks)


def test_nan_weights_are_one_line_and_exit_2(tmp_path):
    module = tmp_path / "nan.py"
    module.write_text(
        "import torch\nfrom torch import nn\n"
        "class Block(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.w = nn.Linear(4, 4)\n"
        "    def forward(self, x):\n        return x + self.w(x)\n"
        "def build_model():\n    m = Block()\n    with torch.no_grad():\n        m.w.weight[0, 0] = float('nan')\n    return m, (torch.randn(2, 4),)\n"
    )
    result = CliRunner().invoke(main, ["probe", f"{module}:build_model"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "qlint: error: the parameter `w.weight` holds inf or nan: nothing to measure"


class _Residuals(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def test_a_stack_pass_that_cannot_run_degrades_to_a_flag(monkeypatch):
    """A graph autograd cannot replay (timm's ResNet in train mode: an in-place running-stat update) loses
    the stack figures, not the probe."""
    from qlint.probe import init

    def fails(analysis, seed):
        raise RuntimeError("one of the variables needed for gradient computation has been modified by an inplace operation")

    analysis, _ = trace_float64(_Residuals(), (torch.randn(2, 8),), spec="residuals", options=Options())
    monkeypatch.setattr(init, "_stack", fails)
    diagnostics = init.diagnose(analysis, 0)
    assert diagnostics.stack == [] and len(diagnostics.branches) == 2
    assert diagnostics.flags == ["the RMS pass through the stack could not run (one of the variables needed for gradient "
                                 "computation has been modified by an inplace operation): no stack figures"]
