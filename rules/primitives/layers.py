"""Layers: affine maps, convolutions, embeddings, normalizations, attention, dropout."""

from __future__ import annotations

from qlint.growth import CONSTANT, Growth
from qlint.rules.primitives import Call, first, multiplied, normalizing, passthrough, primitive, summed


def _affine(call: Call) -> Growth:
    """W x + b with W possibly input-dependent: q = q_x + q_W, then max with q_b."""
    if call.module is not None:  # nn.Linear / nn.ConvNd: W, b are parameters
        return first(call)
    x, weight, bias = call.growth(0, "input"), call.growth(1, "weight"), call.growth(2, "bias", None)
    product = multiplied(Call(call.node, (x, weight), {}))
    return summed(Call(call.node, (product, bias), {}))


def _addmm(call: Call) -> Growth:
    """addmm(bias, a, b) = bias + a @ b."""
    product = multiplied(Call(call.node, (call.growth(1, "mat1"), call.growth(2, "mat2")), {}))
    return summed(Call(call.node, (call.growth(0, "input"), product), {}))


primitive(
    "Affine layer (Linear)",
    "1",
    """Table 1: x -> Wx + b is linear, ||Wx + b|| <= ||W||_op ||x|| + ||b||. With an
    input-dependent weight (F.linear(x, w(x))) it is bilinear and the exponents add.""",
    [
        "module:torch.nn.Linear",
        "module:torch.nn.Bilinear",
        "torch.nn.functional.linear",
        "aten.linear",
    ],
    _affine,
    coefficient="||W||_op",
    table1=True,
)

primitive(
    "addmm (bias + matrix product)",
    "q_bias max (q_a + q_b)",
    "Sum of a bias and a bilinear product: Theorem 9(ii) and (iii).",
    ["torch.addmm", "aten.addmm", "aten.addbmm", "aten.baddbmm"],
    _addmm,
)

primitive(
    "Convolution",
    "1",
    """A convolution is a linear map of its input (a Toeplitz matrix), depthwise and
    grouped ones included: ||conv(x)|| <= ||K||_op ||x|| + ||b||.""",
    [
        "module:torch.nn.Conv1d",
        "module:torch.nn.Conv2d",
        "module:torch.nn.Conv3d",
        "module:torch.nn.ConvTranspose1d",
        "module:torch.nn.ConvTranspose2d",
        "module:torch.nn.ConvTranspose3d",
        "torch.nn.functional.conv1d",
        "torch.nn.functional.conv2d",
        "torch.nn.functional.conv3d",
        "torch.nn.functional.conv_transpose1d",
        "torch.nn.functional.conv_transpose2d",
        "torch.conv1d",
        "torch.conv2d",
        "aten.conv1d",
        "aten.conv2d",
        "aten.conv3d",
        "aten.convolution",
        "aten._convolution",
        "aten.conv_transpose1d",
        "aten.conv_transpose2d",
    ],
    _affine,
    coefficient="||K||_op",
)


def _embedding(call: Call) -> Growth:
    """Rows of the weight: bounded by the largest row whatever the (integer) index."""
    if call.module is not None:
        return CONSTANT if not first(call).depends else Growth(0.0)
    weight = call.growth(1, "weight")
    return weight if weight.depends else Growth(0.0, depends=first(call).depends)


primitive(
    "Embedding lookup",
    "0",
    """The output rows are rows of the weight table; an integer index cannot scale
    them, so the output is bounded by max_i ||W_i||.""",
    ["module:torch.nn.Embedding", "torch.nn.functional.embedding", "aten.embedding"],
    _embedding,
    coefficient="max_i ||W_i|| sqrt(n)",
)

primitive(
    "LayerNorm",
    "0",
    """Table 1 / Theorem 9(v): ||LN(z)|| <= |beta| + ||gamma|| sqrt(d) for every z
    (Lemma 1 of Kan et al. 2025), uniformly in eps > 0.""",
    [
        "module:torch.nn.LayerNorm",
        "torch.nn.functional.layer_norm",
        "aten.layer_norm",
    ],
    normalizing,
    coefficient="|beta| + ||gamma|| sqrt(d)",
    table1=True,
)

primitive(
    "LayerNorm (ATen, with statistics)",
    "0",
    """native_layer_norm returns (normalized, mean, rstd); the first output is bounded
    as LayerNorm is. The statistics are not bounded and are treated as unknown.""",
    ["aten.native_layer_norm"],
    lambda call: (normalizing(call), Growth(None, culprit="layer_norm statistics"), Growth(None, culprit="layer_norm statistics")),
    coefficient="|beta| + ||gamma|| sqrt(d)",
)

primitive(
    "RMSNorm",
    "0",
    """Table 1: gamma * x / RMS(x) has norm ||gamma|| sqrt(d) whatever x is.""",
    ["module:torch.nn.RMSNorm", "torch.nn.functional.rms_norm", "aten.rms_norm"],
    normalizing,
    coefficient="||gamma|| sqrt(d)",
    table1=True,
)

primitive(
    "RMSNorm (ATen, with statistics)",
    "0",
    "_fused_rms_norm returns (normalized, rstd); the first output is bounded.",
    ["aten._fused_rms_norm"],
    lambda call: (normalizing(call), Growth(None, culprit="rms_norm statistics")),
)

primitive(
    "L2 / Scale normalization",
    "0",
    """Table 1: g * x / max(||x||, eps) has norm at most g.""",
    ["torch.nn.functional.normalize"],
    normalizing,
    coefficient="g",
    table1=True,
)

primitive(
    "GroupNorm / InstanceNorm",
    "0",
    """Each entry is divided by the standard deviation of a group that contains it,
    so |x_i - mu| / sqrt(var + eps) <= sqrt(group size): bounded whatever the input.""",
    [
        "module:torch.nn.GroupNorm",
        "module:torch.nn.InstanceNorm1d",
        "module:torch.nn.InstanceNorm2d",
        "module:torch.nn.InstanceNorm3d",
        "torch.nn.functional.group_norm",
        "torch.nn.functional.instance_norm",
        "aten.group_norm",
        "aten.instance_norm",
    ],
    normalizing,
    coefficient="(|beta| + ||gamma||) sqrt(group size)",
)

primitive(
    "GroupNorm (ATen, with statistics)",
    "0",
    "native_group_norm returns (normalized, mean, rstd); the first output is bounded.",
    ["aten.native_group_norm"],
    lambda call: (normalizing(call), Growth(None, culprit="group_norm statistics"), Growth(None, culprit="group_norm statistics")),
)


def _batch_norm_module(call: Call) -> Growth:
    module = call.module
    uses_batch_stats = module.training or not module.track_running_stats
    return normalizing(call) if uses_batch_stats else first(call)


def _batch_norm_function(call: Call) -> Growth:
    training = call.get(5, "training", False)
    return normalizing(call) if training else first(call)


def _batch_norm_aten(call: Call) -> tuple:
    name = str(call.node.target)
    stats = Growth(None, culprit="batch_norm statistics")
    if "no_training" in name:
        out = first(call)
    elif "functional" in name or "legit" in name:
        out = normalizing(call)
    else:
        out = _batch_norm_function(call)
    return (out, stats, stats, stats, stats)


_BN_WHY = """With batch statistics (train mode) each entry is divided by the batch standard
deviation of its channel, which bounds it by sqrt(batch size): q = 0. With running
statistics (eval mode) BatchNorm is the affine map gamma (x - mu) / sigma + beta: q = 1."""

primitive(
    "BatchNorm",
    "0 (train) / 1 (eval)",
    _BN_WHY,
    [
        "module:torch.nn.BatchNorm1d",
        "module:torch.nn.BatchNorm2d",
        "module:torch.nn.BatchNorm3d",
        "module:torch.nn.SyncBatchNorm",
    ],
    _batch_norm_module,
)
primitive(
    "BatchNorm (functional)",
    "0 (training=True) / 1",
    _BN_WHY,
    ["torch.nn.functional.batch_norm", "aten.batch_norm"],
    _batch_norm_function,
)
primitive(
    "BatchNorm (ATen, with statistics)",
    "0 (training) / 1",
    _BN_WHY,
    [
        "aten._native_batch_norm_legit",
        "aten._native_batch_norm_legit_functional",
        "aten._native_batch_norm_legit_no_training",
        "aten.native_batch_norm",
        "aten._batch_norm_with_update",
        "aten._batch_norm_no_update",
    ],
    _batch_norm_aten,
)


def _sdpa(call: Call) -> Growth:
    """softmax(QK^T/sqrt(d) + mask) V: the weights are row-stochastic, so q = q_V."""
    value = call.growth(2, "value")
    return value


def _sdpa_aten(call: Call) -> tuple:
    out = _sdpa(call)
    rest = Growth(None, culprit="attention statistics")
    return (out, rest, rest, rest, rest, rest, rest, rest, rest)


_ATTN_WHY = """Table 1: the attention weights softmax(QK^T / sqrt(d_k)) are row-stochastic
(q = 0 whatever Q and K are), so ||Attn(X)|| <= ||W_V||_op ||X||: the output inherits
the exponent of V alone."""

primitive(
    "Self-attention (scaled dot product)",
    "q_V (1 for V = W_V X)",
    _ATTN_WHY,
    ["torch.nn.functional.scaled_dot_product_attention", "aten.scaled_dot_product_attention"],
    _sdpa,
    coefficient="||W_V||_op",
    table1=True,
)
primitive(
    "Self-attention kernels (ATen)",
    "q_V",
    _ATTN_WHY,
    [
        "aten._scaled_dot_product_attention_math",
        "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_cudnn_attention",
    ],
    _sdpa_aten,
)


def _multihead(call: Call) -> tuple:
    value = call.growth(2, "value")
    return (value, Growth(0.0, depends=value.depends))


primitive(
    "Multi-head attention",
    "q_V (1)",
    """Table 1: sum_h W_O^(h) Attn^(h)(X); each head's weights are row-stochastic, so the
    output is linear in the value input. The returned attention weights are bounded.""",
    ["module:torch.nn.MultiheadAttention"],
    _multihead,
    coefficient="sum_h ||W_O^h||_op ||W_V^h||_op",
    table1=True,
)

primitive(
    "Dropout",
    "1",
    """Dropout zeroes entries and rescales the rest by 1/(1-p): ||out|| <= ||x||/(1-p).
    In eval mode it is the identity.""",
    [
        "module:torch.nn.Dropout",
        "module:torch.nn.Dropout1d",
        "module:torch.nn.Dropout2d",
        "module:torch.nn.Dropout3d",
        "module:torch.nn.AlphaDropout",
        "torch.nn.functional.dropout",
        "torch.nn.functional.dropout1d",
        "torch.nn.functional.dropout2d",
        "torch.dropout",
        "aten.dropout",
        "aten.feature_dropout",
        "aten.alpha_dropout",
    ],
    passthrough,
    coefficient="1/(1-p)",
)

primitive(
    "Dropout (ATen, with mask)",
    "1",
    "native_dropout returns (output, mask); the output is the input rescaled by at most 1/(1-p).",
    ["aten.native_dropout"],
    lambda call: (first(call), Growth(0.0, depends=first(call).depends)),
)

primitive(
    "Identity and shape modules",
    "1",
    "nn.Identity, Flatten and Unflatten rearrange entries without changing the norm.",
    ["module:torch.nn.Identity", "module:torch.nn.Flatten", "module:torch.nn.Unflatten"],
    passthrough,
)

primitive(
    "Pooling and resampling",
    "1",
    """Average pooling and linear interpolation are linear maps with bounded operator
    norm; max pooling is 1-Lipschitz and positively homogeneous: ||out|| <= C ||x||.""",
    [
        "module:torch.nn.AvgPool1d",
        "module:torch.nn.AvgPool2d",
        "module:torch.nn.MaxPool1d",
        "module:torch.nn.MaxPool2d",
        "module:torch.nn.AdaptiveAvgPool1d",
        "module:torch.nn.AdaptiveAvgPool2d",
        "module:torch.nn.AdaptiveMaxPool1d",
        "module:torch.nn.AdaptiveMaxPool2d",
        "module:torch.nn.Upsample",
        "module:torch.nn.PixelShuffle",
        "module:torch.nn.PixelUnshuffle",
        "module:torch.nn.ZeroPad2d",
        "module:torch.nn.ConstantPad1d",
        "module:torch.nn.ConstantPad2d",
        "module:torch.nn.ReflectionPad1d",
        "module:torch.nn.ReplicationPad1d",
        "torch.nn.functional.avg_pool1d",
        "torch.nn.functional.avg_pool2d",
        "torch.nn.functional.max_pool1d",
        "torch.nn.functional.max_pool2d",
        "torch.nn.functional.adaptive_avg_pool1d",
        "torch.nn.functional.adaptive_avg_pool2d",
        "torch.nn.functional.adaptive_max_pool2d",
        "torch.nn.functional.interpolate",
        "torch.nn.functional.pixel_shuffle",
        "torch.nn.functional.unfold",
        "torch.nn.functional.fold",
        "torch.nn.functional.pad",
        "aten.avg_pool1d",
        "aten.avg_pool2d",
        "aten.max_pool1d",
        "aten.max_pool2d",
        "aten.adaptive_avg_pool1d",
        "aten.adaptive_avg_pool2d",
        "aten._adaptive_avg_pool2d",
        "aten.upsample_nearest2d",
        "aten.upsample_bilinear2d",
        "aten.pixel_shuffle",
        "aten.im2col",
        "aten.col2im",
        "aten.pad",
        "aten.constant_pad_nd",
        "aten.reflection_pad1d",
        "aten.replication_pad1d",
    ],
    passthrough,
)

primitive(
    "Max pooling with indices (ATen)",
    "1",
    "max_pool2d_with_indices returns (values, indices): values as max pooling, indices bounded.",
    ["aten.max_pool2d_with_indices", "aten.max_pool1d_with_indices"],
    lambda call: (first(call), Growth(0.0, depends=first(call).depends)),
)

