"""Transfers of the entries in ``rules/primitives/tensors.toml``: views, selections and casts,
constructors, reductions, writes into tensors, and the plumbing that carries no value.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from qlint.core import algebra, domain
from qlint.core.domain import ANY, CONSTANT, Growth, Range, unknown
from qlint.core.graph import META_ATTRIBUTES, dtype_of, sizes
from qlint.core.ops import Call, growths_in
from qlint.registry.transfers.arithmetic import maximum
from qlint.registry.transfers.base import transfer
from qlint.registry.transfers.combinators import combine_max, is_number, outputs, range_of, scaled


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
    if call.op in ("view", "view_copy", "_view_dtype") \
            and any(_is_dtype(v) for v in _flat(list(call.arguments.values()))):
        call.every()  # h.view(torch.int32): the same bits read as another type; (i * 2).view(float32) is not 2 h
        return unknown(f"`{call.op}` to another dtype reinterprets the bits: its values are not the input's")
    source = call.operand("input")
    index = call.value("index") if call.has("index") else None
    call.selectors("index", "indices", "mask", "repeats", "shifts", "offsets", "sorted_sequence")
    call.accept_params()
    if isinstance(source, tuple):  # a tuple-valued op (or a shape): getitem picks one output, a slice several
        if is_number(index) and -len(source) <= int(index) < len(source):
            call.picked.add("input")  # the other outputs are not read: their growth does not matter here
            return source[int(index)]
        if isinstance(index, slice) and all(v is None or is_number(v) for v in (index.start, index.stop, index.step)):
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
    # what the trace recorded: covers type_as(int), .to(int tensor), .type("torch.LongTensor")
    produced = dtype_of(call.node)
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

    integer = isinstance(dtype, torch.dtype) and not dtype.is_floating_point and dtype != torch.bool \
        and not dtype.is_complex
    limits = torch.iinfo(dtype) if integer else None
    if limits is not None and (limits.bits >= 64 or limits.min <= r.lo and r.hi <= limits.max):  # int64: past 9.2e18
        return Range(lo=math.trunc(r.lo) if r.lo > -math.inf else -math.inf,
                     hi=math.trunc(r.hi) if r.hi < math.inf else math.inf, below=r.below, above=r.above)
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
    if not all(is_number(v) for v in raw.values()):
        return Growth(0.0, depends=False)
    try:
        made = getattr(torch, call.op)(**{k: v for k, v in raw.items()}) if call.op != "range" else torch.arange(
            raw.get("start", 0), raw.get("end", 0) + raw.get("step", 1), raw.get("step", 1))
    except (TypeError, RuntimeError, ValueError):
        return Growth(0.0, depends=False)
    if made.numel() == 0 or not bool(torch.isfinite(made).all()):
        return Growth(0.0, depends=False)
    return Growth(0.0, depends=False, range=domain.interval(float(made.min()), float(made.max())))


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
    r = range_of(x)
    if call.op in ("sum", "nansum", "cumsum", "trace"):
        r = Range(lo=0.0 if r.nonneg else -math.inf, hi=0.0 if r.nonpos else math.inf, pos=r.pos, neg=r.neg)
        if _wraps(call):
            r = ANY  # an integer sum narrower than 64 bits wraps past its range: its sign says nothing
    elif call.op in ("logsumexp", "logcumsumexp"):
        r = Range(lo=r.lo if r.lo > -math.inf else -math.inf, below=r.below)
    values = Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real, range=r, culprit=x.culprit)
    if call.op in ("max", "min", "median", "nanmedian") and call.has("other"):
        return maximum(call, entry)
    if _returns_indices(call, entry):
        return (values, Growth(0.0, depends=x.depends, range=Range(lo=0.0)))
    return values


def _wraps(call: Call) -> bool:
    """A reduction whose result is an integer (or bool) narrower than int64 (``sum(dtype=torch.int8)``)."""
    import torch

    dtype = dtype_of(call.node) if call.node is not None else None
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex and dtype != torch.int64


def _returns_indices(call: Call, entry: Any) -> bool:
    schema = getattr(call.node.target, "_schema", None) if call.node is not None else None
    if schema is not None:
        return len(schema.returns) > 1
    return call.op in ("sort", "topk", "kthvalue", "mode", "cummax", "cummin", "aminmax") or (
        call.op in ("max", "min", "median", "nanmedian") and call.has("dim"))


@transfer("indexed")
def indexed(call: Call, entry: Any) -> Any:
    """sort / topk / kthvalue / mode / cummax: (values, indices); the values are entries of the
    input, the indices bounded integers. Also named by ``layers.toml`` (max pooling with indices)."""
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
    if is_number(p) and p == 0:
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
    correction = int(correction) if is_number(correction) else (1 if unbiased is not False else 0)
    call.accept_params()
    if x is None:
        return CONSTANT
    degenerate = _degenerate(call, correction, dim)
    if degenerate is not None:
        return unknown(degenerate)
    if x.real is False:
        spread_q = algebra.compose(2.0, x.q) if call.op.startswith("var") else x.q
        spread = Growth(spread_q if x.depends else 0.0, depends=x.depends, real=True, range=Range(lo=0.0),
                        culprit=x.culprit)
    else:
        spread_q = algebra.compose(2.0, x.q) if call.op.startswith("var") else x.q
        spread = Growth(spread_q if x.depends else 0.0, depends=x.depends, range=Range(lo=0.0), culprit=x.culprit)
    if call.op in ("var_mean", "std_mean"):
        mean = Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real, range=range_of(x), culprit=x.culprit)
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


def _input_shape(call: Call) -> Optional[tuple]:
    """The first argument's shape when every length is a number (a symbolic length: None)."""
    return sizes(call.node.args[0] if call.node is not None and call.node.args else None)


@transfer("concat")
def concat(call: Call, entry: Any) -> Any:
    """||cat(a, b)||^2 = ||a||^2 + ||b||^2: the largest exponent dominates (Theorem 9(ii))."""
    parts = call.growths("tensors")
    call.accept_params()
    if not parts:
        return CONSTANT
    return combine_max(*parts, r=domain.union(*[range_of(p) for p in parts]))


@transfer("write")
def write(call: Call, entry: Any) -> Any:
    """scatter / index_put / index_add / slice_scatter ...: each output entry is an entry of the
    data or a written value (a sum of them when accumulating, scaled by alpha): Theorem 9(ii)."""
    data = call.growth("input")
    values = [g for name in ("src", "source", "values", "value") if (g := call.growth(name)) is not None]
    alpha = call.operand("alpha", 1)
    call.selectors("index", "indices", "mask")
    call.accept_params()
    values = [scaled(v, alpha) for v in values]
    reduce_kind = call.param("reduce", None)
    if reduce_kind not in (None, "add", "sum", "mean", "amax", "amin"):
        call.every()
        return unknown(
            f"{call.op} with reduce={reduce_kind!r} (a product of entries, or a reduction qlint cannot bound)")
    accumulate = call.op in ("scatter_add", "index_add") or reduce_kind in ("add", "sum") \
        or bool(call.param("accumulate", False))
    present = [g for g in [data, *values] if g is not None]
    if not present:
        return CONSTANT
    ranges = [range_of(g) for g in present]
    if accumulate:
        r = Range(lo=0.0 if all(x.nonneg for x in ranges) else -math.inf,
                  hi=0.0 if all(x.nonpos for x in ranges) else math.inf)
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


@transfer("bincount")
def bincount(call: Call, entry: Any) -> Any:
    """Counts are bounded by the number of entries (histc, bincount); with weights, each bin is a
    sum of weights: the weights' exponent. histogram also returns its bin edges, which span
    the data's range: the data's exponent."""
    weights = call.growth("weights")
    data = call.growth("input")
    call.accept_params()
    depends = any(g.depends for g in call.every())
    if call.op == "bincount" and data is not None and data.depends and not math.isfinite(range_of(data).hi):
        return unknown("bincount of indices computed from the input with no upper bound (its length grows with them)")
    counts = combine_max(weights) if weights is not None else Growth(0.0, depends=depends, range=Range(lo=0.0))
    if call.op == "histogram":  # (counts, bin edges): the edges span [min x, max x], linear in x
        edges = Growth(data.q, depends=data.depends, real=data.real, culprit=data.culprit) if data is not None \
            else CONSTANT
        return (counts, edges)
    return counts


@transfer("indices")
def indices(call: Call, entry: Any) -> Any:
    """argmax / argsort / nonzero / searchsorted / bucketize: integer positions, bounded by the
    tensor's shape whatever the magnitude (nonzero's length is at most the input's numel)."""
    depends = any(g.depends for g in call.every())
    return Growth(0.0, depends=depends, range=Range(lo=0.0))


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
        return Growth(source.q if source.depends else 0.0, depends=source.depends,
                      real=True if source.real is not None else None,
                      range=source.range if (name == "real" and source.real is True) else ANY, culprit=source.culprit)
    if name in ("T", "mT", "H", "mH", "data"):
        return source
    return unknown(f"attribute `{name}` of a tensor")


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
