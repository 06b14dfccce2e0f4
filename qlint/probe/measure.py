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
Jacobian on the example trajectory; :mod:`qlint.probe.bounds` turns them into the
paper's forward and backward bounds and overflow depths, :mod:`qlint.probe.init`
adds the initialization diagnostics.
"""

from __future__ import annotations

import collections
import copy
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch
import torch.fx as fx

from qlint.analysis import Options, load_model, run
from qlint.core.blocks import Block as ResidualBlock
from qlint.core.engine import Analysis
from qlint.core.graph import run_cone
from qlint.core.results import ModelReport, Report
from qlint.probe import bounds as probe_bounds
from qlint.probe import init as probe_init

TOLERANCE = 0.05  # absolute, on exponents: |measured - static| within it counts as equal


class ProbeError(Exception):
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

    @property
    def alphas(self) -> list[float]:
        steps = (self.highest_decade - self.lowest_decade) * self.points_per_decade
        return [10.0 ** (self.lowest_decade + i / self.points_per_decade) for i in range(steps + 1)]

    def in_fit_window(self, alpha: float) -> bool:
        return alpha >= 10.0 ** (self.highest_decade - self.fit_decades) * (1 - 1e-9)


# --- overflow-safe norms --------------------------------------------------------------


def log_norm(value: torch.Tensor) -> Optional[float]:
    """log ||value||_2 computed as log(max|v|) + log||v / max|v|||, never overflowing.

    -inf for a zero tensor, None when the tensor holds inf or nan (a failed sample).
    """
    value = value.detach().to(torch.float64)
    if value.numel() == 0:
        return -math.inf
    if not bool(torch.isfinite(value).all()):
        return None
    peak = float(value.abs().max())
    if peak == 0.0:
        return -math.inf
    return math.log(peak) + math.log(float((value / peak).norm()))


def stable_norm(value: torch.Tensor) -> float:
    """||value||_2 by :func:`log_norm` (inf when it exceeds float64, nan when not finite)."""
    logarithm = log_norm(value)
    if logarithm is None:
        return math.nan
    return math.exp(logarithm) if logarithm < 709.0 else math.inf


# --- the velocity of one block as a function ------------------------------------------


class Trajectory:
    """One forward pass of the example inputs with every node's value kept."""

    def __init__(self, module: fx.GraphModule, inputs: tuple) -> None:
        self.module = module
        interpreter = fx.Interpreter(module, garbage_collect_values=False)
        with torch.no_grad():
            interpreter.run(*inputs)
        self.values: dict[fx.Node, Any] = interpreter.env


class VelocityField:
    """v(X) = F(X) - X: the block's join re-run with X_k := X, all else as recorded.

    Only the block's region is re-run; every other node (embeddings, token ids, the
    values the block reads from elsewhere) keeps its recorded value, so v is a function
    of X_k alone, the paper's definition (for X + v(X) this is exactly v; for a scaled
    join it is the velocity F - id the static analysis bounds).
    """

    def __init__(self, trajectory: Trajectory, block: ResidualBlock) -> None:
        self.block = block
        self.trajectory = trajectory
        self.interpreter = fx.Interpreter(trajectory.module, garbage_collect_values=False)
        self.evaluations = 0

    @property
    def stream(self) -> torch.Tensor:
        """X_k on the recorded trajectory."""
        return self.trajectory.values[self.block.stream]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """v(x); random ops (dropout in train mode) draw the same numbers at every call."""
        self.evaluations += 1
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            torch.manual_seed(0)
            local = run_cone(self.interpreter, {self.block.stream: x}, self.block.region, self.trajectory.values)
        return local[self.block.join] - x


# --- power iteration on Jacobian-vector products --------------------------------------


def _unit_random(like: torch.Tensor, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    u = torch.randn(like.shape, generator=generator, dtype=like.dtype).to(like.device)
    return u / u.norm()


def operator_norm(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, iters: int = 20, seed: int = 0) -> float:
    """||grad fn(x)||_2: power iteration on J^T J, one JVP and one VJP per step.

    Returns ||J u|| for the last unit vector u, a lower estimate that converges to
    the largest singular value.
    """
    u = _unit_random(x, seed)
    _, pullback = torch.func.vjp(fn, x)
    sigma = 0.0
    for _ in range(iters):
        _, ju = torch.func.jvp(fn, (x,), (u,))
        sigma = stable_norm(ju)
        if not 0.0 < sigma < math.inf:
            return sigma
        (jtju,) = pullback(ju)
        length = stable_norm(jtju)
        if not 0.0 < length < math.inf:
            return sigma
        u = jtju / length
    return sigma


def jvp_power_iteration(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, iters: int = 40, seed: int = 0) -> float:
    """Spectral radius of grad fn(x) (fn maps a tensor to one of the same shape), JVPs only.

    Power iteration u <- J u / ||J u||; the growth rates ||J u|| are averaged
    geometrically over the second half of the iterations, which also converges when
    the dominant eigenvalues are a complex pair (a rotation).
    """
    u = _unit_random(x, seed)
    logs = []
    for _ in range(iters):
        _, ju = torch.func.jvp(fn, (x,), (u,))
        rate = log_norm(ju)
        if rate is None or math.isinf(rate):
            return math.nan if rate is None else 0.0
        logs.append(rate)
        u = ju / math.exp(rate)
    tail = logs[len(logs) // 2 :]
    return math.exp(sum(tail) / len(tail))


# --- the measured exponent ------------------------------------------------------------


@dataclass
class DirectionFit:
    """The scaled samples along one direction and the slope they give."""

    label: str
    norm: float  # ||x||: every direction has the norm of the recorded X_k
    samples: list[tuple[float, Optional[float]]]  # (alpha, log||v(alpha x)||), None = inf/nan
    slope: Optional[float] = None  # least squares over the fit window
    decade_slopes: tuple[float, ...] = ()  # each of the top decades alone
    failed: list[float] = field(default_factory=list)  # alphas whose velocity was inf or nan (or 0 amid nonzero)


def probe_directions(x: torch.Tensor, count: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    """``count`` random directions plus single channel, single token and all-ones.

    Each is scaled to ||x|| so alpha = 1 is the scale of the real trajectory.
    """
    generator = torch.Generator().manual_seed(seed)
    shape = x.shape
    directions = [(f"random {i}", torch.randn(shape, generator=generator, dtype=torch.float64)) for i in range(count)]
    if x.dim() >= 1:
        channel = torch.zeros(shape, dtype=torch.float64)
        channel[..., 0] = 1.0
        directions.append(("single channel", channel))
    if x.dim() >= 2:
        token = torch.zeros(shape, dtype=torch.float64)
        token[..., 0, :] = torch.randn(token[..., 0, :].shape, generator=generator, dtype=torch.float64)
        directions.append(("single token", token))
    directions.append(("all ones", torch.ones(shape, dtype=torch.float64)))
    scale = float(x.detach().double().norm()) or 1.0
    return [(label, (d * (scale / float(d.norm()))).to(dtype=x.dtype, device=x.device)) for label, d in directions]


def fit_direction(field_: Callable[[torch.Tensor], torch.Tensor], label: str, x: torch.Tensor, settings: ProbeSettings) -> DirectionFit:
    """Sample ||v(alpha x)|| over the grid and fit the slope over the top decades."""
    fit = DirectionFit(label, float(x.norm()), [])
    with torch.no_grad():
        for alpha in settings.alphas:
            logarithm = log_norm(field_(alpha * x))
            fit.samples.append((alpha, logarithm))
    fit.failed = [alpha for alpha, logarithm in fit.samples if logarithm is None]
    window = [(math.log(alpha), logarithm) for alpha, logarithm in fit.samples if settings.in_fit_window(alpha)]
    if any(logarithm is None for _, logarithm in window):
        return fit
    zeros = [math.exp(log_alpha) for log_alpha, logarithm in window if logarithm == -math.inf]
    if zeros:  # v = 0 along the whole window has no slope; at some scales only, no power law
        if len(zeros) < len(window):
            fit.failed.extend(zeros)
        return fit
    fit.slope = _least_squares_slope(window)
    step = settings.points_per_decade
    fit.decade_slopes = tuple(
        (window[i + step][1] - window[i][1]) / (window[i + step][0] - window[i][0]) for i in range(0, len(window) - step, step)
    )
    return fit


def _least_squares_slope(points: list[tuple[float, float]]) -> float:
    mean_x = sum(p[0] for p in points) / len(points)
    mean_y = sum(p[1] for p in points) / len(points)
    covariance = sum((px - mean_x) * (py - mean_y) for px, py in points)
    variance = sum((px - mean_x) ** 2 for px, _ in points)
    return covariance / variance


def estimate_constants(fits: list[DirectionFit], q: float, settings: ProbeSettings) -> tuple[float, float]:
    """The envelope ``c||x||^q + b`` over the samples: c from the fit window, b covers the rest.

    An estimate from sampled directions, not a certificate. For q = 0 the whole
    bound is the constant b.
    """
    samples = [  # (alpha, log||x||, log||v||) of every finite, nonzero sample
        (alpha, math.log(alpha * fit.norm), log_v) for fit in fits for alpha, log_v in fit.samples if log_v is not None and log_v > -math.inf
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
    """The measured exponent of one block and the constants the bounds need."""

    name: str
    q_static: Optional[float]
    fits: list[DirectionFit]
    tolerance: float
    c: Optional[float] = None
    b: Optional[float] = None
    lipschitz: Optional[float] = None
    lipschitz_error: str = ""
    seconds: float = 0.0
    evaluations: int = 0

    @property
    def slopes(self) -> list[float]:
        return [fit.slope for fit in self.fits if fit.slope is not None]

    @property
    def q_measured(self) -> Optional[float]:
        """The median slope over the directions."""
        return statistics.median(self.slopes) if self.slopes else None

    @property
    def q_measured_max(self) -> Optional[float]:
        return max(self.slopes) if self.slopes else None

    @property
    def spread(self) -> Optional[float]:
        return max(self.slopes) - min(self.slopes) if self.slopes else None

    @property
    def failed_samples(self) -> int:
        return sum(len(fit.failed) for fit in self.fits)

    @property
    def asymptotic(self) -> bool:
        """In every direction the last two decades agree: the fit window is asymptotic."""
        return all(abs(fit.decade_slopes[-1] - fit.decade_slopes[-2]) <= self.tolerance for fit in self.fits if len(fit.decade_slopes) >= 2)

    @property
    def agrees(self) -> Optional[bool]:
        """Every direction grows at most like the static exponent (+ tolerance).

        The largest slope is compared, not the median: the static bound must hold in
        every direction. None when the static exponent is unknown.
        """
        if self.q_static is None:
            return None
        if math.isinf(self.q_static) or self.q_measured_max is None:
            return True
        return self.q_measured_max <= self.q_static + self.tolerance

    @property
    def agreement(self) -> str:
        """'exact', 'below' (the bound is not attained), 'VIOLATION' or 'n/a'."""
        if self.agrees is None or self.q_measured_max is None or math.isinf(self.q_static or 0.0):
            return "n/a"
        if not self.agrees:
            return "VIOLATION"
        return "exact" if self.q_measured_max >= self.q_static - self.tolerance else "below"

    def to_extra(self) -> dict[str, Any]:
        """The keys merged into the block's JSON."""
        return {
            "q_measured": _rounded(self.q_measured),
            "q_measured_max": _rounded(self.q_measured_max),
            "q_measured_spread": _rounded(self.spread),
            "agrees": self.agrees,
            "agreement": self.agreement,
            "asymptotic": self.asymptotic,
            "directions": {fit.label: _rounded(fit.slope) for fit in self.fits},
            "failed_samples": self.failed_samples,
            "c": self.c,
            "b": self.b,
            "lipschitz": self.lipschitz,
            **({"lipschitz_error": self.lipschitz_error} if self.lipschitz_error else {}),
            "cost": {"seconds": round(self.seconds, 3), "evaluations": self.evaluations},
        }


def _rounded(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4) + 0.0  # + 0.0: no "-0.0" in reports


def measure_block(trajectory: Trajectory, residual: ResidualBlock, q_static: Optional[float], settings: ProbeSettings, seed: int) -> BlockProbe:
    """Sample one block's velocity along every probe direction and fit its exponent."""
    start = time.perf_counter()
    field_ = VelocityField(trajectory, residual)
    directions = probe_directions(field_.stream, settings.random_directions, seed)
    fits = [fit_direction(field_, label, direction, settings) for label, direction in directions]
    probe = BlockProbe(residual.name, q_static, fits, settings.tolerance)
    probe.seconds, probe.evaluations = time.perf_counter() - start, field_.evaluations
    return probe


def probe_block(trajectory: Trajectory, residual: ResidualBlock, q_static: Optional[float], settings: ProbeSettings, seed: int) -> BlockProbe:
    """:func:`measure_block`, then the constants c, b and the Jacobian norm L."""
    start = time.perf_counter()
    probe = measure_block(trajectory, residual, q_static, settings, seed)
    if q_static is not None and math.isfinite(q_static):
        probe.c, probe.b = estimate_constants(probe.fits, q_static, settings)
    field_ = VelocityField(trajectory, residual)
    try:
        probe.lipschitz = operator_norm(field_, field_.stream, settings.power_iterations, seed)
    except (RuntimeError, NotImplementedError) as exc:  # an op torch.func cannot differentiate
        probe.lipschitz_error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    probe.seconds = time.perf_counter() - start
    probe.evaluations += field_.evaluations
    return probe


# --- whole models ---------------------------------------------------------------------


@dataclass
class ModelProbe:
    """One model's probe: its report (with probe keys merged), blocks, bounds, init."""

    report: ModelReport
    blocks: list[BlockProbe]
    bounds: probe_bounds.StackBounds
    init: probe_init.InitDiagnostics
    seconds: float

    @property
    def violations(self) -> list[BlockProbe]:
        return [block for block in self.blocks if block.agrees is False]


def as_float64(model: torch.nn.Module, inputs: tuple) -> tuple[torch.nn.Module, tuple]:
    """A float64 copy of the model and its floating inputs (token ids stay as they are)."""
    cast = tuple(x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    return copy.deepcopy(model).to(torch.float64), cast


def _require_weights(model: torch.nn.Module, inputs: Optional[tuple]) -> None:
    tensors = [*model.parameters(), *model.buffers(), *(x for x in inputs or () if isinstance(x, torch.Tensor))]
    if any(t.is_meta for t in tensors):
        raise ProbeError("probe evaluates the model, but it was built on the meta device (no weights); drop --device meta")
    if inputs is None:
        raise ProbeError("probe needs example inputs: return (model, inputs) from the factory or give --input-shape")


def trace_float64(model: torch.nn.Module, inputs: Optional[tuple], *, spec: str, options: Options) -> tuple[Analysis, Trajectory]:
    """The static analysis of a float64 copy and its recorded forward pass."""
    _require_weights(model, inputs)
    model64, inputs64 = as_float64(model, inputs)  # type: ignore[arg-type]
    analysis = run(model64, inputs64, spec=spec, options=options)
    return analysis, Trajectory(analysis.traced.module, analysis.inputs)  # type: ignore[arg-type]


def measure_model(model: torch.nn.Module, inputs: tuple, settings: ProbeSettings = ProbeSettings()) -> list[BlockProbe]:
    """Static against measured exponent for every block, nothing else (the soundness property)."""
    analysis, trajectory = trace_float64(model, inputs, spec=type(model).__name__, options=Options())
    return [
        measure_block(trajectory, residual, block.q, settings, settings.seed + index)
        for index, (residual, block) in enumerate(zip(analysis.stream.blocks, analysis.report.blocks))
    ]


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

    ``on_block(done, total, name)`` is called after each block (the CLI's progress bar).
    """
    start = time.perf_counter()
    analysis, trajectory = trace_float64(model, inputs, spec=spec, options=options or Options())
    blocks = []
    for index, (residual, block) in enumerate(zip(analysis.stream.blocks, analysis.report.blocks)):
        probe = probe_block(trajectory, residual, block.q, settings, settings.seed + index)
        block.extra.update(probe.to_extra())
        blocks.append(probe)
        on_block(index + 1, len(analysis.stream.blocks), block.name)
    bounds = _bounds(analysis, trajectory, blocks)
    init = probe_init.diagnose(analysis, settings.seed)
    result = ModelProbe(analysis.report, blocks, bounds, init, time.perf_counter() - start)
    _attach(result)
    return result


def _bounds(analysis: Analysis, trajectory: Trajectory, blocks: list[BlockProbe]) -> probe_bounds.StackBounds:
    x0 = stable_norm(trajectory.values[analysis.stream.blocks[0].stream]) if blocks else 0.0
    constants = [
        probe_bounds.BlockConstants(block.q_static, block.c, block.b) if block.c is not None and block.b is not None else None
        for block in blocks
    ]
    bounds = probe_bounds.stack_bounds(x0, constants, [block.lipschitz for block in blocks], [block.name for block in blocks])
    post_norm = [b.name for b in analysis.report.blocks if b.form == "post-norm"]
    if post_norm:
        bounds.note = "; ".join(filter(None, [bounds.note, f"{', '.join(post_norm)} is post-norm: outside the additive analysis"]))
    return bounds


def _attach(result: ModelProbe) -> None:
    """Merge the model-level results into the report's JSON."""
    extra = result.report.extra
    extra["bounds"] = result.bounds.to_dict()
    extra["overflow_depth"] = dict(result.bounds.overflow_depths)
    extra["init"] = result.init.to_dict()
    extra["soundness_violations"] = [
        {"block": block.name, "q": block.q_static, "q_measured_max": _rounded(block.q_measured_max)} for block in result.violations
    ]
    extra["probe_seconds"] = round(result.seconds, 3)


def probe(
    specs: Iterable[str],
    options: Optional[Options] = None,
    settings: ProbeSettings = ProbeSettings(),
    on_block: Callable[[int, int, str], None] = lambda done, total, name: None,
) -> list[ModelProbe]:
    """Load and probe each spec."""
    options = options or Options()
    results = []
    for spec in specs:
        loaded = load_model(spec, options)
        results.append(probe_model(loaded.model, loaded.inputs, spec=spec, options=options, settings=settings, on_block=on_block))
    return results


def as_report(results: Iterable[ModelProbe]) -> Report:
    return Report([result.report for result in results])
