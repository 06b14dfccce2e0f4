"""Numerically confirm every label of the adversarial corpus (fixtures/adversarial/CASES.toml).

Every case is a map F from its input to an output of the same shape, so its
velocity is v(x) = F(x) - x. For each case, in float64, this script measures how
||v(s d)|| grows over the scales s = 1e0 .. 1e6 along several directions d: random
ones, one entry nonzero, constant rows, alternating signs, the null spaces of the
first linear layers' rows, and any the fixture names itself. It does this for the
parameters as built and for adversarial parameter values too (signs flipped, every
parameter redrawn, which also makes zero-initialised ones nonzero, the same at 3x
scale, and any perturbation the fixture names), because q must hold for every
parameter value.

The measured exponent of one (perturbation, direction) is the least-squares slope
of log sup_{t <= s} ||v(t d)|| against log s over the last two decades (1e4 ..
1e6, 16 scales a decade, the running maximum started at 1e3): the bound is about
that envelope, and reading it keeps oscillating factors (cos, a polar angle) from
faking steep slopes. A velocity below 1e-10 of the largest one measured at the same
scale and parameters counts as 0: it is float64 rounding of a v that vanishes along
that direction (mean(x) for alternating signs), not growth. A case's measured
exponent is the maximum over all of them. Super-polynomial growth is read on the
coarse grid 1e0 .. 1e6: the steepest local slope before the values stop being
finite. The quick mode (the test suite's) keeps 6 generic directions (random, +-1,
alternating, one entry, a gate row's null space), the fixture's own, the parameters
as built, redrawn and the fixture's own perturbations.

A label is CONFIRMED when:

* q_true a number (safe or unsafe): no non-finite value anywhere, and the measured
  exponent is q_true within 0.25 (so a safe case shows at most ~1, an unsafe case
  clearly more than 1, and the hand derivation is tight);
* q_true = "inf": some (perturbation, direction) shows a local slope of at least 5
  before its values stop being finite (exponential growth: slopes climb without
  bound, then overflow), or a trainable exponent set to 8 shows slope 8 (no finite
  q holds for every parameter value);
* q_true = "pole": at the input the fixture names as a pole (its denominator 0),
  v is non-finite or huge, and ||v|| grows by at least 1e3 as that input is
  approached from 1e-1 to 1e-10 away: no finite b bounds v near there.

Usage:  python bench/adversarial_truth.py [--quick] [-k SUBSTRING]
Exits 1 if any label is contradicted (or a case fails to run).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
ADVERSARIAL = ROOT / "fixtures" / "adversarial"
CASES_FILE = ADVERSARIAL / "CASES.toml"

SCALES = [10.0 ** (k / 2) for k in range(13)]  # 1e0 .. 1e6, half decades: blow-ups, super-polynomial slopes
TAIL_SCALES = [10.0 ** (3 + k / 16) for k in range(49)]  # 1e3 .. 1e6, 16 a decade: the envelope
FIT_FROM = 1e4  # the measured exponent is the envelope's slope over [FIT_FROM, 1e6]
ROUNDOFF = 1e-10  # a velocity below this fraction of the largest one at the same scale is rounding noise
TOL = 0.25
INF_SLOPE = 5.0
POLE_RATIO = 1e3
POLE_DELTAS = [10.0 ** -k for k in range(1, 11)]


# ------------------------------------------------------------------ cases


@dataclass
class Case:
    spec: str  # "FILE.py:FACTORY", relative to fixtures/adversarial
    expect: str  # "safe" | "unsafe"
    q_true: Any  # float, "inf" or "pole"
    family: int
    why: str

    @property
    def file(self) -> str:
        return self.spec.split(":")[0]

    @property
    def factory_name(self) -> str:
        return self.spec.split(":")[1]

    @property
    def cli_spec(self) -> str:
        """The spec as the CLI takes it, relative to the repository root."""
        return f"fixtures/adversarial/{self.spec}"


def load_cases(path: Path = CASES_FILE) -> list[Case]:
    data = tomllib.loads(path.read_text())
    cases = []
    for spec, entry in data["cases"].items():
        q = entry["q_true"]
        if not isinstance(q, str):
            q = float(q)
        elif q not in ("inf", "pole"):
            raise ValueError(f"{spec}: q_true must be a number, 'inf' or 'pole', not {q!r}")
        case = Case(spec, entry["expect"], q, int(entry["family"]), entry["why"])
        if case.expect not in ("safe", "unsafe"):
            raise ValueError(f"{spec}: expect must be 'safe' or 'unsafe'")
        unsafe = isinstance(q, str) or q > 1
        if unsafe != (case.expect == "unsafe"):
            raise ValueError(f"{spec}: expect = {case.expect!r} contradicts q_true = {q!r}")
        cases.append(case)
    return cases


_MODULES: dict[str, Any] = {}


def factory_of(case: Case) -> Callable:
    """Import fixtures/adversarial/FILE.py (once) and return the factory."""
    if case.file not in _MODULES:
        path = ADVERSARIAL / case.file
        spec = importlib.util.spec_from_file_location(f"adversarial_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[case.file] = module
    return getattr(_MODULES[case.file], case.factory_name)


def build(factory: Callable) -> tuple[torch.nn.Module, torch.Tensor]:
    model, inputs = factory()
    model = model.double()
    return model, inputs[0].double()


# ------------------------------------------------------------------ directions and perturbations


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


def directions(model: torch.nn.Module, x: torch.Tensor, hints: dict, quick: bool) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    shape, d = x.shape, x.shape[-1]
    out: list[tuple[str, torch.Tensor]] = []
    for i in range(1 if quick else 3):
        out.append((f"randn{i}", torch.randn(*shape, generator=g, dtype=x.dtype)))
    out.append(("ones", torch.ones_like(x)))
    out.append(("-ones", -torch.ones_like(x)))
    alt = torch.ones(d, dtype=x.dtype)
    alt[1::2] = -1
    out.append(("alternating", alt.expand(shape).clone()))
    last = torch.zeros_like(x)
    last.view(-1)[-1] = 1.0
    out.append(("onehot_last", last))
    linears = _linears(model, d)
    if quick and linears:
        out.append(("null0[:1]", _null_of_rows(linears[0].weight, 1, shape, g)))
    if not quick:
        first = torch.zeros_like(x)
        first.view(-1)[0] = 1.0
        out.append(("onehot_first", first))
        out.append(("-onehot_last", -last))
        out.append(("ones+noise", torch.ones_like(x) + 1e-3 * torch.randn(*shape, generator=g, dtype=x.dtype)))
        out.append(("rows_equal", torch.randn(*shape[:-1][:1], *([1] * (len(shape) - 2)), d, generator=g, dtype=x.dtype).expand(shape).clone()))
        for j, lin in enumerate(linears[:2]):
            for k in (1, min(4, lin.out_features)):
                out.append((f"null{j}[:{k}]", _null_of_rows(lin.weight, k, shape, g)))
    for i, t in enumerate(hints.get("directions", lambda m, x: [])(model, x)):
        out.append((f"hint{i}", t.to(x.dtype)))
    return [(name, _unit(t)) for name, t in out]


def _redraw(scale: float, seed: int) -> Callable[[torch.nn.Module], None]:
    def apply(model: torch.nn.Module) -> None:
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))

    return apply


def _negate(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.neg_()


def perturbations(hints: dict, quick: bool) -> list[tuple[str, Optional[Callable]]]:
    out: list[tuple[str, Optional[Callable]]] = [("as built", None), ("redrawn", _redraw(1.0, 7))]
    if not quick:
        out += [("negated", _negate), ("redrawn x3", _redraw(3.0, 11))]
    out += list(hints.get("perturb", {}).items())
    return out


# ------------------------------------------------------------------ measurement


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
    return [(logs[i + 1] - logs[i]) / (math.log10(scales[i + 1]) - math.log10(scales[i])) for i in range(len(norms) - 1)]


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
class Pole:
    at_pole: float  # ||v(x0)|| (inf / nan allowed)
    near: list[float]  # ||v(x0 + delta d)|| for POLE_DELTAS
    ratio: float  # ||v|| at the closest delta over ||v|| at the farthest

    @property
    def confirmed(self) -> bool:
        finite_near = [n for n in self.near if math.isfinite(n)]
        blows_up = not math.isfinite(self.at_pole) or self.at_pole > 1e8
        grows = len(finite_near) < len(self.near) or self.ratio >= POLE_RATIO
        return blows_up and grows


def measure_pole(model: torch.nn.Module, x: torch.Tensor, hints: dict) -> Pole:
    x0, d = hints["pole"](model, x)
    x0, d = x0.to(x.dtype), d.to(x.dtype)
    at_pole = velocity(model, x0).norm().item()
    near = [velocity(model, x0 + delta * d).norm().item() for delta in POLE_DELTAS]
    finite = [n for n in near if math.isfinite(n)]
    ratio = (finite[-1] / max(finite[0], 1e-300)) if len(finite) >= 2 else math.inf
    return Pole(at_pole, near, ratio)


@dataclass
class Result:
    case: Case
    rays: list[Ray] = field(default_factory=list)
    pole: Optional[Pole] = None
    measured: Optional[float] = None  # max tail slope over the all-finite rays
    max_prefix_slope: float = 0.0
    nonfinite: bool = False
    confirmed: bool = False
    reason: str = ""
    seconds: float = 0.0

    def worst(self) -> Optional[Ray]:
        finite = [r for r in self.rays if r.tail_slope is not None]
        return max(finite, key=lambda r: r.tail_slope) if finite else None


def check_case(case: Case, quick: bool = False) -> Result:
    start = time.perf_counter()
    result = Result(case)
    factory = factory_of(case)
    hints = getattr(factory, "truth", {})
    with torch.no_grad():
        for pname, perturb in perturbations(hints, quick):
            model, x = build(factory)
            if perturb is not None:
                perturb(model)
            result.rays.extend(measure_rays(model, directions(model, x, hints, quick), pname))
        if case.q_true == "pole":
            if "pole" not in hints:
                result.reason = "q_true = 'pole' but the factory names no pole input (truth(pole=...))"
                result.seconds = time.perf_counter() - start
                return result
            model, x = build(factory)
            result.pole = measure_pole(model, x, hints)
    tails = [r.tail_slope for r in result.rays if r.tail_slope is not None]
    result.measured = max(tails) if tails else None
    result.max_prefix_slope = max(r.max_slope for r in result.rays)
    result.nonfinite = any(r.nonfinite_at is not None for r in result.rays)
    _judge(result)
    result.seconds = time.perf_counter() - start
    return result


def _judge(result: Result) -> None:
    case, q = result.case, result.case.q_true
    if q == "pole":
        pole = result.pole
        assert pole is not None
        result.confirmed = pole.confirmed
        result.reason = (
            f"||v|| at the pole input = {pole.at_pole:.3g}; grows x{pole.ratio:.3g} from delta=1e-1 to 1e-10"
            + ("" if pole.confirmed else f" (needs a non-finite/huge value at the pole and growth >= {POLE_RATIO:g})")
        )
        return
    if q == "inf":
        worst = max(result.rays, key=lambda r: r.max_slope)
        result.confirmed = worst.max_slope >= INF_SLOPE
        where = f"non-finite from s={worst.nonfinite_at:.3g}" if worst.nonfinite_at else "finite"
        result.reason = f"steepest local slope {worst.max_slope:.3g} ({worst.perturbation}, {worst.direction}; {where})"
        if not result.confirmed:
            result.reason += f" < {INF_SLOPE}: no super-polynomial growth seen"
        return
    if result.nonfinite:
        bad = next(r for r in result.rays if r.nonfinite_at is not None)
        result.reason = f"non-finite v at s={bad.nonfinite_at:.3g} ({bad.perturbation}, {bad.direction}) for a polynomial label"
        return
    worst = result.worst()
    assert worst is not None and result.measured is not None
    ok = abs(result.measured - q) <= TOL
    if case.expect == "safe":
        ok = ok and result.measured <= 1 + TOL
    else:
        ok = ok and result.measured > 1 + TOL
    result.confirmed = ok
    result.reason = f"measured {result.measured:.3f} at ({worst.perturbation}, {worst.direction})" + (
        "" if ok else f"; q_true = {q:g} needs |measured - q_true| <= {TOL}"
    )


# ------------------------------------------------------------------ report


def _fmt_q(q: Any) -> str:
    return q if isinstance(q, str) else f"{q:g}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer directions and perturbations (the test suite's mode)")
    parser.add_argument("-k", default="", help="only cases whose spec contains this substring")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cases = [c for c in load_cases() if args.k in c.spec]
    header = f"{'case':48} {'fam':>3} {'label':6} {'q_true':>6} {'measured':>8} {'nonfin':>6}  verdict"
    print(header)
    print("-" * len(header))
    contradicted = []
    start = time.perf_counter()
    for case in cases:
        try:
            result = check_case(case, quick=args.quick)
        except Exception as exc:  # a case that does not run cannot be confirmed
            print(f"{case.spec:48} {case.family:>3} {case.expect:6} {_fmt_q(case.q_true):>6} {'-':>8} {'-':>6}  ERROR {type(exc).__name__}: {exc}")
            contradicted.append(case.spec)
            continue
        measured = "-" if result.measured is None else f"{result.measured:.2f}"
        verdict = "CONFIRMED" if result.confirmed else "CONTRADICTED"
        print(
            f"{case.spec:48} {case.family:>3} {case.expect:6} {_fmt_q(case.q_true):>6} {measured:>8} "
            f"{'yes' if result.nonfinite else 'no':>6}  {verdict}: {result.reason}"
        )
        if not result.confirmed:
            contradicted.append(case.spec)
    by_family: dict[int, list[int]] = {}
    for case in cases:
        counts = by_family.setdefault(case.family, [0, 0])
        counts[case.expect == "safe"] += 1
    print("-" * len(header))
    print("per family (unsafe/safe): " + ", ".join(f"{f}: {u}/{s}" for f, (u, s) in sorted(by_family.items())))
    print(f"{len(cases) - len(contradicted)}/{len(cases)} labels CONFIRMED in {time.perf_counter() - start:.1f} s")
    if contradicted:
        print("CONTRADICTED: " + ", ".join(contradicted))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
