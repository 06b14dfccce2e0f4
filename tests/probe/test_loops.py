"""``qlint probe --loop``: a looped recurrence at its fixed point (source 003, Section 5.3)."""

import io
import json
import math
import sys

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

from qlint.analysis import Options
from qlint.cli import main
from qlint.lint.looped import find_loops
from qlint.probe.loops import LoopMap, LoopSettings, jacobian_spectrum, print_loops, probe_loop, probe_loops
from qlint.probe.measure import ProbeError, trace_float64
from qlint.probe.spectral import arnoldi_spectral_radius, jacobian_matrix, lanczos_operator_norm
from conftest import FIXTURES, fixture_spec

sys.path.insert(0, str(FIXTURES))
import looped  # noqa: E402  (fixtures/looped.py)
import placement  # noqa: E402  (fixtures/placement.py)

sys.path.remove(str(FIXTURES))

DENSE_TOLERANCE = 1e-8  # relative: the probe's fixed point (residual 1e-10) against one iterated to 1e-12
CARRIES = {"constrained": 0.3, "constrained_097": 0.97, "two_layer_loop": 0.97}


class Reference:
    """One looped model traced once, with a fixed point and its Jacobian computed apart from the probe.

    The fixed point is iterated by a plain loop to a relative residual of 1e-12 (the probe
    stops at 1e-10), the Jacobian is taken by reverse-mode autograd (the probe uses forward
    mode) and decomposed by torch.linalg.eigvals and matrix_norm(ord=2).
    """

    def __init__(self, factory):
        self.name = factory.__name__
        self.analysis, self.trajectory = trace_float64(*factory(), spec=factory.__name__, options=Options())
        [self.loop] = find_loops(self.analysis)
        self.loop_map = LoopMap(self.trajectory, self.loop)
        h = self.loop_map.start
        with torch.no_grad():
            for _ in range(20_000):
                following = self.loop_map(h)
                settled = (following - h).norm() < 1e-12 * h.norm()
                h = following
                if settled:
                    break
        assert settled
        self.fixed_point = h
        n = h.numel()
        dense = torch.autograd.functional.jacobian(self.loop_map, h, vectorize=True).detach().reshape(n, n)
        self.rho_spec = float(torch.linalg.eigvals(dense).abs().max())
        self.operator_norm = float(torch.linalg.matrix_norm(dense, ord=2))


@pytest.fixture(scope="module", params=list(CARRIES))
def reference(request):
    """003's non-normal low carry (0.3), a carry of 0.97, and a two-block body at 0.97."""
    return Reference(getattr(looped, request.param))


@pytest.fixture(scope="module")
def probed(reference):
    """The probe, with its default settings, on the reference's trace."""
    return probe_loop(reference.analysis, reference.trajectory, reference.loop)


@pytest.fixture(scope="module")
def low_carry():
    """The constrained fixture at rho = 0.3, probed once."""
    [probe] = probe_loops(*looped.constrained())
    return probe


def test_low_carry_is_contractive_but_non_normal(low_carry):
    """003, Table 3: at low carry ||J_G||_2 > 1 while rho_spec < 1."""
    assert low_carry.path == "block" and low_carry.iterations == 8
    assert low_carry.carry_rho == pytest.approx(0.3)
    assert low_carry.orbit == "settled" and low_carry.fixed_point_reached and low_carry.residuals[-1] < 1e-10
    assert low_carry.rho_spec < 1 < low_carry.operator_norm
    assert low_carry.gap == pytest.approx(low_carry.operator_norm - low_carry.rho_spec)
    assert low_carry.gap > 0.5
    assert low_carry.verdict == "sufficient" and low_carry.findings == []


def test_residuals_shrink_geometrically_at_the_spectral_rate(low_carry):
    tail = low_carry.residuals[-10:]
    rate = (tail[-1] / tail[0]) ** (1 / 9)
    assert rate == pytest.approx(low_carry.rho_spec, abs=0.05)


def test_probe_reaches_the_fixed_point_and_matches_the_dense_reference(reference, probed):
    assert probed.fixed_point_reached and probed.residuals[-1] < 1e-10
    assert probed.method == "dense" and probed.jacobian == "exact (dense 512×512)"
    assert probed.rho_spec_error == 0.0 and probed.operator_norm_error == 0.0
    assert probed.rho_spec == pytest.approx(reference.rho_spec, rel=DENSE_TOLERANCE)
    assert probed.operator_norm == pytest.approx(reference.operator_norm, rel=DENSE_TOLERANCE)
    assert probed.margin == pytest.approx(1 - reference.rho_spec, rel=1e-6)


def test_dense_path_is_exact_at_the_same_point(reference):
    radius, norm = jacobian_spectrum(reference.loop_map, reference.fixed_point, LoopSettings())
    assert radius.method == norm.method == "dense"
    assert radius.value == pytest.approx(reference.rho_spec, rel=1e-12)
    assert norm.value == pytest.approx(reference.operator_norm, rel=1e-12)


def test_arnoldi_agrees_with_the_dense_jacobian_within_its_error_bar(reference):
    radius, norm = jacobian_spectrum(reference.loop_map, reference.fixed_point, LoopSettings(dense_limit=0))
    assert radius.method == norm.method == "arnoldi"
    assert 0 < radius.error < 1e-8 and 0 < norm.error < 1e-8
    assert abs(radius.value - reference.rho_spec) <= radius.error
    assert abs(norm.value - reference.operator_norm) <= norm.error


def test_non_normal_at_low_carry_thin_at_097(reference, probed):
    """003's regimes: ||J_G||_2 > 1 > rho_spec at carry 0.3 (no finding); a margin under 0.05 at 0.97, QL304."""
    assert probed.carry_rho == pytest.approx(CARRIES[reference.name])
    if probed.carry_rho < 0.5:
        assert probed.rho_spec < 1 < probed.operator_norm
        assert probed.verdict == "sufficient" and probed.findings == []
        return
    assert probed.margin < 0.05 and probed.verdict == "thin"
    [finding] = probed.findings
    assert finding.code == "QL304" and finding.block == reference.loop.path
    assert finding.message.startswith(
        f"looped recurrence `{reference.loop.path}`: spectral margin 1 - rho_spec = {probed.margin:.3g} < 0.05 at the fixed point")
    assert finding.message.endswith("; exact (dense 512×512))")


def test_two_layer_body_needs_more_than_the_old_budget():
    """The two-block loop at 0.97 settles after 1830 iterations: 1000 (the old budget) stop short of the fixed point."""
    [probe] = probe_loops(*looped.two_layer_loop(), settings=LoopSettings(max_iterations=1000))
    assert probe.path == "layers" and probe.orbit == "converging" and not probe.fixed_point_reached
    assert probe.margin is None and probe.verdict == "not yet at the fixed point"
    [finding] = probe.findings
    assert finding.code == "QL304"
    assert finding.message.startswith("looped recurrence `layers`: not yet at the fixed point after 1000 iterations")
    assert "no verdict on the spectral margin" in finding.message


def test_not_yet_at_the_fixed_point_is_said_instead_of_a_margin():
    [probe] = probe_loops(*looped.constrained(), settings=LoopSettings(max_iterations=5))
    assert probe.orbit == "converging" and not probe.fixed_point_reached and len(probe.residuals) == 5
    assert probe.rho_spec is not None and probe.margin is None
    report = probe.to_dict()
    assert report["fixed_point_reached"] is False
    assert report["spectral_margin"] is None and report["margin_verdict"] == "not yet at the fixed point"
    [finding] = probe.findings
    assert finding.code == "QL304"
    assert finding.message.startswith("looped recurrence `block`: not yet at the fixed point after 5 iterations (relative residual")
    assert "spectral margin 1 - rho_spec =" not in finding.message
    assert "1 − ρ_spec           │ not yet at the fixed point: no verdict" in _table({"m": [probe]})


def _table(results) -> str:
    """The rich report printed on an 80-column console."""
    out = io.StringIO()
    print_loops(results, console=Console(file=out, width=80, color_system=None))
    return out.getvalue()


def test_the_table_fits_80_columns_with_every_row_on_one_line(low_carry):
    arnoldi = probe_loops(*looped.constrained(), settings=LoopSettings(dense_limit=0))[0]
    text = _table({"dense": [low_carry], "arnoldi": [arnoldi]})
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 2 * 11 and all(line.count("│") == 3 for line in rows)  # no cell wrapped, none dropped
    assert "│ J_G measured         │ exact (dense 512×512)" in text
    assert "│ ρ_spec(J_G)          │ 0.6195242 (exact)" in text
    assert "│ J_G measured         │ Arnoldi: ρ_spec 1×80 JVPs, ‖J_G‖₂ 1×80 JVP+VJPs" in text
    assert f"│ ρ_spec(J_G)          │ 0.6195242 ± {arnoldi.rho_spec_error:.1g}" in text
    assert "│ fixed point          │ reached (relative residual" in text


def test_json_reports_method_error_bars_and_the_fixed_point(low_carry):
    report = low_carry.to_dict()
    assert report["fixed_point_reached"] is True and report["jacobian_method"] == "dense"
    assert report["jacobian"] == "exact (dense 512×512)"
    assert report["rho_spec_error"] == 0.0 and report["operator_norm_error"] == 0.0
    assert report["spectral_margin"] == pytest.approx(1 - low_carry.rho_spec, rel=1e-5)
    assert report["margin_verdict"] == "sufficient"


def test_min_token_spread_is_read_at_the_blocks_first_norm(low_carry):
    assert low_carry.spread_at == "input of `block.ln_1`"
    assert 0 < low_carry.min_spread < 10


def test_identity_in_the_increment_diverges():
    [probe] = probe_loops(*looped.identity_increment())
    assert probe.carry_rho == pytest.approx(1.3)  # Ā + I
    assert probe.orbit == "diverging" and probe.rho_spec is None
    assert probe.verdict == "no fixed point reached" and probe.margin is None
    [finding] = probe.findings
    assert finding.code == "QL305"
    assert finding.message.startswith("looped recurrence `block` does not settle after")
    assert finding.message.endswith("it diverges")


# --- the Jacobian helpers on matrices whose spectrum is known ----------------------------------


def _non_normal(n: int, off_diagonal: float) -> torch.Tensor:
    """Upper triangular: the eigenvalues are its diagonal, the largest 0.95; the off-diagonal sets how far from normal."""
    generator = torch.Generator().manual_seed(1)
    upper = torch.triu(torch.randn(n, n, generator=generator, dtype=torch.float64), diagonal=1)
    return off_diagonal * upper + torch.diag(torch.linspace(-0.5, 0.95, n, dtype=torch.float64))


def test_jacobian_matrix_by_vmap_and_column_by_column(monkeypatch):
    matrix = _non_normal(12, 1.0)
    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4)

    def fn(v):
        return torch.tanh(matrix @ v.reshape(-1)).reshape(3, 4)

    expected = torch.diag(1 - torch.tanh(matrix @ x.reshape(-1)) ** 2) @ matrix
    torch.testing.assert_close(jacobian_matrix(fn, x), expected, rtol=1e-14, atol=1e-14)

    def refuse(*args, **kwargs):
        raise RuntimeError("vmap: a data-dependent op")

    monkeypatch.setattr(torch.func, "vmap", refuse)
    torch.testing.assert_close(jacobian_matrix(fn, x), expected, rtol=1e-14, atol=1e-14)


def test_arnoldi_finds_the_spectral_radius_of_a_non_normal_matrix():
    matrix = _non_normal(30, 0.3)
    x = torch.zeros(30, dtype=torch.float64)
    assert float(torch.linalg.matrix_norm(matrix, ord=2)) > 2.5  # ||J||_2 > 2.5 > 0.95 = rho
    radius = arnoldi_spectral_radius(lambda v: matrix @ v, x, dimension=20)
    assert abs(radius.value - 0.95) <= radius.error < 1e-10
    assert radius.method == "arnoldi" and radius.detail == "5×20 JVPs"
    norm = lanczos_operator_norm(lambda v: matrix @ v, x, dimension=20)
    assert abs(norm.value - float(torch.linalg.matrix_norm(matrix, ord=2))) <= norm.error < 1e-9
    assert norm.detail == "1×20 JVP+VJPs"


def test_arnoldi_without_convergence_has_no_error_bar():
    """Far from normal, a small space and few cycles: the Ritz value is off by more than its residual says."""
    matrix = _non_normal(30, 1.0)
    radius = arnoldi_spectral_radius(lambda v: matrix @ v, torch.zeros(30, dtype=torch.float64), dimension=12, cycles=4)
    assert radius.detail == "4×12 JVPs, not converged"
    assert abs(radius.value - 0.95) > 0.1 and radius.error == math.inf


def test_a_margin_the_error_bar_does_not_clear_is_undecided():
    [probe] = probe_loops(*looped.constrained(), settings=LoopSettings(dense_limit=0, krylov_dimension=4, krylov_cycles=1))
    assert probe.fixed_point_reached and probe.margin > 0.05
    assert probe.rho_spec_error == math.inf and probe.jacobian.startswith("Arnoldi: ρ_spec 1×4 JVPs, not converged")
    assert probe.verdict == "undecided" and probe.to_dict()["rho_spec_error"] is None
    [finding] = probe.findings
    assert finding.code == "QL304"
    assert finding.message.startswith(f"looped recurrence `block`: spectral margin 1 - rho_spec = {probe.margin:.7g} ± inf, not shown >= 0.05,")


def test_arnoldi_is_exact_once_the_krylov_space_is_the_whole_space():
    rotation = torch.tensor([[0.6, -0.7], [0.7, 0.6]], dtype=torch.float64)  # eigenvalues 0.6 ± 0.7i
    radius = arnoldi_spectral_radius(lambda v: rotation @ v, torch.zeros(2, dtype=torch.float64), dimension=80)
    assert radius.value == pytest.approx(math.hypot(0.6, 0.7), rel=1e-14)
    assert radius.detail == "1×2 JVPs" and radius.error < 1e-14


# --- the command line ----------------------------------------------------------------------------


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
    assert loop["loop"] == "block" and loop["orbit"] == "settled" and loop["fixed_point_reached"] is True
    assert loop["rho_spec"] < 1 < loop["operator_norm"]
    assert loop["jacobian_method"] == "dense" and loop["rho_spec_error"] == 0.0
    assert loop["final_residual"] < 1e-10 and len(loop["residuals"]) == loop["probe_iterations"]


def test_a_model_without_loops_is_a_probe_error_naming_the_spec():
    with pytest.raises(ProbeError, match="^Stack: no looped recurrence found"):
        probe_loops(*placement.pre_ln())
