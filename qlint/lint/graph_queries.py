"""Graph questions the QL2xx / QL3xx rules share, asked in the registry's op vocabulary."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Optional, TypeVar

import torch
import torch.fx as fx

from qlint.growth.engine import Analysis
from qlint.core.graph import facts
from qlint.core.ops import op_name
from qlint.growth.annotated import strip
from qlint.growth.relations import Normalisation

_RUNNING_STATS_OPS = {"_native_batch_norm_legit_no_training", "_batch_norm_no_update"}
_BATCH_STATS_OPS = {"_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_batch_norm_with_update"}


Result = TypeVar("Result")


def once_per_graph(question: Callable[[Analysis], Result]) -> Callable[[Analysis], Result]:
    """Answer a whole-graph question once per traced graph: several rules (and the probe) ask it."""
    answers: "weakref.WeakKeyDictionary[fx.Graph, Any]" = weakref.WeakKeyDictionary()

    @functools.wraps(question)
    def ask(analysis: Analysis) -> Result:
        graph = analysis.traced.graph
        if graph not in answers:
            answers[graph] = question(analysis)
        return answers[graph]

    return ask


def op(node: Any) -> str:
    """The registry entry id of a node ('' for ops outside the registry and leaves)."""
    return facts(node).op if isinstance(node, fx.Node) and "qlint" in node.meta else ""


def family(node: Any) -> frozenset[str]:
    """The registry families of a node's entry (the op vocabulary, ``qlint.registry.FAMILIES``)."""
    return facts(node).family if isinstance(node, fx.Node) and "qlint" in node.meta else frozenset()


def argument(node: fx.Node, name: str, default: Any = None) -> Any:
    bound = facts(node).bound
    if bound is None:
        return default
    return bound.arguments.get(name, bound.defaults.get(name, default))


def carried(node: Any) -> Any:
    """The value a node carries through copies, casts and reshapes."""
    while isinstance(node, fx.Node):
        stripped = strip(node)
        if stripped is not node:
            node = stripped
            continue
        passes_through = family(node) & {"view", "cast"} and op_name(node) != "getitem"
        if passes_through and isinstance(argument(node, "input"), fx.Node):
            node = argument(node, "input")
            continue
        return node
    return node


def uses_running_stats(node: fx.Node) -> Optional[bool]:
    """True for a BatchNorm / InstanceNorm on running statistics (an affine map), False on
    batch statistics, None if the node is neither."""
    if op(node) != "batch_norm":
        return None
    name = op_name(node)
    if name in _RUNNING_STATS_OPS or name in _BATCH_STATS_OPS:
        return name in _RUNNING_STATS_OPS
    if argument(node, "running_mean") is None and argument(node, "running_var") is None:
        return False
    if name == "instance_norm":
        return not argument(node, "use_input_stats", True)
    return not argument(node, "training", False)


def is_normalizer(node: fx.Node) -> bool:
    """LayerNorm, RMSNorm, GroupNorm, L2 normalization, hand-written (proved) or not; BatchNorm
    only with batch statistics (with running statistics it is an affine map, QL205)."""
    if not isinstance(node, fx.Node) or "qlint" not in node.meta:
        return False
    if isinstance(facts(node).relation, Normalisation) or "norm" in family(node):
        return True
    return uses_running_stats(node) is False


def normalised_input(node: fx.Node) -> Optional[fx.Node]:
    """The tensor a normalizer normalises (through casts; the raw x of a centred x - mean)."""
    relation = facts(node).relation
    value = relation.numerator if isinstance(relation, Normalisation) else argument(node, "input")
    if not isinstance(value, fx.Node):
        return None
    value = carried(value)
    if isinstance(relation, Normalisation) and op(value) == "sub" and isinstance(argument(value, "input"), fx.Node):
        value = carried(argument(value, "input"))
    return value


def constant_value(value: Any, analysis: Analysis) -> Optional[torch.Tensor]:
    """Evaluate a value that depends on parameters, buffers and constants only (None otherwise)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value))
    if not isinstance(value, fx.Node):
        return None
    result = analysis.graph.constant(value)
    if not isinstance(result, torch.Tensor) or result.is_meta:
        return None
    return result.detach()


@once_per_graph
def stacks(analysis: Analysis) -> list[list[Any]]:
    """The blocks grouped into stacks, each in execution order.

    A stack is a run of blocks on one residual stream: blocks chained by the stream,
    split where a norm outside every block normalises the stream between two of them
    (SigLIP's ``post_layernorm`` before its pooling head, a stage's norm) and where the
    stream starts anew (an encoder-decoder's decoder starts from its own embedding; the
    encoder's output enters it as a condition). A Post-LN block's own norm LN(X + f(X))
    is part of the block and splits nothing.
    """
    stream = analysis.stream
    owner = {id(b): i for i, b in enumerate(stream.blocks)}
    parent = list(range(len(stream.blocks)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    normalised = set()  # (previous, next) pairs with a norm on the stream between them
    for transition in stream.transitions:
        if transition.before is None:
            continue
        own = {n for b in transition.after for n in (b.post_node, *b.post_region)}
        if any(is_normalizer(n) and n not in own for n in transition.region):
            normalised.update((id(b), id(transition.before)) for b in transition.after)
    for block in stream.blocks:
        for previous in block.predecessors:
            if (id(previous), id(block)) not in normalised:
                parent[root(owner[id(previous)])] = root(owner[id(block)])
    groups: dict[int, list[Any]] = {}
    for i, block in enumerate(stream.blocks):
        groups.setdefault(root(i), []).append(block)
    return list(groups.values())


def common_path(paths: list[str]) -> str:
    """The longest dotted prefix shared by module paths ('layers' for layers.0, layers.1)."""
    split = [p.split(".") for p in paths if p]
    if not split or len(split) < len(paths):
        return ""
    prefix = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    return ".".join(prefix)
