"""``qlint probe``: measure what the exponent arithmetic predicts.

The static analysis says ``||v(x)|| <= c||x||^q + b``. The probe checks it on the
real weights: each block's velocity ``v(X) = block(X) - X`` is evaluated in float64
at ``alpha * x`` for alpha up to 1e7 and the asymptotic log-log slope is fitted over
the top decades (growth is asymptotic only there: the native Mamba block grows like
alpha^2.2 at unit scale and reaches 5 beyond alpha ~ 1e4). A measured slope above
the static q is a soundness bug of a rule; one below means the bound is not attained
in the sampled directions.

From the same samples the probe estimates each block's constants c_k, b_k and, by
power iteration on Jacobian-vector products, the operator norm L_k of the velocity
Jacobian on the example trajectory (the velocity as a function of X_k is :mod:`qlint.velocity.field`'s,
the linear algebra :mod:`qlint.probe.spectral`'s);
:mod:`qlint.velocity.bounds` turns them into the paper's forward and backward bounds and
overflow depths, :mod:`qlint.probe.init` adds the initialization diagnostics.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
import torch.fx as fx

from qlint.analysis import Options, run
from qlint.growth.stream import StreamBlock
from qlint.growth.engine import Analysis
from qlint.core.errors import QlintError
from qlint.core.results import ModelReport, Report
from qlint.capture.harness import tensor_outputs
from qlint.capture.trace import non_finite_parameters
from qlint.velocity import bounds as paper_bounds
from qlint.core import curves as growth_curves
from qlint.probe import init as probe_init
from qlint.probe.spectral import least_squares_slope, log_norm, operator_norm, stable_norm
from qlint.velocity.field import Trajectory, VelocityField
from qlint.probe.witness import AS_BUILT, directions, perturbations

TOLERANCE = 0.05  # absolute, on exponents: |measured - static| within it counts as equal


class ProbeError(QlintError):
    """The model cannot be probed (no weights, no example inputs); one-line message."""


@dataclass(frozen=True)
class ProbeSettings:
    """How to sample: the scale grid, the fit window, directions and iterations."""

    seed: int = 0
    random_directions: int = 8
    lowest_decade: int = -2  # alpha from 10**lowest_decade ...
    highest_decade: int = 7  # ... to 10**highest_decade
    points_per_decade: int = 2
    fit_decades: int = 2  # the slope is fitted over the top decades only
    tolerance: float = TOLERANCE
    power_iterations: int = 20
    perturb: bool = True  # also measure under the witness's adversarial parameter values
    eager_scales: tuple[float, ...] = (1.0, 1e3, 1e6)  # inputs scaled by these: the graph must still be the model

    @property
    def alphas(self) -> list[float]:
        steps = (self.highest_decade - self.lowest_decade) * self.points_per_decade
        return [10.0 ** (self.lowest_decade + i / self.points_per_decade) for i in range(steps + 1)]

    def in_fit_window(self, alpha: float) -> bool:
        return alpha >= 10.0 ** (self.highest_decade - self.fit_decades) * (1 - 1e-9)


# --- the measured exponent ------------------------------------------------------------


@dataclass
class DirectionFit:
    """The scaled samples along one direction and the slope they give."""

    label: str
    norm: float  # ||x||: every direction has the norm of the recorded X_k
    samples: list[tuple[float, Optional[float]]]  # (alpha, log||v(alpha x)||), None = inf/nan
    slope: Optional[float] = None  # least squares over the fit window
    decade_slopes: tuple[float, ...] = ()  # each of the top decades alone
    failed: list[float] = field(default_factory=list)  # alphas whose velocity was 0 amid nonzero
    nonfinite: list[float] = field(default_factory=list)  # alphas whose velocity was inf or nan
    perturbation: str = AS_BUILT  # the parameter values it was measured under
    source: str = "graph"  # "graph": the traced block; "eager": the model's own submodule

    @property
    def graph_as_built(self) -> bool:
        """Measured on the traced block with the parameters as built: the setting the constants describe."""
        return self.perturbation == AS_BUILT and self.source == "graph"


def probe_directions(
    x: torch.Tensor, weights: list[torch.Tensor], settings: ProbeSettings, seed: int, *, random_count: int
) -> list[tuple[str, torch.Tensor]]:
    """Random directions and the witness's worst cases, each scaled to ||x||.

    The worst cases (constant and alternating rows, one entry nonzero or zero, equal rows,
    one token, the null spaces of the first rows of the block's weight matrices) are
    where value-dependent safety breaks: a gate sigma(W x) that stops moving, a divisor
    that vanishes. alpha = 1 is the scale of the real trajectory.
    """
    scale = float(x.detach().double().norm()) or 1.0
    found = directions(x.detach().double(), weights, random_count=random_count, quick=False, seed=seed)
    return [(label.replace("randn", "random "), (d * scale).to(dtype=x.dtype, device=x.device)) for label, d in found]


def fit_direction(
    field_: Callable[[torch.Tensor], torch.Tensor],
    label: str,
    x: torch.Tensor,
    settings: ProbeSettings,
    perturbation: str = AS_BUILT,
    source: str = "graph",
) -> DirectionFit:
    """Sample ||v(alpha x)|| over the grid and fit the slope over the top decades."""
    fit = DirectionFit(label, float(x.norm()), [], perturbation=perturbation, source=source)
    with torch.no_grad():
        for alpha in settings.alphas:
            try:
                logarithm = log_norm(field_(alpha * x))
            except (ArithmeticError, RuntimeError):  # an op that refuses the value (a singular solve): not finite
                logarithm = None
            fit.samples.append((alpha, logarithm))
    fit.nonfinite = [alpha for alpha, logarithm in fit.samples if logarithm is None]
    window = [(math.log(alpha), logarithm) for alpha, logarithm in fit.samples if settings.in_fit_window(alpha)]
    if any(logarithm is None for _, logarithm in window):
        return fit
    zeros = [math.exp(log_alpha) for log_alpha, logarithm in window if logarithm == -math.inf]
    if zeros:  # v = 0 along the whole window has no slope; at some scales only, no power law
        if len(zeros) < len(window):
            fit.failed.extend(zeros)
        return fit
    fit.slope = least_squares_slope(window)
    step = settings.points_per_decade
    fit.decade_slopes = tuple(
        (window[i + step][1] - window[i][1]) / (window[i + step][0] - window[i][0])
        for i in range(0, len(window) - step, step)
    )
    return fit



def estimate_constants(fits: list[DirectionFit], q: float, settings: ProbeSettings) -> tuple[float, float]:
    """The envelope ``c||x||^q + b`` over the samples: c from the fit window, b covers the rest.

    An estimate from sampled directions, not a certificate. For q = 0 the whole
    bound is the constant b.
    """
    samples = [  # (alpha, log||x||, log||v||) of every finite, nonzero sample
        (alpha, math.log(alpha * fit.norm), log_v)
        for fit in fits
        for alpha, log_v in fit.samples
        if log_v is not None and log_v > -math.inf
    ]
    if not samples:
        return 0.0, 0.0
    if q == 0:
        return 0.0, _exp(max(log_v for _, _, log_v in samples))
    ratios = [log_v - q * log_x for alpha, log_x, log_v in samples if settings.in_fit_window(alpha)]
    c = _exp(max(ratios)) if ratios else 0.0
    # Samples beyond e^700 lie in the window, where v <= c x^q by the choice of c.
    b = max(0.0, *(_exp(log_v) - c * _exp(q * log_x) for _, log_x, log_v in samples if log_v < 700.0))
    return c, b


def _exp(value: float) -> float:
    return math.exp(value) if value < 709.0 else math.inf


@dataclass
class BlockProbe:
    """The measured exponent of one block and the constants the bounds need.

    ``fits`` holds every (parameter setting, source, direction) measured; the typical
    exponent ``q_measured`` is the median over the random directions of the traced
    block as built, the witness ``q_measured_max`` the largest slope of all of them.
    """

    name: str
    q_static: Optional[float]
    fits: list[DirectionFit]
    tolerance: float
    c: Optional[float] = None
    b: Optional[float] = None
    lipschitz: Optional[float] = None
    lipschitz_error: str = ""
    eager_module: Optional[str] = None  # the model's submodule that computes this block, measured too
    seconds: float = 0.0
    evaluations: int = 0

    @property
    def typical(self) -> list[DirectionFit]:
        return [f for f in self.fits if f.graph_as_built and f.label.startswith("random")]

    @property
    def slopes(self) -> list[float]:
        return [fit.slope for fit in self.fits if fit.slope is not None]

    @property
    def q_measured(self) -> Optional[float]:
        """The median slope over the random directions as built."""
        typical = [fit.slope for fit in self.typical if fit.slope is not None]
        return statistics.median(typical) if typical else None

    @property
    def q_measured_max(self) -> Optional[float]:
        return max(self.slopes) if self.slopes else None

    @property
    def spread(self) -> Optional[float]:
        typical = [fit.slope for fit in self.typical if fit.slope is not None]
        return max(typical) - min(typical) if typical else None

    @property
    def failed_samples(self) -> int:
        """Samples with no power law: inf or nan, or zero amid nonzero values."""
        return sum(len(fit.failed) + len(fit.nonfinite) for fit in self.fits)

    @property
    def nonfinite_samples(self) -> int:
        return sum(len(fit.nonfinite) for fit in self.fits)

    @property
    def asymptotic(self) -> bool:
        """In every direction the last two decades agree: the fit window is asymptotic."""
        return all(
            abs(fit.decade_slopes[-1] - fit.decade_slopes[-2]) <= self.tolerance
            for fit in self.fits
            if len(fit.decade_slopes) >= 2
        )

    @property
    def agrees(self) -> Optional[bool]:
        """Every sample is finite and grows at most like the static exponent (+ tolerance).

        The largest slope is compared, not the median: the static bound must hold in
        every direction and for every parameter value. A finite static q with an inf or
        nan sample is a violation (||v|| <= c||x||^q + b was claimed for every input).
        None when the static exponent is unknown; True for q = inf (nothing claimed).
        """
        if self.q_static is None:
            return None
        if math.isinf(self.q_static):
            return True
        if self.nonfinite_samples:
            return False
        return self.q_measured_max is None or self.q_measured_max <= self.q_static + self.tolerance

    @property
    def agreement(self) -> str:
        """'exact', 'below' (the bound is not attained), 'VIOLATION' or 'n/a'."""
        if self.agrees is False:
            return "VIOLATION"
        if self.agrees is None or self.q_measured_max is None or math.isinf(self.q_static or 0.0):
            return "n/a"
        return "exact" if self.q_measured_max >= self.q_static - self.tolerance else "below"

    def worst(self) -> Optional[DirectionFit]:
        """The fit that witnesses the violation (the first non-finite one, else the steepest)."""
        broken = [fit for fit in self.fits if fit.nonfinite]
        if broken:
            return broken[0]
        finite = [fit for fit in self.fits if fit.slope is not None]
        return max(finite, key=lambda fit: fit.slope) if finite else None  # type: ignore[arg-type, return-value]

    def to_extra(self) -> dict[str, Any]:
        """The keys merged into the block's JSON."""
        worst = self.worst()
        settings: dict[str, Optional[float]] = {}
        for fit in self.fits:
            key = fit.perturbation if fit.source == "graph" else f"{fit.perturbation} (eager)"
            slope = math.inf if fit.nonfinite else fit.slope
            if slope is not None:
                settings[key] = max(settings.get(key) or -math.inf, slope)
        return {
            "q_measured": _rounded(self.q_measured),
            "q_measured_max": _rounded(self.q_measured_max),
            "q_measured_spread": _rounded(self.spread),
            "agrees": self.agrees,
            "agreement": self.agreement,
            "asymptotic": self.asymptotic,
            "directions": {fit.label: _rounded(fit.slope) for fit in self.fits if fit.graph_as_built},
            "perturbations": {key: _rounded(value) for key, value in settings.items()},
            "eager_module": self.eager_module,
            "worst": None if worst is None else {
                "direction": worst.label,
                "perturbation": worst.perturbation,
                "source": worst.source,
                "nonfinite_at": worst.nonfinite[0] if worst.nonfinite else None,
            },
            "failed_samples": self.failed_samples,
            "nonfinite_samples": self.nonfinite_samples,
            "c": self.c,
            "b": self.b,
            "lipschitz": self.lipschitz,
            **({"lipschitz_error": self.lipschitz_error} if self.lipschitz_error else {}),
            "cost": {"seconds": round(self.seconds, 3), "evaluations": self.evaluations},
            "growth_curve": growth_curves.record(self.typical or [fit for fit in self.fits if fit.graph_as_built]),
        }


def significant(value: Optional[float]) -> Optional[float]:
    """Six significant figures for a report; None for a missing or non-finite figure."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


def _rounded(value: Optional[float]) -> Optional[float]:
    if value is None or math.isinf(value):
        return value
    return round(value, 4) + 0.0  # + 0.0: no "-0.0" in reports


# --- the parameter settings and the eager model ---------------------------------------


def _graph_weights(module: fx.GraphModule, residual: StreamBlock, values: dict) -> list[torch.Tensor]:
    """The matrices the block reads whose rows have the stream's width (for null-space directions)."""
    width = values[residual.stream].shape[-1] if values[residual.stream].dim() else 0
    found: list[torch.Tensor] = []
    for node in residual.region:
        candidates = [values.get(arg) for arg in node.all_input_nodes if arg.op == "get_attr"]
        if node.op == "call_module":
            candidates += list(module.get_submodule(str(node.target)).parameters())
        for tensor in candidates:
            if isinstance(tensor, torch.Tensor) and tensor.dim() == 2 and tensor.is_floating_point():
                if tensor.shape[-1] == width:
                    found.append(tensor.detach())
                elif tensor.shape[0] == width:
                    found.append(tensor.detach().T)
    return found


@dataclass
class EagerCall:
    """One recorded call of a submodule of the eager model that maps a tensor to a tensor of its shape."""

    name: str
    module: torch.nn.Module
    args: tuple
    kwargs: dict
    output: torch.Tensor

    def velocity(self, x: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            torch.manual_seed(0)
            out = self.module(x, *self.args[1:], **self.kwargs)
        return _first_tensor(out) - x


def _first_tensor(value: Any) -> Any:
    if isinstance(value, (tuple, list)) and value:
        return _first_tensor(value[0])
    return value


def _close(a: Any, b: Any, rtol: float) -> bool:
    """Same shape, same non-finite entries, and ||a - b|| <= rtol * max(||a||, ||b||) on the rest."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return False
    if not (a.is_floating_point() or a.is_complex()):
        return bool(torch.equal(a, b))
    a, b = (t.detach().to(torch.complex128 if t.is_complex() else torch.float64) for t in (a, b))
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    non_finite_a = torch.where(finite_a, 0, a).nan_to_num(0.5)
    non_finite_b = torch.where(finite_b, 0, b).nan_to_num(0.5)
    if not torch.equal(finite_a, finite_b) or not torch.equal(non_finite_a, non_finite_b):
        return False
    a, b = torch.where(finite_a, a, 0), torch.where(finite_b, b, 0)
    return stable_norm(a - b) <= rtol * max(stable_norm(a), stable_norm(b)) + 1e-300


class ProbeContext:
    """The float64 eager model, its traced graph (sharing the parameters' storage) and the settings.

    :meth:`states` yields the parameter settings the witness measures under, each
    applied in place and undone afterwards: as built, then (unless disabled) the
    witness's perturbations, which redraw every parameter (zero-initialised ones
    become nonzero), negate them and scale them up. In each setting it records the
    trajectory, the calls of the eager submodules, and whether the graph still computes
    what the eager model computes at scaled inputs (a graph specialised on parameter
    values, or on the scale of the input, does not).
    """

    def __init__(self, analysis: Analysis, model: torch.nn.Module, inputs: tuple, settings: ProbeSettings) -> None:
        self.analysis, self.model, self.inputs, self.settings = analysis, model, inputs, settings
        self.mismatches: list[str] = []

    def states(self) -> Iterator["ProbeState"]:
        settings = perturbations({}, quick=False) if self.settings.perturb else [(AS_BUILT, None)]
        parameters = _distinct(self.model.parameters())
        saved = [p.detach().clone() for p in parameters]
        for name, perturb in settings:
            try:
                with torch.no_grad():
                    if perturb is not None:
                        perturb(self.model)
                yield self._record(name)
            finally:
                with torch.no_grad():
                    for parameter, value in zip(parameters, saved):
                        parameter.copy_(value)

    def _record(self, name: str) -> "ProbeState":
        module = self.analysis.traced.module
        calls: list[EagerCall] = []

        def keep(submodule: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            out = _first_tensor(output)
            if (args and isinstance(args[0], torch.Tensor)
                    and isinstance(out, torch.Tensor) and out.shape == args[0].shape):
                calls.append(EagerCall(names[submodule], submodule, args, kwargs, out))

        names = {sub: qualified for qualified, sub in self.model.named_modules()}
        handles = [sub.register_forward_hook(keep, with_kwargs=True) for sub in names]
        try:
            with torch.no_grad(), tensor_outputs(self.model):
                torch.manual_seed(0)
                eager = self.model(*self.inputs)
        finally:
            for handle in handles:
                handle.remove()
        trajectory = Trajectory(module, self.inputs)
        for alpha in self.settings.eager_scales:
            scaled = tuple(
                alpha * x if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in self.inputs
            )
            with torch.no_grad(), tensor_outputs(self.model):
                torch.manual_seed(0)
                mine = module(*scaled)
                torch.manual_seed(0)
                theirs = eager if alpha == 1.0 else self.model(*scaled)
            graph_out, eager_out = _tensor_list(mine), _tensor_list(theirs)
            if len(graph_out) != len(eager_out) or not all(_close(a, b, 1e-6) for a, b in zip(graph_out, eager_out)):
                self.mismatches.append(f"with the parameters {name}, the traced graph's output differs from the "
                                       f"eager model's at inputs scaled by {alpha:g}")
        return ProbeState(name, trajectory, calls)


def _distinct(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for tensor in tensors:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            out.append(tensor)
    return out


def _tensor_list(value: Any) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


@dataclass
class ProbeState:
    """One parameter setting: its recorded trajectory and eager submodule calls."""

    name: str
    trajectory: Trajectory
    calls: list[EagerCall]

    def eager_call(self, field_: VelocityField, direction: torch.Tensor) -> Optional[EagerCall]:
        """The submodule call that is this block: the same velocity on the trajectory and at
        ``direction`` (the velocity, not the output, is compared: a branch that returns the
        update without the skip differs by the whole input). Only unit scale is compared:
        where graph and model part at large scale is what the eager witness is for."""
        stream, join = field_.stream, self.trajectory.values[field_.block.output]
        matches: list[tuple[float, int, EagerCall]] = []
        for index, call in enumerate(self.calls):
            if not _same_velocity(call.output - call.args[0], join - stream, stream):
                continue
            try:
                with torch.no_grad():
                    error = _velocity_error(call.velocity(direction), field_(direction), direction)
            except Exception:  # a submodule that cannot be called on its own: no eager witness
                continue
            if error <= 1.0:
                matches.append((error, index, call))
        # the closest match: a branch that differs from the block by its input x can pass the
        # tolerance when ||v|| dwarfs ||x||, but never matches as closely as the block itself
        return min(matches, key=lambda match: match[:2])[2] if matches else None


def _velocity_error(a: Any, b: Any, point: torch.Tensor) -> float:
    """||a - b|| in units of float64 rounding of ``point + v`` (1e-9 (||b|| + ||point||)); inf if incomparable."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return math.inf
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        return 0.0 if _close(a, b, 1e-9) else math.inf
    scale = 1e-9 * (stable_norm(b) + stable_norm(point))
    difference = stable_norm(a - b)
    return difference / scale if scale > 0 else (0.0 if difference == 0 else math.inf)


def _same_velocity(a: Any, b: Any, point: torch.Tensor) -> bool:
    """Equal up to float64 rounding of ``point + v``: ||a - b|| <= 1e-9 (||b|| + ||point||)."""
    return _velocity_error(a, b, point) <= 1.0


def _graph_fits(
    field_: VelocityField, settings: ProbeSettings, seed: int, perturbation: str
) -> tuple[list[DirectionFit], list[tuple[str, torch.Tensor]]]:
    """The traced block's fits along the probe directions, and the directions."""
    weights = _graph_weights(field_.trajectory.module, field_.block, field_.trajectory.values)
    random_count = settings.random_directions if perturbation == AS_BUILT else min(2, settings.random_directions)
    found = probe_directions(field_.stream, weights, settings, seed, random_count=random_count)
    return [fit_direction(field_, label, d, settings, perturbation) for label, d in found], found


def measure_block(
    trajectory: Trajectory, residual: StreamBlock, q_static: Optional[float], settings: ProbeSettings, seed: int
) -> BlockProbe:
    """Sample one traced block's velocity as built along every probe direction and fit its exponent."""
    start = time.perf_counter()
    field_ = VelocityField(trajectory, residual)
    fits, _ = _graph_fits(field_, settings, seed, AS_BUILT)
    probe = BlockProbe(residual.name, q_static, fits, settings.tolerance)
    probe.seconds, probe.evaluations = time.perf_counter() - start, field_.evaluations
    return probe


def measure_blocks(context: ProbeContext, pairs: list[tuple[StreamBlock, Optional[float]]]) -> list[BlockProbe]:
    """Sample every block's velocity, graph and eager, along every direction and parameter setting.

    A block whose input is not finite in a perturbed setting (an earlier layer overflowed)
    is not measured in that setting: nothing there can be attributed to it.
    """
    settings = context.settings
    probes = [BlockProbe(residual.name, q, [], settings.tolerance) for residual, q in pairs]
    for state in context.states():
        for index, ((residual, _), probe) in enumerate(zip(pairs, probes)):
            start = time.perf_counter()
            field_ = VelocityField(state.trajectory, residual)
            if state.name != AS_BUILT and not bool(torch.isfinite(field_.stream).all()):
                continue
            fits, found = _graph_fits(field_, settings, settings.seed + index, state.name)
            probe.fits += fits
            probe.evaluations += field_.evaluations
            call = state.eager_call(field_, found[0][1]) if found else None
            if call is not None:
                probe.eager_module = probe.eager_module or call.name
                probe.fits += [
                    fit_direction(call.velocity, label, d, settings, state.name, "eager") for label, d in found
                ]
                probe.evaluations += len(found) * len(settings.alphas)
            probe.seconds += time.perf_counter() - start
    return probes


def probe_block(
    trajectory: Trajectory, residual: StreamBlock, probe: BlockProbe, settings: ProbeSettings, seed: int
) -> None:
    """The constants c, b and the Jacobian norm L of a measured block, on the trajectory as built."""
    start = time.perf_counter()
    if probe.q_static is not None and math.isfinite(probe.q_static):
        as_built = [f for f in probe.fits if f.graph_as_built]
        probe.c, probe.b = estimate_constants(as_built, probe.q_static, settings)
    field_ = VelocityField(trajectory, residual)
    try:
        probe.lipschitz = operator_norm(field_, field_.stream, settings.power_iterations, seed)
    except (RuntimeError, NotImplementedError) as exc:  # an op torch.func cannot differentiate
        probe.lipschitz_error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    probe.seconds += time.perf_counter() - start
    probe.evaluations += field_.evaluations


# --- whole models ---------------------------------------------------------------------


@dataclass
class ModelProbe:
    """One model's probe: its report (with probe keys merged), blocks, bounds, init."""

    report: ModelReport
    blocks: list[BlockProbe]
    bounds: paper_bounds.StackBounds
    init: probe_init.InitDiagnostics
    seconds: float
    graph_mismatches: list[str] = field(default_factory=list)  # where the traced graph is not the eager model
    analysis: Optional[Analysis] = field(default=None, repr=False)  # the float64 analysis the figures were measured on
    trajectory: Optional[Trajectory] = field(default=None, repr=False)  # its forward pass on the example inputs

    @property
    def violations(self) -> list[BlockProbe]:
        return [block for block in self.blocks if block.agrees is False]

    @property
    def unsound(self) -> bool:
        """A block outgrew its static exponent, or the graph that was analysed is not the model."""
        return bool(self.violations or self.graph_mismatches)


def as_float64(model: torch.nn.Module, inputs: tuple) -> tuple[torch.nn.Module, tuple]:
    """A float64 copy of the model and its floating inputs (token ids stay as they are)."""
    cast = tuple(x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    return copy.deepcopy(model).to(torch.float64), cast


def _require_weights(model: torch.nn.Module, inputs: Optional[tuple]) -> None:
    tensors = [*model.parameters(), *model.buffers(), *(x for x in inputs or () if isinstance(x, torch.Tensor))]
    if any(t.is_meta for t in tensors):
        raise ProbeError(
            "probe evaluates the model, but it was built on the meta device (no weights); drop --device meta")
    if inputs is None:
        raise ProbeError("probe needs example inputs: return (model, inputs) from the factory or give --input-shape")


def _require_finite(model: torch.nn.Module, inputs: tuple) -> None:
    """A model whose own output is inf or nan on its example inputs has nothing to measure."""
    bad = non_finite_parameters(model)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ProbeError(f"the parameter `{bad[0]}` holds inf or nan{more}: nothing to measure")
    with torch.no_grad(), tensor_outputs(model):
        outputs = _tensor_list(model(*inputs))
    if not all(bool(torch.isfinite(t).all()) for t in outputs if t.is_floating_point() or t.is_complex()):
        raise ProbeError("the model's output on its example inputs is inf or nan (in float64): nothing to measure")


def float64_context(
    model: torch.nn.Module, inputs: Optional[tuple], *, spec: str, options: Options, settings: ProbeSettings
) -> ProbeContext:
    """The static analysis of a float64 copy, with the copy itself (the eager witness)."""
    _require_weights(model, inputs)
    model64, inputs64 = as_float64(model, inputs)  # type: ignore[arg-type]
    _require_finite(model64, inputs64)
    analysis = run(model64, inputs64, spec=spec, options=options)
    return ProbeContext(analysis, model64, analysis.inputs, settings)  # type: ignore[arg-type]


def trace_float64(
    model: torch.nn.Module, inputs: Optional[tuple], *, spec: str, options: Options
) -> tuple[Analysis, Trajectory]:
    """The static analysis of a float64 copy and its recorded forward pass."""
    context = float64_context(model, inputs, spec=spec, options=options, settings=ProbeSettings())
    return context.analysis, Trajectory(context.analysis.traced.module, context.inputs)


def _pairs(analysis: Analysis) -> list[tuple[StreamBlock, Optional[float]]]:
    return [(residual, block.q) for residual, block in zip(analysis.stream.blocks, analysis.report.blocks)]


def measure_model(model: torch.nn.Module, inputs: tuple, settings: ProbeSettings = ProbeSettings()) -> list[BlockProbe]:
    """Static against measured exponent for every block, graph and eager, nothing else."""
    context = float64_context(model, inputs, spec=type(model).__name__, options=Options(), settings=settings)
    return measure_blocks(context, _pairs(context.analysis))


def probe_model(
    model: torch.nn.Module,
    inputs: Optional[tuple],
    *,
    spec: str,
    options: Optional[Options] = None,
    settings: ProbeSettings = ProbeSettings(),
    on_block: Callable[[int, int, str], None] = lambda done, total, name: None,
) -> ModelProbe:
    """Trace a float64 copy, probe every block, then the stack bounds and init diagnostics.

    ``on_block(done, total, name)`` is called after each block's constants (the CLI's progress bar).
    """
    start = time.perf_counter()
    context = float64_context(model, inputs, spec=spec, options=options or Options(), settings=settings)
    analysis = context.analysis
    blocks = measure_blocks(context, _pairs(analysis))
    trajectory = Trajectory(analysis.traced.module, context.inputs)
    for index, (residual, block, probe) in enumerate(zip(analysis.stream.blocks, analysis.report.blocks, blocks)):
        probe_block(trajectory, residual, probe, settings, settings.seed + index)
        block.extra.update(probe.to_extra())
        on_block(index + 1, len(blocks), block.name)
    bounds = _bounds(analysis, trajectory, blocks)
    init = probe_init.diagnose(analysis, settings.seed)
    seconds = time.perf_counter() - start
    result = ModelProbe(analysis.report, blocks, bounds, init, seconds, context.mismatches, analysis, trajectory)
    _attach(result)
    return result


def _bounds(analysis: Analysis, trajectory: Trajectory, blocks: list[BlockProbe]) -> paper_bounds.StackBounds:
    x0 = stable_norm(trajectory.values[analysis.stream.blocks[0].stream]) if blocks else 0.0
    constants = [
        paper_bounds.BlockConstants(block.q_static, block.c, block.b)
        if block.c is not None and block.b is not None
        else None
        for block in blocks
    ]
    lipschitz = [block.lipschitz for block in blocks]
    bounds = paper_bounds.stack_bounds(x0, constants, lipschitz, [block.name for block in blocks])
    post_norm = [b.name for b in analysis.report.blocks if b.form == "post-norm"]
    if post_norm:
        outside = f"{', '.join(post_norm)} is post-norm: outside the additive analysis"
        bounds.note = "; ".join(filter(None, [bounds.note, outside]))
    return bounds


def _attach(result: ModelProbe) -> None:
    """Merge the model-level results into the report's JSON."""
    extra = result.report.extra
    extra["bounds"] = result.bounds.to_dict()
    extra["overflow_depth"] = dict(result.bounds.overflow_depths)
    extra["init"] = result.init.to_dict()
    extra["soundness_violations"] = [
        {"block": block.name, "q": block.q_static, "q_measured_max": _rounded(block.q_measured_max)}
        for block in result.violations
    ]
    extra["graph_mismatches"] = list(result.graph_mismatches)
    extra["probe_seconds"] = round(result.seconds, 3)


def as_report(results: Iterable[ModelProbe]) -> Report:
    return Report([result.report for result in results])
