"""The paper's forward and backward bounds from measured constants (Remark 6, eq. 38 and 39): the depths at
which a stack of blocks passes each float format's largest value."""

import math

import pytest

from qlint.velocity.bounds import BlockConstants, backward_bound, forward_bound, largest_finite, overflow_depth, step


def test_remark_6_depths_are_computed():
    """c = 1, q = 1, ||X_0|| = 1: 2^D passes 65504 at D = 16 and the float32/bfloat16 maxima at D = 128."""
    doubling = [BlockConstants(q=1.0, c=1.0, b=0.0)]
    assert largest_finite("float16") == 65504.0
    assert overflow_depth(1.0, doubling, largest_finite("float16")) == 16
    assert overflow_depth(1.0, doubling, largest_finite("bfloat16")) == 128
    assert overflow_depth(1.0, doubling, largest_finite("float32")) == 128
    assert forward_bound(1.0, doubling * 16) == (2.0**16, "eq. 38")


def test_eq_38_is_the_layerwise_recursion():
    stack = [BlockConstants(0.0, 0.0, 0.7), BlockConstants(1.0, 0.3, 0.2), BlockConstants(1.0, 1.5, 0.0)]
    r = 2.0
    for block in stack:
        r = step(r, block)
    bound, rule = forward_bound(2.0, stack)
    assert rule == "eq. 38" and bound == pytest.approx(r)
    # explicitly: prod over S_1 of (1 + c_k) ||X_0|| + sum_k b_k prod_{j > k, j in S_1} (1 + c_j)
    assert bound == pytest.approx(1.3 * 2.5 * 2.0 + 0.7 * 1.3 * 2.5 + 0.2 * 2.5)


def test_sublinear_blocks_are_folded_into_an_upper_bound():
    block = BlockConstants(0.5, 2.0, 1.0)
    bound, rule = forward_bound(10.0, [block] * 3)
    exact = 10.0
    for _ in range(3):
        exact = step(exact, block)
    assert rule == "eq. 38" and bound >= exact


def test_bounded_stack_overflows_linearly_and_exactly():
    stack = [BlockConstants(0.0, 0.0, 1.0), BlockConstants(0.0, 0.0, 2.0)]
    assert overflow_depth(1.0, stack, 10.0) == 7  # 1 + 1 + 2 + 1 + 2 + 1 + 2 = 10 at D = 6, 12 at D = 7
    assert overflow_depth(1.0, stack, largest_finite("float32")) > 2 * 10**38
    assert overflow_depth(1.0, [BlockConstants(0.0, 0.0, 0.0)], 10.0) is None


def test_supercritical_stack_uses_the_recursion():
    bound, rule = forward_bound(2.0, [BlockConstants(2.0, 1.0, 0.0)] * 3)
    assert bound == 2.0 + 4.0 + 36.0 + 42.0**2 and rule.startswith("layerwise recursion")
    assert overflow_depth(2.0, [BlockConstants(2.0, 1.0, 0.0)], 65504.0) == 4


def test_backward_bound_is_eq_39():
    product, exponential = backward_bound([0.5, 1.0, 0.25])
    assert product == pytest.approx(1.5 * 2.0 * 1.25) and exponential == pytest.approx(math.exp(1.75))
    assert product <= exponential
