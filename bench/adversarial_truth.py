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

Usage:  python bench/adversarial_truth.py [--quick] [-k SUBSTRING] [--cases FILE]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from qlint.probe.witness import Ray, velocity, witness  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ADVERSARIAL = ROOT / "fixtures" / "adversarial"
CASES_FILES = sorted(ADVERSARIAL.glob("CASES*.toml"))  # CASES.toml, then each review round's CASES_<round>.toml

TOL = 0.25
INF_SLOPE = 5.0
POLE_RATIO = 1e3
POLE_DELTAS = [10.0 ** -k for k in range(1, 11)]


# ------------------------------------------------------------------ cases


@dataclass
class Case:
    spec: str  # "FILE.py:FACTORY", relative to fixtures/adversarial (or, failing that, to its CASES file)
    expect: str  # "safe" | "unsafe"
    q_true: Any  # float, "inf" or "pole"
    family: int
    why: str
    folder: Path = ADVERSARIAL  # the folder FILE.py lies in

    @property
    def file(self) -> str:
        return self.spec.split(":")[0]

    @property
    def factory_name(self) -> str:
        return self.spec.split(":")[1]

    @property
    def cli_spec(self) -> str:
        """The spec as the CLI takes it, relative to the repository root where it lies inside."""
        folder = self.folder.resolve()
        where = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        return f"{where.as_posix()}/{self.spec}" if self.folder != ADVERSARIAL else f"fixtures/adversarial/{self.spec}"


def load_cases(paths: Optional[list[Path]] = None) -> list[Case]:
    cases = []
    for spec, entry, source in _entries(paths or CASES_FILES):
        q = entry["q_true"]
        if not isinstance(q, str):
            q = float(q)
        elif q not in ("inf", "pole"):
            raise ValueError(f"{spec}: q_true must be a number, 'inf' or 'pole', not {q!r}")
        folder = ADVERSARIAL if (ADVERSARIAL / spec.split(":")[0]).exists() else source.parent  # a review's own folder
        case = Case(spec, entry["expect"], q, int(entry["family"]), entry["why"], folder)
        if case.expect not in ("safe", "unsafe"):
            raise ValueError(f"{spec}: expect must be 'safe' or 'unsafe'")
        unsafe = isinstance(q, str) or q > 1
        if unsafe != (case.expect == "unsafe"):
            raise ValueError(f"{spec}: expect = {case.expect!r} contradicts q_true = {q!r}")
        cases.append(case)
    return cases


def _entries(paths: list[Path]) -> list[tuple[str, dict, Path]]:
    entries: dict[str, tuple[str, dict, Path]] = {}
    for path in paths:
        for spec, entry in tomllib.loads(path.read_text())["cases"].items():
            if spec in entries:
                raise ValueError(f"{spec} is labelled twice ({path.name})")
            entries[spec] = (spec, entry, path)
    return list(entries.values())


_MODULES: dict[str, Any] = {}


def factory_of(case: Case) -> Callable:
    """Import fixtures/adversarial/FILE.py (once) and return the factory."""
    if case.file not in _MODULES:
        path = (case.folder / case.file).resolve()
        # the fixtures' shared harness (common.py) is their folder's own: the CLI imports it from the spec's folder
        sys.path.insert(0, str(path.parent))
        sys.modules.pop("common", None)
        spec = importlib.util.spec_from_file_location(f"adversarial_{path.parent.name}_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[case.file] = module
    return getattr(_MODULES[case.file], case.factory_name)


def build(factory: Callable) -> tuple[torch.nn.Module, torch.Tensor]:
    model, inputs = factory()
    model = model.double()
    return model, inputs[0].double()


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
    measured = witness(lambda: build(factory), quick=quick, hints=hints)
    result.rays = measured.rays
    if case.q_true == "pole":
        if "pole" not in hints:
            result.reason = "q_true = 'pole' but the factory names no pole input (truth(pole=...))"
            result.seconds = time.perf_counter() - start
            return result
        with torch.no_grad():
            model, x = build(factory)
            result.pole = measure_pole(model, x, hints)
    result.measured, result.max_prefix_slope, result.nonfinite = (measured.measured, measured.max_prefix_slope,
                                                                  measured.nonfinite)
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
        result.reason = (f"non-finite v at s={bad.nonfinite_at:.3g} ({bad.perturbation}, {bad.direction}) for a "
                         "polynomial label")
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
    parser.add_argument("--quick", action="store_true",
                        help="fewer directions and perturbations (the test suite's mode)")
    parser.add_argument("-k", default="", help="only cases whose spec contains this substring")
    parser.add_argument("--cases", type=Path, action="append",
                        help="a cases file (default: every fixtures/adversarial/CASES*.toml)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cases = [c for c in load_cases(args.cases) if args.k in c.spec]
    header = f"{'case':48} {'fam':>3} {'label':6} {'q_true':>6} {'measured':>8} {'nonfin':>6}  verdict"
    print(header)
    print("-" * len(header))
    contradicted = []
    start = time.perf_counter()
    for case in cases:
        try:
            result = check_case(case, quick=args.quick)
        except Exception as exc:  # a case that does not run cannot be confirmed
            print(f"{case.spec:48} {case.family:>3} {case.expect:6} {_fmt_q(case.q_true):>6} {'-':>8} {'-':>6}  ERROR "
                  f"{type(exc).__name__}: {exc}")
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
