"""The arithmetic of input-magnitude exponents (paper 000, Theorem 9).

An exponent ``q`` bounds a map's growth: ``||B(x)|| <= c*||x||**q + b``. It is a
float ``>= 0``, ``math.inf`` for growth faster than any polynomial (exp, sinh of an
unbounded argument), or ``None`` when nothing is known (an op outside the registry).
``None`` absorbs every operation: an unknown factor can never be certified away.

These five functions are the whole algebra; everything else in qlint maps graph
nodes onto them.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

Exponent = Optional[float]

INDEPENDENT: float = 0.0  # parameters, buffers, constants: bounded whatever the input
IDENTITY: float = 1.0  # the block input itself
SUPERPOLYNOMIAL: float = math.inf


def compose(outer: Exponent, inner: Exponent) -> Exponent:
    """q(B1 o B2) <= q1 * q2 (Theorem 9(i)).

    A bounded inner map (q2 = 0) keeps the composite bounded whatever the outer map
    is, because a continuous map sends a bounded set to a bounded set; this also
    makes ``exp`` of a bounded argument bounded (inf * 0 is taken as 0). A bounded
    outer map of a super-polynomial inner one is bounded in real arithmetic (paper
    000, Remark 10), but the inner value overflows every float format first and the
    bounded map of an overflow is NaN (softmax(inf - inf), LN(inf)): not certified.
    """
    if outer is None or inner is None:
        return None
    if inner == 0:
        return 0.0
    if outer == 0:
        return None if math.isinf(inner) else 0.0
    return outer * inner


def parallel_sum(exponents: Iterable[Exponent]) -> Exponent:
    """q(B1 + B2) <= max(q1, q2) (Theorem 9(ii)); an empty sum is a constant."""
    result: float = INDEPENDENT
    for q in exponents:
        if q is None:
            return None
        result = max(result, q)
    return result


def hadamard(exponents: Iterable[Exponent]) -> Exponent:
    """q(B1 . B2) <= q1 + q2 (Theorem 9(iii)); also bounds bilinear maps (matmul)."""
    result: float = INDEPENDENT
    for q in exponents:
        if q is None:
            return None
        result += q
    return result


def residual(q: Exponent) -> Exponent:
    """q(I + dt*B) <= max(1, q(B)) (Theorem 9(iv))."""
    return None if q is None else max(IDENTITY, q)


def normalize(q: Exponent) -> Exponent:
    """q(LN o B) = 0 (Theorem 9(v)), provided B itself is known and polynomial.

    The outer normalization bounds the output whatever B does, but an unknown B is
    still reported as unknown: qlint certifies only what it can name; a
    super-polynomial B overflows before it is normalised (see :func:`compose`).
    """
    return None if q is None or math.isinf(q) else 0.0


def is_certified(q: Exponent, threshold: float = 1.0) -> bool:
    """The sublinear-growth principle: q <= threshold (1 by default)."""
    return q is not None and q <= threshold


def format_q(q: Exponent) -> str:
    """Render an exponent the way the report prints it."""
    if q is None:
        return "?"
    if math.isinf(q):
        return "∞"
    return f"{q:g}"
