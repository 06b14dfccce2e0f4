"""``qlint probe --loop``: a looped recurrence measured at its fixed point (source 003).

The static rules QL301-QL303 look at the linear part of the loop map
G(h) = Ā ⊙ h + f(h, e). Whether the full map contracts is a property of its
Jacobian at the fixed point, which only running it tells: starting from the state
the model reaches on the example input, G is iterated in float64 until
||G(h) - h|| / ||h|| falls below the tolerance or 003's budget of 2×10⁴ iterations
runs out (near rho = 1 the approach is slow, and a Jacobian taken before the fixed
point is not the one that decides), then at the final h

* the spectral radius rho_spec(J_G), the asymptotic rate, and the operator norm
  ||J_G||_2; the gap between them measures non-normality (003, Table 3: at low
  carry ||J_G||_2 > 1 while rho_spec < 1). A state of up to ``dense_limit`` entries
  gets its dense Jacobian decomposed exactly; a larger one Arnoldi on JVPs, each
  figure with its error bar (:mod:`qlint.probe.spectral`);
* the smallest per-token spread (standard deviation over channels) of the input of
  the block's first normalization: LayerNorm's Jacobian is bounded by gamma / s(x),
  so an imploding token spikes the loop's gain (003, Section 6).

A thin spectral margin 1 - rho_spec < 0.05 at the fixed point (or one whose error bar
does not clear 0.05) is reported as QL304; a loop still converging when the budget
runs out gets no margin verdict, QL304 says it is not yet at the fixed point; a loop
that does not settle (bounded orbit or divergence) is QL305.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch
import torch.fx as fx

from qlint.analysis import Options
from qlint.growth.engine import Analysis, source_of
from qlint.core.graph import module_path, run_cone
from qlint.core.results import Finding
from qlint.lint.rule import rule
from qlint.lint.graph_queries import argument, is_normalizer
from qlint.lint.looped import Loop, carry_value, cone, find_loops
from qlint.probe.measure import ProbeError, significant, trace_float64
from qlint.velocity.field import Trajectory
from qlint.probe.spectral import Estimate, arnoldi_spectral_radius, dense_spectrum, lanczos_operator_norm, stable_norm


@dataclass(frozen=True)
class LoopSettings:
    """How long to iterate and how to measure the Jacobian.

    ``dense_limit`` is 2048 state entries: up to it J_G is formed (n JVPs, vectorised)
    and decomposed by LAPACK, exact but O(n³): eigvals of a 2048×2048 matrix takes
    about 5 s on one core, 4096 eight times that. Beyond it Arnoldi needs 80 to a few
    hundred JVPs.
    """

    max_iterations: int = 20_000  # 003 (Table 4) iterated 2×10⁴ times before calling an orbit bounded
    tolerance: float = 1e-10  # relative residual ||G(h) - h|| / ||h|| at which h is the fixed point
    dense_limit: int = 2048
    krylov_dimension: int = 80  # Arnoldi: the space's dimension ...
    krylov_cycles: int = 10  # ... rebuilt from the Ritz vector at most this many times ...
    krylov_tolerance: float = 1e-10  # ... until the error bar is below this, relative to the figure
    thin_margin: float = 0.05  # QL304 below this spectral margin
    divergence: float = 1e8  # ||h|| / ||h_start|| beyond which the orbit counts as diverging
    seed: int = 0


class LoopMap:
    """G(h): the loop's step re-run with its state set to h, everything else as recorded."""

    def __init__(self, trajectory: Trajectory, loop: Loop) -> None:
        order = {node: i for i, node in enumerate(trajectory.module.graph.nodes)}
        self.step = loop.step
        self.nodes = cone(self.step.state, self.step.root, order)
        self.trajectory = trajectory
        self.interpreter = fx.Interpreter(trajectory.module, garbage_collect_values=False)

    @property
    def start(self) -> torch.Tensor:
        """The state the model itself fed to its last iteration."""
        return self.trajectory.values[self.step.state]

    def values(self, h: torch.Tensor) -> dict[fx.Node, Any]:
        """Every cone node's value at state h."""
        return run_cone(self.interpreter, {self.step.state: h}, self.nodes, self.trajectory.values)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self.values(h)[self.step.root]


@dataclass
class LoopProbe:
    """What the probe measured on one looped recurrence."""

    path: str
    form: str
    iterations: int  # the model's own
    carry_rho: Optional[float]  # max |Ā| (1 for a unit carry), None when not computable
    residuals: list[float]  # relative ||G(h) - h|| / ||h|| per probe iteration
    orbit: str  # "settled", "converging", "growing", "bounded orbit" or "diverging" (see :func:`iterate`)
    rho_spec: Optional[float] = None  # of J_G at the final iterate: the fixed point only when it was reached
    rho_spec_error: Optional[float] = None  # at that iterate; 0.0 on the dense path (exact up to round-off)
    operator_norm: Optional[float] = None
    operator_norm_error: Optional[float] = None
    method: str = ""  # "dense" or "arnoldi"
    jacobian: str = ""  # how J_G was measured, in words
    verdict: str = ""  # on the margin: thin, sufficient, undecided, not yet at the fixed point, no fixed point reached
    min_spread: Optional[float] = None
    spread_at: str = ""
    findings: list[Finding] = field(default_factory=list)

    @property
    def settles(self) -> bool:
        """Reached the tolerance, or still contracting when the budget ran out."""
        return self.orbit in ("settled", "converging")

    @property
    def fixed_point_reached(self) -> bool:
        return self.orbit == "settled"

    @property
    def margin(self) -> Optional[float]:
        """1 - rho_spec at the fixed point; None before it is reached: there is no margin to judge."""
        if not self.fixed_point_reached or self.rho_spec is None or not math.isfinite(self.rho_spec):
            return None
        return 1 - self.rho_spec

    @property
    def gap(self) -> Optional[float]:
        """||J_G||_2 - rho_spec: zero for a normal Jacobian."""
        if self.rho_spec is None or self.operator_norm is None:
            return None
        return self.operator_norm - self.rho_spec

    def to_dict(self) -> dict[str, Any]:
        return {
            "loop": self.path,
            "form": self.form,
            "iterations": self.iterations,
            "carry_rho": significant(self.carry_rho),
            "orbit": self.orbit,
            "fixed_point_reached": self.fixed_point_reached,
            "probe_iterations": len(self.residuals),
            "final_residual": significant(self.residuals[-1]) if self.residuals else None,
            "residuals": [significant(r) for r in self.residuals],
            "jacobian_method": self.method or None,
            "jacobian": self.jacobian,
            "rho_spec": significant(self.rho_spec),
            "rho_spec_error": significant(self.rho_spec_error),
            "operator_norm": significant(self.operator_norm),
            "operator_norm_error": significant(self.operator_norm_error),
            "non_normality_gap": significant(self.gap),
            "spectral_margin": significant(self.margin),
            "margin_verdict": self.verdict,
            "min_token_spread": significant(self.min_spread),
            "spread_at": self.spread_at,
            "findings": [finding.to_dict() for finding in self.findings],
        }



def iterate(loop_map: LoopMap, settings: LoopSettings) -> tuple[torch.Tensor, list[float], str]:
    """Run h <- G(h) from the model's own state; (last h, relative residuals, orbit).

    The orbit is "settled" once the relative residual ||G(h) - h|| / ||h|| is below
    the tolerance. When the budget runs out first, the last quarter of the run is
    compared with the quarter before: "converging" if the step ||G(h) - h|| still
    shrinks (by 0.9 or more), "growing" if ||h|| rose by 10% or more, else a
    "bounded orbit". "diverging" when ||h|| leaves float range or the divergence
    factor.
    """
    h = loop_map.start
    scale = max(stable_norm(h), 1e-300)
    residuals: list[float] = []
    steps: list[float] = []
    norms: list[float] = []
    with torch.no_grad():
        for _ in range(settings.max_iterations):
            following = loop_map(h)
            size = stable_norm(following)
            if not math.isfinite(size) or size > settings.divergence * scale:
                residuals.append(math.inf)
                return following, residuals, "diverging"
            steps.append(stable_norm(following - h))
            residuals.append(steps[-1] / max(stable_norm(h), 1e-300))
            norms.append(size)
            h = following
            if residuals[-1] < settings.tolerance:
                return h, residuals, "settled"
    window = max(len(steps) // 4, 1)
    if max(steps[-window:]) < 0.9 * max(steps[-2 * window : -window] or [math.inf]):
        return h, residuals, "converging"
    if norms[-1] > 1.1 * norms[-window - 1 if len(norms) > window else 0]:
        return h, residuals, "growing"
    return h, residuals, "bounded orbit"


def min_token_spread(loop_map: LoopMap, h: torch.Tensor, analysis: Analysis) -> tuple[Optional[float], str]:
    """The smallest per-token standard deviation over channels entering the step's first normalization.

    Without a normalization in the step, that of the state itself.
    """
    normalizer = next((node for node in loop_map.nodes if is_normalizer(node)), None)
    with torch.no_grad():
        if normalizer is None:
            value, where = h, "the loop state"
        else:
            relation = getattr(normalizer.meta["qlint"].relation, "numerator", None)
            source = relation if relation is not None else argument(normalizer, "input")
            values = loop_map.values(h)
            value = values.get(source, loop_map.trajectory.values.get(source))
            where = f"input of `{module_path(normalizer) or normalizer.name}`"
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return None, where
        spread = value.var(dim=-1, unbiased=False).sqrt()
        return float(spread.min()), where


def _carry_rho(loop: Loop, trajectory: Trajectory) -> Optional[float]:
    carry = loop.step.carry
    if carry is None:
        return 1.0 + loop.step.identity
    value = carry_value(carry, trajectory.values.get)
    if value is None or value.numel() == 0:
        return None
    return float(value.detach().abs().max()) + loop.step.identity


def jacobian_spectrum(loop_map: LoopMap, h: torch.Tensor, settings: LoopSettings) -> tuple[Estimate, Estimate]:
    """rho_spec(J_G) and ||J_G||_2 at h: exact from the dense Jacobian for a small state, else Arnoldi with
    error bars."""
    if h.numel() <= settings.dense_limit:
        return dense_spectrum(loop_map, h)
    krylov = {"dimension": settings.krylov_dimension, "cycles": settings.krylov_cycles,
              "tolerance": settings.krylov_tolerance, "seed": settings.seed}
    return arnoldi_spectral_radius(loop_map, h, **krylov), lanczos_operator_norm(loop_map, h, **krylov)


def probe_loop(
    analysis: Analysis, trajectory: Trajectory, loop: Loop, settings: LoopSettings = LoopSettings()
) -> LoopProbe:
    """Iterate one loop to its fixed point and measure its Jacobian there."""
    loop_map = LoopMap(trajectory, loop)
    h, residuals, orbit = iterate(loop_map, settings)
    result = LoopProbe(loop.path, loop.form, loop.iterations, _carry_rho(loop, trajectory), residuals, orbit)
    if orbit != "diverging":
        radius, norm = jacobian_spectrum(loop_map, h, settings)
        result.rho_spec, result.rho_spec_error = radius.value, radius.error
        result.operator_norm, result.operator_norm_error = norm.value, norm.error
        result.method = radius.method
        result.jacobian = (f"exact ({radius.detail})" if radius.method == "dense"
                           else f"Arnoldi: ρ_spec {radius.detail}, ‖J_G‖₂ {norm.detail}")
        result.min_spread, result.spread_at = min_token_spread(loop_map, h, analysis)
    result.verdict = _verdict(result, settings)
    result.findings = list(_findings(result, loop, settings))
    return result


def _verdict(result: LoopProbe, settings: LoopSettings) -> str:
    """At the fixed point: thin or sufficient when the margin's error bar lies on one side of the threshold,
    else undecided."""
    if not result.fixed_point_reached:
        return "not yet at the fixed point" if result.settles else "no fixed point reached"
    if result.margin is None:
        return "not measured"
    error = result.rho_spec_error or 0.0
    if result.margin + error < settings.thin_margin:
        return "thin"
    return "sufficient" if result.margin - error >= settings.thin_margin else "undecided"


def _findings(result: LoopProbe, loop: Loop, settings: LoopSettings) -> Iterable[Finding]:
    source = source_of(loop.step.root)
    where = f"looped recurrence `{result.path}`"
    last = result.residuals[-1] if result.residuals else math.nan
    if not result.settles:
        detail = {
            "diverging": "diverges",
            "growing": f"keeps growing (relative residual {last:.2g})",
        }.get(result.orbit, f"stays on a bounded orbit (relative residual {last:.2g})")
        yield rule("QL305").finding(result.path, source, message=(
            f"{where} does not settle after {len(result.residuals)} iterations: it {detail}"))
    elif not result.fixed_point_reached:
        yield rule("QL304").finding(result.path, source, message=(
            f"{where}: not yet at the fixed point after {len(result.residuals)} iterations "
            f"(relative residual {last:.2g}, still shrinking), so no verdict on the spectral margin; "
            "at the last iterate "
            f"rho_spec = {_plus_minus(result.rho_spec, result.rho_spec_error)}"))
    elif result.verdict in ("thin", "undecided"):
        judged = (f"= {result.margin:.3g} < {settings.thin_margin:g}" if result.verdict == "thin" else
                  f"= {_plus_minus(result.margin, result.rho_spec_error)}, not shown >= {settings.thin_margin:g},")
        yield rule("QL304").finding(result.path, source, message=(
            f"{where}: spectral margin 1 - rho_spec {judged} at the fixed point "
            f"(rho_spec = {_plus_minus(result.rho_spec, result.rho_spec_error)}, "
            f"||J_G||_2 = {_plus_minus(result.operator_norm, result.operator_norm_error)}; {result.jacobian})"))


def _plus_minus(value: Optional[float], error: Optional[float]) -> str:
    """A figure with its error bar; a dense (exact) one without."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.7g}" if not error else f"{value:.7g} ± {error:.1g}"


def probe_loops(
    model: torch.nn.Module,
    inputs: Optional[tuple],
    *,
    spec: Optional[str] = None,
    options: Optional[Options] = None,
    settings: LoopSettings = LoopSettings(),
) -> list[LoopProbe]:
    """Trace a float64 copy of the model and probe each of its looped recurrences.

    >>> [probe] = probe_loops(*fixtures.looped.constrained())
    >>> probe.rho_spec < 1 < probe.operator_norm
    """
    spec = spec or type(model).__name__
    analysis, trajectory = trace_float64(model, inputs, spec=spec, options=options or Options())
    loops = find_loops(analysis)
    if not loops:
        raise ProbeError(f"{spec}: no looped recurrence found (a module applied to its own output with shared weights)")
    return [probe_loop(analysis, trajectory, loop, settings) for loop in loops]


def as_json(results: dict[str, list[LoopProbe]]) -> dict[str, Any]:
    return {"models": [{"spec": spec, "loops": [probe.to_dict() for probe in probes]}
                       for spec, probes in results.items()]}


def print_loops(results: dict[str, list[LoopProbe]], console: Any = None) -> None:
    """The rich report: one two-column table per loop (80 columns wide at most), then its findings."""
    from qlint.ci.render import fit_cells, make_console
    from rich.table import Table

    console = console or make_console()
    for spec, probes in results.items():
        for probe in probes:
            table = Table(title=f"{spec}: looped recurrence `{probe.path}` (float64)", show_header=False)
            table.add_column("measure", style="bold")
            table.add_column("value")
            for measure, value in _rows(probe):
                table.add_row(measure, value)
            console.print(fit_cells(table))
            for finding in probe.findings:
                style = "yellow" if finding.severity == "warning" else "red"
                where = f" ({finding.source})" if finding.source else ""
                console.print(f"  [{style}]{finding.code}[/{style}] {finding.message}{where}")


def _rows(probe: LoopProbe) -> list[tuple[str, str]]:
    """(measure, value) pairs, each value short enough for an 80-column table."""
    last = probe.residuals[-1] if probe.residuals else math.nan
    shown = sorted({0, *(len(probe.residuals) * k // 5 for k in range(1, 5)), len(probe.residuals) - 1})
    trail = " → ".join(f"{probe.residuals[i]:.0e}" for i in shown if i < len(probe.residuals))
    reached = "reached" if probe.fixed_point_reached else "not reached"
    margin = (f"{_fmt(probe.margin)} (spectral margin: {probe.verdict})" if probe.fixed_point_reached
              else f"{probe.verdict}: no verdict")
    return [
        ("form", f"{probe.form}, {probe.iterations} iterations in the model"),
        ("carry ρ(Ā)", _fmt(probe.carry_rho)),
        ("orbit", f"{probe.orbit} after {len(probe.residuals)} iterations"),
        ("fixed point", f"{reached} (relative residual {last:.1e})"),
        ("‖G(h) − h‖ / ‖h‖", trail),
        ("J_G measured", probe.jacobian or "—"),
        ("ρ_spec(J_G)", _figure(probe.rho_spec, probe.rho_spec_error, probe.method)),
        ("‖J_G‖₂", _figure(probe.operator_norm, probe.operator_norm_error, probe.method)),
        ("‖J_G‖₂ − ρ_spec", f"{_fmt(probe.gap)} (non-normality)"),
        ("1 − ρ_spec", margin),
        ("min per-token spread", f"{_fmt(probe.min_spread)} at the {probe.spread_at or 'state'}"),
    ]


def _figure(value: Optional[float], error: Optional[float], method: str) -> str:
    """A Jacobian figure for the table: exact on the dense path, with its error bar on Arnoldi's."""
    shown = _plus_minus(value, error)
    return f"{shown} (exact)" if method == "dense" and shown != "—" else shown


def _fmt(value: Optional[float]) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4g}"
