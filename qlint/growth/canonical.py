"""Exact rewrites of masked averages with an all-ones mask, before the graph is analysed.

Time-series scalers take an observation mask and default it to ``ones_like(x)`` (Hugging Face's
PatchTST, PatchTSMixer, Informer): ``loc = (x * m).sum(d, keepdim=True) / m.sum(d, keepdim=True)
.clamp_min(1)``, ``var = ((x - loc) * m) ** 2`` summed and divided the same way. With the mask all
ones these are ``mean`` and the variance, and ``(x - loc) / sqrt(var + eps)`` is a normalisation;
the relations (:mod:`qlint.growth.relations`) and the centring test of the block detector prove those
on ``mean`` only. Two rewrites make the graph say so, each exact for every value of x:

* ``x * ones`` -> ``x``, when the ones do not broadcast x to a larger shape;
* ``sum(a, d, keepdim=True) / sum(ones, d, keepdim=True)`` (the count optionally ``clamp_min(c)``
  with c <= 1) -> ``mean(a, d, keepdim=True)``, when the ones have a's shape: the count is the
  group size n >= 1, so the clamp leaves it.

The ones are ``ones_like`` / ``ones`` / ``new_ones`` or a ``full`` of 1, read through plumbing. A
mask passed in as an input is not rewritten: its entries are not known.

A third rewrite cancels a value against itself: ``a - b`` -> ``zeros_like(a)`` when b is a, or an exact
copy of it (``detach``, ``clone``, ``alias``, ``contiguous``; not a cast, which rounds): a straight-through
term ``f - f.detach()`` is 0 on every input, whatever f's exponent, and carries only f's gradient.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx as fx

from qlint.core.graph import dtype_of, facts, keeps_values, shape_of
from qlint.core.ops import op_name

_ONES = frozenset({"ones_like", "ones", "new_ones"})
_FULL = frozenset({"full", "full_like", "new_full"})


def simplify(module: fx.GraphModule) -> int:
    """Rewrite the all-ones masked averages of an annotated graph in place; the number rewritten."""
    replaced: dict[fx.Node, fx.Node] = {}  # the facts' bound arguments predate the rewrites: read through this
    for node in list(module.graph.nodes):
        if "qlint" not in node.meta or node.op != "call_function":
            continue
        name = op_name(node)
        replacement = (_unmasked(node, replaced) if name == "mul" else _mean(node, module.graph, replaced)
                       if name == "div" else _cancelled(node, module.graph, replaced) if name == "sub" else None)
        if replacement is not None:
            node.replace_all_uses_with(replacement)
            replaced[node] = replacement
    rewritten = len(replaced)
    if rewritten:
        module.graph.eliminate_dead_code()
        module.recompile()
    return rewritten


def _unmasked(node: fx.Node, replaced: dict) -> Optional[fx.Node]:
    """x for ``x * ones`` whose result has x's shape."""
    a, b = _argument(node, "input", replaced), _argument(node, "other", replaced)
    for value, mask in ((a, b), (b, a)):
        if (isinstance(value, fx.Node) and _ones(mask) and shape_of(value) is not None
            and shape_of(value) == shape_of(node)):
            return value
    return None


def _mean(node: fx.Node, graph: fx.Graph, replaced: dict) -> Optional[fx.Node]:
    """``mean(a, d, keepdim=True)`` for ``sum(a, d, keepdim=True) / count(d)`` over ones of a's shape."""
    total, count = _argument(node, "input", replaced), _argument(node, "other", replaced)
    if _argument(node, "rounding_mode") is not None:
        return None
    if not (isinstance(total, fx.Node) and op_name(total) == "sum" and isinstance(count, fx.Node)):
        return None
    if op_name(count) == "clamp_min":
        floor = _argument(count, "min")
        if not (isinstance(floor, (int, float)) and not isinstance(floor, bool) and floor <= 1):
            return None
        count = _argument(count, "input", replaced)
    if not (isinstance(count, fx.Node) and op_name(count) == "sum"):
        return None
    summed, ones = _argument(total, "input", replaced), _argument(count, "input", replaced)
    if not (isinstance(summed, fx.Node) and _ones(ones) and shape_of(ones) is not None
            and shape_of(ones) == shape_of(summed) and keeps_values(summed, total)):
        return None  # (a sum in its own narrower dtype= is no sum of a's values)
    dims, keep = _argument(total, "dim"), _argument(total, "keepdim")
    if (keep is not True or _argument(count, "keepdim") is not True
        or _normalised(dims, summed) != _normalised(_argument(count, "dim"), ones)):
        return None
    if _normalised(dims, summed) is None or shape_of(node) != shape_of(total):
        return None
    if not _holds_count(count, ones, _normalised(dims, summed)):
        return None  # the count rounded or wrapped in its dtype (a bool sum is 1, an int8 one wraps past 127)
    with graph.inserting_after(node):
        mean = graph.call_function(torch.ops.aten.mean.dim,
                                   (summed, list(dims) if isinstance(dims, (list, tuple)) else [dims], True))
    mean.meta.update({k: v for k, v in node.meta.items() if k != "qlint"})
    return mean


# the largest integer count each dtype holds exactly, and every count below it
_EXACT_COUNTS = {torch.int8: 127, torch.uint8: 255, torch.int16: 2 ** 15 - 1, torch.int32: 2 ** 31 - 1,
                 torch.int64: 2 ** 63 - 1, torch.float16: 2 ** 11, torch.bfloat16: 2 ** 8, torch.float32: 2 ** 24,
                 torch.float64: 2 ** 53}


def _holds_count(count: fx.Node, ones: fx.Node, dims: frozenset[int]) -> bool:
    """Whether the count, the sum of ones over ``dims``, is the number of entries there: its dtype holds that
    number exactly (known sizes; an unknown one only in a 64-bit dtype)."""
    limit = _EXACT_COUNTS.get(dtype_of(count))
    shape = shape_of(ones)
    if limit is None or shape is None:
        return False
    number = 1
    for d in dims:
        size = shape[d]
        if not isinstance(size, int):
            return limit >= 2 ** 53
        number *= size
    return number <= limit


# ops whose result is their input's value exactly (a detach keeps the value and drops the gradient)
_EXACT_COPIES = frozenset({"detach", "clone", "alias", "contiguous", "lift_fresh_copy", "lift_fresh", "positive"})


def _cancelled(node: fx.Node, graph: fx.Graph, replaced: dict) -> Optional[fx.Node]:
    """``zeros_like(a)`` for ``a - copy(a)`` (alpha 1) whose result has a's shape."""
    a, b = _argument(node, "input", replaced), _argument(node, "other", replaced)
    alpha = _argument(node, "alpha")
    if alpha not in (None, 1) or not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return None
    if _original(a, replaced) is not _original(b, replaced) or shape_of(a) is None or shape_of(a) != shape_of(node):
        return None
    with graph.inserting_after(node):
        zeros = graph.call_function(torch.ops.aten.zeros_like.default, (a,))
    zeros.meta.update({k: v for k, v in node.meta.items() if k != "qlint"})
    return zeros


def _original(value: fx.Node, replaced: dict) -> fx.Node:
    """The value an exact copy chain starts from."""
    while "qlint" in value.meta and op_name(value) in _EXACT_COPIES:
        source = _argument(value, "input", replaced)
        if not isinstance(source, fx.Node):
            break
        value = source
    return value


def _ones(value: Any) -> bool:
    """A tensor of ones, through plumbing that computes from its input alone (views, casts, copies; not
    ``copy_(ones, src)``, plumbing too, whose entries are src's)."""
    while (isinstance(value, fx.Node) and "qlint" in value.meta and facts(value).plumbing
           and op_name(value) not in _ONES):
        source = _argument(value, "input")
        if any(other is not source and not _a_size(other) for other in value.all_input_nodes):
            return False  # another value enters: the entries may be its
        value = source
    if not isinstance(value, fx.Node) or "qlint" not in value.meta:
        return False
    name = op_name(value)
    if name in _ONES:
        return True
    return name in _FULL and _argument(value, "fill_value") == 1


def _a_size(node: fx.Node) -> bool:
    """A length (a view's target shape on a dynamic export), not a tensor."""
    return isinstance(node.meta.get("val"), (int, torch.SymInt)) or op_name(node) in ("size", "sym_size", "numel")


def _normalised(dims: Any, source: fx.Node) -> Optional[frozenset[int]]:
    shape = shape_of(source)
    listed = [dims] if isinstance(dims, int) else list(dims) if isinstance(dims, (list, tuple)) else None
    if shape is None or not listed or not all(isinstance(d, int) for d in listed):
        return None
    return frozenset(d % len(shape) for d in listed)


def _argument(node: fx.Node, name: str, replaced: Optional[dict] = None) -> Any:
    bound = facts(node).bound
    if bound is None:
        return None
    value = bound.arguments.get(name, bound.defaults.get(name))
    return (replaced or {}).get(value, value) if isinstance(value, fx.Node) else value


__all__ = ["simplify"]
