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
inputs and all parameter values; ``tests/test_domain.py`` checks each one numerically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
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
    a value independent of the input also gives a floor.
    """

    lo: float = -INF
    hi: float = INF
    pos: bool = False
    neg: bool = False
    below: bool = False
    above: bool = False
    floor: bool = False
    ceil: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
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


def interval(lo: float, hi: float, *, pos: bool = False, neg: bool = False) -> Range:
    return Range(lo=lo, hi=hi, pos=pos, neg=neg)


def negate(r: Range) -> Range:
    return Range(lo=-r.hi, hi=-r.lo, pos=r.neg, neg=r.pos, below=r.above, above=r.below, floor=r.ceil, ceil=r.floor)


def _sum(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b) and a != b:
        return math.nan  # never reached: lo sums only -inf, hi sums only +inf
    return a + b


def add(a: Range, b: Range) -> Range:
    """a + b entrywise (broadcast)."""
    lo, hi = _sum(a.lo, b.lo), _sum(a.hi, b.hi)
    return Range(
        lo=lo,
        hi=hi,
        pos=(a.pos and b.nonneg) or (b.pos and a.nonneg),
        neg=(a.neg and b.nonpos) or (b.neg and a.nonpos),
        below=a.below and b.below,
        above=a.above and b.above,
        floor=(a.floor and b.nonneg) or (b.floor and a.nonneg),
        ceil=(a.ceil and b.nonpos) or (b.ceil and a.nonpos),
    )


def _product(a: float, b: float) -> float:
    """Endpoint product with 0 * inf = 0: a bound of 0 times any finite value is 0."""
    if a == 0 or b == 0:
        return 0.0
    return a * b


def mul(a: Range, b: Range) -> Range:
    """a * b entrywise (broadcast), by interval arithmetic plus sign facts."""
    ends = [_product(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Range(
        lo=min(ends),
        hi=max(ends),
        pos=(a.pos and b.pos) or (a.neg and b.neg),
        neg=(a.pos and b.neg) or (a.neg and b.pos),
        below=a.bounded and b.bounded,
        above=a.bounded and b.bounded,
        floor=(a.floor and b.floor) or (a.ceil and b.ceil),
        ceil=(a.floor and b.ceil) or (a.ceil and b.floor),
    )


def square(a: Range) -> Range:
    """x * x for the same real x: non-negative, whatever the sign of x."""
    if a.nonneg:
        return mul(a, a)
    if a.nonpos:
        return mul(negate(a), negate(a))
    top = max(_product(a.lo, a.lo), _product(a.hi, a.hi))
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
        )
    return out


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
    """exp(x): positive; bounded above when x is; floored when x is bounded below."""
    return Range(
        lo=_exp(a.lo),
        hi=_exp(a.hi),
        pos=True,
        below=True,
        above=a.above,
        floor=a.below,
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
        lo=max(lo, _safe(f, a.lo, lo)),
        hi=min(hi, _safe(f, a.hi, hi)),
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


@dataclass(frozen=True)
class Growth:
    """What qlint knows about one value, relative to the seeded inputs of a pass."""

    q: Exponent
    depends: bool = True
    real: Optional[bool] = True
    range: Range = ANY
    culprit: Optional[str] = None

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
        return Growth(q=0.0, depends=False, real=False)
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
