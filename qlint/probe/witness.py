"""An eager witness of growth: how ||F(x) - x|| grows with the scale of x, measured on the model.

The static analysis claims ||v(x)|| <= c ||x||^q + b for every input and every parameter
value. A witness checks the claim on the eager model in float64, where it is hardest:
along random directions, constant and alternating rows, one entry nonzero, and the null
spaces of the first linear layers' rows (where a gate sigma(W x) stops moving); and
for the parameters as built and for adversarial values (redrawn, which also makes
zero-initialised parameters nonzero; negated; at 3x scale). The measured exponent of a
(perturbation, direction) is the least-squares slope of log sup_{t <= s} ||v(t d)||
against log s over the last two decades (the envelope keeps oscillating factors from
faking steep slopes); values below 1e-10 of the largest velocity at the same scale are
float64 rounding, not growth. Non-finite values are reported as such: they are never
agreement with a finite static q.

Used by ``qlint probe`` (the eager check), the differential soundness test and
``bench/adversarial_truth.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

SCALES = [10.0 ** (k / 2) for k in range(13)]  # 1e0 .. 1e6, half decades: blow-ups, super-polynomial slopes
TAIL_SCALES = [10.0 ** (3 + k / 16) for k in range(49)]  # 1e3 .. 1e6, 16 a decade: the envelope
FIT_FROM = 1e4  # the measured exponent is the envelope's slope over [FIT_FROM, 1e6]
ROUNDOFF = 1e-10  # a velocity below this fraction of the largest one at the same scale is rounding noise
AS_BUILT = "as built"  # the parameter setting that is no perturbation


def _unit(t: torch.Tensor) -> torch.Tensor:
    n = t.norm()
    return t / n if n > 0 else t


def _linears(model: torch.nn.Module, d: int) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.in_features == d]


def _null_of_rows(weight: torch.Tensor, k: int, shape, generator) -> torch.Tensor:
    """A random input whose last-dim vectors are orthogonal to the first k rows of weight."""
    rows = weight[:k].detach()
    q, _ = torch.linalg.qr(rows.T)  # (d, k): an orthonormal basis of the row span
    r = torch.randn(*shape, generator=generator, dtype=weight.dtype)
    return r - (r @ q) @ q.T


def directions(
    x: torch.Tensor, weights: list[torch.Tensor], *, random_count: int, quick: bool, seed: int = 1234
) -> list[tuple[str, torch.Tensor]]:
    """Unit directions that reach the corners: random, constant and alternating rows, one
    entry nonzero or zero, equal rows, and inputs orthogonal to the first rows of
    ``weights`` (matrices whose rows have the input's last dimension: where a gate
    sigma(W x) stops moving). ``quick`` keeps a short list (the differential test)."""
    g = torch.Generator().manual_seed(seed)
    shape, d = x.shape, x.shape[-1]
    out: list[tuple[str, torch.Tensor]] = []
    for i in range(random_count):
        out.append((f"randn{i}", torch.randn(*shape, generator=g, dtype=x.dtype)))
    out.append(("ones", torch.ones_like(x)))
    out.append(("-ones", -torch.ones_like(x)))
    alt = torch.ones(d, dtype=x.dtype)
    alt[1::2] = -1
    out.append(("alternating", alt.expand(shape).clone()))
    last = torch.zeros_like(x)
    last.view(-1)[-1] = 1.0
    out.append(("onehot_last", last))
    if quick and weights:
        out.append(("null0[:1]", _null_of_rows(weights[0], 1, shape, g)))
    if not quick:
        first = torch.zeros_like(x)
        first.view(-1)[0] = 1.0
        out.append(("onehot_first", first))
        out.append(("-onehot_last", -last))
        out.append(("ones+noise", torch.ones_like(x) + 1e-3 * torch.randn(*shape, generator=g, dtype=x.dtype)))
        row = torch.randn(*shape[:-1][:1], *([1] * (len(shape) - 2)), d, generator=g, dtype=x.dtype)
        out.append(("rows_equal", row.expand(shape).clone()))
        for j, weight in enumerate(weights[:2]):
            for k in (1, min(4, weight.shape[0])):
                out.append((f"null{j}[:{k}]", _null_of_rows(weight, k, shape, g)))
        one_zero = torch.randn(*shape, generator=g, dtype=x.dtype)
        one_zero[..., 0] = 0.0
        out.append(("one entry zero", one_zero))
        if x.dim() >= 2:
            token = torch.zeros_like(x)
            token[..., 0, :] = torch.randn(token[..., 0, :].shape, generator=g, dtype=x.dtype)
            out.append(("single token", token))
    return [(name, _unit(t)) for name, t in out if t.norm() > 0]


def _model_directions(
    model: torch.nn.Module, x: torch.Tensor, hints: dict, quick: bool
) -> list[tuple[str, torch.Tensor]]:
    weights = [lin.weight for lin in _linears(model, x.shape[-1])]
    hinted_directions = hints.get("directions", lambda m, x: [])(model, x)
    hinted = [(f"hint{i}", _unit(t.to(x.dtype))) for i, t in enumerate(hinted_directions)]
    return directions(x, weights, random_count=1 if quick else 3, quick=quick) + hinted


def redraw(scale: float, seed: int) -> Callable[[torch.nn.Module], None]:
    def apply(model: torch.nn.Module) -> None:
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))

    return apply


def _negate(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.neg_()


def perturbations(hints: dict, quick: bool) -> list[tuple[str, Optional[Callable]]]:
    out: list[tuple[str, Optional[Callable]]] = [(AS_BUILT, None), ("redrawn", redraw(1.0, 7))]
    if not quick:
        out += [("negated", _negate), ("redrawn x3", redraw(3.0, 11))]
    out += list(hints.get("perturb", {}).items())
    return out



def velocity(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    if isinstance(out, tuple):
        out = out[0]
    return out - x


@dataclass
class Ray:
    perturbation: str
    direction: str
    norms: list[float]  # ||v(s d)|| on the coarse grid SCALES, up to the first non-finite value
    nonfinite_at: Optional[float]  # the first scale with a non-finite value (or an overflowing norm)
    tail_slope: Optional[float]  # envelope exponent over TAIL_SCALES (None if something was not finite)
    max_slope: float  # steepest local slope on the coarse grid's finite prefix


def _slopes(norms: list[float], scales: list[float]) -> list[float]:
    logs = [math.log10(max(n, 1e-300)) for n in norms]
    return [(logs[i + 1] - logs[i]) / (math.log10(scales[i + 1]) - math.log10(scales[i]))
            for i in range(len(norms) - 1)]


def _norm(model: torch.nn.Module, x: torch.Tensor) -> float:
    v = velocity(model, x)
    return v.norm().item() if torch.isfinite(v).all() else math.inf


def envelope_slope(norms: list[float], scales: list[float]) -> float:
    """Least-squares slope of log sup_{t <= s} ||v(t d)|| against log s over [FIT_FROM, 1e6].

    The bound ||v|| <= c |x|^q + b is about this envelope; reading it rather than the
    raw norms keeps oscillating factors (cos, a polar angle) from faking steep slopes.
    A velocity that is numerically zero over the window has slope 0; one that switches
    on inside it is read from where it does.
    """
    envelope, top = [], 0.0
    for n in norms:
        top = max(top, n)
        envelope.append(top)
    points = [(math.log10(s), math.log10(e)) for s, e in zip(scales, envelope) if s >= FIT_FROM * (1 - 1e-9) and e > 0]
    if len(points) < 8:
        return 0.0
    mx = sum(a for a, _ in points) / len(points)
    my = sum(b for _, b in points) / len(points)
    return sum((a - mx) * (b - my) for a, b in points) / sum((a - mx) ** 2 for a, _ in points)


def _denoise(grid: list[list[float]]) -> list[list[float]]:
    """Zero the norms that are float64 roundoff: below ROUNDOFF x the largest velocity at that scale.

    A direction along which v vanishes exactly (mean(x) = 0 for alternating signs, say)
    still returns ~1e-16 x (the magnitudes involved); that noise is no growth of v.
    """
    out = [list(row) for row in grid]
    for j in range(len(grid[0]) if grid else 0):
        column = [row[j] for row in grid if math.isfinite(row[j])]
        ref = max(column, default=0.0)
        for row in out:
            if math.isfinite(row[j]) and row[j] < ROUNDOFF * ref:
                row[j] = 0.0
    return out


def measure_rays(model: torch.nn.Module, dirs: list[tuple[str, torch.Tensor]], perturbation: str) -> list[Ray]:
    """Measure every direction under one parameter setting (the roundoff floor compares them)."""
    coarse = [[_norm(model, s * d) for s in SCALES] for _, d in dirs]
    tail = [[_norm(model, s * d) for s in TAIL_SCALES] for _, d in dirs]
    coarse, tail = _denoise(coarse), _denoise(tail)
    rays = []
    for (name, _), c_row, t_row in zip(dirs, coarse, tail):
        first_bad = next((i for i, n in enumerate(c_row) if not math.isfinite(n)), None)
        norms = c_row if first_bad is None else c_row[:first_bad]
        nonfinite_at = None if first_bad is None else SCALES[first_bad]
        slopes = _slopes(norms, SCALES[: len(norms)]) if all(n > 0 for n in norms) else _onset_slopes(norms)
        max_slope = max(slopes) if slopes else 0.0
        slope = None
        if nonfinite_at is None:
            bad_tail = next((s for s, n in zip(TAIL_SCALES, t_row) if not math.isfinite(n)), None)
            if bad_tail is None:
                slope = envelope_slope(t_row, TAIL_SCALES)
            else:
                nonfinite_at = bad_tail
        rays.append(Ray(perturbation, name, norms, nonfinite_at, slope, max_slope))
    return rays


def _onset_slopes(norms: list[float]) -> list[float]:
    """Local slopes of a ray that is exactly zero at some scales: only between nonzero neighbours."""
    scales = SCALES[: len(norms)]
    return [
        (math.log10(norms[i + 1]) - math.log10(norms[i])) / (math.log10(scales[i + 1]) - math.log10(scales[i]))
        for i in range(len(norms) - 1)
        if norms[i] > 0 and norms[i + 1] > 0
    ]




@dataclass
class Witness:
    """All rays of one model: the largest measured exponent and whether anything overflowed."""

    rays: list[Ray] = field(default_factory=list)

    @property
    def measured(self) -> Optional[float]:
        tails = [r.tail_slope for r in self.rays if r.tail_slope is not None]
        return max(tails) if tails else None

    @property
    def nonfinite(self) -> bool:
        return any(r.nonfinite_at is not None for r in self.rays)

    @property
    def max_prefix_slope(self) -> float:
        return max((r.max_slope for r in self.rays), default=0.0)

    def worst(self) -> Optional[Ray]:
        finite = [r for r in self.rays if r.tail_slope is not None]
        return max(finite, key=lambda r: r.tail_slope) if finite else None


def witness(
    build: Callable[[], tuple[torch.nn.Module, torch.Tensor]], *, quick: bool = False, hints: Optional[dict] = None,
    grad: bool = False,
) -> Witness:
    """Measure a freshly built (float64) model and input under every perturbation and direction;
    ``grad``: with gradients enabled (a training forward, which may branch on it)."""
    hints = hints or {}
    result = Witness()
    with torch.set_grad_enabled(grad):
        for name, perturb in perturbations(hints, quick):
            model, x = build()
            if perturb is not None:
                with torch.no_grad():
                    perturb(model)
            result.rays.extend(measure_rays(model, _model_directions(model, x, hints, quick), name))
    return result
