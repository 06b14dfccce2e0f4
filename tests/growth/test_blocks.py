"""find_stream (qlint.growth.blocks) on small traced graphs: which joins are blocks, their skip and
velocity terms, their form and names, and the transitions that cover the ops between them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from growth_graphs import D, Residual, Stack, named, prepare
from torch import nn

from qlint.growth.blocks import find_stream
from qlint.growth.stream import Stream


def stream_of(model: nn.Module) -> Stream:
    _, graph = prepare(model)
    return find_stream(graph, root_name=type(model).__name__)


def terms(block) -> list[tuple[str, float]]:
    return [(t.node.name, t.coefficient) for t in block.terms]


class PreNorm(nn.Module):
    """x + W LN(x)"""

    def __init__(self):
        super().__init__()
        self.norm, self.f = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        return x + self.f(self.norm(x))


class PostNorm(nn.Module):
    """LN(x + W x)"""

    def __init__(self):
        super().__init__()
        self.norm, self.f = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        return self.norm(x + self.f(x))


def test_a_plain_residual_stack_is_one_additive_block_per_layer():
    stream = stream_of(Stack(Residual(), Residual()))
    first, second = stream.blocks
    assert [(b.name, b.index, b.form, b.post) for b in stream.blocks] == [
        ("layers.0", 0, "additive", ""), ("layers.1", 1, "additive", "")]
    assert (first.stream.name, first.join.name, first.skip.node.name, first.skip.coefficient) == ("x", "add", "x", 1.0)
    assert terms(first) == [("linear", 1.0)] and terms(second) == [("linear_1", 1.0)]
    assert second.stream is first.join  # chained: X_1 is the first block's output
    assert [n.name for n in second.region] == ["linear_1", "add_1"]
    assert stream.transitions == [] and stream.nested == []


def test_a_pre_ln_block_holds_its_norm_in_the_velocity():
    (block,) = stream_of(Stack(PreNorm())).blocks
    assert (block.name, block.form, block.post, block.skip.node.name) == ("layers.0", "additive", "", "x")
    assert [n.name for n in block.region] == ["layer_norm", "linear", "add"]


def test_a_post_ln_block_owns_the_norm_after_its_join():
    first, second = stream_of(Stack(PostNorm(), PostNorm())).blocks
    assert (first.post, first.post_node.name, first.output.name) == ("post-norm", "layer_norm", "layer_norm")
    assert [n.name for n in first.region] == ["linear", "add"]
    assert second.stream is first.output  # the next block reads the normalised value


class TopLevel(nn.Module):
    """Two joins in the model's own forward, then a final norm: Pre-LN (``x + f(LN x)``) or Post-LN."""

    def __init__(self, pre_norm: bool):
        super().__init__()
        self.pre_norm = pre_norm
        self.n1, self.n2, self.final = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
        self.f1, self.f2 = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        if self.pre_norm:
            x = x + self.f1(self.n1(x))
            return self.final(x + self.f2(self.n2(x)))
        x = self.n1(x + self.f1(x))
        return self.n2(x + self.f2(x))


def test_at_the_top_level_the_norm_after_a_pre_ln_stack_is_the_head():
    assert [b.post for b in stream_of(TopLevel(pre_norm=True)).blocks] == ["", ""]
    assert [b.post for b in stream_of(TopLevel(pre_norm=False)).blocks] == ["post-norm", "post-norm"]


def test_a_gated_velocity_is_one_term_whose_skip_is_the_input():
    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.f = nn.Linear(D, D), nn.Linear(D, D)

        def forward(self, x):
            return x + torch.sigmoid(self.gate(x)) * self.f(x)

    (block,) = stream_of(Gated()).blocks
    assert (block.name, block.form, block.skip.node.name) == ("Gated", "additive", "x")
    assert terms(block) == [("mul", 1.0)]
    assert [n.name for n in block.region] == ["linear", "sigmoid", "linear_1", "mul", "add"]


def test_lerp_with_a_number_is_a_scaled_block():
    class Lerp(nn.Module):
        def __init__(self):
            super().__init__()
            self.f = nn.Linear(D, D)

        def forward(self, x):
            return torch.lerp(x, self.f(x), 0.25)

    (block,) = stream_of(Lerp()).blocks
    assert (block.form, block.skip.coefficient, terms(block)) == ("scaled", 0.75, [("linear", 0.25)])


def test_a_graph_with_no_residual_has_no_block():
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(D, D), nn.Linear(D, D)

        def forward(self, x):
            return self.b(F.gelu(self.a(x)))

    stream = stream_of(MLP())
    assert (stream.blocks, stream.transitions, stream.nested) == ([], [], [])


def test_an_added_parameter_is_a_condition_not_a_block():
    class Positional(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos, self.f = nn.Parameter(torch.zeros(D)), nn.Linear(D, D)

        def forward(self, x):
            x = x + self.pos
            return x + self.f(x)

    stream = stream_of(Positional())
    assert [(b.stream.name, b.join.name) for b in stream.blocks] == [("add", "add_1")]
    assert [(t.name, t.kind, [n.name for n in t.region]) for t in stream.transitions] == [
        ("input -> Positional", "stem", ["add"])]


def test_the_stretches_no_block_covers_are_stem_between_and_head_transitions():
    class Stages(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.one, self.down, self.two, self.head = (
                nn.Linear(D, D), PreNorm(), nn.Linear(D, D), PreNorm(), nn.Linear(D, 2))

        def forward(self, x):
            x = self.one(self.stem(x))
            x = self.two(torch.tanh(self.down(x)))
            return self.head(x)

    stream = stream_of(Stages())
    assert [b.name for b in stream.blocks] == ["one", "two"]
    assert [(t.name, t.kind, [n.name for n in t.region]) for t in stream.transitions] == [
        ("input -> one (stem)", "stem", ["linear"]),
        ("one -> two (down)", "between", ["linear_2", "tanh"]),
        ("two -> output (head)", "head", ["linear_4"]),
    ]
    between = stream.transitions[1]
    assert (between.after, between.before) == ([stream.blocks[0]], stream.blocks[1])


def test_two_joins_in_one_module_are_named_by_their_branch():
    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.mlp = nn.Linear(D, D), nn.Linear(D, D)

        def forward(self, x):
            x = x + self.attn(x)
            return x + self.mlp(x)

    assert [b.name for b in stream_of(Stack(Layer())).blocks] == ["layers.0:attn", "layers.0:mlp"]


def test_a_join_inside_a_velocity_is_nested_in_its_block():
    class InnerResidual(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = nn.Linear(D, D), nn.Linear(D, D)

        def forward(self, x):
            h = self.w1(x)
            return x + self.w2(h + F.gelu(h))

    _, graph = prepare(InnerResidual())
    stream = find_stream(graph, root_name="InnerResidual")
    assert [b.join for b in stream.blocks] == [named(graph, "add_1")]
    assert [b.join for b in stream.nested] == [named(graph, "add")]
