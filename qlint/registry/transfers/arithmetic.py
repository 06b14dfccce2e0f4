"""Transfers of the entries in ``rules/primitives/arithmetic.toml``: sums, products, quotients,
powers, exponentials and logarithms, clamps and selections, rounding.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Optional

from qlint.core import algebra, domain
from qlint.core.domain import ANY, CONSTANT, Growth, Range, unknown
from qlint.core.ops import Call, op_name
from qlint.registry.transfers.base import transfer
from qlint.registry.transfers.combinators import (
    argument_node, argument_shape, clamp_bound, combine_max, combine_product, culprit_of, has_zero, hazard, is_number,
    negated, nonzero_constant, plain_number, range_of, reciprocal_range, scaled,
)


@transfer("add")
def add(call: Call, entry: Any) -> Any:
    """a + alpha*b, a - alpha*b, b - alpha*a: Theorem 9(ii); a difference is a + (-b)."""
    raw_a, raw_b = call.operand("input"), call.operand("other")
    if entry.id == "add" and isinstance(raw_a, (tuple, list)) and isinstance(raw_b, (tuple, list)):
        # a shape sum such as x.size()[:-1] + (n,)
        return tuple(v if isinstance(v, Growth) else domain.constant(v) for v in (*raw_a, *raw_b))
    a, b = call.growth("input"), call.growth("other")
    alpha = call.operand("alpha", 1)
    if a is None or b is None:
        return combine_max(a, b)
    first, second = (b, a) if entry.id == "rsub" else (a, b)
    term = scaled(second, alpha)
    term = negated(term) if entry.id in ("rsub", "sub") else term
    total = combine_max(first, term, r=domain.add(range_of(first), range_of(term)))
    if total.real is not True and is_number(alpha) and not isinstance(alpha, complex):  # Re(a + c b) = Re a + c Re b
        step = domain.mul(domain.point(-float(alpha) if entry.id in ("rsub", "sub") else float(alpha)),
                          _real_part(second))
        return replace(total, real_part=domain.add(_real_part(first), step))
    return total


def _real_part(g: Growth) -> Range:
    """The range of a value's real part: a real value's own, a complex one's ``real_part``."""
    return g.range if g.real is True else g.real_part if g.real is False else ANY


@transfer("neg")
def neg(call: Call, entry: Any) -> Any:
    """||-x|| = ||x||; the range flips."""
    return negated(call.growth("input")) or CONSTANT


@transfer("mul")
def mul(call: Call, entry: Any) -> Any:
    """Theorem 9(iii): |a_i b_i| <= |a_i||b_i|, so the exponents add; x*x of a real x is >= 0."""
    a, b = call.growth("input"), call.growth("other")
    if a is None or b is None:
        return combine_max(a, b)
    if any(is_number(call.value(n)) and not math.isfinite(call.value(n)) for n in ("input", "other")):
        return unknown("a product with an infinite or NaN constant")
    same = call.node is not None and len(call.node.args) >= 2 and call.node.args[0] is call.node.args[1]
    if same and a.real is True:
        return combine_product(a, b, r=domain.square(a.range))
    product = combine_product(a, b, r=domain.mul(range_of(a), range_of(b)))
    for number, value in ((call.value("input"), b), (call.value("other"), a)):
        if isinstance(number, complex) and value.real is True:  # Re(c t) = Re(c) t for a real t
            return replace(product, real_part=domain.mul(domain.point(number.real), value.range))
    return product


@transfer("div")
def div(call: Call, entry: Any) -> Any:
    """a / b is bounded by |a| / c when b stays at least c > 0 away from 0 (for each parameter
    value), or b does not depend on the input (a per-parameter constant, Table 1 keeps such
    coefficients); otherwise the quotient has a pole and nothing bounds it. floor/trunc
    rounding adds at most 1 to the magnitude."""
    a, b = call.growth("input"), call.growth("other")
    rounding = "floor" if entry.id == "floor_divide" else call.param("rounding_mode")
    if a is None or b is None:
        return CONSTANT
    raw = call.value("other")
    if is_number(raw) or isinstance(raw, bool):
        if raw == 0:
            return unknown("division by zero")
        r = domain.divide(range_of(a), float(raw))
        return _rounded(Growth(a.q, depends=a.depends, real=a.real, range=r, culprit=a.culprit), rounding)
    inverse = reciprocal_range(b)
    if b.depends and inverse is None:
        return unknown("division by an input-dependent value that may approach 0")
    if b.depends and b.real is not True:
        return unknown("division by a complex (or unknown-dtype) value")
    if not b.depends and inverse is None and not nonzero_constant(call, "other"):
        call.hazard("division by a parameter expression that may be 0", "other", has_zero)
    if inverse is None:
        r = ANY
    else:
        r = domain.mul(range_of(a), inverse)
    out = combine_max(a, Growth(0.0, depends=b.depends, real=b.real), r=r)
    return _rounded(out, rounding)


def _rounded(g: Growth, rounding: Any) -> Growth:
    if rounding in ("floor", "trunc"):
        r = g.range
        return g.with_range(Range(lo=r.lo - 1, hi=r.hi + 1, below=r.below, above=r.above))
    return g


@transfer("reciprocal")
def reciprocal(call: Call, entry: Any) -> Any:
    """1/x <= 1/c when |x| >= c > 0 (q = 0); rsqrt(x) <= 1/sqrt(c) when x >= c > 0."""
    x = call.growth("input")
    if x is None:
        return CONSTANT
    if not x.depends:
        if entry.id == "rsqrt" and not (x.real is True and x.range.pos):
            return hazard("rsqrt of a parameter expression that may be <= 0")
        if not nonzero_constant(call, "input"):
            return hazard("reciprocal of a parameter expression that may be 0")
        inverse = reciprocal_range(x) if entry.id != "rsqrt" else None
        if entry.id == "rsqrt" and x.range.floor:
            inverse = Range(lo=0.0, hi=1.0 / math.sqrt(x.range.lo) if x.range.lo > 0 else math.inf, pos=True,
                            floor=x.range.above)
        return Growth(0.0, depends=False, real=x.real, range=inverse or ANY)
    if x.real is not True:
        return unknown(f"{entry.name} of a complex (or unknown-dtype) value")
    if entry.id == "rsqrt":
        if not x.range.floor:
            return unknown(
                "rsqrt (reciprocal square root) of an input-dependent value that may approach 0 (or be negative)")
        r = x.range
        return Growth(0.0, range=Range(lo=0.0, hi=1.0 / math.sqrt(r.lo) if r.lo > 0 else math.inf, pos=True,
                                       above=True, below=True))
    inverse = reciprocal_range(x)
    if inverse is None:
        return unknown("reciprocal of an input-dependent value that may approach 0")
    return Growth(0.0, range=inverse)


@transfer("pow")
def power(call: Call, entry: Any) -> Any:
    """x ** p: q = p * q_x (Table 1, polynomial activation). A fractional power needs x >= 0
    (it is NaN below); a negative power is a reciprocal and needs |x| >= c > 0; c ** x is
    exp(x ln c). An exponent computed from the input, or held in a parameter, has no fixed
    value, so nothing bounds the power."""
    base_raw, exp_raw = call.operand("input"), call.operand("exponent", 2 if entry.id == "square" else None)
    if entry.id == "square":
        exp_raw = 2
    elif entry.id == "sqrt":
        exp_raw = 0.5
    base = base_raw if isinstance(base_raw, Growth) else domain.constant(base_raw)
    exponent = exp_raw if isinstance(exp_raw, Growth) else None
    if exponent is not None and not exponent.depends and exponent.range.lo == exponent.range.hi \
            and math.isfinite(exponent.range.lo):
        exp_raw, exponent = exponent.range.lo, None  # a lifted constant with a known value
    if exponent is not None:
        if not base.depends and not exponent.depends:
            return Growth(0.0, depends=False)
        if is_number(base_raw) and base_raw > 0:  # c ** x = exp(x ln c)
            if base_raw == 1:
                return Growth(0.0, depends=False, range=domain.point(1.0))
            log_c = math.log(base_raw)
            argument = Growth(exponent.q, depends=exponent.depends, real=exponent.real,
                              range=domain.mul(range_of(exponent), domain.point(log_c)), culprit=exponent.culprit)
            return _exp_of(argument, "pow of an argument not bounded above")
        if exponent.depends:
            return unknown("power with an input-dependent exponent")
        return unknown("power with an exponent held in a parameter (training sets its value)")
    if not is_number(exp_raw):
        return unknown("power with an exponent qlint cannot read")
    p = float(exp_raw)
    if not base.depends:
        if p != int(p) and not (base.real is True and base.range.nonneg):
            return hazard(f"x ** {p:g} of a parameter expression that may be negative")
        if p < 0 and not nonzero_constant(call, "input"):
            return hazard(f"x ** {p:g} of a parameter expression that may be 0")
        return Growth(0.0, depends=False, real=base.real,
                      range=_power_range(base.range, p) if base.real is True else ANY)
    if p == 0:
        return Growth(0.0, depends=False, range=domain.point(1.0))
    integer = p == int(p)
    if base.real is not True and not (integer and p > 0):
        return unknown(f"x ** {p:g} of a complex (or unknown-dtype) value")
    if not integer and not base.range.nonneg:
        return unknown(f"x ** {p:g} of a value that may be negative (NaN below 0)")
    if p < 0:
        inverse = reciprocal_range(base)
        if inverse is None:
            return unknown(f"x ** {p:g} of a value that may approach 0")
        return Growth(0.0, real=base.real, range=_power_range(base.range, p))
    return Growth(algebra.compose(p, base.q), real=base.real, range=_power_range(base.range, p) if base.real else ANY,
                  culprit=base.culprit)


def _power_range(r: Range, p: float) -> Range:
    """The range of x**p for a real x with range r (p an integer, or x >= 0).

    For p < 0 the order reverses and the far end maps to 0: with 0 < m <= |x| <= M,
    |x|**p lies in [M**p, m**p] (M = inf gives 0, not inf); a range that reaches 0 has a pole.
    """
    if p < 0:
        if r.lo <= 0 <= r.hi:
            return ANY
        near, far = min(abs(r.lo), abs(r.hi)), max(abs(r.lo), abs(r.hi))
        small, large = (0.0 if math.isinf(far) else math.pow(far, p)), math.pow(near, p)
        if r.lo > 0 or (p == int(p) and int(p) % 2 == 0):
            return Range(lo=small, hi=large, pos=True)
        return Range(lo=-large, hi=-small, neg=True)  # odd p of a negative range

    def powered(v: float) -> float:
        if math.isinf(v):
            return math.inf if v > 0 or (p == int(p) and int(p) % 2 == 0) else -math.inf
        try:
            return math.pow(v, p) if v != 0 or p > 0 else math.inf
        except (OverflowError, ValueError):
            return math.inf
    if p == int(p) and int(p) % 2 == 0:
        top = max(powered(abs(r.lo)), powered(abs(r.hi)))
        low = 0.0 if r.lo <= 0 <= r.hi else min(powered(abs(r.lo)), powered(abs(r.hi)))
        return Range(lo=low, hi=top, pos=r.pos or r.neg, below=True, above=r.bounded, floor=r.floor or r.ceil)
    return Range(lo=powered(r.lo), hi=powered(r.hi), pos=r.pos, neg=r.neg, below=r.below, above=r.above,
                 floor=r.floor and r.bounded, ceil=r.ceil and r.bounded)


def _exp_of(a: Growth, culprit: str) -> Growth:
    """exp(a) is bounded when a is bounded above (for each parameter value); otherwise it
    grows faster than any polynomial (paper 000, Remark 10: outside P)."""
    if not a.depends:
        return Growth(0.0, depends=False, range=domain.exp(range_of(a)) if a.real is True else ANY, real=a.real)
    if a.real is False:
        if a.q == 0 or (a.known and (a.real_part.above or math.isfinite(a.real_part.hi))):
            return Growth(0.0, real=False)  # |exp z| = exp(Re z) <= exp(sup Re z): exp(1j * theta) has modulus 1
        return Growth(algebra.SUPERPOLYNOMIAL if a.known else None, real=False,
                      culprit=a.culprit if not a.known else "exp of a complex argument (|exp z| = exp(Re z))")
    r = domain.exp(a.range) if a.real is True else ANY
    if a.q == 0 or (a.real is True and a.range.above and a.known):  # (a super-polynomial a overflows first)
        return Growth(0.0, range=r, real=a.real)
    if a.q is None:
        return Growth(None, culprit=a.culprit)
    return Growth(algebra.SUPERPOLYNOMIAL, range=r, culprit=culprit)


@transfer("exp")
def exp(call: Call, entry: Any) -> Any:
    """exp(a) <= exp(sup a): bounded when a is bounded above; exp2 and expm1 likewise."""
    a = call.growth("input")
    if a is None:
        return CONSTANT
    if call.op == "exp2":
        a = scaled(a, math.log(2.0))
    out = _exp_of(a, f"{call.op} of an argument not bounded above")
    if call.op == "expm1" and out.real is True:
        r = out.range
        out = out.with_range(Range(lo=r.lo - 1, hi=r.hi - 1, below=r.below, above=r.above))
    return out


@transfer("hyperbolic")
def hyperbolic(call: Call, entry: Any) -> Any:
    """sinh and cosh grow like e^|a|: faster than any polynomial unless a is bounded."""
    a = call.growth("input")
    if a is None or not a.depends:
        return Growth(0.0, depends=False)
    if a.q == 0:
        r = Range(lo=1.0, below=True, above=True) if entry.id == "cosh" and a.real is True else ANY
        return Growth(0.0, real=a.real, range=r)
    if a.q is None:
        return Growth(None, culprit=a.culprit)
    return Growth(algebra.SUPERPOLYNOMIAL, culprit=f"{entry.id} of an unbounded argument")


@transfer("log")
def log(call: Call, entry: Any) -> Any:
    """log(a) for a >= c > 0: |log a| <= |log c| + log(C ||x||^q), slower than any power, so
    q <= min(q_a, 1). Near 0 the logarithm is unbounded; log1p needs a >= -1 + c."""
    a = call.growth("input")
    if a is None:
        return CONSTANT
    argument = domain.add(a.range, domain.point(1.0)) if entry.id == "log1p" else a.range
    if not a.depends:
        if not (a.real is True and argument.pos):
            return hazard(f"{entry.id} of a parameter expression that may be <= 0")
        return Growth(0.0, depends=False)
    if a.real is not True:
        return unknown(f"{entry.id} of a complex (or unknown-dtype) value")
    if not argument.floor:
        return unknown(f"{entry.id} of an argument that may approach 0")
    if not a.known:
        return Growth(a.q, culprit=a.culprit)
    base = {"log": math.e, "log2": 2.0, "log10": 10.0, "log1p": math.e}[entry.id]
    r = domain.monotone(argument, lambda v: math.log(v, base) if v > 0 else -math.inf)
    return Growth(min(a.q, 1.0), range=r)


@transfer("abs")
def absolute(call: Call, entry: Any) -> Any:
    """|| |x| || = ||x||; the result is real and non-negative (|z| of a complex z too)."""
    x = call.growth("input")
    if x is None:
        return CONSTANT
    r = domain.absolute(x.range) if x.real is True else Range(lo=0.0)
    return Growth(x.q if x.depends else 0.0, depends=x.depends, real=True, range=r, culprit=x.culprit)


@transfer("clamp")
def clamp(call: Call, entry: Any) -> Any:
    """clamp(x, lo, hi) = min(max(x, lo), hi): with both bounds it lies between them (q of the
    bounds: 0 for numbers); with one, |out| <= max(|x|, |bound|). An infinite number is no
    bound. Tensor bounds count with their own growth."""
    x = call.growth("input")
    low_raw = None if entry.id == "clamp_max" else call.operand("min")
    high_raw = None if entry.id == "clamp_min" else call.operand("max")
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown("clamp of a complex value")
    low = clamp_bound(low_raw, -math.inf)
    high = clamp_bound(high_raw, math.inf)
    r = range_of(x)
    if low is not None:
        r = domain.maximum(r, range_of(low))
    if high is not None:
        r = domain.minimum(r, range_of(high))
    if low is not None and high is not None:
        if low.depends or high.depends:
            return combine_max(low, high, r=r, real=x.real if x.real is not None else None)
        return Growth(0.0, depends=x.depends, real=x.real, range=r)
    bound = low if low is not None else high
    return combine_max(x, bound, r=r)


@transfer("maximum")
def maximum(call: Call, entry: Any) -> Any:
    """max(a, b) / min(a, b) entrywise is one of a, b: Theorem 9(ii)."""
    a, b = call.growth("input"), call.growth("other")
    if a is None or b is None:
        return combine_max(a, b)
    if a.real is False or b.real is False:
        return unknown(f"{entry.id} of complex values")
    fn = domain.maximum if entry.id in ("maximum", "fmax") else domain.minimum
    return combine_max(a, b, r=fn(range_of(a), range_of(b)))


@transfer("where")
def where(call: Call, entry: Any) -> Any:
    """where(c, a, b) and masked_fill(x, m, v): each entry is one of the values (the condition
    selects); Theorem 9(ii). A condition that is one value at every entry for every input and
    parameter (a bool flag buffer, a literal) selects the same value everywhere: the other is not
    computed into the result, whatever it is (``where(use_aux, aux, 0)`` with ``use_aux`` False)."""
    call.selectors("condition", "mask")
    if entry.id == "where" and call.has("condition") and not call.has("input"):
        # where(c) = nonzero(c, as_tuple=True): one index tensor per axis of c
        rank = len(argument_shape(call, "condition") or ())
        index = Growth(0.0, depends=True, range=Range(lo=0.0))
        return tuple(index for _ in range(rank)) if rank else unknown("where(c) of a condition of unknown rank")
    selects = ({True: ("input",), False: ("other",)} if entry.id == "where"
               else {True: ("value",), False: ("input",)})
    every = ("input", "other") if entry.id == "where" else ("input", "value")
    chosen = selects.get(_uniform(call.value("condition" if entry.id == "where" else "mask")), every)
    call.meta(*(name for name in every if name not in chosen))  # not in the result: the condition never takes it
    values = [g for g in (call.growth(name) for name in chosen) if g is not None]
    if not values:
        return CONSTANT
    ranges = [range_of(v) for v in values]
    return combine_max(*values, r=domain.union(*ranges))


def _uniform(condition: Any) -> Optional[bool]:
    """True or False when a condition has that value at every entry for every input and parameter
    (its range one point, not depending on the input); None otherwise."""
    if isinstance(condition, bool):
        return condition
    if isinstance(condition, Growth) and not condition.depends and condition.range.lo == condition.range.hi:
        return condition.range.lo != 0
    return None


@transfer("lerp")
def lerp(call: Call, entry: Any) -> Any:
    """lerp(a, b, w) = a + w (b - a): Theorem 9(ii) for the sum, 9(iii) for the weighted step.

    No convexity is assumed: a weight outside [0, 1] extrapolates, which the range
    arithmetic a + w*(b - a) accounts for."""
    a, b = call.growth("input"), call.growth("end")
    w_raw = call.operand("weight")
    w = w_raw if isinstance(w_raw, Growth) else domain.constant(w_raw)
    if a is None or b is None:
        return combine_max(a, b, w)
    difference = combine_max(a, b, r=domain.add(range_of(b), domain.negate(range_of(a))))
    step = combine_product(w, difference, r=domain.mul(range_of(w), difference.range))
    return combine_max(a, step, r=domain.add(range_of(a), step.range))


@transfer("addcmul")
def addcmul(call: Call, entry: Any) -> Any:
    """addcmul(x, a, b, value) = x + value * a * b; addcdiv(x, a, b, value) = x + value * a / b
    (the quotient needs b bounded away from 0, as a division does)."""
    x, t1, t2 = call.growth("input"), call.growth("tensor1"), call.growth("tensor2")
    value = call.operand("value", 1)
    if entry.id == "addcdiv":
        inverse = reciprocal_range(t2) if t2 is not None else None
        if t2 is not None and t2.depends and inverse is None:
            return unknown("addcdiv divides by an input-dependent value that may approach 0")
        if t2 is not None and not t2.depends and inverse is None and not nonzero_constant(call, "tensor2"):
            call.hazard("addcdiv divides by a parameter expression that may be 0", "tensor2", has_zero)
        factor = Growth(0.0, depends=t2.depends if t2 else False, range=inverse or ANY)
        product = combine_max(t1, factor, r=domain.mul(range_of(t1), inverse or ANY))
    else:
        product = combine_product(t1, t2, r=domain.mul(range_of(t1), range_of(t2)))
    term = scaled(product, value)
    return combine_max(x, term, r=domain.add(range_of(x), range_of(term)))


@transfer("indicator")
def indicator(call: Call, entry: Any) -> Any:
    """Comparisons, logical ops, isnan/isinf, sign: values in {-1, 0, 1}: bounded."""
    depends = any(g.depends for g in call.every())
    lo = -1.0 if call.op in ("sign", "sgn") else 0.0
    return Growth(0.0, depends=depends, range=domain.interval(lo, 1.0))


@transfer("maxof")
def maxof(call: Call, entry: Any) -> Any:
    """Maps bounded by their largest input: hypot, logaddexp (= max + log(1 + e^-|a-b|)),
    distances (||x - y|| <= ||x|| + ||y||), bitwise and/or/xor of integers, complex(re, im). Also
    named by ``layers.toml`` (distances, complex, polar)."""
    growths = call.every()
    if call.op in ("cdist", "_cdist_forward", "pdist", "_pdist_forward", "pairwise_distance", "hypot"):
        r = Range(lo=0.0)
    elif call.op in ("logaddexp", "logaddexp2"):
        r = Range(lo=max([g.range.lo for g in growths if g.real is True] or [-math.inf]))
    else:
        r = ANY
    real = False if call.op in ("complex", "polar") else "auto"
    if call.op == "polar":
        magnitude = call.growth("abs")
        return combine_max(magnitude, Growth(0.0, depends=any(g.depends for g in growths)), real=False)
    if any(g.real is False and g.depends for g in growths) and call.op not in ("complex",):
        return unknown(f"{entry.name} of a complex value")
    return combine_max(*growths, r=r, real=real)


@transfer("shift")
def shift(call: Call, entry: Any) -> Any:
    """a << b = a * 2^b: exponential in b, so b must not depend on the input."""
    a, b = call.growth("input"), call.growth("other")
    if b is not None and b.depends:
        return Growth(algebra.SUPERPOLYNOMIAL if b.known else None, culprit=f"{entry.id} by an input-dependent amount")
    return combine_max(a)


@transfer("fmod")
def fmod(call: Call, entry: Any) -> Any:
    """fmod(a, b) has |.| <= min(|a|, |b|); a % b (remainder) lies between 0 and b. Both are
    NaN at b = 0, so a divisor computed from the input must stay away from 0. An infinite b bounds
    nothing (fmod(a, inf) = a): a divisor independent of the input bounds the result only when it is
    finite for every parameter value (a finite range, or a parameter or buffer itself)."""
    a, b = call.growth("input"), call.growth("other")
    if a is None or b is None:
        return CONSTANT
    if not b.depends and not _finite_divisor(call, b):
        if entry.id == "remainder":
            return unknown("remainder by a divisor that may be infinite")
        return Growth(a.q if a.depends else 0.0, depends=a.depends, real=a.real, culprit=a.culprit)
    raw = call.value("other")
    if (is_number(raw) and raw == 0) or (b.depends and reciprocal_range(b) is None):
        return unknown(f"{entry.id} by a divisor that may be 0")
    if not b.depends and reciprocal_range(b) is None and not nonzero_constant(call, "other"):
        call.hazard(f"{entry.id} by a parameter expression that may be 0", "other", has_zero)
    if a.real is False or b.real is False:
        return unknown(f"{entry.id} of complex values")
    if entry.id == "remainder":
        r = Range(lo=min(0.0, b.range.lo), hi=max(0.0, b.range.hi), below=b.range.below, above=b.range.above)
        return Growth(b.q if b.depends else 0.0, depends=a.depends or b.depends, range=r, culprit=b.culprit)
    qs = [g.q if g.depends else 0.0 for g in (a, b)]
    if any(q is None for q in qs):
        return Growth(None, culprit=culprit_of(a, b))
    return Growth(min(qs), depends=a.depends or b.depends)


def _finite_divisor(call: Call, b: Growth) -> bool:
    """An input-independent divisor that is finite for every parameter value: its range is finite, or it is a
    parameter or buffer up to sign and copies (finite, or refused where it is read)."""
    if math.isfinite(b.range.lo) and math.isfinite(b.range.hi):
        return True
    node = argument_node(call, "other")
    while op_name(node) in ("abs", "neg", "clone", "detach", "alias", "contiguous", "positive"):
        node = node.args[0] if node.args else None
    return getattr(node, "op", None) == "get_attr"


@transfer("rounding")
def rounding(call: Call, entry: Any) -> Any:
    """floor / ceil / round / trunc move each entry by less than 1: |round(x)| <= |x| + 1
    (``round(x, decimals=d)`` by less than 10^-d); frac(x) = x - trunc(x) lies in (-1, 1)."""
    x = call.growth("input")
    call.accept_params()
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown(f"{call.op} of a complex value")
    if call.op == "frac":
        return Growth(0.0, depends=x.depends, range=domain.interval(-1.0, 1.0))
    decimals = plain_number(call, "decimals", 0)
    if not is_number(decimals):
        return unknown(f"{call.op} to decimals qlint cannot read")
    unit = 10.0 ** (-int(decimals))  # round(x, d) moves x by at most half of 10^-d
    r = range_of(x)
    return Growth(x.q if x.depends else 0.0, depends=x.depends,
                  range=Range(lo=r.lo - unit, hi=r.hi + unit, below=r.below, above=r.above), culprit=x.culprit)
