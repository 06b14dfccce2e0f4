"""What several families of transfers share: Theorem 9's ways of combining exponents
(:func:`combine_max`, :func:`combine_product`), scaling and negation with their ranges, the reading
of numeric parameters, the op's output structure (:func:`outputs`), and the tests of a divisor
that is a parameter (:func:`nonzero_constant`, :func:`hazard`).

A helper only one family uses lives in that family's module.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch.fx as fx

from qlint.core import algebra, domain
from qlint.core.domain import ANY, Growth, Range, unknown
from qlint.core.ops import Call
from qlint.growth.propagate import ANY_LENGTH, TENSOR, output_structure


def _real(*growths: Optional[Growth]) -> Optional[bool]:
    """A combination is complex if any part is, real if every part is, else unknown."""
    values = [g.real for g in growths if g is not None]
    if any(v is False for v in values):
        return False
    if all(v is True for v in values):
        return True
    return None


def culprit_of(*growths: Optional[Growth]) -> Optional[str]:
    """The reason the first input-dependent growth of unknown exponent gives, to pass on to a combination."""
    for g in growths:
        if g is not None and g.depends and g.culprit and not g.known:
            return g.culprit
    return None


def _dependent(*growths: Optional[Growth]) -> list[Growth]:
    """The growths that depend on the input: only they contribute an exponent."""
    return [g for g in growths if g is not None and g.depends]


def combine_max(*growths: Optional[Growth], r: Range = ANY, real: Any = "auto") -> Growth:
    """Theorem 9(ii): a value bounded by a sum of the inputs has the largest exponent."""
    return _combined(algebra.parallel_sum, growths, r, real)


def combine_product(*growths: Optional[Growth], r: Range = ANY, real: Any = "auto") -> Growth:
    """Theorem 9(iii): a (multi)linear product of the inputs has the sum of their exponents.

    A real factor that is exactly 0 for every input and parameter value (range [0, 0]) makes the product 0
    when every other factor is finite, which a known exponent says (a polynomial bound): 0 t = 0 for finite t,
    while 0 inf is NaN, so a factor of unknown or infinite exponent keeps the exponents' sum."""
    present = [g for g in growths if g is not None]
    if any(_is_zero(g) for g in present) and all(g.known or not g.depends for g in present):
        r = domain.point(0.0)
    return _combined(algebra.hadamard, growths, r, real)


def _is_zero(g: Growth) -> bool:
    return g.real is True and g.range.lo == 0.0 == g.range.hi


def _combined(rule: Any, growths: tuple[Optional[Growth], ...], r: Range, real: Any) -> Growth:
    """The input-dependent exponents combined by ``rule``; a constant when no input depends on X."""
    dependent = _dependent(*growths)
    realness = _real(*[g for g in growths if g is not None]) if real == "auto" else real
    if not dependent:
        return Growth(0.0, depends=False, real=realness, range=r)
    return Growth(rule(g.q for g in dependent), real=realness, range=r, culprit=culprit_of(*dependent))


def range_of(g: Optional[Growth]) -> Range:
    """A growth's entrywise range, claimed only for a real value (a complex one has no order)."""
    return g.range if g is not None and g.real is True else ANY


def is_number(value: Any) -> bool:
    """A plain int or float (a bool is a flag, not a number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def plain_number(call: Call, name: str, default: Any = None) -> Any:
    """A parameter that must be a plain number (a graph value here means: from data)."""
    value = call.value(name, default)
    if isinstance(value, Growth):
        if not value.depends and value.range.lo == value.range.hi and math.isfinite(value.range.lo):
            return value.range.lo  # a lifted constant with a known value
        return None
    return value


def scaled(g: Optional[Growth], factor: Any) -> Optional[Growth]:
    """factor * g for a Python number or a tensor factor."""
    if g is None:
        return None
    if is_number(factor) or isinstance(factor, bool):
        if not math.isfinite(factor):
            return unknown("a value scaled by an infinite or NaN constant")
        if factor == 1:
            return g
        return Growth(g.q if factor != 0 or g.depends else 0.0, depends=g.depends and factor != 0, real=g.real,
                      range=domain.mul(g.range, domain.point(float(factor))), culprit=g.culprit)
    f = factor if isinstance(factor, Growth) else domain.constant(factor)
    return combine_product(g, f, r=domain.mul(range_of(g), range_of(f)))


def outputs(call: Call, *values: Growth, rest: Optional[Growth] = None) -> Any:
    """The op's outputs, as many as the tensors it returns (its trace, else its schema):
    ``values`` in order, then ``rest`` for any further one (unknown when not given). One tensor:
    ``values[0]``. A rule written once for a family of overloads (``sort`` / ``msort``,
    ``native_batch_norm`` / ``_batch_norm_impl_index``) so gives each overload its own structure."""
    expected = output_structure(call.node) if call.node is not None else None
    if expected == TENSOR or (expected is None and len(values) == 1):
        return values[0]
    if not isinstance(expected, tuple) or expected == (ANY_LENGTH,):
        return tuple(values)
    extra = rest if rest is not None else unknown(f"an output of {call.label()} its rule does not bound")
    return tuple(values[i] if i < len(values) else extra for i in range(len(expected)))


def hazard(what: str) -> Growth:
    """A per-parameter value that is NaN or infinite for some parameter values (the sqrt or
    log of a parameter that may be negative). The propagation reads it at the model's own
    parameter values (:meth:`qlint.growth.propagate.GrowthProp._parameter_value`): a numerical
    hazard (QL108), or unknown where it is not finite there."""
    return Growth(None, depends=False, culprit=f"{what}: not finite for every parameter value")


def has_zero(value: Any) -> bool:
    """A divisor's value with a 0 in it (a number or a tensor)."""
    import torch

    return bool((value == 0).any()) if isinstance(value, torch.Tensor) else value == 0


def argument_node(call: Call, name: str) -> Any:
    """The graph node (or nodes, or constant) bound to an argument, as the trace wrote it."""
    from qlint.core.graph import facts

    node = call.node
    bound = facts(node).bound if node is not None and "qlint" in getattr(node, "meta", {}) else None
    return bound.arguments.get(name) if bound is not None else None


def nonzero_constant(call: Call, name: str) -> bool:
    """Whether an input-independent divisor is 0 at most on a null set of parameter values.

    It is when its range excludes 0, when it is a nonzero number, or when it is a raw
    parameter (through views and floating casts): a learned value is exactly 0 only on a
    null set; a buffer or a constant only when none of its entries is 0. A parameter
    *expression* (an integer cast, a copy of something else) is not trusted (relu(p), clamp(p, 0, 5), LN of a
    constant are 0 on whole regions of parameter space).
    """
    from qlint.core.graph import facts

    growth = call.growth(name)
    if growth is not None and growth.real is True and (growth.range.pos or growth.range.neg):
        return True
    raw = call.value(name)
    if is_number(raw):
        return raw != 0
    source = argument_node(call, name)
    while source is not None and getattr(source, "op", None) in ("call_function", "call_method") \
            and "qlint" in source.meta:
        info = facts(source)
        if not ({"plumbing"} & info.family) or _rounds_to_integers(info):
            return False
        if any(isinstance(v, fx.Node) for k, v in info.bound.arguments.items() if k != "input"):
            return False  # copy(p, src) / p.clone().copy_(src): the value is src's, not p's
        source = info.bound.arguments.get("input") if info.bound is not None else None
    return getattr(source, "op", None) == "get_attr" and _learned_or_nonzero(source)


def _rounds_to_integers(info: Any) -> bool:
    """An integer or bool cast: it is 0 on a whole interval of parameter values ((-1, 1) for trunc)."""
    import torch

    if "cast" not in info.family or info.op == "cast_float":
        return False
    if info.op in ("cast_int", "cast_bool"):
        return True
    dtype = info.bound.arguments.get("dtype") if info.bound is not None else None
    return not (isinstance(dtype, torch.dtype) and (dtype.is_floating_point or dtype.is_complex))


def _learned_or_nonzero(node: Any) -> bool:
    """A parameter is exactly 0 only on a null set of its values; a buffer or a constant is what
    it is, so it must have no zero entry (unknown on meta tensors)."""
    import torch

    owner = node.graph.owning_module
    try:
        value = owner.get_parameter(str(node.target)) if owner is not None else None
    except (AttributeError, TypeError):
        value = None
    if isinstance(value, torch.nn.Parameter):
        return True
    try:
        value = owner.get_buffer(str(node.target)) if owner is not None else None
    except (AttributeError, TypeError):
        value = getattr(owner, str(node.target), None) if owner is not None else None
    return isinstance(value, torch.Tensor) and not value.is_meta and bool((value != 0).all())


def negated(g: Optional[Growth]) -> Optional[Growth]:
    """-g: the same exponent, the range flipped."""
    if g is None:
        return None
    return Growth(g.q, depends=g.depends, real=g.real, range=domain.negate(g.range), culprit=g.culprit)


def reciprocal_range(d: Growth) -> Optional[Range]:
    """The range of 1/d, or None when d may come arbitrarily close to 0."""
    r = d.range if d.real is True else ANY
    if r.floor:  # d >= c > 0
        return domain.reciprocal(r)
    if r.ceil:
        return domain.negate(reciprocal_range(negated(d)))  # type: ignore[arg-type]
    return None


def clamp_bound(raw: Any, infinite: float) -> Optional[Growth]:
    """A clamp bound: a finite number, a computed tensor (its own growth), or None.

    A parameter or buffer is no bound unless its value range is known to be finite: a
    buffer may hold +-inf ("no bound"), and then clamp is the identity.
    """
    if raw is None:
        return None
    if isinstance(raw, Growth):
        if not raw.depends and not (raw.real is True and math.isfinite(raw.range.lo) and math.isfinite(raw.range.hi)):
            return None
        return raw
    if is_number(raw) and (math.isinf(raw) or math.isnan(raw)):
        return None
    return domain.constant(raw)


def eps_positive(call: Call, name: str = "eps", default: Any = 1e-5) -> bool:
    """eps > 0 as a number; ``None`` only where the op then uses the dtype's epsilon (rms_norm)."""
    raw = call.value(name, default)
    if raw is None:
        return default is None
    eps = plain_number(call, name, default)
    return is_number(eps) and eps > 0


def argument_shape(call: Call, name: str) -> Optional[tuple]:
    """The traced shape of the argument bound to ``name`` (None when the trace recorded none)."""
    from qlint.core.graph import shape_of

    return shape_of(argument_node(call, name))
