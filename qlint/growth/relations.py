"""Relational facts proved on the graph: values that are bounded because of what they
are computed from, which the per-op algebra cannot see.

- A **normalisation written out by hand** divides a tensor by a magnitude statistic of
  itself: ``x * rsqrt(mean(x**2) + eps)`` (RMSNorm), ``(x - mean) / sqrt(var + eps)``
  (LayerNorm), ``x / max(||x||_p, eps)`` (L2 / ScaleNorm), ``x / (max|x| + eps)``,
  ``x / (1 + |x|)`` (softsign). Accepted only with proof (:func:`match_normalisation`):
  the statistic is a real norm (p >= 1, or inf) of the numerator itself, or of its
  centred version for a centred numerator; it is reduced over the same dims as the
  centring and broadcast back over its own reduction group (``keepdim=True``, or shapes
  that prove it); it is bounded away from 0 by a numeric ``eps > 0`` (``+ eps``,
  ``clamp(min=eps)``), never clamped from above; positive constant factors only.
  Then each entry satisfies |x_i| <= sqrt(n) sqrt(mean_group x^2), so the ratio is
  bounded by sqrt(n) / c: q = 0 (Theorem 9(v)).
- A **ratio to its own sum** ``e / e.sum(dim, keepdim=True)`` of a positive ``e`` is in
  [0, 1] (a softmax written out); checked at propagation time, when the sign of ``e`` is
  known.
- A **shift by its own maximum** ``s - s.amax(dim, keepdim=True)`` is <= 0 (the stable
  softmax's argument), and so is ``s - logsumexp(s)``.
- A **ratio to itself plus a constant** ``n / (n + c)`` with c > 0 is in [0, 1) when n >= 0
  (the capsule squash's |s|^2 / (1 + |s|^2)); checked at propagation time.
- A **selection by a comparison** ``where(v > t, a, b)`` (``>=``, ``<``, ``<=``, ``|v| < t``) with a
  fixed number t takes each branch only where v lies on its side of t: a branch computed from v
  entry by entry is bounded there by its value on that half-line or interval (the written-out ELU's
  ``exp(v) - 1`` for v <= 0, Huber's ``v**2 / 2`` for |v| < t); checked at propagation time
  (:class:`Selection`).
- A normalisation whose numerator is the normalised tensor times a factor (``g * x / ||x||``)
  grows as the factor does: |g_i x_i| / ||x|| <= B |g_i|, so its exponent is g's (bounded when g is,
  with that range); checked at propagation time. x may be a detached copy in the statistic
  (``a * g / ||g.detach()||``): a detach keeps the value.

Anything not proved falls back to the generic rules (a division by a value that may
approach 0 is then not bounded). The proofs read the annotated nodes through
:mod:`qlint.growth.annotated` (bound arguments, :func:`~qlint.growth.annotated.strip`, reduction groups).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch.fx as fx

from qlint.core.graph import dtype_of, facts, keeps_values, shape_of, sizes
from qlint.growth.annotated import (_arg, _dims, _floating_or_same, _is_number, _keeps_dims, _op, _op_name,
                                    _same_group, strip, strip_exact)

_SQUARE_STATS = {"mean": "mean", "sum": "sum"}


@dataclass(frozen=True)
class Normalisation:
    """``numerator / statistic(numerator)`` proved bounded; ``bound`` on |entries| if known. With a
    ``factor``, the value is ``factor * numerator / statistic``: bounded when the factor is."""

    numerator: fx.Node
    description: str
    bound: Optional[float]
    factor: Optional[fx.Node] = None


@dataclass(frozen=True)
class OwnSumRatio:
    """``numerator / (sum of numerator over its group [+ eps])``: in [0, 1] when numerator > 0.

    ``floored``: the numerator is the k largest entries of a softmax over the summed dim (an
    MoE router renormalising its top-k weights), so the sum holds the row's maximum, which
    is at least 1/n for n entries: a non-negative numerator is enough.
    """

    numerator: fx.Node
    eps: bool
    floored: bool = False
    mean: bool = False  # over the group's mean (ConvNeXt V2's GRN): in [0, n] for a group of n entries
    group: Optional[int] = None  # n, when the shapes give it
    addend: Optional[fx.Node] = None  # a further term of the denominator, which must be >= 0 (softmax-one)


@dataclass(frozen=True)
class OwnShiftRatio:
    """``n / (n + c)`` (or ``(c + n)``) with a number c > 0: in [0, 1) when n >= 0 (a capsule squash's
    |s|^2 / (1 + |s|^2)); checked at propagation time, when the sign of ``n`` is known."""

    numerator: fx.Node


@dataclass(frozen=True)
class OwnMaxShift:
    """``s - max(s)`` or ``s - logsumexp(s)`` over the same group: every entry <= 0."""

    source: fx.Node


@dataclass(frozen=True)
class Selection:
    """``where(condition, input, other)`` whose condition compares ``base`` entrywise with a fixed number:
    ``input`` is taken only where base lies in ``taken`` (lo, hi, lo open, hi open), ``other`` only where it
    lies in ``left`` (None: anywhere). A threshold computed from parameters (a learnable Huber ``delta``) is
    ``threshold``: which sides of the sets are finite is known, not where (they are per parameter value);
    the propagation checks that it does not depend on the input."""

    base: fx.Node
    taken: tuple[float, float, bool, bool]
    left: Optional[tuple[float, float, bool, bool]]
    threshold: Optional[fx.Node] = None
    left_base: Optional[fx.Node] = None  # the value ``left`` bounds, when not base (|v| >= t bounds |v|, not v)


_SIDES = {"gt": ((1, False), (0, True)), "ge": ((1, True), (0, False)),  # (side, closed) of the taken / left set
          "lt": ((0, False), (1, True)), "le": ((0, True), (1, False))}


_CONJUNCTIONS = frozenset({"logical_and", "bitwise_and", "and_", "__and__"})


def _selection(node: fx.Node) -> Optional[Selection]:
    """The selection a ``where`` makes by comparing a value with a number (``|v| < t`` too), or with two
    numbers at once (``(v > a) & (v < b)``: taken on the interval, the other branch anywhere)."""
    if _op_name(node) != "where" or not isinstance(_arg(node, "condition"), fx.Node):
        return None
    condition = strip(_arg(node, "condition"))
    if _op_name(condition) in _CONJUNCTIONS:
        return _interval(condition)
    return _compared(condition)


def _interval(condition: fx.Node) -> Optional[Selection]:
    """Both sides of a conjunction compare the same value with numbers: the taken set is their intersection."""
    sides = [_compared(strip(side)) if isinstance(side, fx.Node) else None
             for side in (_arg(condition, "input"), _arg(condition, "other"))]
    if any(side is None or side.threshold is not None for side in sides) or sides[0].base is not sides[1].base:
        return None
    (lo_a, hi_a, lo_open_a, hi_open_a), (lo_b, hi_b, lo_open_b, hi_open_b) = sides[0].taken, sides[1].taken
    lo, lo_open = max((lo_a, lo_open_a), (lo_b, lo_open_b))
    hi, hi_closed = min((hi_a, not hi_open_a), (hi_b, not hi_open_b))
    if lo > hi:
        return None  # never taken: no fact to propagate
    return Selection(sides[0].base, (lo, hi, lo_open, not hi_closed), None)


def _compared(condition: Any) -> Optional[Selection]:
    """The selection one comparison of a value with a number (or a held threshold) makes."""
    if not isinstance(condition, fx.Node):
        return None
    name = _op_name(condition)
    if name not in _SIDES or "qlint" not in condition.meta:
        return None
    base, threshold = _arg(condition, "input"), _arg(condition, "other")
    if not (isinstance(base, fx.Node) and (_is_number(threshold) or isinstance(threshold, fx.Node))):
        return None
    held = threshold if isinstance(threshold, fx.Node) else None
    t = 1.0 if held is not None else float(threshold)  # a held threshold: only the finite sides are read
    if held is None:
        base, t, name = _solved(base, t, name)
    (taken_side, taken_closed), (left_side, left_closed) = _SIDES[name]
    if _op_name(base) == "abs" and isinstance(_arg(base, "input"), fx.Node):
        if taken_side == 1 or t <= 0:
            return None  # |v| > t leaves v unbounded on both sides; only |v| < t bounds it
        outside = (t, math.inf, not left_closed, False) if held is None else None  # the other branch: |v| >= t
        return Selection(_arg(base, "input"), (-t, t, not taken_closed, not taken_closed), outside, held,
                         left_base=base if outside is not None else None)

    def half(side: int, closed: bool) -> tuple[float, float, bool, bool]:
        return (t, math.inf, not closed, False) if side == 1 else (-math.inf, t, False, not closed)

    return Selection(base, half(taken_side, taken_closed), half(left_side, left_closed), held)


def _floating(node: fx.Node) -> bool:
    dtype = dtype_of(node)
    return dtype is not None and dtype.is_floating_point


_FLIPPED = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge"}


def _solved(base: fx.Node, t: float, name: str) -> tuple[fx.Node, float, str]:
    """``c v + d  > t`` read as a comparison of v itself (``beta h > 20`` is ``h > 20 / beta``): a scale by a
    nonzero number (flipping the sides when negative), a shift by a number, a negation. Only in floating
    dtypes, where each is monotone (an integer product wraps: 2^61 v is 0 for every v divisible by 8)."""
    while "qlint" in base.meta and _floating(base):
        op, a, b = _op_name(base), _arg(base, "input"), _arg(base, "other")
        number, value = (b, a) if _is_number(b) else (a, b) if _is_number(a) else (None, None)
        if op == "neg" and isinstance(a, fx.Node):
            base, t, name = a, -t, _FLIPPED[name]
        elif op == "mul" and isinstance(value, fx.Node) and number != 0:
            base, t, name = value, t / number, name if number > 0 else _FLIPPED[name]
        elif (op == "div" and isinstance(a, fx.Node) and _is_number(b) and b != 0
              and _arg(base, "rounding_mode") is None):
            base, t, name = a, t * b, name if b > 0 else _FLIPPED[name]
        elif op in ("add", "sub") and isinstance(value, fx.Node) and value is a and _arg(base, "alpha", 1) == 1:
            base, t = value, t - number if op == "add" else t + number
        else:
            return base, t, name
    return base, t, name


def find(nodes: list[fx.Node]) -> None:
    """Record the relation proved at each node into its NodeFacts."""
    for node in nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        relation = (match_normalisation(node) or _own_sum_ratio(node) or _own_shift_ratio(node)
                    or _own_max_shift(node) or _selection(node))
        if relation is not None:
            facts(node).relation = relation


# --- the statistic -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Statistic:
    base: fx.Node  # the tensor whose magnitude it measures
    kind: str  # "ms" mean of squares, "ss" sum of squares, "var" centred mean square, "norm", "abs"
    reduction: Optional[fx.Node]  # the reduction node (None: entrywise |x|)
    centred: bool
    rooted: bool  # already a homogeneous (degree 1) statistic
    rounding: float = 0.0  # how far below max |x_i| the computed statistic may round (a p-norm through pow)
    spread: float = 1.0  # max |x_i| <= spread * statistic (the mean of the k largest |x_i|: k)
    what: Optional[str] = None  # how a normalisation by it reads, where the kind does not say


def _squared(node: Any) -> Optional[fx.Node]:
    """b when node is b**2, square(b), b*b or |b|**2."""
    node = strip(node)
    op = _op(node)
    if op == "pow" and _arg(node, "exponent") == 2:
        base = strip(_arg(node, "input"))
    elif op == "square":
        base = strip(_arg(node, "input"))
    elif (op == "mul" and isinstance(_arg(node, "input"), fx.Node)
          and strip(_arg(node, "input")) is strip(_arg(node, "other"))):
        base = strip(_arg(node, "input"))
    else:
        return None
    if _op(base) == "abs":
        base = strip(_arg(base, "input"))
    return base


def _centred_base(node: Any) -> Optional[tuple[fx.Node, fx.Node]]:
    """(x, the mean node) when node is x - mean(x, dims, keepdim=True), every value exact up to the
    subtraction: a rounding cast before it (of x, of the mean or of its input) leaves x's rounding error
    where the centred value of a constant row is 0 (a statistic of it then vanishes while it does not)."""
    node = strip(node)
    if _op(node) != "sub" or _arg(node, "alpha", 1) != 1:
        return None
    raw = strip_exact(_arg(node, "input"))
    centre = _tuple_part(_to_grid_of(_arg(node, "other"), raw), 1) or _to_grid_of(_arg(node, "other"), raw)
    if (_op(centre) not in ("mean", "variance", "std")
        or (_op(centre) != "mean" and _op_name(centre) not in ("var_mean", "std_mean")) or not isinstance(raw, fx.Node)
        or strip_exact(_arg(centre, "input")) is not raw):
        return None
    if not _keeps_dims(centre):
        return None
    return raw, centre


def _to_grid_of(node: Any, raw: Any) -> Any:
    """Follow exact copies and casts, and casts to a dtype that holds every value of ``raw``'s (a mean taken
    in float64 and cast back to x's dtype): such a rounding lands on x's own grid, so it keeps a constant
    row's mean exact and moves any other's by less than the spacing of x's entries."""
    while True:
        node = strip_exact(node)
        if not (isinstance(node, fx.Node) and _op(node) in ("cast", "cast_float") and _floating_or_same(node)
                and keeps_values(raw, node)):
            return node
        node = _arg(node, "input")


def _tuple_part(node: Any, index: int) -> Any:
    """The reduction behind ``var_mean(...)[index]`` (``torch.var_mean`` returns a tuple)."""
    if _op(node) == "view" and _op_name(node) == "getitem" and facts(node).bound.arguments.get("index") == index:
        source = strip(_arg(node, "input"))
        if _op_name(source) in ("var_mean", "std_mean"):
            return source
    return None


def _statistic(node: Any) -> Optional[_Statistic]:
    """A magnitude statistic before any root: mean/sum of squares, a variance, a norm."""
    node = strip(node)
    node = _tuple_part(node, 0) or node
    op = _op(node)
    if op in ("mean", "sum"):
        top = _top_magnitudes(node)
        if top is not None:
            return top
        base = _squared(_arg(node, "input"))
        if base is None or not _keeps_dims(node):
            return None
        centred = _centred_base(base)
        kind = "ms" if op == "mean" else "ss"
        return _Statistic(base=base, kind=kind, reduction=node, centred=centred is not None, rooted=False)
    if op in ("variance", "std"):
        correction = _arg(node, "correction", 1)
        if correction is not None and not (_is_number(correction) and correction >= 0):
            return None  # a negative correction divides by n - c > n: the deviation passes sqrt(n) sds
        if not _keeps_dims(node) or not _more_entries_than_correction(node):
            return None
        base = strip_exact(_arg(node, "input"))  # the spread of a rounded copy may vanish where x's does not
        return _Statistic(base=base, kind="var", reduction=node, centred=True, rooted=op == "std")
    if op == "norm":
        p = _arg(node, "p", _arg(node, "ord", 2))
        if p is None:
            p = 2
        if not (isinstance(p, (int, float)) and (p >= 1 or p == math.inf)) or isinstance(p, bool):
            return None
        if not _keeps_dims(node):
            return None
        base = strip(_arg(node, "input"))
        # |x_i| <= ||x||_p holds in floating point for p = 1, 2, inf (monotone rounding: sums of
        # non-negatives, sqrt(fl(x^2)) = |x|); (sum |x|^p)^(1/p) may round below |x_i| otherwise
        exact = p in (1, 2, math.inf)
        return _Statistic(base=base, kind="norm", reduction=node, centred=False, rooted=True,
                          rounding=0.0 if exact else 1e-5)
    if op == "extremum" and _arg(node, "other") is None:
        inner = strip(_arg(node, "input"))
        if (_op(inner) == "abs" and _keeps_dims(node) and facts(node).primitive is not None
            and _op_name(node) in ("amax", "max")):
            return _Statistic(base=strip(_arg(inner, "input")), kind="norm", reduction=node, centred=False, rooted=True)
        return None
    if op == "abs":
        return _Statistic(base=strip(_arg(node, "input")), kind="abs", reduction=None, centred=False, rooted=True)
    return None


def _top_magnitudes(reduction: fx.Node) -> Optional[_Statistic]:
    """The sum or mean of ``topk(|x|, k, dim).values`` over that dim: the k largest |x_i| hold max |x_i|, so
    the sum is at least max |x_i| and the mean at least max |x_i| / k (the terms are non-negative, so rounding
    never takes a partial sum below one of them; the division by k rounds by less than 1 % even in bfloat16)."""
    values = strip(_arg(reduction, "input"))
    top = strip(_arg(values, "input"))
    if not ((_op_name(values) == "getitem" and _arg(values, "index") == 0)
            or (_op(values) == "getattr" and _arg(values, "name") == "values")):
        return None
    k = _arg(top, "k")
    if (_op_name(top) != "topk" or _arg(top, "largest", True) is not True or not isinstance(k, int) or k < 1
            or _op(strip(_arg(top, "input"))) != "abs" or not _keeps_dims(reduction)
            or _dims(reduction) is None or _dims(reduction) != _dims(top)):
        return None
    mean = _op(reduction) == "mean"
    return _Statistic(base=strip(_arg(strip(_arg(top, "input")), "input")), kind="norm", reduction=reduction,
                      centred=False, rooted=True, rounding=1e-2 if mean else 0.0, spread=float(k) if mean else 1.0,
                      what=f"x / (the {'mean' if mean else 'sum'} of its k largest |x| + eps) (at least max |x|"
                           f"{' / k' if mean else ''})")


def _more_entries_than_correction(node: fx.Node) -> bool:
    """A variance reads more entries than its correction (else it is NaN or inf: the std of
    one entry, unbiased); unknown shapes are refused."""
    from qlint.core.graph import least_size, tensor_meta

    shape = getattr(tensor_meta(_arg(node, "input")), "shape", None)
    if shape is None:
        return False
    correction, unbiased = _arg(node, "correction", None), _arg(node, "unbiased", True)
    dim = _arg(node, "dim", None)
    if isinstance(unbiased, int) and not isinstance(unbiased, bool):  # x.std(0) bound to std(unbiased)
        dim, unbiased = unbiased, True
    correction = correction if _is_number(correction) else (1 if unbiased is not False else 0)
    dims = [] if dim is None else list(dim) if isinstance(dim, (list, tuple)) else [dim]
    try:
        count = math.prod(least_size(shape[d]) for d in dims) if dims else math.prod(least_size(s) for s in shape)
    except (IndexError, TypeError, ValueError):
        return False
    return count > correction


@dataclass(frozen=True)
class _Denominator:
    statistic: _Statistic
    eps: bool  # bounded away from 0 by a numeric eps > 0
    scale: float  # the product of positive constant factors applied to the statistic
    inverse: bool  # already 1 / statistic
    squared: bool = False  # a second moment without its root: |x_i| / (m + eps) <= sqrt(n) / (2 sqrt(eps))


def _broadcast_strip(node: Any) -> Any:
    """Copies, casts and explicit broadcasts (expand): a statistic expanded to the
    numerator's shape divides exactly as the implicit broadcast does."""
    while True:
        node = strip(node)
        if (isinstance(node, fx.Node) and _op(node) == "view"
            and _op_name(node) in ("expand", "expand_as", "broadcast_to")):
            node = _arg(node, "input")
            continue
        return node


def _eps_wrapped(node: Any) -> tuple[Any, bool, float]:
    """Peel ``+ eps`` (eps > 0), ``clamp(min=eps > 0)`` and positive constant factors."""
    eps, scale = False, 1.0
    node = _broadcast_strip(node)
    while isinstance(node, fx.Node):
        op = _op(node)
        if op == "add" and _arg(node, "alpha", 1) == 1:
            a, b = _arg(node, "input"), _arg(node, "other")
            if _is_number(b) and b > 0 and isinstance(a, fx.Node):
                node, eps = _broadcast_strip(a), True
                continue
            if _is_number(a) and a > 0 and isinstance(b, fx.Node):
                node, eps = _broadcast_strip(b), True
                continue
            return node, eps, scale
        if op in ("clamp", "clamp_min"):
            low, high = _arg(node, "min"), _arg(node, "max")
            if high is not None:
                return None, False, scale  # a cap on the statistic breaks the proof
            if _is_number(low) and low > 0:
                node, eps = _broadcast_strip(_arg(node, "input")), True
                continue
            return node, eps, scale
        if op in ("mul", "div"):
            a, b = _arg(node, "input"), _arg(node, "other")
            if _is_number(b) and b > 0 and isinstance(a, fx.Node):
                scale *= float(b) if op == "mul" else 1.0 / float(b)
                node = _broadcast_strip(a)
                continue
            if op == "mul" and _is_number(a) and a > 0 and isinstance(b, fx.Node):
                scale *= float(a)
                node = _broadcast_strip(b)
                continue
            return node, eps, scale
        return node, eps, scale
    return node, eps, scale


def _denominator(node: Any) -> Optional[_Denominator]:
    """A homogeneous statistic bounded away from 0: sqrt(stat + eps), norm + eps, clamp(norm, eps)."""
    inner, eps, scale = _eps_wrapped(node)
    if inner is None:
        return None
    op = _op(inner)
    if op == "sqrt" or (op == "pow" and _arg(inner, "exponent") == 0.5):
        radicand, eps_in, scale_in = _eps_wrapped(_arg(inner, "input"))
        if radicand is None:
            return None
        stat = _statistic(radicand)
        if stat is None or stat.rooted:
            return None
        return _Denominator(stat, eps or eps_in, scale * math.sqrt(scale_in), inverse=False)
    stat = _statistic(inner)
    if stat is not None and stat.rooted:
        return _Denominator(stat, eps, scale, inverse=False)
    if stat is not None and stat.kind in ("ms", "ss", "var") and eps:
        # sqrt(m) / (m + eps) <= 1 / (2 sqrt(eps)): a second moment over-normalises
        return _Denominator(stat, eps, scale, inverse=False, squared=True)
    return None


def _inverse_denominator(node: Any) -> Optional[_Denominator]:
    """1 / a homogeneous statistic: rsqrt(stat + eps), (...)**-0.5, reciprocal(den), 1 / den."""
    inner, eps, scale = _eps_wrapped(node)  # constant factors on the inverse scale the bound
    if inner is None or eps:
        return None
    op = _op(inner)
    if op == "rsqrt" or (op == "pow" and _arg(inner, "exponent") == -0.5):
        radicand, eps_in, scale_in = _eps_wrapped(_arg(inner, "input"))
        if radicand is None:
            return None
        stat = _statistic(radicand)
        if stat is None or stat.rooted:
            return None
        return _Denominator(stat, eps_in, math.sqrt(scale_in) / scale, inverse=True)
    if op == "reciprocal" or (op == "pow" and _arg(inner, "exponent") == -1):
        den = _denominator(_arg(inner, "input"))
        return None if den is None else dataclasses.replace(den, scale=den.scale / scale, inverse=True)
    if op == "div" and _is_number(_arg(inner, "input")) and _arg(inner, "input") > 0:
        den = _denominator(_arg(inner, "other"))
        return None if den is None else dataclasses.replace(den, scale=den.scale / (scale * _arg(inner, "input")),
                                                            inverse=True)  # (a second moment stays one: squared)
    return None


def _proves(numerator: Any, den: Optional[_Denominator]) -> Optional[str]:
    """Why ``numerator / den`` is bounded, or None when it is not proved."""
    if den is None or not den.eps or den.scale <= 0:
        return None
    stat = den.statistic
    numerator = strip(numerator)
    if not isinstance(numerator, fx.Node):
        return None
    if stat.kind == "abs":
        return "x / (|x| + eps) (softsign written out)" if stat.base is numerator else None
    centred = _centred_base(numerator)
    if stat.kind == "var":
        if centred is None:
            return None  # an uncentred numerator over a deviation is not bounded
        if den.squared:
            return ("(x - mean) / (var + eps) (over-normalised, bounded)"
                    if _centred_alike(centred, stat.base, numerator, stat.reduction) else None)
        if not _centred_alike(centred, stat.base, numerator, stat.reduction):
            return None
        return "(x - mean) / sqrt(var + eps) (LayerNorm written out)"
    # mean / sum of squares, or a p-norm, of the same signal
    if stat.centred:
        if centred is None or not _centred_alike(centred, stat.base, numerator, stat.reduction):
            return None
        return "(x - mean) / sqrt(mean((x - mean)^2) + eps) (LayerNorm written out)"
    if stat.base is not numerator:
        return None
    if den.squared:
        return "x / (mean(x^2) + eps) (a second moment: over-normalised, bounded)"
    if stat.kind == "ms":
        return ("x * rsqrt(mean(x^2) + eps) (RMSNorm written out)" if den.inverse
                else "x / sqrt(mean(x^2) + eps) (RMSNorm written out)")
    if stat.kind == "ss":
        return "x / sqrt(sum(x^2) + eps) (L2 normalization written out)"
    return stat.what or "x / (||x||_p + eps) (L2 normalization written out)"


def _centred_alike(centred: tuple[fx.Node, fx.Node], base: fx.Node, numerator: fx.Node, reduction: fx.Node) -> bool:
    """The statistic measures the numerator's own deviation: the numerator is x - mean_G(x), and
    the statistic reduces over G a base that is x itself (a variance centres over its own
    reduction), the numerator, or x - mean_G'(x) with G' = G too. A base centred over another
    group (RevIN's typo: centred over time, its spread taken over channels) vanishes where the
    numerator does not, and the ratio is unbounded."""
    raw, mean = centred
    if not _same_group(mean, reduction):
        return False
    if base is raw or base is numerator:
        return True
    base_centred = _centred_base(base)
    return base_centred is not None and base_centred[0] is raw and _same_group(base_centred[1], reduction)


def _bound(den: _Denominator) -> Optional[float]:
    stat = den.statistic
    if den.squared:
        return None  # bounded, by a constant that depends on eps
    if stat.kind in ("ss", "norm", "abs"):
        return (1.0 + stat.rounding) * stat.spread / den.scale
    if stat.reduction is None:
        return None
    group = _group_size(stat.reduction)
    if group is None:
        return None
    return math.sqrt(group) / den.scale


def _group_size(reduction: fx.Node) -> Optional[int]:
    shape = sizes(_arg(reduction, "input"))
    if shape is None:
        return None
    dims = _dims(reduction)
    size = 1
    for d in (dims if dims is not None else range(len(shape))):
        size *= shape[d]
    return size


def match_normalisation(node: fx.Node) -> Optional[Normalisation]:
    """A node that divides a tensor by a magnitude statistic of itself, with proof."""
    op = _op(node)
    if op == "mul":
        a, b = _arg(node, "input"), _arg(node, "other")
        for numerator, factor in ((a, b), (b, a)):
            if isinstance(factor, fx.Node):
                den = _inverse_denominator(factor)
                why = _proves(numerator, den)
                if why:
                    return Normalisation(strip(numerator), why, _bound(den))  # type: ignore[arg-type]
    if op == "div" and _arg(node, "rounding_mode") is None:
        numerator, denominator = _arg(node, "input"), _arg(node, "other")
        if isinstance(denominator, fx.Node):
            den = _denominator(denominator)
            why = _proves(numerator, den)
            if why:
                return Normalisation(strip(numerator), why, _bound(den))  # type: ignore[arg-type]
            scaled = strip(numerator)
            if den is not None and _op(scaled) == "mul":  # (g * x) / ||x||: g bounded is checked at propagation
                for base, factor in ((_arg(scaled, "input"), _arg(scaled, "other")),
                                     (_arg(scaled, "other"), _arg(scaled, "input"))):
                    why = _proves(base, den) if isinstance(factor, fx.Node) else None
                    if why:
                        return Normalisation(strip(base), f"{why}, times a bounded factor", _bound(den), factor=factor)
    return None


def _own_sum_ratio(node: fx.Node) -> Optional[OwnSumRatio]:
    if _op(node) != "div" or _arg(node, "rounding_mode") is not None:
        return None
    numerator, denominator = strip_exact(_arg(node, "input")), _arg(node, "other")
    if not isinstance(numerator, fx.Node) or not isinstance(denominator, fx.Node):
        return None
    inner, eps, scale = _eps_wrapped(denominator)
    if inner is not None and scale == 1.0 and _gathered_own_group(inner, numerator, ("sum",)):
        return OwnSumRatio(numerator, eps)
    if scale == 1.0 and _op(inner) == "add" and _arg(inner, "alpha", 1) == 1:  # softmax-one: exp(-m) + sum(e), >= 0
        for term, other in ((_arg(inner, "input"), _arg(inner, "other")), (_arg(inner, "other"), _arg(inner, "input"))):
            summed = _broadcast_strip(term)
            if (isinstance(other, fx.Node) and _op(summed) == "sum" and _keeps_dims(summed)
                    and strip_exact(_arg(summed, "input")) is numerator):
                return OwnSumRatio(numerator, eps, addend=other)
    if _gathered_own_group(strip_exact(denominator), numerator, ("sum",), eps_first=True):
        return OwnSumRatio(numerator, True)  # torch_geometric adds eps before gathering: (scatter_sum + eps)[index]
    if inner is None or scale != 1.0 or _op(inner) not in ("sum", "mean") or not _keeps_dims(inner):
        return None
    if strip_exact(_arg(inner, "input")) is not numerator:
        return None
    if _op(inner) == "mean":  # x_i / mean(x) = n x_i / sum(x): at most n for non-negative entries
        return OwnSumRatio(numerator, eps, mean=True, group=_group_size(inner))
    return OwnSumRatio(numerator, eps, floored=_largest_of_softmax(numerator, inner))


def _own_shift_ratio(node: fx.Node) -> Optional[OwnShiftRatio]:
    if _op(node) != "div" or _arg(node, "rounding_mode") is not None:
        return None
    numerator, denominator = strip(_arg(node, "input")), _broadcast_strip(_arg(node, "other"))
    if not isinstance(numerator, fx.Node) or _op(denominator) != "add" or _arg(denominator, "alpha", 1) != 1:
        return None
    a, b = _arg(denominator, "input"), _arg(denominator, "other")
    for term, shift in ((a, b), (b, a)):
        if isinstance(term, fx.Node) and strip(term) is numerator and _is_number(shift) and shift > 0:
            return OwnShiftRatio(numerator)
    return None


_SOFTMAXES = ("softmax", "_softmax", "special_softmax", "softmin")  # not _safe_softmax: a masked row is all 0


def _largest_of_softmax(values: fx.Node, total: fx.Node) -> bool:
    """``topk(softmax(z, d), k, d).values`` summed over d alone: the sum includes each row's
    largest softmax entry, e^{max z} / sum_j e^{z_j} >= 1/n."""
    if not (_op_name(values) == "getitem" and facts(values).bound.arguments.get("index") == 0):
        return False
    top = strip(_arg(values, "input"))
    if _op_name(top) != "topk" or _arg(top, "largest", True) is not True:
        return False
    weights = strip(_arg(top, "input"))
    if _op_name(weights) not in _SOFTMAXES:
        return False
    dim = _single_dim(top, -1)
    return dim is not None and dim == _single_dim(weights, None) and _dims(total) == frozenset([dim])


def _single_dim(node: fx.Node, default: Any) -> Optional[int]:
    """A one-dim argument ``dim`` normalised by the rank of the node's input."""
    dim, shape = _arg(node, "dim", default), shape_of(_arg(node, "input"))
    if not isinstance(dim, int) or isinstance(dim, bool) or shape is None:
        return None
    return dim % len(shape)


_INDEX_PLUMBING = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "expand", "expand_as", "broadcast_to"})


def _gathered_own_group(gathered: Any, values: fx.Node, reduces: tuple[str, ...], *, eps_first: bool = False) -> bool:
    """``gathered`` is ``scatter(base, 0, index, values)`` read back at ``index`` (``index_select(0, index)``
    or ``table[index]``), the scatter reducing by one of ``reduces`` (a graph's softmax over the edges
    into each node, torch_geometric's): entry e reads the reduction over the entries whose index is
    index[e], which include entry e itself. The scatter's index may be ``index`` laid along axis 0 and
    expanded over the other axes (torch_geometric's broadcast); the base and include_self only add
    entries to the group. ``eps_first``: the table read back is the scatter plus a number eps > 0."""
    name, indices = _op_name(gathered), _arg(gathered, "indices")
    if name == "index_select" and _arg(gathered, "dim") == 0:
        table, index = strip_exact(_arg(gathered, "input")), _arg(gathered, "index")
    elif name == "index" and isinstance(indices, (list, tuple)) and len(indices) == 1:
        table, index = strip_exact(_arg(gathered, "input")), indices[0]
    elif name == "getitem" and isinstance(_arg(gathered, "index"), fx.Node):  # table[index], as symbolic_trace has it
        table, index = strip_exact(_arg(gathered, "input")), _arg(gathered, "index")
    else:
        return False
    if eps_first:
        table, eps, scale = _eps_wrapped(table)
        if table is None or not eps or scale != 1.0:
            return False
        table = strip_exact(table)
    scatter = _op_name(table)
    added = scatter in ("index_add", "index_add_")  # index_add(0, index, values): the index is one entry per row
    reduce = "sum" if scatter in ("scatter_add", "scatter_add_") or (added and _arg(table, "alpha", 1) == 1) else (
        _arg(table, "reduce") if scatter in ("scatter_reduce", "scatter_reduce_") else None)
    source = strip_exact(_arg(table, "source" if added else "src"))
    if reduce not in reduces or _arg(table, "dim") != 0 or source is not strip_exact(values):
        return False
    if reduce == "sum" and not _nonnegative_fill(_arg(table, "input")):
        return False  # a sum scattered onto values that may be negative may cross 0
    shape, length = shape_of(values), shape_of(index)
    if not (isinstance(index, fx.Node) and shape and length is not None and len(length) == 1
            and shape_of(gathered) == shape and shape[0] == length[0]):
        return False
    laid = _arg(table, "index")
    if added:
        return isinstance(laid, fx.Node) and shape_of(laid) == length and _laid_along_axis_0(laid, index)
    if shape_of(laid) != shape:
        return False  # an index narrower than the values scatters only its own columns: the rest keep the base
    return _laid_along_axis_0(laid, index)


def _same_value(a: Any, b: Any) -> bool:
    """The same node, or two reads of the same attribute (symbolic_trace reads ``self.index`` once per use)."""
    return a is b or (isinstance(a, fx.Node) and isinstance(b, fx.Node) and a.op == b.op == "get_attr"
                      and a.target == b.target)


def _laid_along_axis_0(laid: fx.Node, index: fx.Node) -> bool:
    """``laid`` is ``index`` (or a copy: ``index.clone()`` holds the same groups) with its one axis kept at
    axis 0, the others added around it: entry (e, ...) holds index[e]. Followed op by op: ``unsqueeze``
    before the axis moves it; ``expand`` to more axes prepends them, so a 1-D index expanded straight to
    the values' 2-D shape lies along the last axis; a view keeps it first only from (n, 1, ...) to
    (n, 1, ...)."""
    chain = []
    while not _same_value(strip_exact(laid), strip_exact(index)):
        if not (isinstance(laid, fx.Node) and _op_name(laid) in _INDEX_PLUMBING):
            return False
        chain.append(laid)
        laid = _arg(laid, "input")
    axis = 0
    for step in reversed(chain):
        before, after = shape_of(_arg(step, "input")), shape_of(step)
        if before is None or after is None:
            return False
        name = _op_name(step)
        if name in ("expand", "expand_as", "broadcast_to"):
            if len(after) != len(before):
                return False
        elif name == "unsqueeze":
            dim = _arg(step, "dim")
            if not isinstance(dim, int):
                return False
            axis += dim % (len(before) + 1) <= axis
        elif axis != 0 or before[0] != after[0] or any(s != 1 for s in (*before[1:], *after[1:])):
            return False
    return axis == 0


def _nonnegative_fill(node: Any) -> bool:
    """A tensor of one number >= 0 (zeros, ones, a full of c >= 0): a base that only adds to a sum of
    non-negative entries, so the entry over it stays in [0, 1]."""
    node = strip(node)
    name = _op_name(node)
    fill = _arg(node, "fill_value")
    return name in ("zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones") or (
        name in ("full", "full_like", "new_full") and _is_number(fill) and fill >= 0)


def _own_max_shift(node: fx.Node) -> Optional[OwnMaxShift]:
    if _op(node) != "sub" or _arg(node, "alpha", 1) != 1:
        return None
    source, shift = strip_exact(_arg(node, "input")), strip_exact(_arg(node, "other"))
    if not isinstance(source, fx.Node) or not isinstance(shift, fx.Node):
        return None
    while _op_name(shift) in ("clamp", "clamp_min") and _arg(shift, "max") is None:
        shift = strip_exact(_arg(shift, "input"))  # raised to a floor (softmax-one's max(m, 0)): still >= every entry
    if _gathered_own_group(shift, source, ("amax", "max")):
        return OwnMaxShift(source)
    # s.max(dim, keepdim=True).values is getitem(max.dim(...), 0)
    if _op(shift) == "view" and _op_name(shift) == "getitem" and facts(shift).bound.arguments.get("index") == 0:
        shift = strip_exact(_arg(shift, "input"))
    op = _op(shift)
    if op == "extremum" and _op_name(shift) in ("amax", "max") and _arg(shift, "other") is None:
        pass
    elif op == "logsumexp" and _op_name(shift) in ("logsumexp", "special_logsumexp"):
        pass
    else:
        return None
    if strip_exact(_arg(shift, "input")) is not source or not (_keeps_dims(shift) or _over_everything(shift)):
        return None
    return OwnMaxShift(source)


def _over_everything(statistic: fx.Node) -> bool:
    """A reduction of every entry to one number (``s.max()``, ``s.amax()``): at least every entry of s wherever
    it broadcasts, so s minus it is <= 0 in every group a later sum takes (PyG's global shift)."""
    source = _arg(statistic, "input")
    return (_arg(statistic, "dim") in (None, (), []) and shape_of(statistic) == () and shape_of(source) is not None
            and keeps_values(source, statistic))


__all__ = ["Normalisation", "OwnMaxShift", "OwnShiftRatio", "OwnSumRatio", "find", "match_normalisation", "strip"]
