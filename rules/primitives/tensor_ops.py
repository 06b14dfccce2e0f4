"""Tensor plumbing: views, indexing, concatenation, reductions, constructors."""

from __future__ import annotations

from qlint import algebra
from qlint.growth import CONSTANT, NONNEG, Growth
from qlint.rules.primitives import Call, composed, first, passthrough, primitive, summed

_VIEWS = [
    "view",
    "reshape",
    "permute",
    "transpose",
    "t",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "expand",
    "expand_as",
    "broadcast_to",
    "repeat",
    "tile",
    "repeat_interleave",
    "movedim",
    "moveaxis",
    "swapaxes",
    "narrow",
    "select",
    "slice",
    "flip",
    "roll",
    "unfold",
    "diagonal",
    "tril",
    "triu",
    "index_select",
    "gather",
    "take",
    "masked_select",
    "view_as",
    "reshape_as",
    "as_strided",
    "_unsafe_view",
    "unsafe_view",
    "t_",
    "transpose_",
    "squeeze_",
    "unsqueeze_",
    "mT",
    "nan_to_num",
]

primitive(
    "Views, permutations and selections",
    "q",
    """Reshaping, permuting and selecting entries never increase the norm; expand/repeat
    multiply it by a constant factor (the number of copies).""",
    [f"torch.{n}" for n in _VIEWS]
    + [f"aten.{n}" for n in _VIEWS]
    + [f"method:{n}" for n in _VIEWS]
    + ["_operator.getitem", "aten.index", "aten._unsafe_index", "torch.Tensor.__getitem__"],
    lambda call: _select(call),
    plumbing=True,
)


def _select(call: Call) -> Growth | tuple:
    """Indexing a tuple picks one element; indexing a tensor keeps its bound."""
    source = call.get(0, "input")
    index = call.get(1, "idx")
    if isinstance(source, tuple) and isinstance(index, int):
        return source[index]
    if isinstance(source, tuple):
        return summed(Call(call.node, source, {}))
    return source if isinstance(source, Growth) else CONSTANT


primitive(
    "Split / chunk / unbind",
    "q",
    "Each piece is a selection of the input's entries.",
    [
        "torch.split",
        "torch.chunk",
        "torch.unbind",
        "torch.tensor_split",
        "aten.split",
        "aten.split_with_sizes",
        "aten.chunk",
        "aten.unbind",
        "aten.tensor_split",
        "method:split",
        "method:chunk",
        "method:unbind",
        "method:tensor_split",
    ],
    passthrough,
    plumbing=True,
)

primitive(
    "Concatenate / stack",
    "max(q_i)",
    "||cat(a, b)||^2 = ||a||^2 + ||b||^2: the largest exponent dominates (Theorem 9(ii)).",
    ["torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.hstack", "torch.vstack", "aten.cat", "aten.concat", "aten.stack"],
    summed,
)

primitive(
    "Scatter / index_put",
    "max(q_data, q_values)",
    "Each output entry is an entry of the data or a (sum of) written values.",
    ["aten.index_put", "aten.scatter", "aten.scatter_add", "aten.slice_scatter", "aten.select_scatter", "aten.index_add", "aten.index_copy", "torch.scatter", "torch.scatter_add", "method:scatter", "method:scatter_add", "method:index_put", "aten.diagonal_scatter", "aten.masked_scatter"],
    summed,
)

_LINEAR_REDUCTIONS = ["sum", "mean", "nansum", "nanmean", "cumsum", "amax", "amin", "max", "min", "norm", "std", "linalg_vector_norm", "median", "nanmedian", "trace", "logcumsumexp"]

primitive(
    "Reductions (sum, mean, max, norm, std)",
    "q",
    """Sums and means are linear; max/min select an entry; norms and standard deviations
    are positively 1-homogeneous: each is bounded by C ||x||.""",
    [f"torch.{n}" for n in _LINEAR_REDUCTIONS]
    + [f"aten.{n}" for n in _LINEAR_REDUCTIONS]
    + [f"method:{n}" for n in _LINEAR_REDUCTIONS]
    + ["torch.linalg.vector_norm", "torch.linalg.norm", "aten.linalg_norm", "torch.cummax", "torch.cummin"],
    lambda call: _reduce(call),
)


def _reduce(call: Call) -> Growth | tuple:
    """Overloads such as aten.max.dim also return indices."""
    x = first(call)
    out = composed(1.0, sign=x.sign)(call)
    schema = getattr(call.node.target, "_schema", None)
    if schema is not None and len(schema.returns) > 1:
        return (out, Growth(0.0, depends=x.depends, sign=NONNEG))
    return out


primitive(
    "Variance",
    "2 q",
    "var(x) <= mean(x^2): quadratic in x.",
    ["torch.var", "aten.var", "method:var"],
    lambda call: Growth(algebra.compose(2.0, first(call).q), depends=first(call).depends, sign=NONNEG, culprit=first(call).culprit),
)


def _with_indices(call: Call) -> tuple:
    x = first(call)
    return (x, Growth(0.0, depends=x.depends))


primitive(
    "Reductions with indices (max.dim, sort, topk)",
    "q (values) / 0 (indices)",
    "The values are entries of the input; the indices are bounded integers.",
    ["aten.sort", "aten.topk", "aten.cummax", "aten.cummin", "aten.var_mean", "aten.std_mean", "torch.sort", "torch.topk", "method:sort", "method:topk", "aten.kthvalue", "aten.mode"],
    _with_indices,
)

primitive(
    "Index-valued ops (argmax, argsort, nonzero)",
    "0",
    "Integer positions are bounded by the tensor's shape, whatever the magnitude.",
    [f"{prefix}{n}" for n in ("argmax", "argmin", "argsort", "nonzero", "searchsorted", "bucketize", "count_nonzero") for prefix in ("torch.", "aten.", "method:")],
    lambda call: Growth(0.0, depends=first(call).depends, sign=NONNEG),
)

_SHAPE_ONLY = ["zeros_like", "ones_like", "empty_like", "rand_like", "randn_like", "new_zeros", "new_ones", "new_empty", "size", "dim", "numel", "sym_size", "sym_numel", "sym_stride", "stride", "zero_", "zeros", "ones", "empty", "lift_fresh", "_assert_tensor_metadata", "sym_constrain_range_for_size", "_assert_scalar"]

primitive(
    "Shape queries and shape-only constructors",
    "0",
    """x.size(), zeros_like(x), ones(n), ...: their values depend on the input's shape
    or on constants, never on its magnitude.""",
    [f"{prefix}{n}" for n in _SHAPE_ONLY for prefix in ("torch.", "aten.", "method:")] + ["torch.Tensor.size"],
    lambda call: CONSTANT,
)


def _filled(call: Call) -> Growth:
    """The value written is what grows: full_like(x, v) and x.fill_(v) carry v, not x."""
    values = [a for i, a in enumerate(call.args) if i > 0 or not _is_template(call)]
    return summed(Call(call.node, tuple(values), dict(call.kwargs)))


def _is_template(call: Call) -> bool:
    """*_like / new_* / fill take a tensor only for its shape, dtype and device."""
    name = str(getattr(call.node.target, "__name__", call.node.target))
    return any(key in name for key in ("_like", "new_", "fill"))


primitive(
    "Constructors filled with a value",
    "q of the value",
    """full(size, v), full_like(x, v), x.new_full(size, v), x.fill_(v), scalar_tensor(v),
    arange(n): every entry is (at most) the given value, whose growth is what counts; the
    template tensor contributes only its shape.""",
    [f"{prefix}{n}" for n in ("full", "full_like", "new_full", "fill", "fill_", "scalar_tensor", "new_tensor", "arange") for prefix in ("torch.", "aten.", "method:")],
    _filled,
)

primitive(
    "Scalar extraction (item)",
    "q",
    """x.item() (aten._local_scalar_dense) turns a data-dependent value into a Python
    number: it carries the growth of x, it is not a constant.""",
    ["method:item", "aten._local_scalar_dense", "aten.item"],
    passthrough,
)

primitive(
    "Bernoulli sampling",
    "0",
    "Samples are 0 or 1 whatever the probabilities: bounded, but possibly 0 (no safe denominator).",
    ["torch.bernoulli", "aten.bernoulli", "method:bernoulli"],
    lambda call: Growth(0.0, depends=first(call).depends, sign=NONNEG),
)

_METADATA_ATTRIBUTES = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "is_sparse"}


def _getattr(call: Call) -> Growth:
    """x.shape is metadata; x.T, x.values, x.data are the data itself."""
    return CONSTANT if call.get(1, "name") in _METADATA_ATTRIBUTES else _select(Call(call.node, call.args[:1], {}))


primitive(
    "Attribute access",
    "0 (metadata) / q",
    "Shapes and dtypes do not depend on magnitude; x.T or a named tuple's .values do.",
    ["builtins.getattr"],
    _getattr,
)

primitive(
    "Autocast / grad-mode markers",
    "q",
    "Export records autocast and grad-mode regions as wrappers that pass values through.",
    ["torch._C._set_grad_enabled", "torch.amp.autocast_mode._enter_autocast", "torch.amp.autocast_mode._exit_autocast"],
    lambda call: CONSTANT,
)

