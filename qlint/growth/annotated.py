"""Reading an annotated node (``node.meta["qlint"]``, :func:`qlint.core.graph.annotate`) the way the growth
analysis's proofs read it: its registry op id and ATen name, its arguments bound by name, the value a copy
or a floating cast carries (:func:`strip`; :func:`strip_exact` when the order between values matters), and
a reduction's dims and group. The relations (:mod:`qlint.growth.relations`) are proved with these, and the
block detector follows skips with :func:`strip`. The underscored helpers are the package's own.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch.fx as fx

from qlint.core.graph import dtype_of, facts, keeps_values, shape_of
from qlint.core.ops import op_name


def _op(node: Any) -> str:
    return facts(node).op if isinstance(node, fx.Node) and "qlint" in node.meta else ""


def _arg(node: fx.Node, name: str, default: Any = None) -> Any:
    bound = facts(node).bound
    if bound is None:
        return default
    if name in bound.arguments:
        return bound.arguments[name]
    return bound.defaults.get(name, default)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def strip(node: Any, *, exact: bool = False) -> Any:
    """Follow copies and floating casts back to the value they carry. ``exact``: only casts that keep every
    value (to the same or a wider dtype), for an order between values: ``s.bfloat16().amax()`` may lie
    below an entry of s, so s minus it is not <= 0. A normalisation is bounded whatever the rounding."""
    while isinstance(node, fx.Node) and "qlint" in node.meta:
        op = _op(node)
        if op == "copy" or (op in ("cast", "cast_float") and _floating_or_same(node)
                            and (not exact or _exact_cast(node))):
            node = _arg(node, "input")
            continue
        break
    return node


def strip_exact(node: Any) -> Any:
    return strip(node, exact=True)


def _exact_cast(node: fx.Node) -> bool:
    """Whether the cast keeps every value: its input's dtype and its own are known, and it widens (or keeps)."""
    return keeps_values(_arg(node, "input"), node)


def _floating_or_same(node: fx.Node) -> bool:
    """A cast that gives a real floating value, judged by the dtype it produced, whatever names it (a dtype,
    ``type('torch.IntTensor')``, a tensor's type): an integer cast truncates, and past its range wraps."""
    bound, target = facts(node).bound, dtype_of(node)
    if bound is None or target is None or not target.is_floating_point:
        return False
    other = bound.arguments.get("other")
    if isinstance(other, fx.Node):
        return False
    return True


def _dims(node: fx.Node) -> Optional[frozenset[int]]:
    """The reduction dims of a reduction node, normalised by rank when the rank is known."""
    dim = _arg(node, "dim")
    if dim is None:
        return None  # a reduction over everything: its group is the whole tensor
    dims = [dim] if isinstance(dim, int) else list(dim) if isinstance(dim, (list, tuple)) else None
    if dims is None or not all(isinstance(d, int) for d in dims) or not dims:
        return None
    source = _arg(node, "input")
    shape = shape_of(source)
    if shape is not None:
        return frozenset(d % len(shape) for d in dims)
    return frozenset(dims)


def _keeps_dims(node: fx.Node) -> bool:
    """The statistic broadcasts back over its own reduction group, computed in a dtype that holds its
    input's values (a reduction's own ``dtype=torch.int8`` wraps: no statistic of the input then)."""
    if not keeps_values(_arg(node, "input"), node):
        return False
    if _arg(node, "keepdim", False) is True:
        return True
    source_shape, shape = shape_of(_arg(node, "input")), shape_of(node)
    return source_shape is not None and shape is not None and source_shape == shape


def _same_group(a: fx.Node, b: fx.Node) -> bool:
    """Two reductions over the same dims of tensors of the same shape."""
    da, db = _dims(a), _dims(b)
    if da is None or db is None:
        return da is None and db is None and _arg(a, "dim") is None and _arg(b, "dim") is None
    if da != db:
        return False
    sa, sb = shape_of(_arg(a, "input")), shape_of(_arg(b, "input"))
    if sa is not None and sb is not None and sa != sb:
        return False
    if any(d < 0 for d in da) and (sa is None or sb is None):
        return True  # both use the same negative dims on tensors of unknown rank
    return True


def _op_name(node: fx.Node) -> str:
    return op_name(node)


__all__ = ["strip", "strip_exact"]
