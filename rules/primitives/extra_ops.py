"""Ops that real models (Hugging Face, timm) and the core ATen set need beyond Table 1.

Found by ``qlint coverage`` on the model zoo and ``scripts/registry_coverage.py``:
assertions, in-place ATen variants (torch.export's training IR keeps them), copies, masks
built with bitwise ops, FFTs, grid sampling, distances, more pooling and padding. Each
entry says why its bound holds; ops without a sound bound (tan, atanh, prod, losses)
stay unknown on purpose.
"""

from __future__ import annotations

import torch

from qlint.growth import CONSTANT, NONNEG, Growth
from qlint.rules.primitives import REGISTRY, Call, Value, bounded, composed, first, multiplied, passthrough, primitive, summed
from qlint.rules.primitives import elementwise, layers, tensor_ops  # noqa: F401  (in-place twins below must exist)


def _targets(*names: str, namespaces: tuple[str, ...] = ("torch.", "aten.", "method:")) -> list[str]:
    return [f"{namespace}{name}" for name in names for namespace in namespaces]


primitive(
    "Assertions and storage queries",
    "0",
    """torch._assert checks a condition and returns nothing; a storage offset is metadata:
    no value of the input flows out of them.""",
    ["torch._assert", "aten._assert_async", "aten.sym_storage_offset"],
    lambda call: CONSTANT,
)


def _copy(call: Call) -> Growth:
    """copy(dst, src) holds src's values broadcast to dst's shape: the bound of src."""
    return call.growth(1, "src")


primitive(
    "Copy into a tensor (copy_)",
    "q_src",
    """dst.copy_(src) overwrites every entry of dst with an entry of src, so the result is
    bounded by src alone; torch.export points later reads of dst at this node.""",
    ["aten.copy", "aten.copy_", "method:copy_"],
    _copy,
    plumbing=True,
)

primitive(
    "Bitwise and / or / xor",
    "max(q_a, q_b)",
    """On booleans (attention masks) the result is 0 or 1. On integers the result has no
    more bits than its widest operand, so |a op b| <= 2 max(|a|, |b|) + 1.""",
    _targets("bitwise_and", "bitwise_or", "bitwise_xor") + ["aten.__and__", "aten.__or__", "aten.__xor__"],
    summed,
)
primitive(
    "Bitwise not",
    "q",
    "~x = -x - 1 on integers (logical not on booleans): |~x| <= |x| + 1.",
    _targets("bitwise_not"),
    composed(1.0),
)
primitive(
    "Boolean reductions (any, all, logical_xor)",
    "0",
    "The result is a boolean: 0 or 1 whatever the input.",
    _targets("any", "all", "logical_xor"),
    bounded(sign=NONNEG),
)
primitive(
    "Bounded inverse trigonometric maps (atan, atan2, asin, acos)",
    "0",
    "atan and atan2 take values in [-pi, pi], asin and acos in [-pi/2, pi]: bounded entrywise.",
    _targets("atan", "arctan", "atan2", "arctan2", "asin", "arcsin", "acos", "arccos"),
    bounded(),
    coefficient="pi sqrt(d)",
)


primitive(
    "Inverse hyperbolic maps (asinh, acosh)",
    "q",
    "|asinh(x)| <= |x| everywhere and 0 <= acosh(x) <= x on its domain x >= 1 (tan and atanh have poles: unknown).",
    _targets("asinh", "arcsinh", "acosh", "arccosh"),
    composed(1.0),
)


def _fmod(call: Call) -> Growth:
    """|fmod(a, b)| <= min(|a|, |b|): the smaller exponent; a constant operand bounds it."""
    a, b = call.growth(0, "input"), call.growth(1, "other")
    if not (a.depends or b.depends):
        return CONSTANT
    known = [g.q if g.depends else 0.0 for g in (a, b) if g.q is not None or not g.depends]
    if not known:
        return Growth(None, culprit=a.culprit or b.culprit)
    return Growth(min(known))


def _remainder(call: Call) -> Growth:
    """Python's a % b lies between 0 and b: bounded by |b| alone."""
    a, b = call.growth(0, "input"), call.growth(1, "other")
    return Growth(0.0, depends=a.depends) if not b.depends else Growth(b.q, culprit=b.culprit)


primitive(
    "fmod",
    "min(q_a, q_b)",
    "fmod(a, b) has the sign of a and magnitude below |b| and at most |a|.",
    _targets("fmod"),
    _fmod,
)
primitive(
    "remainder (a % b)",
    "q_b",
    "a % b takes the sign of b and has magnitude below |b|, whatever a is.",
    _targets("remainder") + ["_operator.mod", "method:__mod__"],
    _remainder,
)

primitive(
    "Random and uninitialised constructors",
    "0",
    """rand/randn/randint/randperm/empty_strided take a shape, never a value of the input:
    their output does not depend on X_k.""",
    _targets("rand", "randn", "randint", "randperm", "empty_strided", namespaces=("torch.", "aten.")),
    lambda call: CONSTANT,
)


def _with_indices(call: Call) -> tuple:
    x = first(call)
    return (x, Growth(0.0, depends=x.depends, sign=NONNEG))


_FUNCTIONAL_RESAMPLING = ["avg_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool3d", "max_pool3d",
                          "lp_pool1d", "lp_pool2d", "lp_pool3d", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
                          "upsample", "upsample_nearest", "upsample_bilinear"]
_ATEN_RESAMPLING = ["avg_pool3d", "adaptive_avg_pool3d", "_adaptive_avg_pool3d", "reflection_pad2d", "reflection_pad3d",
                    "replication_pad2d", "replication_pad3d", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
                    "upsample_nearest1d", "upsample_nearest3d", "_upsample_nearest_exact2d", "upsample_linear1d",
                    "upsample_bicubic2d", "upsample_trilinear3d"]

primitive(
    "More pooling, padding and resampling",
    "1",
    """Average/Lp pooling and interpolation are positively 1-homogeneous with bounded gain;
    max pooling selects entries; padding and shuffles copy or permute entries:
    ||out|| <= C ||x|| in every case.""",
    [f"torch.nn.functional.{name}" for name in _FUNCTIONAL_RESAMPLING]
    + [f"aten.{name}" for name in _ATEN_RESAMPLING]
    + ["module:torch.nn.AvgPool3d", "module:torch.nn.MaxPool3d", "module:torch.nn.AdaptiveAvgPool3d",
       "module:torch.nn.AdaptiveMaxPool3d", "module:torch.nn.ReflectionPad2d", "module:torch.nn.ReplicationPad2d",
       "module:torch.nn.ChannelShuffle", "module:torch.nn.LPPool1d", "module:torch.nn.LPPool2d"],
    passthrough,
)
primitive(
    "Pooling with indices",
    "1 (values) / 0 (indices)",
    "Max pooling returns (values, indices): the values are entries of the input, the indices bounded integers.",
    ["aten.max_pool3d_with_indices", "aten.adaptive_max_pool2d", "aten.adaptive_max_pool1d", "aten.adaptive_max_pool3d"]
    + [f"torch.nn.functional.{n}" for n in ("max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
                                             "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d_with_indices",
                                             "adaptive_max_pool3d_with_indices")],
    _with_indices,
)

primitive(
    "Grid sampling",
    "q_input",
    """Each output entry is a combination of at most 4 (8 in 3-D; 16 for bicubic) input
    entries with weights bounded by a constant whatever the grid, so the output is bounded
    by the input alone.""",
    ["torch.nn.functional.grid_sample", "aten.grid_sampler", "aten.grid_sampler_2d", "aten.grid_sampler_3d"],
    passthrough,
)

_FFTS = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn"]

primitive(
    "Fourier transforms",
    "1",
    """The DFT is linear with operator norm sqrt(n) (unitary up to scale, Plancherel):
    ||F x|| <= sqrt(n) ||x||. Complex views and conjugation keep the norm.""",
    [f"torch.fft.{n}" for n in _FFTS]
    + [f"aten.fft_{n}" for n in _FFTS]
    + ["aten._fft_r2c", "aten._fft_c2r", "aten._fft_c2c"]
    + _targets("view_as_real", "view_as_complex", "real", "imag", "conj", "resolve_conj", "_conj", "conj_physical"),
    passthrough,
    coefficient="sqrt(n)",
)


primitive(
    "More dropout and convolution variants, unpooling",
    "1",
    """Alpha/feature dropout is an affine map of x with bounded coefficients; transposed 3-D
    and TBC convolutions are linear; max_unpool writes input entries into zeros.""",
    [f"torch.nn.functional.{name}" for name in ("alpha_dropout", "feature_alpha_dropout", "dropout3d", "conv_transpose3d",
                                                 "conv_tbc", "max_unpool1d", "max_unpool2d", "max_unpool3d",
                                                 "fractional_max_pool2d", "fractional_max_pool3d")]
    + ["aten.conv_tbc", "aten.conv_transpose3d", "aten.max_unpool2d", "aten.max_unpool3d"],
    passthrough,
)
primitive(
    "Fractional max pooling with indices",
    "1 (values) / 0 (indices)",
    "The values are entries of the input; the indices are bounded integers.",
    ["torch.nn.functional.fractional_max_pool2d_with_indices", "torch.nn.functional.fractional_max_pool3d_with_indices",
     "aten.fractional_max_pool2d", "aten.fractional_max_pool3d"],
    _with_indices,
)
primitive(
    "affine_grid",
    "q_theta",
    "The sampling grid is theta times a fixed base grid: linear in theta.",
    ["torch.nn.functional.affine_grid", "aten.affine_grid_generator"],
    composed(1.0),
)
primitive(
    "Gumbel-softmax",
    "0",
    "A softmax (or its one-hot rounding) of perturbed logits: every row sums to 1.",
    ["torch.nn.functional.gumbel_softmax"],
    bounded(sign=NONNEG),
)


def _multi_head_attention(call: Call) -> tuple:
    """(output, weights): W_O softmax(.) (W_V value + b_v) + b_o, the weights row-stochastic.

    Query and key only enter the softmax; the output is multilinear in the value and the
    value/output projections (parameters, so normally only the value counts)."""
    value_side = multiplied(Call(call.node, (call.growth(2, "value"), call.growth(5, "in_proj_weight"),
                                             call.growth(99, "v_proj_weight"), call.growth(11, "out_proj_weight")), {}))
    biases = (call.growth(6, "in_proj_bias"), call.growth(8, "bias_v"), call.growth(12, "out_proj_bias"))
    output = summed(Call(call.node, (value_side, *biases), {}))
    return (output, Growth(0.0, depends=output.depends, sign=NONNEG))


primitive(
    "Multi-head attention (functional)",
    "q_V",
    """Table 1: sum_h W_O^h softmax(Q_h K_h^T / sqrt(d)) W_V^h value; the softmax weights are
    row-stochastic, so the output inherits the exponent of the value input.""",
    ["torch.nn.functional.multi_head_attention_forward"],
    _multi_head_attention,
    coefficient="sum_h ||W_O^h||_op ||W_V^h||_op",
)


def _scatter_reduce(call: Call) -> Growth:
    """sum/mean/amax/amin reductions are bounded by their inputs; a product is not."""
    reduce = call.get(4, "reduce")
    if reduce == "prod":
        return Growth(None, culprit="scatter_reduce with reduce='prod'")
    return summed(Call(call.node, (call.growth(0, "input"), call.growth(3, "src")), {}))


primitive(
    "scatter_reduce (sum, mean, amax, amin)",
    "max(q_self, q_src)",
    "Each output entry is a sum, mean or extremum of input and source entries (Theorem 9(ii)).",
    _targets("scatter_reduce"),
    _scatter_reduce,
)

primitive(
    "Distances (cdist, pdist, pairwise_distance)",
    "max(q_x, q_y)",
    "||x_i - y_j|| <= ||x_i|| + ||y_j||: the larger exponent dominates (Theorem 9(ii)).",
    ["torch.cdist", "aten.cdist", "aten._cdist_forward", "torch.nn.functional.pdist", "torch.pdist", "aten._pdist_forward",
     "torch.nn.functional.pairwise_distance", "aten.pairwise_distance"],
    summed,
)
primitive(
    "Cosine similarity",
    "0",
    "<x, y> / (||x|| ||y||) lies in [-1, 1] (Cauchy-Schwarz).",
    ["torch.nn.functional.cosine_similarity", "aten.cosine_similarity", "module:torch.nn.CosineSimilarity"],
    bounded(),
)
primitive(
    "GLU",
    "q",
    "glu(x) = a * sigmoid(b) for the two halves of x: q_a + 0 (Theorem 9(iii)).",
    ["torch.nn.functional.glu", "aten.glu", "module:torch.nn.GLU"],
    composed(1.0),
)
primitive(
    "one_hot",
    "0",
    "The output entries are 0 or 1.",
    ["torch.nn.functional.one_hot", "aten.one_hot"],
    bounded(sign=NONNEG),
)
primitive(
    "threshold",
    "q",
    "threshold(x, t, v) is x or the constant v entrywise: |out| <= |x| + |v|.",
    ["torch.nn.functional.threshold", "aten.threshold", "module:torch.nn.Threshold"],
    composed(1.0),
)


# --- in-place variants ----------------------------------------------------------------


def _in_place_targets() -> list[str]:
    """ATen ops and F functions ``op_`` whose out-of-place twin ``op`` is registered."""
    import torch.nn.functional as F

    aten = {target.__name__ for kind, target in REGISTRY.keys() if kind == "function" and isinstance(target, torch._ops.OpOverloadPacket)}
    targets = [f"aten.{name}_" for name in sorted(aten) if f"{name}_" not in aten and hasattr(torch.ops.aten, f"{name}_")]
    for name in dir(F):
        twin = getattr(F, name[:-1], None) if name.endswith("_") and not name.endswith("__") else None
        if twin is not None and REGISTRY.knows("call_function", twin) and not REGISTRY.knows("call_function", getattr(F, name)):
            targets.append(f"torch.nn.functional.{name}")
    return targets


def _in_place(call: Call) -> Value:
    """The transfer of the out-of-place twin: aten.add_ -> aten.add, F.relu_ -> F.relu."""
    import torch.nn.functional as F

    target = call.node.target
    packet = getattr(target, "overloadpacket", None)
    twin = getattr(torch.ops.aten, packet.__name__[:-1]) if packet is not None else getattr(F, target.__name__[:-1])
    return REGISTRY.lookup("call_function", twin).transfer(call)


primitive(
    "In-place variants (add_, mul_, detach_, ...)",
    "as the out-of-place op",
    """x.op_(y) stores op(x, y) in x; torch.export's training IR keeps such ops and points
    later reads of x at the in-place node, so its bound is the out-of-place op's.""",
    _in_place_targets(),
    _in_place,
)
