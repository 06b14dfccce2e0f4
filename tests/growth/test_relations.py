"""Each relational fact of qlint.growth.relations on tiny graphs: proved where the algebra holds, and not
proved for the near miss beside it (no eps, another reduction group, another tensor, a cap)."""

from __future__ import annotations

import math

import pytest
import torch
from growth_graphs import D, Forward, named, output_value, prepare
from torch import nn

from qlint.core.graph import facts
from qlint.growth.annotated import strip
from qlint.growth.relations import Normalisation, OwnMaxShift, OwnShiftRatio, OwnSumRatio, match_normalisation


def relations_of(fn) -> dict[str, object]:
    """node name -> the relation relations.find recorded there, for ``forward(x) = fn(self, x)``."""
    _, graph = prepare(Forward(fn, a=nn.Linear(D, D)))
    return {n.name: facts(n).relation for n in graph.nodes
            if n.op in ("call_function", "call_method") and facts(n).relation is not None}


def test_rmsnorm_written_out_is_a_normalisation_bounded_by_sqrt_of_its_group():
    relation = relations_of(lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))["mul"]
    assert isinstance(relation, Normalisation)
    assert relation.numerator.name == "x" and relation.factor is None
    assert relation.description == "x * rsqrt(mean(x^2) + eps) (RMSNorm written out)"
    assert relation.bound == math.sqrt(D)


def test_rmsnorm_without_eps_proves_nothing():
    assert relations_of(lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))) == {}


def test_layernorm_written_out_is_a_normalisation_of_the_centred_input():
    relation = relations_of(
        lambda m, x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5))
    assert set(relation) == {"truediv"}
    assert relation["truediv"].numerator.name == "sub"
    assert relation["truediv"].description == "(x - mean) / sqrt(var + eps) (LayerNorm written out)"
    assert relation["truediv"].bound == math.sqrt(D)


def test_layernorm_with_its_spread_over_another_dim_proves_nothing():
    """Centred over channels, its variance taken over tokens (RevIN's typo): unbounded where the spread is 0."""
    assert relations_of(
        lambda m, x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-2, keepdim=True, unbiased=False) + 1e-5)) == {}


def test_l2_normalisation_with_a_floor_is_bounded_by_one():
    relation = relations_of(lambda m, x: x / x.norm(dim=-1, keepdim=True).clamp(min=1e-6))["truediv"]
    assert relation.description == "x / (||x||_p + eps) (L2 normalization written out)"
    assert relation.bound == 1.0


@pytest.mark.parametrize("fn", [
    lambda m, x: x / x.norm(dim=-1, keepdim=True).clamp(min=1e-6, max=1.0),  # a cap on the statistic
    lambda m, x: x / m.a(x).norm(dim=-1, keepdim=True).clamp(min=1e-6),  # the norm of another tensor
], ids=["capped", "another-tensor"])
def test_l2_normalisation_near_misses_prove_nothing(fn):
    assert relations_of(fn) == {}


def test_match_normalisation_answers_for_one_node():
    _, graph = prepare(Forward(lambda m, x: x / x.norm(dim=-1, keepdim=True).clamp(min=1e-6)))
    assert match_normalisation(output_value(graph)).bound == 1.0
    assert match_normalisation(named(graph, "clamp")) is None


def test_a_ratio_to_its_own_sum():
    relation = relations_of(lambda m, x: (lambda e: e / e.sum(-1, keepdim=True))(torch.exp(x)))["truediv"]
    assert relation == OwnSumRatio(relation.numerator, eps=False, floored=False)
    assert relation.numerator.name == "exp"


def test_top_k_of_a_softmax_over_its_own_sum_is_floored():
    relation = relations_of(
        lambda m, x: (lambda t: t / t.sum(-1, keepdim=True))(torch.topk(torch.softmax(x, -1), 2, -1)[0]))["truediv"]
    assert isinstance(relation, OwnSumRatio) and relation.floored is True


@pytest.mark.parametrize("fn", [
    lambda m, x: (lambda e: e / (2 * e.sum(-1, keepdim=True)))(torch.exp(x)),  # a scale on the sum
    lambda m, x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),  # two exp nodes: not its own sum
], ids=["scaled", "another-node"])
def test_ratio_to_own_sum_near_misses_prove_nothing(fn):
    assert relations_of(fn) == {}


def test_a_ratio_to_itself_plus_a_positive_constant():
    relation = relations_of(lambda m, x: (lambda n: n / (n + 1.0))(x * x))["truediv"]
    assert isinstance(relation, OwnShiftRatio) and relation.numerator.name == "mul"


@pytest.mark.parametrize("fn", [
    lambda m, x: (lambda n: n / (n - 1.0))(x * x),  # a negative shift: a pole at n = 1
    lambda m, x: (lambda n: n / (x + 1.0))(x * x),  # shifted another value
], ids=["negative-shift", "another-value"])
def test_shift_ratio_near_misses_prove_nothing(fn):
    assert relations_of(fn) == {}


@pytest.mark.parametrize("fn", [
    lambda m, x: x - x.amax(-1, keepdim=True),
    lambda m, x: x - torch.logsumexp(x, -1, keepdim=True),
], ids=["amax", "logsumexp"])
def test_a_shift_by_its_own_maximum(fn):
    relation = relations_of(fn)["sub"]
    assert isinstance(relation, OwnMaxShift) and relation.source.name == "x"


@pytest.mark.parametrize("fn", [
    lambda m, x: x - m.a(x).amax(-1, keepdim=True),  # the maximum of another tensor
    lambda m, x: x - x.amax(-1, keepdim=True).mean(),  # reduced further: not broadcast over its own group
], ids=["another-tensor", "reduced-further"])
def test_max_shift_near_misses_prove_nothing(fn):
    assert relations_of(fn) == {}


def test_strip_follows_floating_casts_but_not_integer_ones():
    _, graph = prepare(Forward(lambda m, x: x.float() * x.long()))
    assert strip(named(graph, "float_1")) is named(graph, "x")
    assert strip(named(graph, "long")) is named(graph, "long")
