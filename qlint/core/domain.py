"""The abstract value qlint propagates: a growth exponent plus entrywise facts.

A :class:`Growth` describes one tensor relative to the seeded inputs of a pass (the
block input X_k, and any other input-derived value the block reads):

- ``q``: the exponent of ``||value||`` in the inputs' magnitude (:mod:`.algebra`);
- ``depends``: whether the value depends on a seeded input at all (a parameter does not);
- ``real``: True for a real dtype, False for complex, None when unknown; order facts
  exist only for real values;
- ``range``: a :class:`Range` of entrywise bounds that hold for *every* input and
  *every* parameter value, which is what lets ``exp`` of a non-positive argument or a
  division by a value bounded away from zero be bounded.

Parameters are arbitrary reals here: training may move them anywhere, so no fact is
ever read off their current values. Every transfer in this module is sound for all
inputs and all parameter values; ``tests/core/test_domain.py`` checks each one numerically.
"""

from __future__ import annotations

import math
import operator
import sys
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Optional

from qlint.core.algebra import Exponent

INF = math.inf


@dataclass(frozen=True)
class Range:
    """Entrywise bounds of a real tensor, valid for all inputs and all parameter values.

    ``lo``/``hi`` are numbers that bound every entry uniformly (``-inf``/``inf`` when
    there is none). The other facts are per parameter value: ``below``/``above`` say
    that for each fixed parameter value the entries are bounded below/above uniformly
    in the input (a bias ``b`` is, whatever ``b`` is); ``floor`` that they are at least
    some ``c > 0`` (a safe denominator), ``ceil`` that they are at most ``-c < 0``;
    ``pos``/``neg`` that every entry is strictly positive/negative (``exp``), which for
    a value independent of the input also gives a floor. ``lo_open``/``hi_open`` say
    that a finite bound is never attained (sigmoid lies in the open (0, 1)): what lets a
    loop's carry be proved below 1 (``pos`` is ``lo_open`` at 0).
    """

    lo: float = -INF
    hi: float = INF
    pos: bool = False
    neg: bool = False
    below: bool = False
    above: bool = False
    floor: bool = False
    ceil: bool = False
    lo_open: bool = False
    hi_open: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.lo_open and self.lo == 0:
            set_(self, "pos", True)
        if self.hi_open and self.hi == 0:
            set_(self, "neg", True)
        if self.lo > 0:
            set_(self, "pos", True)
            set_(self, "floor", True)
        if self.hi < 0:
            set_(self, "neg", True)
            set_(self, "ceil", True)
        if self.floor:
            set_(self, "pos", True)
        if self.ceil:
            set_(self, "neg", True)
        if self.pos and self.lo < 0:
            set_(self, "lo", 0.0)
        if self.neg and self.hi > 0:
            set_(self, "hi", 0.0)
        if self.pos and self.lo == 0:
            set_(self, "lo_open", True)
        if self.neg and self.hi == 0:
            set_(self, "hi_open", True)
        if math.isinf(self.lo):
            set_(self, "lo_open", False)
        if math.isinf(self.hi):
            set_(self, "hi_open", False)
        if self.lo > -INF or self.floor:
            set_(self, "below", True)
        if self.hi < INF or self.ceil:
            set_(self, "above", True)

    @property
    def nonneg(self) -> bool:
        return self.lo >= 0

    @property
    def nonpos(self) -> bool:
        return self.hi <= 0

    @property
    def bounded(self) -> bool:
        """Bounded on both sides for each parameter value."""
        return self.below and self.above

    def constant(self) -> "Range":
        """The same facts for a value that does not depend on the input.

        Such a value is one fixed tensor for each parameter value: finite, so bounded,
        and when every entry is strictly positive its minimum is a positive floor.
        """
        return replace(self, below=True, above=True, floor=self.floor or self.pos, ceil=self.ceil or self.neg)


ANY = Range()


def point(value: float) -> Range:
    """The range of a known number."""
    return Range(lo=value, hi=value) if math.isfinite(value) else ANY


def interval(lo: float, hi: float, *, pos: bool = False, neg: bool = False, is_open: bool = False) -> Range:
    """[lo, hi], or the open (lo, hi) with ``is_open``."""
    return Range(lo=lo, hi=hi, pos=pos, neg=neg, lo_open=is_open, hi_open=is_open)


def negate(r: Range) -> Range:
    return Range(lo=-r.hi, hi=-r.lo, pos=r.neg, neg=r.pos, below=r.above, above=r.below, floor=r.ceil, ceil=r.floor,
                 lo_open=r.hi_open, hi_open=r.lo_open)


def strictly_below(r: Range, bound: float) -> bool:
    """Every entry is < bound (for every input and parameter value)."""
    return r.hi < bound or (r.hi == bound and r.hi_open)


def strictly_above(r: Range, bound: float) -> bool:
    return r.lo > bound or (r.lo == bound and r.lo_open)


def _sum(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b) and a != b:
        return math.nan  # never reached: lo sums only -inf, hi sums only +inf
    return a + b


def add(a: Range, b: Range) -> Range:
    """a + b entrywise (broadcast); a rounded end is moved out by one ulp."""
    lo, hi = _sum(a.lo, b.lo), _sum(a.hi, b.hi)
    lo_exact, hi_exact = _exact(lo, a.lo, b.lo, operator.add), _exact(hi, a.hi, b.hi, operator.add)
    return Range(
        lo=_outward(lo, lo_exact, down=True),
        hi=_outward(hi, hi_exact, down=False),
        pos=(a.pos and b.nonneg) or (b.pos and a.nonneg),
        neg=(a.neg and b.nonpos) or (b.neg and a.nonpos),
        below=a.below and b.below,
        above=a.above and b.above,
        floor=(a.floor and b.nonneg) or (b.floor and a.nonneg),
        ceil=(a.ceil and b.nonpos) or (b.ceil and a.nonpos),
        lo_open=(a.lo_open or b.lo_open) and lo_exact,  # x > a.lo, y >= b.lo: x + y > a.lo + b.lo
        hi_open=(a.hi_open or b.hi_open) and hi_exact,
    )


def _exact(result: float, a: float, b: float, operation) -> bool:
    """The float ``result`` of ``a op b`` is the true one (an infinite end is exact: nothing to round).

    Only then may an end be claimed open; otherwise it is moved outward (:func:`_outward`),
    so a bound never rounds inward across a threshold such as a carry's 1.
    """
    if not (math.isfinite(result) and math.isfinite(a) and math.isfinite(b)):
        return not math.isnan(result)
    return Fraction(result) == operation(Fraction(a), Fraction(b))


def _outward(value: float, exact: bool, *, down: bool) -> float:
    """A rounded bound moved one ulp outward: round-to-nearest errs by at most half an ulp.

    An end that overflowed towards the inside (a lower bound of +inf) is the largest float.
    """
    if math.isinf(value) and (value > 0) == down:
        return math.copysign(sys.float_info.max, value)
    if exact or not math.isfinite(value):
        return value
    return math.nextafter(value, -INF if down else INF)


def _product(a: float, b: float) -> float:
    """Endpoint product with 0 * inf = 0: a bound of 0 times any finite value is 0."""
    if a == 0 or b == 0:
        return 0.0
    return a * b


def mul(a: Range, b: Range) -> Range:
    """a * b entrywise (broadcast), by interval arithmetic plus sign facts."""
    products = [(_product(x, y), x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    exact = [(v, _exact_product(v, x, y)) for v, x, y in products]
    lo_open, hi_open = _open_product(a, b)
    return Range(
        lo=min(_outward(v, ok, down=True) for v, ok in exact),  # each end product moved out if it rounded
        hi=max(_outward(v, ok, down=False) for v, ok in exact),
        lo_open=lo_open,
        hi_open=hi_open,
        pos=(a.pos and b.pos) or (a.neg and b.neg),
        neg=(a.pos and b.neg) or (a.neg and b.pos),
        below=a.bounded and b.bounded,
        above=a.bounded and b.bounded,
        floor=(a.floor and b.floor) or (a.ceil and b.ceil),
        ceil=(a.floor and b.ceil) or (a.ceil and b.floor),
    )


def _exact_product(value: float, x: float, y: float) -> bool:
    return x == 0 or y == 0 or _exact(value, x, y, operator.mul)


def divide(r: Range, c: float) -> Range:
    """r / c for a number c != 0: correctly rounded quotients (49 / 49 is 1), moved out when inexact."""
    if not math.isfinite(c) or c == 0:
        return ANY
    if c < 0:
        return negate(divide(r, -c))
    lo, hi = r.lo / c, r.hi / c
    lo_exact = not math.isfinite(r.lo) or (math.isfinite(lo) and Fraction(lo) * Fraction(c) == Fraction(r.lo))
    hi_exact = not math.isfinite(r.hi) or (math.isfinite(hi) and Fraction(hi) * Fraction(c) == Fraction(r.hi))
    return Range(lo=_outward(lo, lo_exact, down=True), hi=_outward(hi, hi_exact, down=False), pos=r.pos, neg=r.neg,
                 below=r.below, above=r.above, floor=r.floor, ceil=r.ceil,
                 lo_open=r.lo_open and lo_exact, hi_open=r.hi_open and hi_exact)


def reciprocal(r: Range) -> Range:
    """1/x for x at least some c > 0 (``r.floor``): decreasing, so the ends swap and keep their openness.
    If x is also at most some M for each parameter value (``r.above``), 1/x is at least 1/M > 0: a floor."""
    lo = 1.0 / r.hi if r.hi < INF else 0.0
    hi = 1.0 / r.lo if r.lo > 0 else INF
    lo_exact = r.hi == INF or (math.isfinite(lo) and Fraction(lo) * Fraction(r.hi) == 1)  # 1 / 2e-313 overflows
    hi_exact = hi == INF or (math.isfinite(r.lo) and Fraction(hi) * Fraction(r.lo) == 1)
    return Range(lo=max(0.0, _outward(lo, lo_exact, down=True)), hi=_outward(hi, hi_exact, down=False), pos=True,
                 below=True, above=True, floor=r.above, lo_open=r.hi == INF or (r.hi_open and lo_exact),
                 hi_open=r.lo_open and hi_exact)


def _open_product(a: Range, b: Range) -> tuple[bool, bool]:
    """Which ends of a * b are never attained (the carry's products: c · x, x · y >= 0).

    A number c != 0 scales b's ends and keeps their openness (swapped for c < 0). For
    a, b >= 0 the product's top a.hi * b.hi is missed when either factor misses its top
    and the other's top is positive (x < a.hi, 0 <= y <= b.hi give x y < a.hi b.hi);
    its bottom is the ``pos`` fact. Everything else is claimed closed (sound, coarser).
    """
    for c, r in ((a, b), (b, a)):
        if c.lo == c.hi and math.isfinite(c.lo) and c.lo != 0:
            k = c.lo
            # the ends of r that give the product's low and high ends
            low, high = (r.lo, r.hi) if k > 0 else (r.hi, r.lo)
            open_low, open_high = (r.lo_open, r.hi_open) if k > 0 else (r.hi_open, r.lo_open)
            return (open_low and _exact(k * low, k, low, operator.mul),
                    open_high and _exact(k * high, k, high, operator.mul))
    if a.nonneg and b.nonneg:
        return (False,
                ((a.hi_open and b.hi > 0) or (b.hi_open and a.hi > 0))
                and _exact(a.hi * b.hi, a.hi, b.hi, operator.mul))
    return False, False


def square(a: Range) -> Range:
    """x * x for the same real x: non-negative, whatever the sign of x."""
    if a.nonneg:
        return mul(a, a)
    if a.nonpos:
        return mul(negate(a), negate(a))
    top = max(_outward(v, _exact_product(v, x, x), down=False) for v, x in ((_product(x, x), x) for x in (a.lo, a.hi)))
    return Range(lo=0.0, hi=top, above=a.bounded, below=True)


def union(*ranges: Range) -> Range:
    """A value that is, entrywise, one of several values (where, max/min, cat)."""
    first, *rest = ranges
    out = first
    for r in rest:
        out = Range(
            lo=min(out.lo, r.lo),
            hi=max(out.hi, r.hi),
            pos=out.pos and r.pos,
            neg=out.neg and r.neg,
            below=out.below and r.below,
            above=out.above and r.above,
            floor=out.floor and r.floor,
            ceil=out.ceil and r.ceil,
            lo_open=_open_end(out.lo, out.lo_open, r.lo, r.lo_open, min),
            hi_open=_open_end(out.hi, out.hi_open, r.hi, r.hi_open, max),
        )
    return out


def _open_end(a: float, a_open: bool, b: float, b_open: bool, pick) -> bool:
    """An end of the union (pick = min / max of the two ends) is open when every range reaching it is open there."""
    end = pick(a, b)
    return all(is_open for value, is_open in ((a, a_open), (b, b_open)) if value == end)


def maximum(a: Range, b: Range) -> Range:
    """max(a, b) entrywise: at least each of them."""
    return Range(
        lo=max(a.lo, b.lo),
        hi=max(a.hi, b.hi),
        pos=a.pos or b.pos,
        neg=a.neg and b.neg,
        below=a.below or b.below,
        above=a.above and b.above,
        floor=a.floor or b.floor,
        ceil=a.ceil and b.ceil,
        lo_open=(a.lo_open and a.lo >= b.lo) or (b.lo_open and b.lo >= a.lo),  # max(x, y) >= x > a.lo
        hi_open=_open_end(a.hi, a.hi_open, b.hi, b.hi_open, max),
    )


def minimum(a: Range, b: Range) -> Range:
    return negate(maximum(negate(a), negate(b)))


def absolute(a: Range) -> Range:
    """|x|: non-negative; bounded above when x is bounded; positive when x avoids 0."""
    top = max(abs(a.lo), abs(a.hi))
    return Range(
        lo=max(0.0, a.lo, -a.hi),
        hi=top,
        pos=a.pos or a.neg,
        below=True,
        above=a.bounded,
        floor=a.floor or a.ceil,
    )


def exp(a: Range) -> Range:
    """exp(x): positive; bounded above when x is; floored when x is bounded below.

    math.exp is not correctly rounded: an end is exact only at x = 0 or +-inf (exp(0) = 1),
    so only there does an open end stay open (strictly increasing); others move out an ulp.
    """
    lo_exact, hi_exact = a.lo in (-INF, 0.0, INF), a.hi in (-INF, 0.0, INF)
    return Range(
        lo=_outward(_exp(a.lo), lo_exact, down=True),
        hi=_outward(_exp(a.hi), hi_exact, down=False),
        pos=True,
        below=True,
        above=a.above,
        floor=a.below,
        lo_open=a.lo_open and lo_exact,
        hi_open=a.hi_open and hi_exact,
    )


def _exp(value: float) -> float:
    if value == -INF:
        return 0.0
    if value == INF or value > 700:
        return INF
    return math.exp(value)


def monotone(a: Range, f, *, lo: float = -INF, hi: float = INF) -> Range:
    """An increasing map f with values in [lo, hi], applied entrywise.

    f maps numeric endpoints; the per-parameter facts carry over because an increasing
    continuous map sends a bounded set to a bounded set.
    """
    return Range(
        lo=max(lo, _outward(_safe(f, a.lo, lo), False, down=True)),  # f is a library function: not correctly rounded
        hi=min(hi, _outward(_safe(f, a.hi, hi), False, down=False)),
        below=a.below or lo > -INF,
        above=a.above or hi < INF,
    )


def _safe(f, value: float, default: float) -> float:
    if math.isinf(value):
        return default
    try:
        return float(f(value))
    except (OverflowError, ValueError):
        return default


@dataclass(frozen=True, eq=False)
class Growth:
    """What qlint knows about one value, relative to the seeded inputs of a pass.

    Compared by identity (``eq=False``): two values with the same facts are still two
    values, so nothing in the engine can tell an argument's role (a weight, a state) by
    comparing facts.
    """

    q: Exponent
    depends: bool = True
    real: Optional[bool] = True
    range: Range = ANY
    culprit: Optional[str] = None
    real_part: Range = ANY  # of a complex value: the range of its real part (1j * theta's is 0)

    def __post_init__(self) -> None:
        if self.real is not True and self.range != ANY:
            object.__setattr__(self, "range", ANY)  # complex (or unknown) values have no order
        if not self.depends:
            object.__setattr__(self, "range", self.range.constant())
        elif self.q == 0:
            object.__setattr__(self, "range", replace(self.range, below=True, above=True))
        elif self.known and self.real is True and self.range.bounded:
            object.__setattr__(self, "q", 0.0)  # bounded on both sides for each parameter value: q = 0

    @property
    def known(self) -> bool:
        return self.q is not None and not math.isinf(self.q)

    @property
    def bounded(self) -> bool:
        return self.q == 0

    def with_q(self, q: Exponent, culprit: Optional[str] = None) -> "Growth":
        return replace(self, q=q, culprit=culprit or self.culprit)

    def with_range(self, r: Range) -> "Growth":
        return replace(self, range=r)


CONSTANT = Growth(q=0.0, depends=False)


def constant(value: object = None) -> Growth:
    """The growth of a Python constant; real numbers carry their value as a range."""
    if isinstance(value, bool):
        return Growth(q=0.0, depends=False, range=point(float(value)))
    if isinstance(value, complex):
        return Growth(q=0.0, depends=False, real=False, real_part=point(value.real))
    if isinstance(value, (int, float)):
        if math.isnan(value):
            return Growth(q=0.0, depends=False)
        return Growth(q=0.0, depends=False, range=point(float(value)))
    return CONSTANT


def unknown(culprit: str) -> Growth:
    """A value whose growth qlint cannot bound; the culprit is named in the report."""
    return Growth(q=None, culprit=culprit)


def stream(real: Optional[bool] = True, r: Range = ANY) -> Growth:
    """A seeded input: the block input X_k (or another value it reads), q = 1."""
    return Growth(q=1.0, depends=True, real=real, range=r)
