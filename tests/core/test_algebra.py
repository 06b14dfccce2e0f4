"""Laws of the exponent algebra (paper 000, Theorem 9), for all inputs."""

import math

from hypothesis import given
from hypothesis import strategies as st

from qlint.core import algebra

finite = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=50))  # no underflow to 0
exponent = st.one_of(finite, st.just(math.inf), st.none())
known = st.one_of(finite, st.just(math.inf))


@given(st.lists(exponent, min_size=1, max_size=5))
def test_unknown_absorbs_every_operation(qs):
    has_unknown = any(q is None for q in qs)
    assert (algebra.parallel_sum(qs) is None) == has_unknown
    assert (algebra.hadamard(qs) is None) == has_unknown
    if has_unknown:
        assert algebra.compose(qs[0], None) is None and algebra.compose(None, qs[0]) is None
        assert algebra.normalize(None) is None and algebra.residual(None) is None


@given(finite, finite)
def test_composition_multiplies(q1, q2):
    assert algebra.compose(q1, q2) == q1 * q2


def at_most(x, y) -> bool:
    """x <= y where unknown (None) ranks with inf: neither is a polynomial bound, so failing
    closed (None) is never below a finite answer."""
    rank = lambda q: math.inf if q is None else q  # noqa: E731
    return rank(x) <= rank(y)


@given(known, known, known)
def test_composition_is_associative_where_known(a, b, c):
    left = algebra.compose(algebra.compose(a, b), c)
    right = algebra.compose(a, algebra.compose(b, c))
    if left is not None and right is not None:
        assert left == right or math.isclose(left, right, rel_tol=1e-12)
    else:  # only a bounded map of a super-polynomial value fails closed
        assert math.inf in (a, b, c) and 0.0 in (a, b, c)


@given(known)
def test_bounded_inner_map_keeps_the_composite_bounded(outer):
    # exp of a bounded argument is bounded: inf * 0 is taken as 0
    assert algebra.compose(outer, 0.0) == 0.0


@given(known)
def test_bounded_outer_map_of_a_super_polynomial_one_fails_closed(inner):
    # tanh(exp(x)) is bounded in real arithmetic, but exp(x) overflows first: NaN downstream
    assert algebra.compose(0.0, inner) == (None if math.isinf(inner) else 0.0)


@given(st.lists(known, min_size=1, max_size=6))
def test_sum_takes_the_max_and_ignores_order(qs):
    assert algebra.parallel_sum(qs) == max(qs)
    assert algebra.parallel_sum(reversed(qs)) == algebra.parallel_sum(qs)


@given(st.lists(finite, min_size=1, max_size=6))
def test_hadamard_adds(qs):
    assert math.isclose(algebra.hadamard(qs), sum(qs), rel_tol=1e-12, abs_tol=1e-12)


@given(known, known)
def test_hadamard_dominates_sum(a, b):
    # gating never lowers the exponent below that of parallel branches
    assert algebra.hadamard([a, b]) >= algebra.parallel_sum([a, b])


def test_constants_are_neutral():
    assert algebra.parallel_sum([]) == algebra.INDEPENDENT == 0
    assert algebra.hadamard([]) == 0
    assert algebra.hadamard([algebra.INDEPENDENT, 3.0]) == 3.0


@given(known)
def test_residual_wrapping(q):
    assert algebra.residual(q) == max(1.0, q)
    assert algebra.residual(q) >= 1


@given(known)
def test_outer_normalization_annihilates_polynomial_growth(q):
    assert algebra.normalize(q) == (None if math.isinf(q) else 0)


@given(known, known, known)
def test_monotone_in_every_argument(a, b, c):
    lo, hi = min(a, b), max(a, b)
    assert at_most(algebra.compose(c, lo), algebra.compose(c, hi))
    assert at_most(algebra.compose(lo, c), algebra.compose(hi, c))
    assert algebra.parallel_sum([lo, c]) <= algebra.parallel_sum([hi, c])
    assert algebra.hadamard([lo, c]) <= algebra.hadamard([hi, c])


def test_certification_threshold():
    assert algebra.is_certified(1.0) and algebra.is_certified(0.0)
    assert not algebra.is_certified(1.0000001)
    assert not algebra.is_certified(None) and not algebra.is_certified(math.inf)
    assert algebra.is_certified(2.0, threshold=2.0)
    assert [algebra.format_q(q) for q in (None, math.inf, 5.0, 0.5)] == ["?", "∞", "5", "0.5"]
