"""``qlint probe --loop``: a looped recurrence at its fixed point (source 003, Section 5.3)."""

import json
import sys

import pytest
import torch
from click.testing import CliRunner

from qlint.cli import main
from qlint.probe.loops import LoopMap, LoopSettings, probe_loops
from qlint.probe.measure import ProbeError
from tests.conftest import FIXTURES, fixture_spec

sys.path.insert(0, str(FIXTURES))
import looped  # noqa: E402  (fixtures/looped.py)
import placement  # noqa: E402  (fixtures/placement.py)

sys.path.remove(str(FIXTURES))



@pytest.fixture(scope="module")
def low_carry():
    """The constrained fixture at rho = 0.3, probed once."""
    [probe] = probe_loops(*looped.constrained())
    return probe


def test_low_carry_is_contractive_but_non_normal(low_carry):
    """003, Table 3: at low carry ||J_G||_2 > 1 while rho_spec < 1."""
    assert low_carry.path == "block" and low_carry.iterations == 8
    assert low_carry.carry_rho == pytest.approx(0.3)
    assert low_carry.orbit == "settled" and low_carry.residuals[-1] < 1e-10
    assert low_carry.rho_spec < 1 < low_carry.operator_norm
    assert low_carry.gap == pytest.approx(low_carry.operator_norm - low_carry.rho_spec)
    assert low_carry.gap > 0.5
    assert low_carry.findings == []


def test_residuals_shrink_geometrically_at_the_spectral_rate(low_carry):
    tail = low_carry.residuals[-10:]
    rate = (tail[-1] / tail[0]) ** (1 / 9)
    assert rate == pytest.approx(low_carry.rho_spec, abs=0.05)


def test_matrix_free_estimates_match_the_dense_jacobian():
    from qlint.analysis import Options
    from qlint.probe.loops import iterate
    from qlint.probe.measure import jvp_power_iteration, operator_norm, trace_float64
    from qlint.lint.looped import find_loops

    analysis, trajectory = trace_float64(*looped.constrained(), spec="constrained", options=Options())
    loop_map = LoopMap(trajectory, find_loops(analysis)[0])
    h, _, orbit = iterate(loop_map, LoopSettings())
    assert orbit == "settled"
    dense = torch.autograd.functional.jacobian(loop_map, h, vectorize=True).reshape(h.numel(), h.numel())
    assert jvp_power_iteration(loop_map, h, 200) == pytest.approx(float(torch.linalg.eigvals(dense).abs().max()), abs=0.005)
    assert operator_norm(loop_map, h, 50) == pytest.approx(float(torch.linalg.matrix_norm(dense, 2)), rel=1e-4)


def test_min_token_spread_is_read_at_the_blocks_first_norm(low_carry):
    assert low_carry.spread_at == "input of `block.ln_1`"
    assert 0 < low_carry.min_spread < 10


def test_high_carry_leaves_a_thin_margin():
    [probe] = probe_loops(*looped.constrained_high_carry(), settings=LoopSettings(max_iterations=400, power_iterations=100))
    assert probe.carry_rho == pytest.approx(0.99)
    assert probe.orbit == "converging"
    assert probe.margin < 0.05
    [finding] = probe.findings
    assert finding.code == "QL304" and finding.severity == "warning" and finding.block == "block"
    assert "spectral margin 1 - rho_spec" in finding.message


def test_identity_in_the_increment_diverges():
    [probe] = probe_loops(*looped.identity_increment())
    assert probe.carry_rho == pytest.approx(1.3)  # Ā + I
    assert probe.orbit == "diverging" and probe.rho_spec is None
    [finding] = probe.findings
    assert finding.code == "QL305"
    assert finding.message.startswith("looped recurrence `block` does not settle after")
    assert finding.message.endswith("it diverges")


def test_cli_without_loop_exits_2_with_one_line():
    result = CliRunner().invoke(main, ["probe", "--loop", fixture_spec("placement.py:pre_ln")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "no looped recurrence found" in result.output


@pytest.mark.slow
def test_cli_json_reports_the_numbers():
    result = CliRunner().invoke(main, ["probe", "--loop", "--threads", "1", "--format", "json", fixture_spec("looped.py:constrained")])
    assert result.exit_code == 0, result.output
    [model] = json.loads(result.output)["models"]
    [loop] = model["loops"]
    assert loop["loop"] == "block" and loop["orbit"] == "settled"
    assert loop["rho_spec"] < 1 < loop["operator_norm"]
    assert loop["final_residual"] < 1e-10 and len(loop["residuals"]) == loop["probe_iterations"]


def test_a_model_without_loops_is_a_probe_error_naming_the_spec():
    with pytest.raises(ProbeError, match="^Stack: no looped recurrence found"):
        probe_loops(*placement.pre_ln())
