"""Compact support: values that vanish unless an input entry lies in a bounded interval.

The per-op algebra multiplies exponents: the B-spline recursion of a KAN layer
(``(x - t_i) / (t_{i+k} - t_i) * B_{i,k-1}(x) + ...``, Cox-de Boor) gets one more power of x at
every level, and ``relu(x - a) * relu(b - x)`` gets q = 2, though both are bounded: each factor
``B_{i,0} = (x >= t_i) & (x < t_{i+1})`` or ``relu(x - a)`` is 0 unless x lies in a half-line,
and a product is 0 unless x lies in every factor's. When that intersection is a bounded interval
[lo, hi], a product whose every factor is a continuous function of the *same entry of x* (with a
known exponent, so bounded on [lo, hi] for each parameter value) is bounded: q = 0.

:func:`find` records, per node, a :class:`Support`: the tensor ``base`` every entry of the value
is a function of, entry by entry (the base's axes of size 1 broadcast; nothing sums, slices or
permutes across the axes it has), and the interval outside of which the value is 0. It follows
comparisons of the base with constants (``x >= grid``), logical and / products (intersection),
sums and differences (union), ``relu(x - a)`` / ``relu(a - x)``, casts, constant scalings and
slices along the broadcast axes. The constants are read by value, so they must be fixed: numbers,
lifted constants, integer buffers the forward never writes (the graph check's record), never parameters.
An interval's ends may also be floating buffers the forward never writes (a spline grid), read at today's
values: an interval between finite ends is bounded whatever the ends are, which is all the proof uses.
:mod:`qlint.growth.propagate` uses the result: a node with a bounded support whose operands all
have a known exponent is bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

from qlint.core.graph import GraphFacts, facts, shape_of
from qlint.core.ops import op_name

INF = math.inf


@dataclass(frozen=True)
class Support:
    """Each entry is a function of ``base``'s entry at the same position; the value is 0 unless that
    entry lies in [lo, hi]."""

    base: fx.Node
    lo: float = -INF
    hi: float = INF

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)


_ELEMENTWISE = frozenset({"add", "sub", "rsub", "mul", "div", "neg", "relu", "abs", "clamp", "pow", "square", "to",
                          "float",
                          "double", "type_as", "_to_copy", "where", "ge", "gt", "le", "lt", "logical_and",
                          "bitwise_and",
                          "and_", "__and__"})
_SLICES = frozenset({"slice", "getitem", "narrow"})


def find(graph: GraphFacts, fixed: Callable[[fx.Node], Optional[torch.Tensor]],
         ends: Optional[Callable[[fx.Node], Optional[torch.Tensor]]] = None) -> dict[fx.Node, Support]:
    """The support of every data node that has one; ``fixed(node)`` is the value of a constant
    operand (None when it is not fixed: a parameter, or not readable); ``ends(node)`` the value of an
    interval's end (``fixed`` by default)."""
    out: dict[fx.Node, Support] = {}
    for node in graph.nodes:
        if node not in graph.data:
            continue
        support = _support(node, graph, out, fixed, ends or fixed)
        if support is not None:
            out[node] = support
    return out


def _support(node: fx.Node, graph: GraphFacts, known: dict, fixed: Callable, ends: Callable) -> Optional[Support]:
    name = op_name(node)
    bound = facts(node).bound
    if bound is None:
        return None
    data = [p for p in graph.parents.get(node, ())]
    if name in _SLICES:
        source = bound.arguments.get("input")
        inner = known.get(source) if isinstance(source, fx.Node) else None
        if inner is None or not _plain_slice(node) or not _along_broadcast(node, source, inner.base):
            return None
        return inner
    if name not in _ELEMENTWISE or not data:
        return None
    operands = [known.get(p) or Support(p) for p in data]
    base = operands[0].base
    if any(s.base is not base for s in operands) or not _broadcasts_from(node, base):
        return None
    constants = [v for k, v in bound.arguments.items() if k not in ("dtype", "memory_format", "copy", "non_blocking")
                 and not (isinstance(v, fx.Node) and v in graph.data)]
    if name in ("ge", "gt", "le", "lt"):
        return _threshold(name, bound, base, operands, ends, graph)
    if name == "relu":
        return _relu(node, bound, base, ends, graph)
    if name in ("logical_and", "bitwise_and", "and_", "__and__", "mul"):  # 0 where any factor is 0 (a weight too)
        return Support(base, max(s.lo for s in operands), min(s.hi for s in operands))
    if name in ("add", "sub", "rsub"):
        if len(operands) == 1 and constants:  # x - c moves the values, not where they vanish
            return Support(base) if not operands[0].bounded else None
        return Support(base, min(s.lo for s in operands), max(s.hi for s in operands))
    if name in ("div", "neg", "to", "float", "double", "type_as", "_to_copy", "abs", "square", "pow"):
        # a divisor only scales (0 where the numerator is 0), so like an interval's end it may be a frozen
        # floating buffer read at today's values (a division by knot differences: its 0 is a QL108 hazard);
        # an exponent decides the growth, so it must be fixed
        reader = ends if name == "div" else fixed
        values = [_fixed_value(v, reader) for v in constants if not isinstance(v, torch.dtype)]
        if len(operands) != 1 or any(v is None for v in values):
            return None
        if name in ("pow", "div") and bound.arguments.get("input") is not data[0]:
            return None  # c ** x is 1 and c / x is inf where x is 0: only the base or the numerator keeps the zeros
        if name == "pow" and not all(v[0] > 0 for v in values):
            return None  # x ** 0 = 1 and x ** -1 = inf where x = 0: only a positive power keeps the zeros
        if name == "div" and any(v[0] <= 0 <= v[1] for v in values):
            return None  # 0 / 0 is NaN
        return operands[0]  # scaled, cast, a positive power: 0 where the operand is 0
    return Support(base) if len(operands) == 1 else None


def _threshold(name: str, bound: Any, base: fx.Node, operands: list, fixed: Callable,
               graph: GraphFacts) -> Optional[Support]:
    """``base >= c`` (``gt``): nonzero only where base >= min c; ``base < c`` (``le``): where base <= max c."""
    a, b = bound.arguments.get("input"), bound.arguments.get("other")
    if a is base and not (isinstance(b, fx.Node) and b in graph.data):
        c, flip = _fixed_value(b, fixed), False
    elif b is base and not (isinstance(a, fx.Node) and a in graph.data):
        c, flip = _fixed_value(a, fixed), True  # c >= base: base <= c
    else:
        return None
    if c is None:
        return None
    lower = (name in ("ge", "gt")) != flip
    return Support(base, lo=c[0]) if lower else Support(base, hi=c[1])


def _relu(node: fx.Node, bound: Any, base: fx.Node, fixed: Callable, graph: GraphFacts) -> Optional[Support]:
    """relu(base - a) is 0 unless base > min a; relu(a - base) unless base < max a."""
    inner = bound.arguments.get("input")
    if not isinstance(inner, fx.Node) or op_name(inner) not in ("sub", "rsub"):
        return Support(base)
    inner_bound = facts(inner).bound
    if inner_bound.arguments.get("alpha", 1) != 1:
        return Support(base)  # sub(x, c, alpha=-1) is x + c: no threshold read here
    a, b = inner_bound.arguments.get("input"), inner_bound.arguments.get("other")
    if op_name(inner) == "rsub":
        a, b = b, a
    if a is base:
        c = _fixed_value(b, fixed)
        return Support(base, lo=c[0]) if c is not None else Support(base)
    if b is base:
        c = _fixed_value(a, fixed)
        return Support(base, hi=c[1]) if c is not None else Support(base)
    return Support(base)


def _fixed_value(value: Any, fixed: Callable) -> Optional[tuple[float, float]]:
    """(min, max) of a fixed operand: a number, or a node whose value ``fixed`` reads."""
    if isinstance(value, bool):
        return (float(value), float(value))
    if isinstance(value, (int, float)):
        return (float(value), float(value)) if math.isfinite(value) else None
    if isinstance(value, fx.Node):
        tensor = fixed(value)
        if isinstance(tensor, torch.Tensor) and tensor.numel() and not tensor.is_complex():
            data = tensor.detach().double()
            if bool(torch.isfinite(data).all()):
                return (float(data.min()), float(data.max()))
    return None


def _broadcasts_from(node: fx.Node, base: fx.Node) -> bool:
    """The node's entries line up with ``base``'s: the same rank, and each axis of base either the
    node's length or 1 (broadcast)."""
    shape, base_shape = shape_of(node), shape_of(base)
    if shape is None or base_shape is None or len(shape) != len(base_shape):
        return False
    return all(b == 1 or b == s for b, s in zip(base_shape, shape))


def _plain_slice(node: fx.Node) -> bool:
    """An index that keeps entries in place (ranges with step 1 and ``...``): an index list or tensor of
    the same length would move entry j to position i (a gather), so entry i no longer tests base's i."""
    if op_name(node) != "getitem":
        bound = facts(node).bound
        return bound is not None and bound.arguments.get("step", 1) == 1
    index = node.args[1] if len(node.args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is Ellipsis or (isinstance(p, slice) and p.step in (None, 1)) for p in parts)


def _along_broadcast(node: fx.Node, source: fx.Node, base: fx.Node) -> bool:
    """A slice that only drops entries along the axes base broadcasts over (same rank, every other
    axis kept whole)."""
    shape, source_shape, base_shape = shape_of(node), shape_of(source), shape_of(base)
    if (shape is None or source_shape is None or base_shape is None
        or not (len(shape) == len(source_shape) == len(base_shape))):
        return False
    return all(s == t or b == 1 for s, t, b in zip(shape, source_shape, base_shape))


__all__ = ["Support", "find"]
