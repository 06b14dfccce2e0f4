"""GrowthProp (qlint.growth.propagate) on small traced graphs: the exponent of every node of the
whole-graph pass, each input seeded at q = 1 (Theorem 9: composition multiplies, a sum takes the
max, a Hadamard product adds, a norm gives 0)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from growth_graphs import D, Forward, named, prepare
from torch import nn

from qlint.growth.propagate import GrowthProp, leading


def mystery(x):
    """An op the registry does not know (fx.wrap keeps it one call in the graph)."""
    return x.sin()


torch.fx.wrap("mystery")


def whole_graph(fn, **members) -> dict[str, tuple]:
    """node name -> (q, depends) of the whole-graph pass over ``forward(x) = fn(self, x)``."""
    traced, graph = prepare(Forward(fn, **members))
    prop = GrowthProp(traced.module, graph, training=False)
    values = prop.run_graph()
    return {node.name: (leading(value).q, leading(value).depends) for node, value in values.items()
            if node.op not in ("get_attr", "output")}


def test_composition_multiplies_the_exponents():
    assert whole_graph(lambda m, x: (x ** 2) ** 3) == {"x": (1.0, True), "pow_1": (2.0, True), "pow_2": (6.0, True)}


def test_a_linear_layer_keeps_the_exponent_of_its_input():
    assert whole_graph(lambda m, x: m.w(x ** 3), w=nn.Linear(D, D)) == {
        "x": (1.0, True), "pow_1": (3.0, True), "linear": (3.0, True)}


def test_a_sum_takes_the_larger_exponent():
    assert whole_graph(lambda m, x: x + x ** 2) == {"x": (1.0, True), "pow_1": (2.0, True), "add": (2.0, True)}


@pytest.mark.parametrize("fn, q", [
    (lambda m, x: x * x ** 2, 3.0),
    (lambda m, x: m.a(x) * m.b(x), 2.0),
])
def test_a_hadamard_product_adds_the_exponents(fn, q):
    values = whole_graph(fn, a=nn.Linear(D, D), b=nn.Linear(D, D))
    assert values["mul"] == (q, True)


def test_a_bounded_factor_adds_nothing():
    values = whole_graph(lambda m, x: torch.sigmoid(x) * x)
    assert values["sigmoid"] == (0.0, True) and values["mul"] == (1.0, True)


def test_a_registry_norm_gives_zero_whatever_it_normalises():
    values = whole_graph(lambda m, x: F.layer_norm(x ** 3, (D,)))
    assert values == {"x": (1.0, True), "pow_1": (3.0, True), "layer_norm": (0.0, True)}


def test_a_norm_written_out_gives_zero_through_its_proved_relation():
    values = whole_graph(lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert values["mean"] == (2.0, True) and values["mul"] == (0.0, True)


def test_without_eps_the_written_out_norm_is_unknown():
    """rsqrt(mean(x^2)) has a pole at x = 0: no relation is proved and the product is not bounded."""
    values = whole_graph(lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)))
    assert values["rsqrt"] == (None, True) and values["mul"] == (None, True)


def test_an_exponential_of_an_unbounded_argument_is_not_polynomial():
    traced, graph = prepare(Forward(lambda m, x: torch.exp(x)))
    value = leading(GrowthProp(traced.module, graph, training=False).run_graph()[named(graph, "exp")])
    assert value.q == math.inf and value.culprit == "exp of an argument not bounded above"


def test_an_unknown_op_is_marked_and_makes_what_reads_it_unknown():
    traced, graph = prepare(Forward(lambda m, x: mystery(x) + 1.0))
    values = GrowthProp(traced.module, graph, training=False).run_graph()
    culprit = f"unknown op `{__name__}.mystery`"
    for name in ("mystery", "add"):
        value = leading(values[named(graph, name)])
        assert (value.q, value.known, value.culprit) == (None, False, culprit)


def test_parameters_are_constants_that_do_not_depend_on_the_input():
    traced, graph = prepare(Forward(lambda m, x: x * m.scale, scale=nn.Parameter(torch.ones(D))))
    values = GrowthProp(traced.module, graph, training=False).run_graph()
    scale = leading(values[named(graph, "scale")])
    assert (scale.q, scale.depends) == (0.0, False)
    assert leading(values[named(graph, "mul")]).q == 1.0


def test_a_block_pass_seeded_at_its_input_measures_only_its_region():
    """propagate() re-runs the cone of a seed: the seeded node is q = 1 however it grows in the model's inputs."""
    traced, graph = prepare(Forward(lambda m, x: m.w(x ** 3) ** 2, w=nn.Linear(D, D)))
    prop = GrowthProp(traced.module, graph, training=False)
    base = prop.run_graph()
    seed = named(graph, "pow_1")
    assert leading(base[named(graph, "pow_2")]).q == 6.0
    region = [named(graph, "linear"), named(graph, "pow_2")]
    cone = prop.propagate({seed: prop.seed(seed, base, stream=True)}, region, base)
    assert leading(cone[named(graph, "linear")]).q == 1.0 and leading(cone[named(graph, "pow_2")]).q == 2.0
