"""Transfers: how each primitive maps the growth of its arguments to its output's.

A transfer reads its arguments by name through :class:`qlint.core.ops.Call`; anything
it does not read and that depends on the input makes the result unknown (the
propagation enforces that, see :func:`qlint.core.propagate.apply`). Each transfer is
sound for every input and every parameter value; its docstring gives the derivation
(paper 000, Theorem 9 and Table 1, or elementary calculus).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch.fx as fx

from qlint.core import algebra, domain
from qlint.core.domain import ANY, CONSTANT, Growth, Range, unknown
from qlint.core.graph import META_ATTRIBUTES, dtype_of, sizes
from qlint.core.ops import Call, growths_in
from qlint.core.propagate import ANY_LENGTH, TENSOR, output_structure

TRANSFERS: dict[str, Callable[..., Any]] = {}


def transfer(name: str) -> Callable:
    def register(fn: Callable) -> Callable:
        TRANSFERS[name] = fn
        return fn

    return register


# --- helpers ---------------------------------------------------------------------------------


def _real(*growths: Optional[Growth]) -> Optional[bool]:
    """A combination is complex if any part is, real if every part is, else unknown."""
    values = [g.real for g in growths if g is not None]
    if any(v is False for v in values):
        return False
    if all(v is True for v in values):
        return True
    return None


def _culprit(*growths: Optional[Growth]) -> Optional[str]:
    for g in growths:
        if g is not None and g.depends and g.culprit and not g.known:
            return g.culprit
    return None


def _dependent(*growths: Optional[Growth]) -> list[Growth]:
    return [g for g in growths if g is not None and g.depends]


def combine_max(*growths: Optional[Growth], r: Range = ANY, real: Any = "auto") -> Growth:
    """Theorem 9(ii): a value bounded by a sum of the inputs has the largest exponent."""
    dependent = _dependent(*growths)
    present = [g for g in growths if g is not None]
    realness = _real(*present) if real == "auto" else real
    if not dependent:
        return Growth(0.0, depends=False, real=realness, range=r)
    return Growth(algebra.parallel_sum(g.q for g in dependent), real=realness, range=r, culprit=_culprit(*dependent))


def combine_product(*growths: Optional[Growth], r: Range = ANY, real: Any = "auto") -> Growth:
    """Theorem 9(iii): a (multi)linear product of the inputs has the sum of their exponents."""
    dependent = _dependent(*growths)
    present = [g for g in growths if g is not None]
    realness = _real(*present) if real == "auto" else real
    if not dependent:
        return Growth(0.0, depends=False, real=realness, range=r)
    return Growth(algebra.hadamard(g.q for g in dependent), real=realness, range=r, culprit=_culprit(*dependent))


def _range_of(g: Optional[Growth]) -> Range:
    return g.range if g is not None and g.real is True else ANY


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(call: Call, name: str, default: Any = None) -> Any:
    """A parameter that must be a plain number (a graph value here means: from data)."""
    value = call.value(name, default)
    if isinstance(value, Growth):
        if not value.depends and value.range.lo == value.range.hi and math.isfinite(value.range.lo):
            return value.range.lo  # a lifted constant with a known value
        return None
    return value


def _scaled(g: Optional[Growth], factor: Any) -> Optional[Growth]:
    """factor * g for a Python number or a tensor factor."""
    if g is None:
        return None
    if _is_number(factor) or isinstance(factor, bool):
        if not math.isfinite(factor):
            return unknown("a value scaled by an infinite or NaN constant")
        if factor == 1:
            return g
        return Growth(g.q if factor != 0 or g.depends else 0.0, depends=g.depends and factor != 0, real=g.real,
                      range=domain.mul(g.range, domain.point(float(factor))), culprit=g.culprit)
    f = factor if isinstance(factor, Growth) else domain.constant(factor)
    return combine_product(g, f, r=domain.mul(_range_of(g), _range_of(f)))


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
    parameter values (:meth:`qlint.core.propagate.GrowthProp._parameter_value`): a numerical
    hazard (QL108), or unknown where it is not finite there."""
    return Growth(None, depends=False, culprit=f"{what}: not finite for every parameter value")


def _has_zero(value: Any) -> bool:
    """A divisor's value with a 0 in it (a number or a tensor)."""
    import torch

    return bool((value == 0).any()) if isinstance(value, torch.Tensor) else value == 0


def _argument_node(call: Call, name: str) -> Any:
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
    if _is_number(raw):
        return raw != 0
    source = _argument_node(call, name)
    while source is not None and getattr(source, "op", None) in ("call_function", "call_method") and "qlint" in source.meta:
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


def _needs_real(x: Growth, what: str) -> Optional[Growth]:
    """Rules derived for real arguments do not hold for complex ones."""
    if x.real is False and x.depends:
        return unknown(f"{what} of a complex value (the real-valued bound does not apply)")
    return None


# --- the default transfer ----------------------------------------------------------------------


def default(call: Call, entry: Any) -> Any:
    """An entrywise map with exponent p of its main argument: q = p * q_x (Theorem 9(i)).

    The declared range holds for real arguments with the entry's parameters at their
    defaults; any other parameter value keeps q (the entry says it does not change the
    exponent) but claims no range.
    """
    call.meta(*entry.meta_args)
    x = call.growth("input")
    at_default = _params_at_default(call, entry)
    if x is None:
        return CONSTANT
    complex_ok = "complex" in entry.family
    if x.real is False and not complex_ok and x.depends:
        return unknown(f"{entry.name} of a complex value (the real-valued bound does not apply)")
    realness = {"real": True, "complex": False}.get(entry.real or "", x.real)
    r = entry.declared_range(x.range) if (at_default and x.real is True) else ANY
    if not x.depends:
        return outputs(call, Growth(0.0, depends=False, real=realness, range=r))
    return outputs(call, Growth(algebra.compose(entry.exponent, x.q), real=realness, range=r, culprit=x.culprit))


def _params_at_default(call: Call, entry: Any) -> bool:
    at_default = True
    names = set(call.arguments) if "*" in entry.params else entry.params
    for name in names:
        if name == "input" or not call.has(name):
            continue
        value = call.value(name)
        if isinstance(value, Growth):
            continue
        if name in call.defaults and value == call.defaults[name]:
            continue
        at_default = False
    return at_default


@transfer("select")
def select(call: Call, entry: Any) -> Any:
    """Views, selections, copies: entries of the input, so its bound and range (indices are selectors).

    ``expand``/``repeat`` copy entries a fixed number of times: the norm grows by a
    constant factor only.
    """
    call.meta(*entry.meta_args)
    dynamic = _length_from_values(call)
    if dynamic is not None:
        call.every()
        return unknown(dynamic)
    if call.op in ("view", "view_copy", "_view_dtype") and any(_is_dtype(v) for v in _flat(list(call.arguments.values()))):
        call.every()  # h.view(torch.int32): the same bits read as another type; (i * 2).view(float32) is not 2 h
        return unknown(f"`{call.op}` to another dtype reinterprets the bits: its values are not the input's")
    source = call.operand("input")
    index = call.value("index") if call.has("index") else None
    call.selectors("index", "indices", "mask", "repeats", "shifts", "offsets", "sorted_sequence")
    call.accept_params()
    if isinstance(source, tuple):  # a tuple-valued op (or a shape): getitem picks one output, a slice several
        if _is_number(index) and -len(source) <= int(index) < len(source):
            call.picked.add("input")  # the other outputs are not read: their growth does not matter here
            return source[int(index)]
        if isinstance(index, slice) and all(v is None or _is_number(v) for v in (index.start, index.stop, index.step)):
            call.picked.add("input")
            return source[index]
        return combine_max(*[s for s in source if isinstance(s, Growth)])
    if not isinstance(source, Growth):
        return domain.constant(source)
    realness = {"real": True, "complex": False}.get(entry.real or "", source.real)
    if realness is not source.real:
        return Growth(source.q, depends=source.depends, real=realness, culprit=source.culprit)
    return source


def _flat(values: list[Any]) -> list[Any]:
    return [v for value in values for v in (_flat(list(value)) if isinstance(value, (list, tuple)) else [value])]


def _length_from_values(call: Call) -> Optional[str]:
    """Why the output's length grows with the input, if it does.

    A sum over a tensor whose length grows with ||x|| grows faster than its entries:
    ``repeat_interleave(v, r)`` with counts r from x, ``x.repeat(n)`` with n from x. (A
    boolean mask or ``nonzero`` only selects among a fixed number of entries: no growth.)
    """
    if call.op in ("repeat_interleave", "repeat", "tile", "expand", "broadcast_to"):
        repeats = call.arguments.get("repeats", call.arguments.get("dims", call.arguments.get("size")))
        if call.op == "repeat_interleave" and not call.has("repeats"):
            repeats = call.arguments.get("input")  # repeat_interleave(r): r is the repeats
        if any(g.depends for g in growths_in(repeats)):
            return f"{call.op} with counts computed from the input (the output's length grows with it)"
    return None


@transfer("cast")
def cast(call: Call, entry: Any) -> Any:
    """A dtype or device change: a floating cast keeps the value (up to rounding, a constant
    relative error), an integer cast truncates toward zero (|trunc x| <= |x|), a bool
    cast is 0 or 1, a complex cast forgets the order."""
    x = call.growth("input")
    target = None
    for name in ("dtype", "device", "other", "non_blocking", "copy", "memory_format", "layout", "pin_memory"):
        value = call.value(name)
        if name in ("dtype", "device") and value is not None and not isinstance(value, Growth):
            target = value if _is_dtype(value) else target
        if name == "other" and isinstance(value, Growth):
            call.meta("other")  # type_as(other): other's dtype only
            target = "complex" if value.real is False else target
    call.accept_params()
    if x is None:
        return CONSTANT
    produced = dtype_of(call.node)  # what the trace recorded: covers type_as(int), .to(int tensor), .type("torch.LongTensor")
    kind = _dtype_kind(entry.id, produced if produced is not None else target)
    if kind == "bool":
        return Growth(0.0, depends=x.depends, range=domain.interval(0, 1))
    if kind == "complex":
        return Growth(x.q, depends=x.depends, real=False, culprit=x.culprit)
    if kind == "int":
        return Growth(x.q, depends=x.depends, real=True if x.real is not None else None,
                      range=_integer_range(x.range if x.real is True else ANY, produced), culprit=x.culprit)
    if kind == "float" and x.real is False:
        return Growth(x.q, depends=x.depends, real=True, culprit=x.culprit)  # drops the imaginary part
    return x


def _integer_range(r: Range, dtype: Any) -> Range:
    """An integer cast: truncation toward zero, monotone, so [trunc(lo), trunc(hi)] (0 < x < 1
    becomes 0) while the values fit the type; past its range the value wraps (int8(256.5) = 0,
    uint8(-5.3) = 251) or is undefined: a narrow type then keeps only its own range (its values
    are bounded), int32 no order fact (its magnitude still follows the input's, q = q_x). int64 is
    taken to truncate: it wraps only past 9.2e18, beyond the float32 values a model computes
    with (a float32 x**3 reaches it at |x| ~ 2e6, where its q = 3 is reported first)."""
    import torch

    limits = torch.iinfo(dtype) if isinstance(dtype, torch.dtype) and not dtype.is_floating_point and dtype != torch.bool \
        and not dtype.is_complex else None
    if limits is not None and (limits.bits >= 64 or limits.min <= r.lo and r.hi <= limits.max):  # int64: past 9.2e18 only
        return Range(lo=math.trunc(r.lo) if r.lo > -math.inf else -math.inf, hi=math.trunc(r.hi) if r.hi < math.inf else math.inf,
                     below=r.below, above=r.above)
    if limits is not None and limits.bits <= 16:  # int8 / uint8 / int16 wrap within reach: only the type's range
        return Range(lo=float(limits.min), hi=float(limits.max))
    return ANY  # a wide integer (or an unknown type): no order fact survives a value past its range


def _is_dtype(value: Any) -> bool:
    import torch

    return isinstance(value, torch.dtype)


def _dtype_kind(entry_id: str, dtype: Any) -> str:
    import torch

    fixed = {"cast_bool": "bool", "cast_int": "int", "cast_float": "float"}.get(entry_id)
    if fixed:
        return fixed
    if dtype is None or not _is_dtype(dtype):
        return "same" if dtype != "complex" else "complex"
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float"
    return "int"


@transfer("metadata")
def metadata(call: Call, entry: Any) -> Any:
    """Shapes, sizes and dtypes do not depend on the input's magnitude."""
    call.every()
    return CONSTANT


@transfer("constructor")
def constructor(call: Call, entry: Any) -> Any:
    """zeros / ones / full / arange / rand ...: shaped by sizes, filled with given values.

    Template tensors (``*_like``, ``new_*``) give only shape, dtype and device; the fill
    value, when the graph computes it (``x.norm().item()``), carries its growth.
    """
    call.meta(*entry.meta_args)
    if call.op in ("arange", "range", "linspace", "logspace"):
        return _sequence(call)
    values: list[Growth] = []
    for name in ("fill_value", "value", "data", "start", "end", "step", "steps", "mean", "std", "low", "high"):
        if call.has(name):
            g = call.growth(name)
            if g is not None:
                values.append(g)
    call.accept_params()
    r = entry.declared_range(ANY)
    if entry.range is None and values and all(v.real is True for v in values):
        r = domain.union(*[v.range for v in values])
    out = combine_max(*values, r=r) if values else Growth(0.0, depends=False, range=r)
    return out


def _sequence(call: Call) -> Growth:
    """arange / linspace / logspace: with numeric arguments, the exact range of the values made
    (arange(8) holds 0, not only 8); with an end point computed from the input the length
    (arange) or the values (logspace: base ** x) are not bounded by a polynomial."""
    import torch

    names = ("start", "end", "step", "steps", "base")
    raw = {n: call.value(n) for n in names if call.has(n)}
    call.accept_params()
    if any(isinstance(v, Growth) and v.depends for v in raw.values()):
        return unknown(f"{call.op} with an end point or a step computed from the input")
    if not all(_is_number(v) for v in raw.values()):
        return Growth(0.0, depends=False)
    try:
        made = getattr(torch, call.op)(**{k: v for k, v in raw.items()}) if call.op != "range" else torch.arange(
            raw.get("start", 0), raw.get("end", 0) + raw.get("step", 1), raw.get("step", 1))
    except (TypeError, RuntimeError, ValueError):
        return Growth(0.0, depends=False)
    if made.numel() == 0 or not bool(torch.isfinite(made).all()):
        return Growth(0.0, depends=False)
    return Growth(0.0, depends=False, range=domain.interval(float(made.min()), float(made.max())))


# --- arithmetic ---------------------------------------------------------------------------------


@transfer("add")
def add(call: Call, entry: Any) -> Any:
    """a + alpha*b, a - alpha*b, b - alpha*a: Theorem 9(ii); a difference is a + (-b)."""
    raw_a, raw_b = call.operand("input"), call.operand("other")
    if entry.id == "add" and isinstance(raw_a, (tuple, list)) and isinstance(raw_b, (tuple, list)):
        return tuple(v if isinstance(v, Growth) else domain.constant(v) for v in (*raw_a, *raw_b))  # x.size()[:-1] + (n,)
    a, b = call.growth("input"), call.growth("other")
    alpha = call.operand("alpha", 1)
    if a is None or b is None:
        return combine_max(a, b)
    if entry.id == "rsub":  # rsub(input, other, alpha) = other - alpha * input
        a, term = b, _negated(_scaled(a, alpha))
    elif entry.id == "sub":
        term = _negated(_scaled(b, alpha))
    else:
        term = _scaled(b, alpha)
    return combine_max(a, term, r=domain.add(_range_of(a), _range_of(term)))


def _negated(g: Optional[Growth]) -> Optional[Growth]:
    if g is None:
        return None
    return Growth(g.q, depends=g.depends, real=g.real, range=domain.negate(g.range), culprit=g.culprit)


@transfer("neg")
def neg(call: Call, entry: Any) -> Any:
    """||-x|| = ||x||; the range flips."""
    return _negated(call.growth("input")) or CONSTANT


@transfer("mul")
def mul(call: Call, entry: Any) -> Any:
    """Theorem 9(iii): |a_i b_i| <= |a_i||b_i|, so the exponents add; x*x of a real x is >= 0."""
    a, b = call.growth("input"), call.growth("other")
    if a is None or b is None:
        return combine_max(a, b)
    if any(_is_number(call.value(n)) and not math.isfinite(call.value(n)) for n in ("input", "other")):
        return unknown("a product with an infinite or NaN constant")
    same = call.node is not None and len(call.node.args) >= 2 and call.node.args[0] is call.node.args[1]
    if same and a.real is True:
        return combine_product(a, b, r=domain.square(a.range))
    return combine_product(a, b, r=domain.mul(_range_of(a), _range_of(b)))


def _reciprocal_range(d: Growth) -> Optional[Range]:
    """The range of 1/d, or None when d may come arbitrarily close to 0."""
    r = d.range if d.real is True else ANY
    if r.floor:  # d >= c > 0
        return domain.reciprocal(r)
    if r.ceil:
        return domain.negate(_reciprocal_range(_negated(d)))  # type: ignore[arg-type]
    return None


@transfer("div")
def div(call: Call, entry: Any) -> Any:
    """a / b is bounded by |a| / c when b stays at least c > 0 away from 0 (for each parameter
    value), or b does not depend on the input (a per-parameter constant, Table 1 keeps such
    coefficients); otherwise the quotient has a pole and nothing bounds it. floor/trunc
    rounding adds at most 1 to the magnitude."""
    a, b = call.growth("input"), call.growth("other")
    rounding = "floor" if entry.id == "floor_divide" else call.param("rounding_mode")
    if a is None or b is None:
        return CONSTANT
    raw = call.value("other")
    if _is_number(raw) or isinstance(raw, bool):
        if raw == 0:
            return unknown("division by zero")
        r = domain.divide(_range_of(a), float(raw))
        return _rounded(Growth(a.q, depends=a.depends, real=a.real, range=r, culprit=a.culprit), rounding)
    inverse = _reciprocal_range(b)
    if b.depends and inverse is None:
        return unknown("division by an input-dependent value that may approach 0")
    if b.depends and b.real is not True:
        return unknown("division by a complex (or unknown-dtype) value")
    if not b.depends and inverse is None and not nonzero_constant(call, "other"):
        call.hazard("division by a parameter expression that may be 0", "other", _has_zero)
    if inverse is None:
        r = ANY
    else:
        r = domain.mul(_range_of(a), inverse)
    out = combine_max(a, Growth(0.0, depends=b.depends, real=b.real), r=r)
    return _rounded(out, rounding)


def _rounded(g: Growth, rounding: Any) -> Growth:
    if rounding in ("floor", "trunc"):
        r = g.range
        return g.with_range(Range(lo=r.lo - 1, hi=r.hi + 1, below=r.below, above=r.above))
    return g


@transfer("reciprocal")
def reciprocal(call: Call, entry: Any) -> Any:
    """1/x <= 1/c when |x| >= c > 0 (q = 0); rsqrt(x) <= 1/sqrt(c) when x >= c > 0."""
    x = call.growth("input")
    if x is None:
        return CONSTANT
    if not x.depends:
        if entry.id == "rsqrt" and not (x.real is True and x.range.pos):
            return hazard("rsqrt of a parameter expression that may be <= 0")
        if not nonzero_constant(call, "input"):
            return hazard("reciprocal of a parameter expression that may be 0")
        inverse = _reciprocal_range(x) if entry.id != "rsqrt" else None
        if entry.id == "rsqrt" and x.range.floor:
            inverse = Range(lo=0.0, hi=1.0 / math.sqrt(x.range.lo) if x.range.lo > 0 else math.inf, pos=True,
                            floor=x.range.above)
        return Growth(0.0, depends=False, real=x.real, range=inverse or ANY)
    if x.real is not True:
        return unknown(f"{entry.name} of a complex (or unknown-dtype) value")
    if entry.id == "rsqrt":
        if not x.range.floor:
            return unknown("rsqrt (reciprocal square root) of an input-dependent value that may approach 0 (or be negative)")
        r = x.range
        return Growth(0.0, range=Range(lo=0.0, hi=1.0 / math.sqrt(r.lo) if r.lo > 0 else math.inf, pos=True, above=True, below=True))
    inverse = _reciprocal_range(x)
    if inverse is None:
        return unknown("reciprocal of an input-dependent value that may approach 0")
    return Growth(0.0, range=inverse)


@transfer("pow")
def power(call: Call, entry: Any) -> Any:
    """x ** p: q = p * q_x (Table 1, polynomial activation). A fractional power needs x >= 0
    (it is NaN below); a negative power is a reciprocal and needs |x| >= c > 0; c ** x is
    exp(x ln c). An exponent computed from the input, or held in a parameter, has no fixed
    value, so nothing bounds the power."""
    base_raw, exp_raw = call.operand("input"), call.operand("exponent", 2 if entry.id == "square" else None)
    if entry.id == "square":
        exp_raw = 2
    elif entry.id == "sqrt":
        exp_raw = 0.5
    base = base_raw if isinstance(base_raw, Growth) else domain.constant(base_raw)
    exponent = exp_raw if isinstance(exp_raw, Growth) else None
    if exponent is not None and not exponent.depends and exponent.range.lo == exponent.range.hi and math.isfinite(exponent.range.lo):
        exp_raw, exponent = exponent.range.lo, None  # a lifted constant with a known value
    if exponent is not None:
        if not base.depends and not exponent.depends:
            return Growth(0.0, depends=False)
        if _is_number(base_raw) and base_raw > 0:  # c ** x = exp(x ln c)
            if base_raw == 1:
                return Growth(0.0, depends=False, range=domain.point(1.0))
            log_c = math.log(base_raw)
            argument = Growth(exponent.q, depends=exponent.depends, real=exponent.real,
                              range=domain.mul(_range_of(exponent), domain.point(log_c)), culprit=exponent.culprit)
            return _exp_of(argument, "pow of an argument not bounded above")
        if exponent.depends:
            return unknown("power with an input-dependent exponent")
        return unknown("power with an exponent held in a parameter (training sets its value)")
    if not _is_number(exp_raw):
        return unknown("power with an exponent qlint cannot read")
    p = float(exp_raw)
    if not base.depends:
        if p != int(p) and not (base.real is True and base.range.nonneg):
            return hazard(f"x ** {p:g} of a parameter expression that may be negative")
        if p < 0 and not nonzero_constant(call, "input"):
            return hazard(f"x ** {p:g} of a parameter expression that may be 0")
        return Growth(0.0, depends=False, real=base.real, range=_power_range(base.range, p) if base.real is True else ANY)
    if p == 0:
        return Growth(0.0, depends=False, range=domain.point(1.0))
    integer = p == int(p)
    if base.real is not True and not (integer and p > 0):
        return unknown(f"x ** {p:g} of a complex (or unknown-dtype) value")
    if not integer and not base.range.nonneg:
        return unknown(f"x ** {p:g} of a value that may be negative (NaN below 0)")
    if p < 0:
        inverse = _reciprocal_range(base)
        if inverse is None:
            return unknown(f"x ** {p:g} of a value that may approach 0")
        return Growth(0.0, real=base.real, range=_power_range(base.range, p))
    return Growth(algebra.compose(p, base.q), real=base.real, range=_power_range(base.range, p) if base.real else ANY,
                  culprit=base.culprit)


def _power_range(r: Range, p: float) -> Range:
    """The range of x**p for a real x with range r (p an integer, or x >= 0).

    For p < 0 the order reverses and the far end maps to 0: with 0 < m <= |x| <= M,
    |x|**p lies in [M**p, m**p] (M = inf gives 0, not inf); a range that reaches 0 has a pole.
    """
    if p < 0:
        if r.lo <= 0 <= r.hi:
            return ANY
        near, far = min(abs(r.lo), abs(r.hi)), max(abs(r.lo), abs(r.hi))
        small, large = (0.0 if math.isinf(far) else math.pow(far, p)), math.pow(near, p)
        if r.lo > 0 or (p == int(p) and int(p) % 2 == 0):
            return Range(lo=small, hi=large, pos=True)
        return Range(lo=-large, hi=-small, neg=True)  # odd p of a negative range

    def powered(v: float) -> float:
        if math.isinf(v):
            return math.inf if v > 0 or (p == int(p) and int(p) % 2 == 0) else -math.inf
        try:
            return math.pow(v, p) if v != 0 or p > 0 else math.inf
        except (OverflowError, ValueError):
            return math.inf
    if p == int(p) and int(p) % 2 == 0:
        top = max(powered(abs(r.lo)), powered(abs(r.hi)))
        low = 0.0 if r.lo <= 0 <= r.hi else min(powered(abs(r.lo)), powered(abs(r.hi)))
        return Range(lo=low, hi=top, pos=r.pos or r.neg, below=True, above=r.bounded, floor=r.floor or r.ceil)
    return Range(lo=powered(r.lo), hi=powered(r.hi), pos=r.pos, neg=r.neg, below=r.below, above=r.above,
                 floor=r.floor and r.bounded, ceil=r.ceil and r.bounded)


def _exp_of(a: Growth, culprit: str) -> Growth:
    """exp(a) is bounded when a is bounded above (for each parameter value); otherwise it
    grows faster than any polynomial (paper 000, Remark 10: outside P)."""
    if not a.depends:
        return Growth(0.0, depends=False, range=domain.exp(_range_of(a)) if a.real is True else ANY, real=a.real)
    if a.real is False:
        if a.q == 0:
            return Growth(0.0, real=False)
        return Growth(algebra.SUPERPOLYNOMIAL if a.known else None, real=False,
                      culprit=a.culprit if not a.known else "exp of a complex argument (|exp z| = exp(Re z))")
    r = domain.exp(a.range) if a.real is True else ANY
    if a.q == 0 or (a.real is True and a.range.above and a.known):  # (a super-polynomial a overflows first)
        return Growth(0.0, range=r, real=a.real)
    if a.q is None:
        return Growth(None, culprit=a.culprit)
    return Growth(algebra.SUPERPOLYNOMIAL, range=r, culprit=culprit)


@transfer("exp")
def exp(call: Call, entry: Any) -> Any:
    """exp(a) <= exp(sup a): bounded when a is bounded above; exp2 and expm1 likewise."""
    a = call.growth("input")
    if a is None:
        return CONSTANT
    if call.op == "exp2":
        a = _scaled(a, math.log(2.0))
    out = _exp_of(a, f"{call.op} of an argument not bounded above")
    if call.op == "expm1" and out.real is True:
        r = out.range
        out = out.with_range(Range(lo=r.lo - 1, hi=r.hi - 1, below=r.below, above=r.above))
    return out


@transfer("hyperbolic")
def hyperbolic(call: Call, entry: Any) -> Any:
    """sinh and cosh grow like e^|a|: faster than any polynomial unless a is bounded."""
    a = call.growth("input")
    if a is None or not a.depends:
        return Growth(0.0, depends=False)
    if a.q == 0:
        r = Range(lo=1.0, below=True, above=True) if entry.id == "cosh" and a.real is True else ANY
        return Growth(0.0, real=a.real, range=r)
    if a.q is None:
        return Growth(None, culprit=a.culprit)
    return Growth(algebra.SUPERPOLYNOMIAL, culprit=f"{entry.id} of an unbounded argument")


@transfer("log")
def log(call: Call, entry: Any) -> Any:
    """log(a) for a >= c > 0: |log a| <= |log c| + log(C ||x||^q), slower than any power, so
    q <= min(q_a, 1). Near 0 the logarithm is unbounded; log1p needs a >= -1 + c."""
    a = call.growth("input")
    if a is None:
        return CONSTANT
    argument = domain.add(a.range, domain.point(1.0)) if entry.id == "log1p" else a.range
    if not a.depends:
        if not (a.real is True and argument.pos):
            return hazard(f"{entry.id} of a parameter expression that may be <= 0")
        return Growth(0.0, depends=False)
    if a.real is not True:
        return unknown(f"{entry.id} of a complex (or unknown-dtype) value")
    if not argument.floor:
        return unknown(f"{entry.id} of an argument that may approach 0")
    if not a.known:
        return Growth(a.q, culprit=a.culprit)
    base = {"log": math.e, "log2": 2.0, "log10": 10.0, "log1p": math.e}[entry.id]
    r = domain.monotone(argument, lambda v: math.log(v, base) if v > 0 else -math.inf)
    return Growth(min(a.q, 1.0), range=r)


@transfer("abs")
def absolute(call: Call, entry: Any) -> Any:
    """|| |x| || = ||x||; the result is real and non-negative (|z| of a complex z too)."""
    x = call.growth("input")
    if x is None:
        return CONSTANT
    r = domain.absolute(x.range) if x.real is True else Range(lo=0.0)
    return Growth(x.q if x.depends else 0.0, depends=x.depends, real=True, range=r, culprit=x.culprit)


@transfer("clamp")
def clamp(call: Call, entry: Any) -> Any:
    """clamp(x, lo, hi) = min(max(x, lo), hi): with both bounds it lies between them (q of the
    bounds: 0 for numbers); with one, |out| <= max(|x|, |bound|). An infinite number is no
    bound. Tensor bounds count with their own growth."""
    x = call.growth("input")
    low_raw = None if entry.id == "clamp_max" else call.operand("min")
    high_raw = None if entry.id == "clamp_min" else call.operand("max")
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown("clamp of a complex value")
    low = _bound(low_raw, -math.inf)
    high = _bound(high_raw, math.inf)
    r = _range_of(x)
    if low is not None:
        r = domain.maximum(r, _range_of(low))
    if high is not None:
        r = domain.minimum(r, _range_of(high))
    if low is not None and high is not None:
        return combine_max(low, high, r=r, real=x.real if x.real is not None else None) if (low.depends or high.depends) else \
            Growth(0.0, depends=x.depends, real=x.real, range=r)
    bound = low if low is not None else high
    return combine_max(x, bound, r=r)


def _bound(raw: Any, infinite: float) -> Optional[Growth]:
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
    if _is_number(raw) and (math.isinf(raw) or math.isnan(raw)):
        return None
    return domain.constant(raw)


@transfer("hardtanh")
def hardtanh(call: Call, entry: Any) -> Any:
    """hardtanh(x, lo, hi) is a clamp to [lo, hi]."""
    x = call.growth("input")
    low, high = call.param("min_val", -1.0), call.param("max_val", 1.0)
    if entry.id == "relu6":
        low, high = 0.0, 6.0
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown("hardtanh of a complex value")
    if not (_is_number(low) and _is_number(high)):
        return unknown("hardtanh with bounds qlint cannot read")
    lo_g, hi_g = _bound(low, -math.inf), _bound(high, math.inf)
    r = _range_of(x)
    if lo_g is not None:
        r = domain.maximum(r, lo_g.range)
    if hi_g is not None:
        r = domain.minimum(r, hi_g.range)
    if lo_g is not None and hi_g is not None:
        return Growth(0.0, depends=x.depends, range=r)
    return Growth(x.q if x.depends else 0.0, depends=x.depends, range=r, culprit=x.culprit)


@transfer("maximum")
def maximum(call: Call, entry: Any) -> Any:
    """max(a, b) / min(a, b) entrywise is one of a, b: Theorem 9(ii)."""
    a, b = call.growth("input"), call.growth("other")
    if a is None or b is None:
        return combine_max(a, b)
    if a.real is False or b.real is False:
        return unknown(f"{entry.id} of complex values")
    fn = domain.maximum if entry.id in ("maximum", "fmax") else domain.minimum
    return combine_max(a, b, r=fn(_range_of(a), _range_of(b)))


@transfer("where")
def where(call: Call, entry: Any) -> Any:
    """where(c, a, b) and masked_fill(x, m, v): each entry is one of the values (the condition
    selects); Theorem 9(ii)."""
    call.selectors("condition", "mask")
    values = [g for g in (call.growth("input"), call.growth("other"), call.growth("value"), call.growth("source"))
              if g is not None]
    if entry.id == "where" and call.has("condition"):
        values = [g for g in (call.growth("input"), call.growth("other")) if g is not None]
        if not call.has("input"):  # where(c) = nonzero(c, as_tuple=True): one index tensor per axis of c
            rank = len(_argument_shape(call, "condition") or ())
            index = Growth(0.0, depends=True, range=Range(lo=0.0))
            return tuple(index for _ in range(rank)) if rank else unknown("where(c) of a condition of unknown rank")
    if not values:
        return CONSTANT
    ranges = [_range_of(v) for v in values]
    return combine_max(*values, r=domain.union(*ranges))


@transfer("lerp")
def lerp(call: Call, entry: Any) -> Any:
    """lerp(a, b, w) = a + w (b - a): Theorem 9(ii) for the sum, 9(iii) for the weighted step.

    No convexity is assumed: a weight outside [0, 1] extrapolates, which the range
    arithmetic a + w*(b - a) accounts for."""
    a, b = call.growth("input"), call.growth("end")
    w_raw = call.operand("weight")
    w = w_raw if isinstance(w_raw, Growth) else domain.constant(w_raw)
    if a is None or b is None:
        return combine_max(a, b, w)
    difference = combine_max(a, b, r=domain.add(_range_of(b), domain.negate(_range_of(a))))
    step = combine_product(w, difference, r=domain.mul(_range_of(w), difference.range))
    return combine_max(a, step, r=domain.add(_range_of(a), step.range))


@transfer("addcmul")
def addcmul(call: Call, entry: Any) -> Any:
    """addcmul(x, a, b, value) = x + value * a * b; addcdiv(x, a, b, value) = x + value * a / b
    (the quotient needs b bounded away from 0, as a division does)."""
    x, t1, t2 = call.growth("input"), call.growth("tensor1"), call.growth("tensor2")
    value = call.operand("value", 1)
    if entry.id == "addcdiv":
        inverse = _reciprocal_range(t2) if t2 is not None else None
        if t2 is not None and t2.depends and inverse is None:
            return unknown("addcdiv divides by an input-dependent value that may approach 0")
        if t2 is not None and not t2.depends and inverse is None and not nonzero_constant(call, "tensor2"):
            call.hazard("addcdiv divides by a parameter expression that may be 0", "tensor2", _has_zero)
        factor = Growth(0.0, depends=t2.depends if t2 else False, range=inverse or ANY)
        product = combine_max(t1, factor, r=domain.mul(_range_of(t1), inverse or ANY))
    else:
        product = combine_product(t1, t2, r=domain.mul(_range_of(t1), _range_of(t2)))
    term = _scaled(product, value)
    return combine_max(x, term, r=domain.add(_range_of(x), _range_of(term)))


@transfer("matmul")
def matmul(call: Call, entry: Any) -> Any:
    """Theorem 9(iii) for bilinear maps: ||A B|| <= ||A|| ||B||, multilinear for einsum and
    tensordot; with a bias, addmm(c, a, b, beta, alpha) = beta c + alpha a b."""
    operands = [g for name in ("input", "other", "mat1", "mat2", "batch1", "batch2", "vec", "vec1", "vec2", "mat",
                               "tensor", "a", "b", "input1", "input2", "weight")
                if (g := call.growth(name)) is not None]
    for name in ("operands", "tensors", "matrices", "args"):  # args: torch.functional.einsum(eq, *operands) under fx
        if call.has(name):
            operands += call.growths(name)
    call.accept_params()
    product = combine_product(*operands)
    if call.op in ("addmm", "baddbmm", "addbmm", "addmv", "addr"):
        bias = call.growth("input")
        operands = [g for name in ("mat1", "mat2", "batch1", "batch2", "mat", "vec", "vec1", "vec2")
                    if (g := call.growth(name)) is not None]
        product = _scaled(combine_product(*operands), call.operand("alpha", 1))
        return combine_max(_scaled(bias, call.operand("beta", 1)), product)
    bias = call.growth("bias")
    return combine_max(product, bias) if bias is not None else product


@transfer("grouped_mm")
def grouped_mm(call: Call, entry: Any) -> Any:
    """Mixture-of-experts dispatch (transformers' grouped_mm_fallback): row r of the output is row
    r of the input times the weight of the expert whose group holds r (``offs``: cumulative row
    counts), the rows past offs[-1] left at 0. So ||out_r|| <= max_e ||W_e|| ||in_r|| whatever
    ``offs`` is: the offsets choose a weight and never scale (Theorem 9(iii)), and a weight
    computed from the input makes it bilinear (the exponents add)."""
    operands = [g for name in ("input", "weight") if (g := call.growth(name)) is not None]
    call.meta("offs")
    call.accept_params()
    return combine_product(*operands)


@transfer("affine")
def affine(call: Call, entry: Any) -> Any:
    """Table 1: x -> W x + b (Linear, convolutions: a Toeplitz W) with ||Wx + b|| <=
    ||W||_op ||x|| + ||b||. With a weight computed from the input the map is bilinear and the
    exponents add (Theorem 9(iii))."""
    call.meta(*entry.meta_args)
    call.accept_params()
    x, weight, bias = call.growth("input"), call.growth("weight"), call.growth("bias")
    product = combine_product(x, weight)
    return combine_max(product, bias) if bias is not None else product


@transfer("embedding")
def embedding(call: Call, entry: Any) -> Any:
    """Rows of the weight table: an integer index cannot scale them, so the output is bounded
    by max_i ||W_i|| (q = 0); a table computed from the input carries its own growth, and
    embedding_bag's per-sample weights multiply."""
    weight = call.growth("weight")
    call.selectors("indices", "offsets")
    psw = call.growth("per_sample_weights")
    call.accept_params()
    if weight is None:
        return CONSTANT
    depends = weight.depends or call.depends_any()
    out = combine_product(Growth(weight.q if weight.depends else 0.0, depends=True, real=weight.real,
                                 culprit=weight.culprit), psw) if psw is not None else \
        Growth(weight.q if weight.depends else 0.0, depends=depends, real=weight.real, culprit=weight.culprit)
    return outputs(call, out, rest=Growth(0.0, depends=depends, range=Range(lo=0.0)))  # _embedding_bag: offsets, counts, argmax


# --- normalizations -----------------------------------------------------------------------------


def _eps_ok(call: Call, name: str = "eps", default: Any = 1e-5) -> bool:
    """eps > 0 as a number; ``None`` only where the op then uses the dtype's epsilon (rms_norm)."""
    raw = call.value(name, default)
    if raw is None:
        return default is None
    eps = _number(call, name, default)
    return _is_number(eps) and eps > 0


def _normalized(x: Growth, weight: Optional[Growth], bias: Optional[Growth], what: str, *, eps_ok: bool) -> Growth:
    """Table 1 / Theorem 9(v): the normalised core is bounded whatever x is; the affine
    wrapper gamma * core + beta then has the exponents of gamma and beta (9(iii), 9(ii))."""
    if not eps_ok:
        return unknown(f"{what} with eps <= 0 (the statistic may vanish)")
    if not x.known:  # unknown, or super-polynomial: it overflows before it is normalised
        return Growth(None, culprit=x.culprit)
    if x.real is False:
        return unknown(f"{what} of a complex value")
    core = Growth(0.0, depends=x.depends, real=x.real)
    out = combine_product(core, weight) if weight is not None else core
    return combine_max(out, bias) if bias is not None else out


@transfer("layer_norm")
def layer_norm(call: Call, entry: Any) -> Any:
    """LayerNorm / RMSNorm / GroupNorm: ||LN(z)|| <= |beta| + ||gamma|| sqrt(d) for every z
    (Lemma 1 of Kan et al. 2025), uniformly in eps > 0. The ATen variants also return the
    statistics: the mean has the input's exponent, the inverse deviation is <= 1/sqrt(eps)."""
    call.meta("normalized_shape", "num_groups", "N", "C", "HxW", "group")
    x = call.growth("input")
    weight, bias = call.growth("weight"), call.growth("bias")
    eps_default = None if call.op in ("rms_norm", "_fused_rms_norm") else 1e-5
    ok = _eps_ok(call, "eps", eps_default)
    call.accept_params()
    if x is None:
        return CONSTANT
    out = _normalized(x, weight, bias, entry.name, eps_ok=ok)
    rstd = Growth(0.0, depends=x.depends, range=Range(lo=0.0, pos=True)) if ok else unknown("inverse deviation with eps <= 0")
    mean = Growth(x.q, depends=x.depends, real=x.real, culprit=x.culprit)
    if call.op in ("native_layer_norm", "native_group_norm"):
        return (out, mean, rstd)
    if call.op == "_fused_rms_norm":
        return (out, rstd)
    return out


@transfer("normalize")
def normalize(call: Call, entry: Any) -> Any:
    """F.normalize: x / max(||x||_p, eps). For p >= 1 (or inf) each |x_i| <= ||x||_p, so every
    entry is in [-1, 1] (Table 1, L2 normalization): exactly so in floating point for p = 1, 2 and
    inf (monotone rounding); a p-norm computed through pow may round below max |x_i|, so its range
    is a little wider (acos of it is a NaN hazard). Other p or eps <= 0 prove nothing more than a
    division by something >= eps."""
    x = call.growth("input")
    p = _number(call, "p", 2.0)
    eps = _number(call, "eps", 1e-12)
    call.value("dim")
    if x is None:
        return CONSTANT
    if not (_is_number(eps) and eps > 0):
        return unknown("normalize with eps <= 0 (divides by a norm that may vanish)")
    if x.real is False:
        return Growth(0.0 if _is_number(p) and p >= 1 else x.q, depends=x.depends, real=False)
    if _is_number(p) and (p >= 1 or math.isinf(p) and p > 0):
        edge = 1.0 if p in (1, 2, math.inf) else 1.0 + 1e-5  # (sum |x|^p)^(1/p) may round below max |x_i| otherwise
        return Growth(0.0, depends=x.depends, range=domain.interval(-edge, edge)) if x.known or not x.depends else Growth(None, culprit=x.culprit)
    return Growth(x.q, depends=x.depends, culprit=x.culprit)


@transfer("batch_norm")
def batch_norm(call: Call, entry: Any) -> Any:
    """With batch statistics (training, or no running statistics) each entry is divided by its
    channel's batch standard deviation, which bounds it by sqrt(batch size): q = 0. With
    running statistics BatchNorm is the affine map gamma (x - mu) / sqrt(var + eps) + beta,
    q = 1: the running buffers are per-parameter constants. InstanceNorm likewise
    (use_input_stats)."""
    x = call.growth("input")
    weight, bias = call.growth("weight"), call.growth("bias")
    mean, var = call.growth("running_mean"), call.growth("running_var")
    training = call.param("training", call.param("use_input_stats", False))
    if call.op in ("_native_batch_norm_legit_no_training", "_batch_norm_no_update"):
        training = False
    elif call.op in ("_native_batch_norm_legit_functional", "_native_batch_norm_legit", "_batch_norm_with_update"):
        training = True if call.op != "_native_batch_norm_legit" else call.param("training", True)
    if call.op == "instance_norm":
        training = call.param("use_input_stats", True)
    ok = _eps_ok(call, "eps", 1e-5)
    call.accept_params()
    if x is None:
        return CONSTANT
    if mean is None and var is None:
        training = True  # no running statistics: batch statistics whatever the mode
    if training:
        out = _normalized(x, weight, bias, entry.name, eps_ok=ok)
    else:
        running = [g for g in (mean, var) if g is not None and g.depends]
        if running:
            return unknown(f"{entry.name} whose running statistics depend on the input")
        trusted = _running_variance_ok(call, ok)
        if trusted is not None:
            return unknown(f"{entry.name} with running statistics: {trusted}")
        centred = combine_max(x, mean)
        out = combine_product(centred, weight) if weight is not None else centred
        out = combine_max(out, bias) if bias is not None else out
    stats = Growth(x.q, depends=x.depends, culprit=x.culprit)  # saved means, inverse deviations (bounded by eps), reserve
    return outputs(call, out, rest=stats)


def _running_variance_ok(call: Call, eps_ok: bool) -> Optional[str]:
    """Why (x - mu) / sqrt(var + eps) may not be finite, if it may: var must be a buffer (the
    norm's own statistics, a mean of squares, >= 0; a parameter or an expression can go
    negative) and var + eps > 0 for every entry (checked on its value when it has one)."""
    import torch

    source = _argument_node(call, "running_var")
    if source is None:
        return None
    if getattr(source, "op", None) != "get_attr":
        return "the running variance is computed, so it may be negative"
    owner = source.graph.owning_module
    try:
        value = owner.get_buffer(str(source.target)) if owner is not None else None
    except AttributeError:  # not a buffer: a parameter (or an attribute fx lifted)
        return "the running variance is a parameter, which may be negative"
    eps = _number(call, "eps", 1e-5)
    if not isinstance(value, torch.Tensor) or value.is_meta:
        return None if eps_ok else "eps <= 0 with a running variance that may be 0"
    if not bool((value + (eps if _is_number(eps) else 0.0) > 0).all()):
        return "var + eps <= 0 for some channel (NaN or inf)"
    return None


# --- reductions -------------------------------------------------------------------------------


@transfer("diff")
def diff(call: Call, entry: Any) -> Any:
    """diff(x, n, dim, prepend, append): forward differences of cat(prepend, x, append), each
    entry a signed sum of at most 2^n entries: ||diff|| <= 2^n ||cat(...)||, the largest exponent."""
    parts = [g for name in ("input", "prepend", "append") if (g := call.growth(name)) is not None]
    call.accept_params()
    return combine_max(*parts)


@transfer("reduce")
def reduce(call: Call, entry: Any) -> Any:
    """Sums and means are linear (a mean stays within the entries' range, a sum keeps their
    sign); max/min/median select an entry; logsumexp <= max|x| + log n. Each is bounded by
    C ||x||."""
    x = call.growth("input")
    call.accept_params()
    if x is None:
        return CONSTANT
    if call.op not in ("sum", "nansum", "cumsum", "trace") and (degenerate := _degenerate(call)) is not None:
        return unknown(degenerate)  # mean of nothing is NaN, logsumexp of nothing -inf
    r = _range_of(x)
    if call.op in ("sum", "nansum", "cumsum", "trace"):
        r = Range(lo=0.0 if r.nonneg else -math.inf, hi=0.0 if r.nonpos else math.inf, pos=r.pos, neg=r.neg)
    elif call.op in ("logsumexp", "logcumsumexp"):
        r = Range(lo=r.lo if r.lo > -math.inf else -math.inf, below=r.below)
    values = Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real, range=r, culprit=x.culprit)
    if call.op in ("max", "min", "median", "nanmedian") and call.has("other"):
        return maximum(call, entry)
    if _returns_indices(call, entry):
        return (values, Growth(0.0, depends=x.depends, range=Range(lo=0.0)))
    return values


def _returns_indices(call: Call, entry: Any) -> bool:
    schema = getattr(call.node.target, "_schema", None) if call.node is not None else None
    if schema is not None:
        return len(schema.returns) > 1
    return call.op in ("sort", "topk", "kthvalue", "mode", "cummax", "cummin", "aminmax") or (
        call.op in ("max", "min", "median", "nanmedian") and call.has("dim"))


@transfer("indexed")
def indexed(call: Call, entry: Any) -> Any:
    """sort / topk / kthvalue / mode / cummax: (values, indices); the values are entries of the
    input, the indices bounded integers."""
    x = call.growth("input")
    call.accept_params()
    if x is None:
        return CONSTANT
    indices = Growth(0.0, depends=x.depends, range=Range(lo=0.0))
    if call.op == "aminmax":
        return outputs(call, x, x)
    return outputs(call, x, indices)


@transfer("norm")
def norm(call: Call, entry: Any) -> Any:
    """A p-norm is positively 1-homogeneous and >= 0 for p > 0 (inf included): q = q_x. p = 0
    counts non-zero entries: bounded by the size. Matrix norms are homogeneous too."""
    x = call.growth("input")
    p = None
    for name in ("p", "ord"):
        if call.has(name):
            p = call.value(name)
    call.accept_params()
    if x is None:
        return CONSTANT
    if isinstance(p, Growth):
        return unknown("a norm whose order is computed")
    if _is_number(p) and p == 0:
        return Growth(0.0, depends=x.depends, range=Range(lo=0.0))
    return Growth(x.q if x.depends else 0.0, depends=x.depends, range=Range(lo=0.0), culprit=x.culprit)


def _reduced_count(call: Call, dim: Any = "read") -> Optional[int]:
    """How many entries each output of a reduction reads (None when the shape is not known)."""
    shape = _input_shape(call)
    if shape is None:
        return None
    dim = call.param("dim", None) if dim == "read" else dim
    dims = [] if dim is None else list(dim) if isinstance(dim, (list, tuple)) else [dim]
    try:
        return math.prod(shape[d] for d in dims) if dims else math.prod(shape)
    except (IndexError, TypeError):
        return None


def _degenerate(call: Call, correction: int = 0, dim: Any = "read") -> Optional[str]:
    """A reduction over no entries (mean NaN, logsumexp -inf), or a variance over no more
    entries than its correction (n - correction <= 0: NaN or inf)."""
    count = _reduced_count(call, dim)
    if count is not None and count <= correction:
        return f"{call.op} over {count} entr{'y' if count == 1 else 'ies'} (correction {correction}): not finite"
    return None


@transfer("moment")
def moment(call: Call, entry: Any) -> Any:
    """var(x) <= mean(x^2) is quadratic (q = 2 q_x); std = sqrt(var) is 1-homogeneous; both >= 0.
    var_mean / std_mean also return the mean (q_x, inside the entries' range). Over no more
    entries than the correction (std of one entry, unbiased) they are NaN: unknown."""
    x = call.growth("input")
    correction, unbiased, dim = call.param("correction", None), call.param("unbiased", True), call.param("dim", None)
    if isinstance(unbiased, int) and not isinstance(unbiased, bool):  # x.std(0) bound to std(unbiased): a dim
        dim, unbiased = unbiased, True
    correction = int(correction) if _is_number(correction) else (1 if unbiased is not False else 0)
    call.accept_params()
    if x is None:
        return CONSTANT
    degenerate = _degenerate(call, correction, dim)
    if degenerate is not None:
        return unknown(degenerate)
    if x.real is False:
        spread_q = algebra.compose(2.0, x.q) if call.op.startswith("var") else x.q
        spread = Growth(spread_q if x.depends else 0.0, depends=x.depends, real=True, range=Range(lo=0.0), culprit=x.culprit)
    else:
        spread_q = algebra.compose(2.0, x.q) if call.op.startswith("var") else x.q
        spread = Growth(spread_q if x.depends else 0.0, depends=x.depends, range=Range(lo=0.0), culprit=x.culprit)
    if call.op in ("var_mean", "std_mean"):
        mean = Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real, range=_range_of(x), culprit=x.culprit)
        return (spread, mean)
    return spread


@transfer("prod")
def prod(call: Call, entry: Any) -> Any:
    """prod multiplies k entries: q = k q_x by Theorem 9(iii), with k from the traced shapes.
    Without shapes k is unknown, and so is the exponent."""
    x = call.growth("input")
    dim = call.param("dim")
    call.accept_params()
    if x is None or not x.depends:
        return Growth(0.0, depends=False) if x is not None else CONSTANT
    shape = _input_shape(call)
    if shape is None:
        return unknown("prod over a dimension of unknown size")
    k = 1
    if dim is None:
        for size in shape:
            k *= int(size)
    else:
        k = int(shape[dim])
    return Growth(algebra.compose(float(k), x.q), culprit=x.culprit)


def _argument_shape(call: Call, name: str) -> Optional[tuple]:
    from qlint.core.graph import shape_of

    return shape_of(_argument_node(call, name))


def _input_shape(call: Call) -> Optional[tuple]:
    """The first argument's shape when every length is a number (a symbolic length: None)."""
    return sizes(call.node.args[0] if call.node is not None and call.node.args else None)


@transfer("regression_loss")
def regression_loss(call: Call, entry: Any) -> Any:
    """Losses of an error e = input - target, |e| <= |input| + |target| (the larger exponent,
    Theorem 9(ii)): mse is e^2 (twice it), l1 |e|, Huber and smooth-L1 quadratic inside
    delta and linear outside (|e| up to a constant). A weight multiplies each term (exponents
    add); the mean or sum over entries counts them, a shape, not a size of the input. The mean
    of no entries is NaN."""
    error = combine_max(call.growth("input"), call.growth("target"), r=Range(lo=0.0), real=True)
    weight = call.growth("weight")
    call.accept_params()
    empty = any(isinstance(n, int) and n == 0 for n in _argument_shape(call, "input") or ())
    if empty and call.param("reduction", "mean") in ("mean", 1):  # aten spells mean 1
        return unknown(f"{call.op} of no entries (a mean of nothing is NaN)")
    loss = combine_product(error, error, r=Range(lo=0.0), real=True) if call.op == "mse_loss" else error
    return loss if weight is None else combine_product(loss, weight, r=domain.mul(loss.range, _range_of(weight)))


@transfer("concat")
def concat(call: Call, entry: Any) -> Any:
    """||cat(a, b)||^2 = ||a||^2 + ||b||^2: the largest exponent dominates (Theorem 9(ii))."""
    parts = call.growths("tensors")
    call.accept_params()
    if not parts:
        return CONSTANT
    return combine_max(*parts, r=domain.union(*[_range_of(p) for p in parts]))


@transfer("write")
def write(call: Call, entry: Any) -> Any:
    """scatter / index_put / index_add / slice_scatter ...: each output entry is an entry of the
    data or a written value (a sum of them when accumulating, scaled by alpha): Theorem 9(ii)."""
    data = call.growth("input")
    values = [g for name in ("src", "source", "values", "value") if (g := call.growth(name)) is not None]
    alpha = call.operand("alpha", 1)
    call.selectors("index", "indices", "mask")
    call.accept_params()
    values = [_scaled(v, alpha) for v in values]
    reduce_kind = call.param("reduce", None)
    if reduce_kind not in (None, "add", "sum", "mean", "amax", "amin"):
        call.every()
        return unknown(f"{call.op} with reduce={reduce_kind!r} (a product of entries, or a reduction qlint cannot bound)")
    accumulate = call.op in ("scatter_add", "index_add") or reduce_kind in ("add", "sum") or bool(call.param("accumulate", False))
    present = [g for g in [data, *values] if g is not None]
    if not present:
        return CONSTANT
    ranges = [_range_of(g) for g in present]
    if accumulate:
        r = Range(lo=0.0 if all(x.nonneg for x in ranges) else -math.inf, hi=0.0 if all(x.nonpos for x in ranges) else math.inf)
    else:
        r = domain.union(*ranges)
    return combine_max(*present, r=r)


@transfer("scatter_reduce")
def scatter_reduce(call: Call, entry: Any) -> Any:
    """sum / mean / amax / amin reductions are bounded by their inputs; a product is not."""
    reduce_kind = call.param("reduce")
    if reduce_kind == "prod":
        call.every()
        return unknown("scatter_reduce with reduce='prod' (a product of an unknown number of entries)")
    return write(call, entry)


@transfer("lp_pool")
def lp_pool(call: Call, entry: Any) -> Any:
    """lp_pool(x, p): q = 1 and >= 0 for an even p > 0, or p > 0 of a nonnegative input; refused otherwise."""
    x = call.growth("input")
    p = _number(call, "norm_type", None)
    call.accept_params()
    if x is None:
        return CONSTANT
    even = _is_number(p) and math.isfinite(p) and p > 0 and p == int(p) and int(p) % 2 == 0
    nonneg = _is_number(p) and math.isfinite(p) and p > 0 and x.real is True and x.range.nonneg
    if x.real is not True or not (even or nonneg):
        call.every()
        return unknown(f"lp_pool with p = {p} of a value that may be negative (NaN), or p <= 0 (a pole)")
    return Growth(algebra.compose(1.0, x.q) if x.depends else 0.0, depends=x.depends, range=Range(lo=0.0), culprit=x.culprit)


@transfer("bincount")
def bincount(call: Call, entry: Any) -> Any:
    """Counts are bounded by the number of entries (histc, bincount); with weights, each bin is a
    sum of weights: the weights' exponent. histogram also returns its bin edges, which span
    the data's range: the data's exponent."""
    weights = call.growth("weights")
    data = call.growth("input")
    call.accept_params()
    depends = any(g.depends for g in call.every())
    if call.op == "bincount" and data is not None and data.depends and not math.isfinite(_range_of(data).hi):
        return unknown("bincount of indices computed from the input with no upper bound (its length grows with them)")
    counts = combine_max(weights) if weights is not None else Growth(0.0, depends=depends, range=Range(lo=0.0))
    if call.op == "histogram":  # (counts, bin edges): the edges span [min x, max x], linear in x
        edges = Growth(data.q, depends=data.depends, real=data.real, culprit=data.culprit) if data is not None else CONSTANT
        return (counts, edges)
    return counts


@transfer("indices")
def indices(call: Call, entry: Any) -> Any:
    """argmax / argsort / nonzero / searchsorted / bucketize: integer positions, bounded by the
    tensor's shape whatever the magnitude (nonzero's length is at most the input's numel)."""
    depends = any(g.depends for g in call.every())
    return Growth(0.0, depends=depends, range=Range(lo=0.0))


@transfer("indicator")
def indicator(call: Call, entry: Any) -> Any:
    """Comparisons, logical ops, isnan/isinf, sign: values in {-1, 0, 1}: bounded."""
    depends = any(g.depends for g in call.every())
    lo = -1.0 if call.op in ("sign", "sgn") else 0.0
    return Growth(0.0, depends=depends, range=domain.interval(lo, 1.0))


@transfer("bounded")
def bounded(call: Call, entry: Any) -> Any:
    """A map whose output is bounded whatever all of its inputs are (atan2, cosine similarity
    with eps > 0, one_hot, angle)."""
    if call.has("eps") and not _eps_ok(call, "eps", 1e-8):
        call.every()
        return unknown(f"{entry.name} with eps <= 0")
    tau = _number(call, "tau", 1.0)
    if call.has("tau") and not (_is_number(tau) and tau > 0 and math.isfinite(tau)):
        call.every()
        return unknown(f"{entry.name} with tau = {tau} (softmax(logits / tau) is NaN at tau = 0)")
    depends = any(g.depends for g in call.every())
    complex_input = any(g.real is False and g.depends for g in call.every())
    if complex_input and "complex" not in entry.family:
        return unknown(f"{entry.name} of a complex value")
    return Growth(0.0, depends=depends, range=entry.declared_range(ANY))


@transfer("one_hot")
def one_hot(call: Call, entry: Any) -> Any:
    """0 or 1 entries; unknown when the width (num_classes = -1) is read off input-dependent indices."""
    classes = _number(call, "num_classes", -1)
    depends = any(g.depends for g in call.every())
    if depends and not (_is_number(classes) and classes > 0):
        return unknown("one_hot with num_classes = -1 of indices computed from the input (its width grows with them)")
    return Growth(0.0, depends=depends, range=entry.declared_range(ANY))


@transfer("maxof")
def maxof(call: Call, entry: Any) -> Any:
    """Maps bounded by their largest input: hypot, logaddexp (= max + log(1 + e^-|a-b|)),
    distances (||x - y|| <= ||x|| + ||y||), bitwise and/or/xor of integers, complex(re, im)."""
    growths = call.every()
    if call.op in ("cdist", "_cdist_forward", "pdist", "_pdist_forward", "pairwise_distance", "hypot"):
        r = Range(lo=0.0)
    elif call.op in ("logaddexp", "logaddexp2"):
        r = Range(lo=max([g.range.lo for g in growths if g.real is True] or [-math.inf]))
    else:
        r = ANY
    real = False if call.op in ("complex", "polar") else "auto"
    if call.op == "polar":
        magnitude = call.growth("abs")
        return combine_max(magnitude, Growth(0.0, depends=any(g.depends for g in growths)), real=False)
    if any(g.real is False and g.depends for g in growths) and call.op not in ("complex",):
        return unknown(f"{entry.name} of a complex value")
    return combine_max(*growths, r=r, real=real)


@transfer("shift")
def shift(call: Call, entry: Any) -> Any:
    """a << b = a * 2^b: exponential in b, so b must not depend on the input."""
    a, b = call.growth("input"), call.growth("other")
    if b is not None and b.depends:
        return Growth(algebra.SUPERPOLYNOMIAL if b.known else None, culprit=f"{entry.id} by an input-dependent amount")
    return combine_max(a)


@transfer("fmod")
def fmod(call: Call, entry: Any) -> Any:
    """fmod(a, b) has |.| <= min(|a|, |b|); a % b (remainder) lies between 0 and b. Both are
    NaN at b = 0, so a divisor computed from the input must stay away from 0."""
    a, b = call.growth("input"), call.growth("other")
    if a is None or b is None:
        return CONSTANT
    raw = call.value("other")
    if (_is_number(raw) and raw == 0) or (b.depends and _reciprocal_range(b) is None):
        return unknown(f"{entry.id} by a divisor that may be 0")
    if not b.depends and _reciprocal_range(b) is None and not nonzero_constant(call, "other"):
        call.hazard(f"{entry.id} by a parameter expression that may be 0", "other", _has_zero)
    if a.real is False or b.real is False:
        return unknown(f"{entry.id} of complex values")
    if entry.id == "remainder":
        r = Range(lo=min(0.0, b.range.lo), hi=max(0.0, b.range.hi), below=b.range.below, above=b.range.above)
        return Growth(b.q if b.depends else 0.0, depends=a.depends or b.depends, range=r, culprit=b.culprit)
    qs = [g.q if g.depends else 0.0 for g in (a, b)]
    if any(q is None for q in qs):
        return Growth(None, culprit=_culprit(a, b))
    return Growth(min(qs), depends=a.depends or b.depends)


@transfer("rounding")
def rounding(call: Call, entry: Any) -> Any:
    """floor / ceil / round / trunc move each entry by less than 1: |round(x)| <= |x| + 1
    (``round(x, decimals=d)`` by less than 10^-d); frac(x) = x - trunc(x) lies in (-1, 1)."""
    x = call.growth("input")
    call.accept_params()
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown(f"{call.op} of a complex value")
    if call.op == "frac":
        return Growth(0.0, depends=x.depends, range=domain.interval(-1.0, 1.0))
    decimals = _number(call, "decimals", 0)
    if not _is_number(decimals):
        return unknown(f"{call.op} to decimals qlint cannot read")
    unit = 10.0 ** (-int(decimals))  # round(x, d) moves x by at most half of 10^-d
    r = _range_of(x)
    return Growth(x.q if x.depends else 0.0, depends=x.depends,
                  range=Range(lo=r.lo - unit, hi=r.hi + unit, below=r.below, above=r.above), culprit=x.culprit)


@transfer("softplus")
def softplus(call: Call, entry: Any) -> Any:
    """softplus(x) = log(1 + e^(beta x)) / beta: |.| <= |x| + log(2)/|beta| (q = 1) for beta != 0;
    positive only for beta > 0 with a threshold >= 0 (above the threshold it returns x)."""
    x = call.growth("input")
    beta, threshold = _number(call, "beta", 1), _number(call, "threshold", 20)
    if x is None:
        return CONSTANT
    if not _is_number(beta) or beta == 0:
        return unknown("softplus with beta = 0 or a beta qlint cannot read")
    if x.real is False:
        return unknown("softplus of a complex value")
    r = Range(lo=0.0, pos=True) if beta > 0 and _is_number(threshold) and threshold >= 0 else (
        Range(hi=0.0, neg=True) if beta < 0 and _is_number(threshold) and threshold >= 0 else ANY)
    if not x.depends:
        return Growth(0.0, depends=False, range=r)
    return Growth(algebra.compose(1.0, x.q), range=r, culprit=x.culprit)


@transfer("activation")
def activation(call: Call, entry: Any) -> Any:
    """Lipschitz activations with a parameter (ELU/CELU alpha, LeakyReLU slope, RReLU bounds,
    shrinkage lambda, threshold value): |sigma(x)| <= L|x| + b for every parameter value, so
    q = 1; the declared lower bound holds only at the default parameters.

    Every such parameter must be finite. Except CELU with alpha <= 0 (and ATen's ELU with
    input_scale <= 0, the same exponential on -x): celu(x) = max(0, x) + min(0, alpha (exp(x/alpha) - 1)), and
    for alpha < 0 the exponential runs on -x/|alpha|, unbounded as x -> -inf (alpha = 0 divides
    by 0). ELU's alpha (exp(x) - 1) for x < 0 is bounded by |alpha| whatever its sign."""
    for name in ("alpha", "scale", "input_scale", "negative_slope", "lower", "upper", "lambd", "value"):
        number = _number(call, name, 0.0)
        if _is_number(number) and not math.isfinite(number):
            call.every()
            return unknown(f"{call.op} with {name} = {number}")
    if call.op == "celu":
        alpha = _number(call, "alpha", 1.0)
        if not (_is_number(alpha) and alpha > 0):
            call.every()
            return unknown(f"celu with alpha = {alpha} (not > 0): it grows like exp(|x|/|alpha|)")
    if call.op == "elu" and call.has("input_scale"):  # aten.elu(x, alpha, scale, input_scale): alpha (exp(input_scale x) - 1)
        input_scale = _number(call, "input_scale", 1.0)
        if not (_is_number(input_scale) and input_scale > 0):
            call.every()
            return unknown(f"elu with input_scale = {input_scale} (not > 0): its negative branch grows like exp(|x|)")
    return default(call, entry)


@transfer("prelu")
def prelu(call: Call, entry: Any) -> Any:
    """prelu(x, w) = max(0, x) + w min(0, x): with a weight computed from the input the exponents
    add (Theorem 9(iii))."""
    x, weight = call.growth("input"), call.growth("weight")
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown("prelu of a complex value")
    return combine_product(x, weight)


@transfer("glu")
def glu(call: Call, entry: Any) -> Any:
    """glu(x) = a * sigmoid(b) for the two halves of x: q_a + 0 (Theorem 9(iii))."""
    x = call.growth("input")
    call.value("dim")
    if x is None:
        return CONSTANT
    if x.real is False:
        return unknown("glu of a complex value")
    return Growth(x.q if x.depends else 0.0, depends=x.depends, culprit=x.culprit)


@transfer("threshold")
def threshold(call: Call, entry: Any) -> Any:
    """threshold(x, t, v) is x where x > t and the constant v elsewhere: |out| <= |x| + |v|."""
    x = call.growth("input")
    call.param("threshold")
    value = call.growth("value")
    if x is None:
        return CONSTANT
    return combine_max(x, value)


@transfer("dropout")
def dropout(call: Call, entry: Any) -> Any:
    """Dropout zeroes entries and rescales the rest by 1/(1-p): ||out|| <= ||x||/(1-p), signs kept
    (alpha dropout is an affine map with bounded coefficients); the mask is 0 or 1."""
    x = call.growth("input")
    p = _number(call, "p", 0.5)
    call.accept_params()
    if x is None:
        return CONSTANT
    alpha = "alpha" in call.op
    if alpha or not _is_number(p) or p >= 1:
        out = Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real, culprit=x.culprit)
    else:
        r = _range_of(x)
        scale = 1.0 / (1.0 - p)
        out = Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real,
                     range=Range(lo=min(0.0, r.lo * scale), hi=max(0.0, r.hi * scale), below=r.below, above=r.above), culprit=x.culprit)
    if call.op == "native_dropout":
        return (out, Growth(0.0, depends=x.depends, range=domain.interval(0, 1)))
    return out


@transfer("attention")
def attention(call: Call, entry: Any) -> Any:
    """Table 1: the weights softmax(Q K^T / sqrt(d_k) + mask) are row-stochastic whatever Q, K,
    the mask and the scale are (q = 0), so the output inherits the exponent of V alone and,
    without dropout, stays within V's range. The ATen kernels also return the log-sum-exp of
    the logits (bilinear in Q and K) and bookkeeping."""
    # the logits' inputs: whatever they are, the weights are row-stochastic
    call.selectors("query", "key", "attn_mask", "attn_bias", "scale", "cum_seq_q", "cum_seq_k", "dropout_mask")
    call.accept_params()
    value = call.growth("value")
    if value is None:
        return CONSTANT
    dropout_p = call.param("dropout_p", 0.0)
    r = _range_of(value) if (dropout_p in (0, 0.0, None)) else ANY
    out = Growth(value.q if value.depends else 0.0, depends=call.depends_any(), real=value.real, range=r, culprit=value.culprit)
    if call.op == "scaled_dot_product_attention":
        return out
    query, key = call.growth("query"), call.growth("key")
    logits = combine_product(query, key)  # the weights (math kernel) or the log-sum-exp: at most bilinear in q, k
    return outputs(call, out, logits, rest=Growth(0.0, depends=False))  # sequence lengths, RNG state


@transfer("flex_attention")
def flex_attention(call: Call, entry: Any) -> Any:
    """flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
    score_mod_other_buffers, mask_mod_other_buffers): row-stochastic weights whatever the logits
    (see the entry), so the output has the value's exponent; every other argument only shapes the
    weights."""
    value = call.growth("value")
    call.selectors("query", "key", "score_mod", "block_mask", "scale", "score_mod_other_buffers", "mask_mod_other_buffers")
    call.accept_params()
    if value is None:
        return unknown("flex_attention whose value argument qlint cannot find")
    out = Growth(value.q if value.depends else 0.0, depends=call.depends_any(), real=value.real, range=_range_of(value),
                 culprit=value.culprit)
    return outputs(call, out)


@transfer("mha_functional")
def mha_functional(call: Call, entry: Any) -> Any:
    """F.multi_head_attention_forward: W_O softmax(.) (W_V value + b_v) + b_o; query and key only
    enter the row-stochastic weights, so the output is multilinear in the value and the value /
    output projections (parameters, normally). The returned weights are in [0, 1]."""
    value = call.growth("value")
    static = call.growth("static_v")  # given static values replace the projected ones
    if static is not None:
        value = combine_max(value, static)
    weights = [call.growth(n) for n in ("in_proj_weight", "v_proj_weight", "out_proj_weight")]
    biases = [call.growth(n) for n in ("in_proj_bias", "bias_v", "out_proj_bias", "bias_k")]
    call.selectors("query", "key", "q_proj_weight", "k_proj_weight", "key_padding_mask", "attn_mask", "static_k")
    call.accept_params()
    side = combine_product(value, *[w for w in weights if w is not None])
    output = combine_max(side, *[b for b in biases if b is not None])
    depends = call.depends_any()
    output = Growth(output.q, depends=depends, real=output.real, culprit=output.culprit) if depends and not output.depends else output
    return (output, Growth(0.0, depends=depends, range=domain.interval(0, 1)))


@transfer("mha_module")
def mha_module(call: Call, entry: Any) -> Any:
    """nn.MultiheadAttention (a leaf: its forward branches on shapes): Table 1, the output is
    linear in ``value`` through W_V and W_O (parameters); ``query``/``key``/masks only enter the
    row-stochastic weights."""
    value = call.growth("value")
    call.selectors("query", "key", "key_padding_mask", "attn_mask")
    call.accept_params()
    depends = call.depends_any()
    if value is None:
        return CONSTANT
    out = Growth(value.q if value.depends else 0.0, depends=depends, real=value.real, culprit=value.culprit)
    return (out, Growth(0.0, depends=depends, range=domain.interval(0, 1)))


@transfer("recurrent")
def recurrent(call: Call, entry: Any) -> Any:
    """Recurrent layers over a sequence of fixed length T (nn.LSTM / GRU / RNN and their ATen ops).

    LSTM: h_t = o_t * tanh(c_t) with o_t in (0, 1): the output and h_n are bounded whatever the
    input (q = 0); c_t = f c_{t-1} + i g with |g| <= 1 gives |c_T| <= |c_0| + T: c_n has the
    exponent of the initial state. GRU: h_t = (1 - z) n + z h_{t-1} with n in (-1, 1), z in
    (0, 1): |h_t| <= max(1, |h_0|), the initial state's exponent. RNN(tanh) is bounded; RNN(relu)
    composes T affine maps and ReLU: positively homogeneous of degree 1 in (x, h_0), q = 1.
    """
    module = call.module
    x = call.growth("input")
    state_names = ("hx", "h0", "c0", "hidden")
    states = [g for name in state_names for g in call.growths(name)]
    call.accept_params()
    # the weights are every other argument, told apart by name (never by comparing values)
    parameters = [g for name in call.arguments if name != "input" and name not in state_names for g in call.growths(name)]
    if any(g.depends for g in parameters):
        return unknown(f"{entry.name} with weights computed from the input")
    kind = call.op
    if module is not None:
        kind = {"LSTM": "lstm", "GRU": "gru", "RNN": "rnn", "LSTMCell": "lstm_cell", "GRUCell": "gru_cell",
                "RNNCell": "rnn_cell"}[type(module).__name__]
        if kind.startswith("rnn"):  # the forward dispatches on `mode`, set at construction (not `nonlinearity`)
            mode = getattr(module, "mode", None) if kind == "rnn" else getattr(module, "nonlinearity", None)
            if mode not in ("RNN_TANH", "RNN_RELU", "tanh", "relu"):
                return unknown(f"{entry.name} of mode {mode!r}")
            kind = kind.replace("rnn", "rnn_relu" if mode in ("RNN_RELU", "relu") else "rnn_tanh")
    initial = combine_max(*states) if states else Growth(0.0, depends=False)
    depends = (x is not None and x.depends) or initial.depends
    bounded_out = Growth(0.0, depends=depends, range=domain.interval(-1, 1))
    if kind.startswith("lstm"):
        c_n = Growth(initial.q if initial.depends else 0.0, depends=depends, culprit=initial.culprit)
        out = bounded_out if module is None or not getattr(module, "proj_size", 0) else Growth(0.0, depends=depends)
        if kind == "lstm_cell":
            return (out, c_n)
        return (out, out, c_n) if module is None else (out, (out, c_n))
    if kind.startswith("gru"):
        h = Growth(initial.q if initial.depends else 0.0, depends=depends, culprit=initial.culprit)
        if kind == "gru_cell":
            return h
        return (h, h) if module is None else (h, h)
    if kind.startswith("rnn_tanh"):
        if kind.endswith("cell"):
            return bounded_out
        return (bounded_out, bounded_out)
    joint = combine_max(x, initial)
    out = Growth(algebra.compose(1.0, joint.q) if joint.depends else 0.0, depends=depends, range=Range(lo=0.0), culprit=joint.culprit)
    if kind.endswith("cell"):
        return out
    return (out, out)


@transfer("declared")
def declared(call: Call, entry: Any) -> Any:
    """A user-declared opaque module: compose(q_declared, max q_in) over all of its inputs."""
    growths = call.every()
    dependent = [g for g in growths if g.depends]
    if not dependent:
        return CONSTANT
    joint = algebra.parallel_sum(g.q for g in dependent)
    return Growth(algebra.compose(entry.exponent, joint), real=None, culprit=_culprit(*dependent))


@transfer("interpolate")
def interpolate(call: Call, entry: Any) -> Any:
    """Resampling is a linear map with bounded gain: nearest / linear / bilinear / trilinear /
    area weights are convex (the range is kept); bicubic weights are not."""
    x = call.growth("input")
    mode = call.param("mode", "nearest")
    call.accept_params()
    if x is None:
        return CONSTANT
    convex = mode in ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "area") and "bicubic" not in call.op
    r = _range_of(x) if convex else ANY
    return Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real, range=r, culprit=x.culprit)


@transfer("pad")
def pad(call: Call, entry: Any) -> Any:
    """Padding copies entries and adds constants: |out| <= max(|x|, |value|)."""
    x = call.growth("input")
    mode = call.param("mode", "constant")
    value = call.operand("value", 0.0)
    call.accept_params()
    if x is None:
        return CONSTANT
    if isinstance(value, Growth):
        return combine_max(x, value, r=domain.union(_range_of(x), _range_of(value)))
    fill = 0.0 if value is None else float(value)
    r = domain.union(_range_of(x), domain.point(fill)) if mode == "constant" else _range_of(x)
    return Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real, range=r, culprit=x.culprit)


@transfer("grid_sample")
def grid_sample(call: Call, entry: Any) -> Any:
    """Each output entry combines at most 4 (8 in 3-D, 16 bicubic) input entries with weights
    bounded by a constant whatever the grid: bounded by the input alone (the grid selects)."""
    x = call.growth("input")
    call.selectors("grid")
    mode = call.param("mode", call.param("interpolation_mode", "bilinear"))
    call.accept_params()
    if x is None:
        return CONSTANT
    convex = mode in ("bilinear", "nearest", 0, 1)
    r = domain.union(_range_of(x), domain.point(0.0)) if convex else ANY
    return Growth(x.q if x.depends else 0.0, depends=x.depends or call.depends_any(), real=x.real, range=r,
                  culprit=x.culprit)


@transfer("copy")
def copy(call: Call, entry: Any) -> Any:
    """copy(dst, src) holds src's values broadcast to dst's shape: the bound of src."""
    call.meta("input")
    call.accept_params()
    src = call.growth("src")
    return src if src is not None else CONSTANT


@transfer("getattr")
def get_attribute(call: Call, entry: Any) -> Any:
    """x.shape / x.dtype are metadata; x.T, x.mT, x.real, x.imag, x.data are the data itself."""
    source = call.operand("input")
    name = call.param("name")
    if name in META_ATTRIBUTES:
        return CONSTANT
    if isinstance(source, tuple):  # a named tuple's field: an output of a multi-output op
        return combine_max(*[s for s in source if isinstance(s, Growth)])
    if not isinstance(source, Growth):
        return CONSTANT
    if name in ("real", "imag"):
        return Growth(source.q if source.depends else 0.0, depends=source.depends, real=True if source.real is not None else None,
                      range=source.range if (name == "real" and source.real is True) else ANY, culprit=source.culprit)
    if name in ("T", "mT", "H", "mH", "data"):
        return source
    return unknown(f"attribute `{name}` of a tensor")




@transfer("complex_view")
def complex_view(call: Call, entry: Any) -> Any:
    """view_as_real / view_as_complex / real / imag / conj / angle / FFTs: a complex view keeps
    the norm (Plancherel: the DFT is sqrt(n) times unitary); the realness changes."""
    x = call.growth("input")
    call.accept_params()
    if x is None:
        return CONSTANT
    real = {"real": True, "complex": False}.get(entry.real or "", x.real)
    if call.op == "angle":
        return Growth(0.0, depends=x.depends, range=domain.interval(-math.pi, math.pi))
    keep = real is True and x.real is True and "preserves_range" in entry.family  # not an inverse real DFT: mixes signs
    return Growth(x.q if x.depends else 0.0, depends=x.depends, real=real, range=x.range if keep else ANY, culprit=x.culprit)


@transfer("sequence")
def sequence(call: Call, entry: Any) -> Any:
    """Python sequence plumbing (tuple/list construction from values): the largest input."""
    growths = call.every()
    return combine_max(*growths) if growths else CONSTANT


@transfer("no_value")
def no_value(call: Call, entry: Any) -> Any:
    """Assertions and grad-mode / autocast markers: no value of the input flows out of them."""
    call.every()
    return CONSTANT


@transfer("random")
def random(call: Call, entry: Any) -> Any:
    """Samples: bernoulli is 0 or 1; normal(mean, std) is mean + std * N(0, 1), linear in both."""
    if call.op == "bernoulli":
        depends = any(g.depends for g in call.every())
        return Growth(0.0, depends=depends, range=domain.interval(0, 1))
    if call.op == "multinomial":
        depends = any(g.depends for g in call.every())
        return Growth(0.0, depends=depends, range=Range(lo=0.0))
    growths = call.every()
    return combine_max(*growths) if growths else CONSTANT


@transfer("erfcx")
def erfcx(call: Call, entry: Any) -> Any:
    """erfcx(x) in (0, 1] for x >= 0; bounded for a bounded argument; else e^(x^2) growth."""
    x = call.growth("input")
    if x is None or not x.depends:
        return Growth(0.0, depends=False) if x is not None else CONSTANT
    if x.real is not True:
        return unknown("erfcx of a complex (or unknown-dtype) value")
    if x.range.nonneg:
        return Growth(0.0, range=domain.interval(0.0, 1.0))
    if x.q == 0:
        return Growth(0.0, range=Range(lo=0.0))
    return Growth(algebra.SUPERPOLYNOMIAL if x.known else None, culprit="erfcx of an argument that may be negative (grows like e^(x^2))")


@transfer("unbounded")
def unbounded(call: Call, entry: Any) -> Any:
    """Registered only to be named: poles, NaN domains and super-polynomial special functions.

    Of a value that does not depend on the input (a parameter expression) it is a hazard,
    as log and sqrt of one are: asin(p) is NaN for every |p| > 1, atanh(p) infinite at 1.
    """
    inside = _within_domain(call)
    if inside is not None:
        return inside
    if not any(g.depends for g in call.every()):
        return hazard(f"{call.label()} of a parameter expression (a pole or a NaN domain for some parameter values)")
    return unknown(f"{call.label()} has no polynomial bound ({entry.q.removeprefix('none (').rstrip(')')})")


def _within_domain(call: Call) -> Optional[Growth]:
    """asin / acos of a value proved in [-1, 1] (acos(tanh z) of a Chebyshev KAN) lie in [-pi/2, pi/2] /
    [0, pi]: bounded; acosh of a value proved >= 1 is at most that value (acosh x <= x there)."""
    x = call.growth("input")
    if x is None or x.real is not True:
        return None
    r = x.range
    if call.op in ("asin", "arcsin", "acos", "arccos") and r.lo >= -1 and r.hi <= 1:
        bounds = (0.0, math.pi) if call.op in ("acos", "arccos") else (-math.pi / 2, math.pi / 2)
        return Growth(0.0, depends=x.depends, range=domain.interval(*bounds))
    if call.op in ("acosh", "arccosh") and r.lo >= 1:
        return Growth(x.q if x.depends else 0.0, depends=x.depends, range=Range(lo=0.0), culprit=x.culprit)
    return None


@transfer("fake_quantize")
def fake_quantize(call: Call, entry: Any) -> Any:
    """(clamp(round(x / s) + z, q_min, q_max) - z) s: every entry lies within |s| max(|q_min - z|,
    |q_max - z|) whatever x, so q = 0 in x for a scale that does not depend on it (a literal, a
    learned or observed scale), and q_s for one computed from x (dynamic quantization), which must
    stay away from 0 (x / s is NaN at s = 0). A parameter scale that may be 0 is a hazard (QL108).
    With ``fake_quant_enabled`` the op may pass x through unchanged: the larger of the two."""
    x, s, z = call.growth("input"), call.growth("scale"), call.growth("zero_point")
    low, high = call.param("quant_min"), call.param("quant_max")
    call.param("axis")
    call.param("grad_factor")
    if x is None or s is None or z is None or not all(isinstance(v, int) for v in (low, high)):
        call.every()
        return unknown(f"{entry.name} without readable quantization bounds")
    if z.depends:
        return unknown(f"{entry.name} with a zero point computed from the input")
    if s.depends and (_reciprocal_range(s) is None or s.real is not True):
        return unknown(f"{entry.name} by a scale computed from the input that may approach 0 (x / s is NaN at s = 0)")
    if not s.depends and not nonzero_constant(call, "scale"):
        call.hazard(f"{entry.name} by a scale that may be 0", "scale", _has_zero)
    span = ANY
    if not s.depends:  # |out| <= |s| max |q - z|: bounded for each parameter value, by numbers when s and z have them
        ends = [s.range.lo, s.range.hi, z.range.lo, z.range.hi]
        if all(math.isfinite(e) for e in ends):
            reach = max(abs(e) for e in ends[:2]) * max(abs(q - e) for q in (low, high) for e in ends[2:])
            span = Range(lo=-reach, hi=reach)
        else:
            span = Range(below=True, above=True)
    quantized = Growth(s.q if s.depends else 0.0, depends=x.depends or s.depends, real=True, range=span)
    if call.has("fake_quant_enabled"):
        enabled = call.growth("fake_quant_enabled")
        if enabled is not None and enabled.depends:
            return outputs(call, unknown(f"{entry.name} switched on and off by the input"), rest=Growth(0.0, range=domain.interval(0.0, 1.0)))
        quantized = combine_max(quantized, x)
    return outputs(call, quantized, rest=Growth(0.0, depends=x.depends, range=domain.interval(0.0, 1.0)))  # cachemask: the mask
