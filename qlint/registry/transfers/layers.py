"""Transfers of the entries in ``rules/primitives/layers.toml``: linear and bilinear layers,
embeddings, normalizations, attention, recurrent layers, dropout, resampling, complex views and
quantization.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from qlint.core import algebra, domain
from qlint.core.domain import ANY, CONSTANT, Growth, Range, unknown
from qlint.core.ops import Call
from qlint.registry.transfers.base import transfer
from qlint.registry.transfers.combinators import (
    argument_node, argument_shape, combine_max, combine_product, eps_positive, has_zero, is_number,
    nonzero_constant, outputs, plain_number, range_of, reciprocal_range, scaled,
)


@transfer("matmul")
def matmul(call: Call, entry: Any) -> Any:
    """Theorem 9(iii) for bilinear maps: ||A B|| <= ||A|| ||B||, multilinear for einsum and
    tensordot; with a bias, addmm(c, a, b, beta, alpha) = beta c + alpha a b. Also named by
    ``arithmetic.toml`` (cross products)."""
    operands = [g for name in ("input", "other", "mat1", "mat2", "batch1", "batch2", "vec", "vec1", "vec2", "mat",
                               "tensor", "a", "b", "input1", "input2", "weight", "sparse", "dense")
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
        product = scaled(combine_product(*operands), call.operand("alpha", 1))
        return combine_max(scaled(bias, call.operand("beta", 1)), product)
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
    # _embedding_bag also returns offsets, counts, argmax
    return outputs(call, out, rest=Growth(0.0, depends=depends, range=Range(lo=0.0)))


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
    ok = eps_positive(call, "eps", eps_default)
    call.accept_params()
    if x is None:
        return CONSTANT
    out = _normalized(x, weight, bias, entry.name, eps_ok=ok)
    rstd = Growth(0.0, depends=x.depends, range=Range(lo=0.0, pos=True)) if ok else \
        unknown("inverse deviation with eps <= 0")
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
    p = plain_number(call, "p", 2.0)
    eps = plain_number(call, "eps", 1e-12)
    call.value("dim")
    if x is None:
        return CONSTANT
    if not (is_number(eps) and eps > 0):
        return unknown("normalize with eps <= 0 (divides by a norm that may vanish)")
    if x.real is False:
        return Growth(0.0 if is_number(p) and p >= 1 else x.q, depends=x.depends, real=False)
    if is_number(p) and (p >= 1 or math.isinf(p) and p > 0):
        edge = 1.0 if p in (1, 2, math.inf) else 1.0 + 1e-5  # (sum |x|^p)^(1/p) may round below max |x_i| otherwise
        if x.known or not x.depends:
            return Growth(0.0, depends=x.depends, range=domain.interval(-edge, edge))
        return Growth(None, culprit=x.culprit)
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
    ok = eps_positive(call, "eps", 1e-5)
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
    # saved means, inverse deviations (bounded by eps), reserve
    stats = Growth(x.q, depends=x.depends, culprit=x.culprit)
    return outputs(call, out, rest=stats)


def _running_variance_ok(call: Call, eps_ok: bool) -> Optional[str]:
    """Why (x - mu) / sqrt(var + eps) may not be finite, if it may: var must be a buffer (the
    norm's own statistics, a mean of squares, >= 0; a parameter or an expression can go
    negative) and var + eps > 0 for every entry (checked on its value when it has one)."""
    import torch

    source = argument_node(call, "running_var")
    if source is None:
        return None
    if getattr(source, "op", None) != "get_attr":
        return "the running variance is computed, so it may be negative"
    owner = source.graph.owning_module
    try:
        value = owner.get_buffer(str(source.target)) if owner is not None else None
    except AttributeError:  # not a buffer: a parameter (or an attribute fx lifted)
        return "the running variance is a parameter, which may be negative"
    eps = plain_number(call, "eps", 1e-5)
    if not isinstance(value, torch.Tensor) or value.is_meta:
        return None if eps_ok else "eps <= 0 with a running variance that may be 0"
    if not bool((value + (eps if is_number(eps) else 0.0) > 0).all()):
        return "var + eps <= 0 for some channel (NaN or inf)"
    return None


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
    empty = any(isinstance(n, int) and n == 0 for n in argument_shape(call, "input") or ())
    if empty and call.param("reduction", "mean") in ("mean", 1):  # aten spells mean 1
        return unknown(f"{call.op} of no entries (a mean of nothing is NaN)")
    loss = combine_product(error, error, r=Range(lo=0.0), real=True) if call.op == "mse_loss" else error
    return loss if weight is None else combine_product(loss, weight, r=domain.mul(loss.range, range_of(weight)))


@transfer("lp_pool")
def lp_pool(call: Call, entry: Any) -> Any:
    """lp_pool(x, p): q = 1 and >= 0 for an even p > 0, or p > 0 of a nonnegative input; refused otherwise."""
    x = call.growth("input")
    p = plain_number(call, "norm_type", None)
    call.accept_params()
    if x is None:
        return CONSTANT
    even = is_number(p) and math.isfinite(p) and p > 0 and p == int(p) and int(p) % 2 == 0
    nonneg = is_number(p) and math.isfinite(p) and p > 0 and x.real is True and x.range.nonneg
    if x.real is not True or not (even or nonneg):
        call.every()
        return unknown(f"lp_pool with p = {p} of a value that may be negative (NaN), or p <= 0 (a pole)")
    return Growth(algebra.compose(1.0, x.q) if x.depends else 0.0, depends=x.depends, range=Range(lo=0.0),
                  culprit=x.culprit)


@transfer("one_hot")
def one_hot(call: Call, entry: Any) -> Any:
    """0 or 1 entries; unknown when the width (num_classes = -1) is read off input-dependent indices."""
    classes = plain_number(call, "num_classes", -1)
    depends = any(g.depends for g in call.every())
    if depends and not (is_number(classes) and classes > 0):
        return unknown("one_hot with num_classes = -1 of indices computed from the input (its width grows with them)")
    return Growth(0.0, depends=depends, range=entry.declared_range(ANY))


@transfer("dropout")
def dropout(call: Call, entry: Any) -> Any:
    """Dropout zeroes entries and rescales the rest by 1/(1-p): ||out|| <= ||x||/(1-p), signs kept
    (alpha dropout is an affine map with bounded coefficients); the mask is 0 or 1."""
    x = call.growth("input")
    p = plain_number(call, "p", 0.5)
    call.accept_params()
    if x is None:
        return CONSTANT
    alpha = "alpha" in call.op
    if alpha or not is_number(p) or p >= 1:
        out = Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real, culprit=x.culprit)
    else:
        r = range_of(x)
        scale = 1.0 / (1.0 - p)
        out = Growth(x.q if x.depends else 0.0, depends=x.depends, real=x.real,
                     range=Range(lo=min(0.0, r.lo * scale), hi=max(0.0, r.hi * scale), below=r.below, above=r.above),
                     culprit=x.culprit)
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
    r = range_of(value) if (dropout_p in (0, 0.0, None)) else ANY
    out = Growth(value.q if value.depends else 0.0, depends=call.depends_any(), real=value.real, range=r,
                 culprit=value.culprit)
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
    call.selectors("query", "key", "score_mod", "block_mask", "scale", "score_mod_other_buffers",
                   "mask_mod_other_buffers")
    call.accept_params()
    if value is None:
        return unknown("flex_attention whose value argument qlint cannot find")
    out = Growth(value.q if value.depends else 0.0, depends=call.depends_any(), real=value.real, range=range_of(value),
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
    if depends and not output.depends:
        output = Growth(output.q, depends=depends, real=output.real, culprit=output.culprit)
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
    parameters = [g for name in call.arguments if name != "input" and name not in state_names
                  for g in call.growths(name)]
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
    out = Growth(algebra.compose(1.0, joint.q) if joint.depends else 0.0, depends=depends, range=Range(lo=0.0),
                 culprit=joint.culprit)
    if kind.endswith("cell"):
        return out
    return (out, out)


@transfer("interpolate")
def interpolate(call: Call, entry: Any) -> Any:
    """Resampling is a linear map with bounded gain: nearest / linear / bilinear / trilinear /
    area weights are convex (the range is kept); bicubic weights are not."""
    x = call.growth("input")
    mode = call.param("mode", "nearest")
    call.accept_params()
    if x is None:
        return CONSTANT
    convex = mode in ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "area") \
        and "bicubic" not in call.op
    r = range_of(x) if convex else ANY
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
        return combine_max(x, value, r=domain.union(range_of(x), range_of(value)))
    fill = 0.0 if value is None else float(value)
    r = domain.union(range_of(x), domain.point(fill)) if mode == "constant" else range_of(x)
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
    r = domain.union(range_of(x), domain.point(0.0)) if convex else ANY
    return Growth(x.q if x.depends else 0.0, depends=x.depends or call.depends_any(), real=x.real, range=r,
                  culprit=x.culprit)


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
    return Growth(x.q if x.depends else 0.0, depends=x.depends, real=real, range=x.range if keep else ANY,
                  culprit=x.culprit)


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
    if s.depends and (reciprocal_range(s) is None or s.real is not True):
        return unknown(f"{entry.name} by a scale computed from the input that may approach 0 (x / s is NaN at s = 0)")
    if not s.depends and not nonzero_constant(call, "scale"):
        call.hazard(f"{entry.name} by a scale that may be 0", "scale", has_zero)
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
            return outputs(call, unknown(f"{entry.name} switched on and off by the input"),
                           rest=Growth(0.0, range=domain.interval(0.0, 1.0)))
        quantized = combine_max(quantized, x)
    # the cachemask variants also return the mask
    return outputs(call, quantized, rest=Growth(0.0, depends=x.depends, range=domain.interval(0.0, 1.0)))
