"""Normalizations written out by hand, recognised as the q = 0 slot of Table 1.

``x * rsqrt(mean(x**2) + eps)`` (LLaMA's RMSNorm), ``(x - mean) / sqrt(var + eps)``
and ``x / x.norm()`` divide a tensor by a magnitude statistic *of itself*. The
exponent algebra cannot see that cancellation (it would give q_x + 0), so the
pattern is matched on the graph and the dividing node is treated as a
normalization.

Why it is bounded, for any reduction dims: each entry x_i belongs to the group the
statistic reduces over, so |x_i| <= sqrt(sum_group x_j^2) = sqrt(n * mean_group x^2),
and |x_i - mu| <= sqrt(n * var). Dividing by sqrt(stat + eps) >= sqrt(stat) bounds
every entry by sqrt(n): q = 0 (Theorem 9(v)).
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch.fx as fx

_CASTS = {"to", "float", "double", "half", "bfloat16", "type", "type_as", "contiguous", "clone", "_to_copy", "detach", "expand_as", "expand", "alias"}
_EPS_WRAPPERS = {"add", "clamp", "clamp_min", "clip"}
_MEAN_SQUARE = {"mean", "sum"}
_HOMOGENEOUS_STATS = {"norm", "std", "linalg_vector_norm", "vector_norm"}


def op_name(node: Any) -> str:
    """A canonical short name for a node's operation (works on fx and ATen graphs)."""
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
        return ""
    if node.op == "call_method":
        return node.target.strip("_") if node.target.startswith("__") else node.target
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return packet.__name__
    if target in (operator.mul, operator.imul):
        return "mul"
    if target in (operator.truediv, operator.itruediv):
        return "div"
    if target in (operator.add, operator.iadd):
        return "add"
    if target in (operator.pow,):
        return "pow"
    return getattr(target, "__name__", str(target))


def _arg(node: fx.Node, index: int) -> Any:
    return node.args[index] if len(node.args) > index else None


def _strip(node: Any) -> Any:
    """Follow casts and copies back to the value they carry."""
    while isinstance(node, fx.Node) and op_name(node) in _CASTS and node.args:
        node = node.args[0]
    return node


def _strip_eps(node: Any) -> Any:
    """Drop ``+ eps`` / ``clamp(min=eps)`` around a statistic."""
    node = _strip(node)
    while isinstance(node, fx.Node) and op_name(node) in _EPS_WRAPPERS:
        inner = [a for a in node.args if isinstance(a, fx.Node)]
        if len(inner) != 1:
            break
        node = _strip(inner[0])
    return node


def _is_const(value: Any, expected: float) -> bool:
    return isinstance(value, (int, float)) and float(value) == expected


def _squared_base(node: Any) -> Optional[fx.Node]:
    """b when node is b**2, square(b) or b*b."""
    node = _strip(node)
    name = op_name(node)
    if name == "pow" and _is_const(_arg(node, 1), 2):
        return _strip(node.args[0])
    if name == "square":
        return _strip(node.args[0])
    if name == "mul" and len(node.args) == 2 and _strip(node.args[0]) is _strip(node.args[1]):
        return _strip(node.args[0])
    return None


def _second_moment_base(node: Any) -> Optional[fx.Node]:
    """b when node is mean(b**2), sum(b**2) or var(b) (the statistic under the root)."""
    node = _strip_eps(node)
    name = op_name(node)
    if name in _MEAN_SQUARE:
        return _squared_base(node.args[0])
    if name in ("var", "var_mean"):
        return _strip(node.args[0])
    return None


def _root_base(node: Any) -> Optional[fx.Node]:
    """b when node is a homogeneous statistic: sqrt(mean b^2), norm(b), std(b) (+ eps)."""
    node = _strip_eps(node)
    name = op_name(node)
    if name == "sqrt" or (name == "pow" and _is_const(_arg(node, 1), 0.5)):
        return _second_moment_base(node.args[0])
    if name in _HOMOGENEOUS_STATS:
        return _strip(node.args[0])
    return None


def _inverse_root_base(node: Any) -> Optional[fx.Node]:
    """b when node is 1 / (a homogeneous statistic of b)."""
    node = _strip(node)
    name = op_name(node)
    if name == "rsqrt" or (name == "pow" and _is_const(_arg(node, 1), -0.5)):
        return _second_moment_base(node.args[0])
    if name == "reciprocal" or (name == "pow" and _is_const(_arg(node, 1), -1)):
        return _root_base(node.args[0])
    if name == "div" and not isinstance(node.args[0], fx.Node):
        return _root_base(node.args[1])
    return None


def _centred(node: Any) -> Optional[fx.Node]:
    """x when node is x - mean(x)."""
    node = _strip(node)
    if op_name(node) != "sub" or not isinstance(node.args[1], fx.Node):
        return None
    raw, centre = _strip(node.args[0]), _strip(node.args[1])
    return raw if op_name(centre) == "mean" and _strip(centre.args[0]) is raw else None


def _same_signal(numerator: Any, base: Optional[fx.Node]) -> bool:
    """The numerator is the statistic's base, or both centre the same tensor."""
    if base is None:
        return False
    numerator = _strip(numerator)
    if numerator is base:
        return True
    raw = _centred(numerator)
    return raw is not None and (base is raw or _centred(base) is raw)


def match(node: fx.Node) -> Optional[tuple[str, fx.Node]]:
    """(description, numerator) if ``node`` divides a tensor by a magnitude statistic of itself."""
    name = op_name(node)
    if name == "mul" and len(node.args) == 2:
        for numerator, factor in (node.args, node.args[::-1]):
            if isinstance(factor, fx.Node) and _same_signal(numerator, _inverse_root_base(factor)):
                return "x * rsqrt(mean(x^2) + eps) (RMSNorm written out)", numerator
    if name == "div" and len(node.args) == 2 and isinstance(node.args[1], fx.Node):
        numerator, denominator = node.args
        if _same_signal(numerator, _root_base(denominator)):
            centred = op_name(_strip(numerator)) == "sub"
            description = "(x - mean) / sqrt(var + eps) (LayerNorm written out)" if centred else "x / ||x|| (L2 normalization written out)"
            return description, numerator
    return None


def find(graph: fx.Graph) -> dict[fx.Node, tuple[str, fx.Node]]:
    """Every hand-written normalization in the graph: node -> (description, numerator)."""
    found = {}
    for node in graph.nodes:
        if node.op in ("call_function", "call_method"):
            matched = match(node)
            if matched:
                found[node] = matched
    return found
