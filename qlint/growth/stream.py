"""The residual stream's parts, as the block detector finds them: the terms of a join, the blocks
(X_{k+1} = F_k(X_k)), the transitions between and around them, and the stream that holds both.
:mod:`qlint.growth.blocks` finds them, :mod:`qlint.growth.dataflow` covers the stream with them,
:mod:`qlint.growth.engine` derives their exponents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import torch.fx as fx

Form = Literal["additive", "scaled"]
Post = Literal["", "post-norm", "post-activation"]


@dataclass(frozen=True)
class Term:
    """One term of a join: ``coefficient * node`` reached through ``path``.

    ``path`` lists (node, argument name) from the join down to the argument that holds
    the term, so the term can be replaced by 0 (the velocity of an additive block);
    ``entry`` is the value as it enters the join (``gamma * f(x)`` for the term f(x)).
    """

    node: fx.Node
    coefficient: Optional[float]  # a known number, None when the factor is not constant
    path: tuple[tuple[fx.Node, str], ...]
    entry: Optional[fx.Node] = None


@dataclass
class StreamBlock:
    """One residual update found in the graph."""

    join: fx.Node
    stream: fx.Node  # X_k
    skip: Term
    terms: list[Term]  # the velocity terms (every term but the skip)
    form: Form
    region: list[fx.Node] = field(default_factory=list)  # nodes from X_k (excluded) to the join (included)
    side: list[fx.Node] = field(default_factory=list)  # input-derived values read from outside the region
    older: list[fx.Node] = field(default_factory=list)  # side inputs that are older stream values
    name: str = ""
    index: int = 0
    post: Post = ""
    post_node: Optional[fx.Node] = None  # the norm (or ReLU) after the join: LN(X + f(X))
    post_region: list[fx.Node] = field(default_factory=list)  # the nodes from the join (excluded) to that norm's output
    norm_in: Optional[fx.Node] = None  # the norm on the skip at the block's input: a LN(X) + f(LN(X)) (shifted Post-LN)
    dataflow: bool = False  # found by dataflow outside the blocks found by form (a write, a partial update)
    predecessors: list["StreamBlock"] = field(default_factory=list)

    @property
    def region_set(self) -> frozenset[fx.Node]:
        return frozenset(self.region)

    @property
    def output(self) -> fx.Node:
        """Where the block's stream map F ends: the norm after the join of a Post-LN block, else the join."""
        return self.post_region[-1] if self.post_region else self.join


@dataclass
class StreamTransition:
    """The stream ops between blocks: from the previous blocks' outputs to a block's input."""

    sources: list[fx.Node]  # the joins of the preceding blocks
    target: fx.Node  # the next block's input X_k
    region: list[fx.Node]
    side: list[fx.Node] = field(default_factory=list)
    older: list[fx.Node] = field(default_factory=list)
    name: str = ""
    after: list[StreamBlock] = field(default_factory=list)
    before: Optional[StreamBlock] = None
    # "between" blocks; "stem": from the model's inputs; "head": to an output; "readout", "condition"
    kind: str = "between"
    # the values that leave it (the target, unless a stretch has several)
    exits: list[fx.Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.exits:
            self.exits = [self.target]


@dataclass
class Stream:
    """The residual stream: blocks in execution order and the transitions between them."""

    blocks: list[StreamBlock]
    transitions: list[StreamTransition]
    nested: list[StreamBlock] = field(default_factory=list)


__all__ = ["Form", "Post", "Stream", "StreamBlock", "StreamTransition", "Term"]
