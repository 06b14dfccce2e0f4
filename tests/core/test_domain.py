"""The value domain is sound: every fact a transfer claims holds on the numbers.

Ranges are sampled with hypothesis (finite and infinite ends, both signs, strict and
non-strict, zero inside or at the edge); values are drawn inside them, the operation is
applied to the numbers, and the claimed output range must contain the result. Then every
registry transfer of an elementwise or reducing op is run on random tensors of both
signs (and complex where the op takes it), with input facts that the sampled tensors
really satisfy: the claimed range must hold, and the claimed exponent must bound the
growth under scaling.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch.fx as fx

from qlint.core import domain
from qlint.core.domain import ANY, Growth, Range
from qlint.core.graph import NodeFacts
from qlint.core.ops import bind
from qlint.growth.propagate import apply
from qlint.registry import default

FINITE = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False)


@st.composite
def ranges(draw) -> Range:
    """A range with any mix of finite / infinite ends and strict signs."""
    lo = draw(st.one_of(st.just(-math.inf), FINITE, st.just(0.0))) + 0.0  # + 0.0: no -0.0
    hi = draw(st.one_of(st.just(math.inf), FINITE, st.just(0.0))) + 0.0
    if lo > hi:
        lo, hi = hi, lo
    pos = lo >= 0 and hi > 0 and draw(st.booleans())
    neg = hi <= 0 and lo < 0 and draw(st.booleans())
    lo_open, hi_open = (hi - lo > 1e-6 and draw(st.booleans()) for _ in range(2))
    return Range(lo=lo, hi=hi, pos=pos, neg=neg, lo_open=lo_open, hi_open=hi_open)


def sample(r: Range, draw) -> float:
    """A number the range allows (its edges included)."""
    lo = r.lo if math.isfinite(r.lo) else (min(r.hi, 0.0) - 1e6 if math.isfinite(r.hi) else -1e6)
    hi = r.hi if math.isfinite(r.hi) else max(lo, 0.0) + 1e6
    low = math.nextafter(lo, math.inf) if r.lo_open else lo  # the nearest number an open end allows
    high = math.nextafter(hi, -math.inf) if r.hi_open else hi
    value = draw(st.one_of(st.just(low), st.just(high), st.floats(min_value=low, max_value=high)))
    if r.pos and value <= 0:
        value = (hi * 0.5 or hi) if hi > 0 else 1e-9  # hi * 0.5 underflows to 0 for the smallest subnormal
    if r.neg and value >= 0:
        value = (lo * 0.5 or lo) if lo < 0 else -1e-9
    return value


def holds(r: Range, value, *, exact: bool = True) -> bool:
    """Whether ``value`` (a float, or an exact Fraction: no underflow to 0) is in the range.

    ``exact``: the value was computed in exact arithmetic, so an open end must not be
    reached (a float tanh saturates to 1.0; the real tanh never does).
    """
    if isinstance(value, float) and math.isnan(value):
        return True  # an undefined result is no counterexample to a range (inf - inf)
    if exact and ((r.lo_open and value == Fraction(r.lo)) or (r.hi_open and value == Fraction(r.hi))):
        return False
    slack = 0 if exact else Fraction(1, 10**9)  # the domain rounds its ends outward: exact values need no slack
    if math.isfinite(r.lo) and value < Fraction(r.lo) - slack * max(1, abs(Fraction(r.lo))):
        return False
    if math.isfinite(r.hi) and value > Fraction(r.hi) + slack * max(1, abs(Fraction(r.hi))):
        return False
    return not ((r.pos and value <= 0) or (r.neg and value >= 0))


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.data(), ranges(), ranges())
def test_sum_and_difference(data, a, b):
    x, y = Fraction(sample(a, data.draw)), Fraction(sample(b, data.draw))
    assert holds(domain.add(a, b), x + y)
    assert holds(domain.add(a, domain.negate(b)), x - y)  # a - b is a + (-b)


@SETTINGS
@given(st.data(), ranges(), ranges())
def test_product(data, a, b):
    x, y = Fraction(sample(a, data.draw)), Fraction(sample(b, data.draw))
    assert holds(domain.mul(a, b), x * y)


@SETTINGS
@given(st.data(), ranges(), st.one_of(FINITE, st.sampled_from([49.0, 3.0, -7.0, 1e-300, 1e300])).filter(lambda c: c != 0))
def test_division_by_a_number_and_reciprocal(data, a, c):
    x = Fraction(sample(a, data.draw))
    assert holds(domain.divide(a, c), x / Fraction(c))
    if a.floor and a.lo > 0:
        assert holds(domain.reciprocal(a), 1 / x)


def test_a_bound_that_rounds_is_moved_outward():
    """clamp(a, 0, 49) / 49 reaches 1 exactly; 49 * fl(1/49) < 1 must not prove it below 1."""
    assert domain.divide(domain.interval(0.0, 49.0), 49.0).hi == 1.0
    assert domain.mul(domain.interval(0.0, 49.0), domain.point(1 / 49)).hi > 1.0 - 1e-16
    assert not domain.strictly_below(domain.mul(domain.interval(0.0, 49.0), domain.point(1 / 49)), 1.0) or \
        Fraction(49) * Fraction(1 / 49) < 1
    assert domain.exp(domain.Range(hi=1e-17, hi_open=True)).hi > 1.0  # math.exp(1e-17) == 1.0: no open end at 1
    tiny = domain.mul(domain.mul(domain.interval(0.0, 1.0, is_open=True), domain.point(-1e-200)), domain.point(1e-200))
    assert not tiny.nonneg  # -1e-400 underflows to -0.0: the end moves below 0
    assert domain.strictly_below(domain.reciprocal(domain.add(domain.point(1.0), domain.exp(ANY))), 1.0)  # 1 / (1 + e^a)


@SETTINGS
@given(st.data(), ranges())
def test_square_abs_exp(data, a):
    x = sample(a, data.draw)
    assert holds(domain.square(a), Fraction(x) * Fraction(x))
    assert holds(domain.absolute(a), abs(x))
    if -700 < x < 700:  # beyond, float64 rounds exp to 0 or inf
        assert holds(domain.exp(a), math.exp(x), exact=False)  # math.exp rounds: exp(5e-324) == 1.0


@SETTINGS
@given(st.data(), ranges(), ranges())
def test_max_min_union(data, a, b):
    x, y = sample(a, data.draw), sample(b, data.draw)
    assert holds(domain.maximum(a, b), max(x, y))
    assert holds(domain.minimum(a, b), min(x, y))
    assert holds(domain.union(a, b), x) and holds(domain.union(a, b), y)


@SETTINGS
@given(ranges())
def test_facts_are_consistent(r):
    """A floor implies strict positivity, a finite end a per-parameter bound, and so on."""
    assert not (r.floor and not r.pos) and not (r.ceil and not r.neg)
    assert (r.lo == -math.inf) or r.below
    assert (r.hi == math.inf) or r.above
    if r.pos:
        assert r.lo >= 0


def test_complex_values_carry_no_order():
    assert Growth(1.0, real=False, range=Range(lo=0.0)).range == ANY
    assert Growth(1.0, real=None, range=Range(lo=0.0)).range == ANY


def test_a_difference_of_negative_terms_has_no_sign():
    """(-|z|) - (-2|z|) = |z|: the sum's rule on a difference would claim <= 0."""
    minus_abs = domain.negate(domain.absolute(ANY))
    assert not domain.add(minus_abs, domain.negate(domain.mul(domain.point(2.0), minus_abs))).nonpos


# --- every registry transfer on random tensors -------------------------------------------------

SHAPE = (3, 5)


def _tensor(kind: str, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(SHAPE, generator=generator, dtype=torch.float64)
    if kind == "positive":
        return x.abs() + 0.1
    if kind == "negative":
        return -x.abs() - 0.1
    if kind == "zeros":
        return torch.where(x > 0, x, torch.zeros_like(x))
    return x


def _facts(x: torch.Tensor, kind: str) -> Growth:
    """The facts the sampled tensor satisfies (never more): q = 1, its sign if any."""
    r = {"positive": Range(lo=0.0, pos=True), "negative": Range(hi=0.0, neg=True), "zeros": Range(lo=0.0)}.get(kind, ANY)
    return Growth(1.0, depends=True, range=r)


def _unary_ops():
    """(entry, op name, callable) for every single-tensor op of the registry with a torch function."""
    registry = default()
    out = []
    for primitive in registry.primitives:
        if primitive.unbounded:
            continue
        for target in primitive.targets:
            if not target.startswith("torch.") or target.count(".") != 1:
                continue
            fn = getattr(torch, target.split(".")[1], None)
            if fn is None or target.split(".")[1].endswith("_"):
                continue
            try:
                fn(torch.randn(SHAPE, dtype=torch.float64))
            except Exception:
                continue
            out.append(pytest.param(primitive, fn, id=f"{primitive.id}:{target}"))
    return out


def _claim(primitive, fn, facts: Growth) -> Growth:
    """The engine's own application of the entry to ``fn(x)``: binding, transfer, the
    check that nothing input-dependent was ignored."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(fn, (x,))
    info = NodeFacts(label=fn.__name__, primitive=primitive, bound=bind(node, None, dict(primitive.aliases)))
    claimed = apply(node, info, {x: facts}, training=False)
    while isinstance(claimed, tuple):
        claimed = claimed[0]
    return claimed


@pytest.mark.parametrize(("primitive", "fn"), _unary_ops())
@pytest.mark.parametrize("kind", ["any", "positive", "negative", "zeros"])
def test_unary_transfer_is_sound(primitive, fn, kind):
    if fn.__name__.startswith("empty") or "rand" in fn.__name__ or fn.__name__ in ("bernoulli", "normal", "poisson", "multinomial"):
        pytest.skip("uninitialised memory and samples have no values to compare across calls")
    generator = torch.Generator().manual_seed(0)
    x = _tensor(kind, generator)
    claimed = _claim(primitive, fn, _facts(x, kind))
    result = fn(x)
    while isinstance(result, tuple):
        result = result[0]
    if not isinstance(result, torch.Tensor) or not result.is_floating_point() or claimed.q is None:
        return
    values = result.detach().double().flatten().tolist()
    assert all(holds(claimed.range, v, exact=False) for v in values), f"{fn.__name__} on {kind} inputs claims {claimed.range}"
    if math.isinf(claimed.q):
        return
    # the exponent bounds the growth: ||f(s x)|| <= C s^q, checked on a decade of s
    small, large = fn(10.0 * x), fn(1e4 * x)
    while isinstance(small, tuple):
        small, large = small[0], large[0]
    small, large = small.double().norm(), large.double().norm()
    if not torch.isfinite(large) or small == 0:
        assert claimed.q > 0 or torch.isfinite(large), f"{fn.__name__}: bounded claim, but {large}"
        return
    slope = math.log(max(float(large), 1e-300) / float(small)) / math.log(1e3)
    assert slope <= claimed.q + 0.05, f"{fn.__name__} grows like s^{slope:.2f}, claimed q = {claimed.q}"


def test_the_reciprocal_of_a_subnormal_range_overflows_outward():
    """1 / 2.2e-313 is beyond the largest float (found by hypothesis in CI): the lower end is
    the largest float, not an exception, and the true reciprocals lie in the result."""
    r = domain.Range(lo=1e-320, hi=2.2250738585e-313, pos=True)
    result = domain.reciprocal(r)
    assert result.lo == sys.float_info.max and result.hi == math.inf
    assert holds(result, 1 / Fraction(2.2250738585e-313)) and holds(result, 1 / Fraction(1e-320))
