"""Entrywise maps: activations (Table 1), arithmetic, powers, exp/log with sign reasoning."""

from __future__ import annotations

import math

from qlint import algebra
from qlint.growth import ANY_SIGN, NONNEG, NONPOS, Growth
from qlint.rules.primitives import (
    Call,
    bounded,
    composed,
    first,
    multiplied,
    passthrough,
    primitive,
    summed,
)


def _targets(*names: str, modules: tuple[str, ...] = (), methods: tuple[str, ...] = ()) -> list[str]:
    """torch.X, torch.nn.functional.X and aten.X for each name, plus methods/modules."""
    out: list[str] = []
    for name in names:
        out += [f"torch.{name}", f"torch.nn.functional.{name}", f"aten.{name}", f"method:{name}"]
    out += [f"module:torch.nn.{m}" for m in modules]
    out += [f"method:{m}" for m in methods]
    return out


# --- Table 1: saturating and Lipschitz activations ------------------------------------

primitive(
    "Saturating activation (tanh, hardtanh, softsign)",
    "0",
    "Table 1: the output lies in [-M, M]^d whatever the input, so ||out|| <= M sqrt(d).",
    _targets("tanh", "hardtanh", "softsign", "tanh_", modules=("Tanh", "Hardtanh", "Softsign")) + ["torch.erf", "aten.erf", "method:erf", "torch.special.erf"],
    bounded(),
    coefficient="M sqrt(d)",
    table1=True,
)
primitive(
    "Saturating activation (sigmoid, ReLU6, hardsigmoid)",
    "0",
    "Table 1: the output lies in [0, M]^d whatever the input, so ||out|| <= M sqrt(d).",
    _targets("sigmoid", "relu6", "hardsigmoid", modules=("Sigmoid", "ReLU6", "Hardsigmoid")) + ["torch.special.expit"],
    bounded(sign=NONNEG),
    coefficient="M sqrt(d)",
    table1=True,
)
primitive(
    "Bounded periodic map (sin, cos)",
    "0",
    "|sin|, |cos| <= 1 entrywise, so the output norm is at most sqrt(d).",
    _targets("sin", "cos"),
    bounded(),
    coefficient="sqrt(d)",
)
primitive(
    "Softmax",
    "0",
    "Table 1: a row-stochastic output has every row of norm at most 1.",
    _targets("softmax", "softmin", "_softmax", "_safe_softmax", modules=("Softmax", "Softmin", "Softmax2d"))
    + ["torch.special.softmax"],
    bounded(sign=NONNEG),
    coefficient="1",
    table1=True,
)
primitive(
    "Lipschitz activation (ReLU family)",
    "1",
    "Table 1: ReLU-like maps are 1-Lipschitz with sigma(0) = 0 and non-negative: |sigma(x)| <= |x|.",
    _targets("relu", "relu_", modules=("ReLU",)),
    composed(1.0, sign=NONNEG),
    coefficient="Lip(sigma)",
    table1=True,
)
primitive(
    "Lipschitz activation (GELU, SiLU, ELU, Mish, LeakyReLU, ...)",
    "1",
    """Table 1: each is Lipschitz with |sigma(x)| <= L |x| + b, so q = 1; ELU/CELU/SELU are
    bounded below, GELU/SiLU/Mish are x times a bounded gate.""",
    _targets(
        "gelu",
        "silu",
        "mish",
        "elu",
        "celu",
        "selu",
        "leaky_relu",
        "hardswish",
        "prelu",
        "rrelu",
        "logsigmoid",
        "tanhshrink",
        "softshrink",
        "hardshrink",
        "_prelu_kernel",
        modules=(
            "GELU",
            "SiLU",
            "Mish",
            "ELU",
            "CELU",
            "SELU",
            "LeakyReLU",
            "Hardswish",
            "PReLU",
            "RReLU",
            "LogSigmoid",
            "Tanhshrink",
            "Softshrink",
            "Hardshrink",
        ),
    )
    + ["torch.nn.functional.log_sigmoid", "aten.log_sigmoid_forward"],
    composed(1.0),
    coefficient="Lip(sigma)",
    table1=True,
)
primitive(
    "Softplus",
    "1",
    "softplus(x) = log(1 + e^x) <= |x| + log 2 and is positive: Lipschitz, q = 1.",
    _targets("softplus", modules=("Softplus",)),
    composed(1.0, sign=NONNEG),
    coefficient="1",
)
primitive(
    "log-softmax / logsumexp",
    "1",
    "|logsumexp(x)| <= max|x| + log n and log_softmax(x) = x - logsumexp(x): q = 1.",
    _targets("log_softmax", "_log_softmax", "logsumexp", modules=("LogSoftmax",)),
    composed(1.0),
)


# --- arithmetic -------------------------------------------------------------------------

primitive(
    "Sum / difference",
    "max(q_a, q_b)",
    "Theorem 9(ii): ||a + b|| <= ||a|| + ||b||, so the larger exponent dominates.",
    [
        "_operator.add",
        "_operator.sub",
        "_operator.iadd",
        "_operator.isub",
        "torch.add",
        "torch.sub",
        "torch.subtract",
        "torch.rsub",
        "aten.add",
        "aten.sub",
        "aten.rsub",
        "method:add",
        "method:sub",
        "method:add_",
        "method:sub_",
        "method:__add__",
        "method:__radd__",
        "method:__sub__",
        "method:__rsub__",
    ],
    summed,
)


def _lerp(call: Call) -> Growth:
    """lerp(a, b, w) = a + w * (b - a): a sum with a Hadamard product by the weight."""
    a, b, weight = call.growth(0, "input"), call.growth(1, "end"), call.growth(2, "weight")
    step = multiplied(Call(call.node, (weight, summed(Call(call.node, (a, b), {}))), {}))
    return summed(Call(call.node, (a, step), {}))


primitive(
    "Linear interpolation (lerp)",
    "max(q_a, q_w + max(q_a, q_b))",
    "lerp(a, b, w) = a + w(b - a): Theorem 9(ii) for the sum, 9(iii) for the weighted step.",
    ["torch.lerp", "aten.lerp", "method:lerp"],
    _lerp,
)


def _negate(call: Call) -> Growth:
    x = first(call)
    return Growth(x.q, depends=x.depends, sign=-x.sign, culprit=x.culprit)


primitive(
    "Negation",
    "q",
    "||-x|| = ||x||; the sign flips, which the exp rule uses.",
    ["_operator.neg", "torch.neg", "torch.negative", "aten.neg", "method:neg", "method:__neg__"],
    _negate,
)

primitive(
    "Absolute value",
    "q",
    "|| |x| || = ||x||, and the result is non-negative.",
    ["torch.abs", "aten.abs", "method:abs", "_operator.abs"],
    lambda call: Growth(first(call).q, depends=first(call).depends, sign=NONNEG, culprit=first(call).culprit),
)

primitive(
    "Hadamard product",
    "q_a + q_b",
    "Theorem 9(iii): |a_i b_i| <= |a_i| |b_i| entrywise, so the exponents add (gating).",
    [
        "_operator.mul",
        "_operator.imul",
        "torch.mul",
        "torch.multiply",
        "aten.mul",
        "method:mul",
        "method:mul_",
        "method:__mul__",
        "method:__rmul__",
        "torch.addcmul",
        "aten.addcmul",
    ],
    multiplied,
)

primitive(
    "Matrix / tensor product",
    "q_a + q_b",
    """Theorem 9(iii) for bilinear maps: ||A B|| <= ||A|| ||B||. Attention written out by
    hand is bounded this way: softmax(...) (q = 0) times V (q = 1).""",
    [
        "_operator.matmul",
        "torch.matmul",
        "torch.bmm",
        "torch.mm",
        "torch.einsum",
        "torch.outer",
        "torch.bilinear",
        "torch.tensordot",
        "torch.baddbmm",
        "aten.matmul",
        "aten.bmm",
        "aten.mm",
        "aten.mv",
        "aten.einsum",
        "aten.outer",
        "aten.dot",
        "method:matmul",
        "method:bmm",
        "method:mm",
        "method:__matmul__",
    ],
    multiplied,
)


def _divide(call: Call) -> Growth:
    """a / b is bounded by |a| / c when b is a constant or stays above c > 0."""
    num, den = call.growth(0, "input"), call.growth(1, "other")
    if not den.depends or den.floor:
        out = Growth(num.q, depends=num.depends, culprit=num.culprit)
        if den.sign != ANY_SIGN and num.sign != ANY_SIGN:
            out = Growth(num.q, depends=num.depends, sign=num.sign * den.sign, culprit=num.culprit)
        return out
    return Growth(None, culprit="division by an input-dependent value that may approach 0")


primitive(
    "Division",
    "q_a (denominator constant or >= c > 0)",
    """|a/b| <= |a|/c when b >= c > 0 or b is a constant. A denominator that depends on
    the input and may approach 0 is not bounded (the normalization patterns that divide
    by a statistic of the numerator are recognised separately).""",
    [
        "_operator.truediv",
        "_operator.itruediv",
        "torch.div",
        "torch.true_divide",
        "torch.divide",
        "aten.div",
        "method:div",
        "method:div_",
        "method:__truediv__",
        "method:true_divide",
    ],
    _divide,
)


def _reciprocal(call: Call) -> Growth:
    x = first(call)
    if not x.depends:
        return Growth(0.0, depends=False, sign=x.sign)
    if x.floor:
        return Growth(0.0, sign=NONNEG)
    return Growth(None, culprit="reciprocal of an input-dependent value that may approach 0")


primitive(
    "Reciprocal / rsqrt",
    "0 (argument >= c > 0)",
    "1/x <= 1/c when x >= c > 0; otherwise unbounded near 0 and not certified.",
    ["torch.reciprocal", "torch.rsqrt", "aten.reciprocal", "aten.rsqrt", "method:reciprocal", "method:rsqrt"],
    _reciprocal,
)


def _power(call: Call) -> Growth:
    """x ** p: q = p * q_x for a constant p >= 0 (Table 1, polynomial activation)."""
    base, exponent = call.get(0, "input"), call.get(1, "exponent")
    if isinstance(base, (int, float)):  # c ** x == exp(x * log c)
        log_c_sign = NONNEG if base >= 1 else NONPOS
        argument = Growth(exponent.q, depends=exponent.depends, sign=exponent.sign * log_c_sign)
        return _exp(Call(call.node, (argument,), {}))
    if isinstance(exponent, Growth):
        if exponent.depends:
            return Growth(None, culprit="power with an input-dependent exponent")
        return Growth(None, culprit="power with a tensor exponent") if base.depends else Growth(0.0, depends=False)
    p = float(exponent)
    if not base.depends:
        return Growth(0.0, depends=False, sign=NONNEG if p % 2 == 0 else base.sign)
    even = p == int(p) and int(p) % 2 == 0
    sign = NONNEG if (even or base.sign == NONNEG) else ANY_SIGN
    if p < 0:
        return _reciprocal(Call(call.node, (base,), {}))
    return Growth(algebra.compose(p, base.q), sign=sign, floor=base.floor and p > 0, culprit=base.culprit)


primitive(
    "Polynomial activation x^p",
    "p * q",
    """Table 1: |x_i^p| <= ||x||^p entrywise, so q = p for x^p; a square root is p = 1/2.
    A negative power is a reciprocal and needs an argument bounded away from 0.""",
    [
        "_operator.pow",
        "_operator.ipow",
        "torch.pow",
        "torch.float_power",
        "aten.pow",
        "method:pow",
        "method:__pow__",
        "method:__rpow__",
    ],
    _power,
    coefficient="1",
    table1=True,
)
primitive(
    "Square",
    "2 q",
    "x^2 is the polynomial activation with p = 2.",
    ["torch.square", "aten.square", "method:square"],
    lambda call: _power(Call(call.node, (first(call), 2), {})),
)
primitive(
    "Square root",
    "q / 2",
    "sqrt(y) <= y^(1/2): the polynomial rule with p = 1/2 (argument assumed >= 0).",
    ["torch.sqrt", "aten.sqrt", "method:sqrt"],
    lambda call: _power(Call(call.node, (first(call), 0.5), {})),
)


def _exp(call: Call) -> Growth:
    """exp(a) is bounded when a is bounded above; otherwise super-polynomial."""
    a = first(call)
    if not a.depends:
        return Growth(0.0, depends=False, sign=NONNEG, floor=True)
    if a.q is not None and a.q == 0:
        return Growth(0.0, sign=NONNEG, floor=True)
    if a.sign == NONPOS:
        return Growth(0.0, sign=NONNEG)
    if a.q is None:
        return Growth(None, culprit=a.culprit)
    return Growth(algebra.SUPERPOLYNOMIAL, sign=NONNEG, culprit=f"{_op_name(call)} of an argument not bounded above")


def _op_name(call: Call) -> str:
    target = call.node.target if call.node is not None else "exp"
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


primitive(
    "Exponential",
    "0 (argument bounded above) / super-polynomial",
    """exp(a) <= 1 when a <= 0 (e.g. Mamba's exp(-softplus(.) * exp(A_log))) and is
    bounded when a is; an argument that is not bounded above grows faster than any
    polynomial (paper Remark 10: outside P).""",
    _targets("exp", "exp2", "expm1") + ["torch.special.exp2", "torch.special.expm1"],
    _exp,
)


def _hyperbolic(call: Call) -> Growth:
    a = first(call)
    if not a.depends:
        return Growth(0.0, depends=False)
    if a.q is not None and a.q == 0:
        return Growth(0.0)
    if a.q is None:
        return Growth(None, culprit=a.culprit)
    return Growth(algebra.SUPERPOLYNOMIAL, culprit=f"{_op_name(call)} of an unbounded argument")


primitive(
    "sinh / cosh",
    "super-polynomial (bounded argument: 0)",
    "sinh and cosh grow like e^|a|: faster than any polynomial unless a is bounded.",
    _targets("sinh", "cosh"),
    _hyperbolic,
)


def _log(call: Call) -> Growth:
    """log(a) for a >= c > 0 with a <= C||x||^q_a: |log a| <= |log c| + log C + q_a log||x||,
    which grows slower than ||x||, so q <= min(q_a, 1). A super-polynomial a gives no bound."""
    a = first(call)
    if not a.depends:
        return Growth(0.0, depends=False)
    shifted = "log1p" in _op_name(call) and a.sign == NONNEG
    if a.floor or shifted:
        if a.q is None or math.isinf(a.q):  # log(exp(exp(x))) = exp(x): no bound
            return Growth(a.q, culprit=a.culprit)
        return Growth(min(a.q, 1.0))
    return Growth(None, culprit="log of an argument that may approach 0")


primitive(
    "Logarithm",
    "min(q, 1) (argument >= c > 0)",
    """For a >= c > 0, |log a| <= |log c| + a, so q <= min(q_a, 1); log(1 + a) with a >= 0
    likewise. Near 0 the logarithm is unbounded and is not certified.""",
    _targets("log", "log2", "log10", "log1p"),
    _log,
)


def _clamp(call: Call) -> Growth:
    x = first(call)
    low, high = call.get(1, "min"), call.get(2, "max")
    if "clamp_max" in _op_name(call):
        low, high = None, low
    elif "clamp_min" in _op_name(call):
        high = None
    numeric_low = isinstance(low, (int, float))
    sign = NONNEG if numeric_low and low >= 0 else x.sign
    if low is not None and high is not None:
        return Growth(0.0, depends=x.depends, sign=sign)
    return Growth(x.q, depends=x.depends, sign=sign, floor=(numeric_low and low > 0) or x.floor, culprit=x.culprit)


primitive(
    "Clamp",
    "0 (both bounds) / q",
    """clamp to [lo, hi] is bounded; a one-sided clamp is 1-Lipschitz, and clamp(min=c)
    with c > 0 gives a safe denominator.""",
    _targets("clamp", "clip", "clamp_min", "clamp_max", "clamp_"),
    _clamp,
)

primitive(
    "Rounding",
    "q",
    "|round(x)| <= |x| + 1 entrywise (discontinuous, but its growth is linear).",
    _targets("floor", "ceil", "round", "trunc", "frac"),
    composed(1.0),
)
primitive(
    "Sign and comparisons",
    "0",
    "Indicators and signs take values in {-1, 0, 1}: bounded.",
    _targets("sign", "gt", "lt", "ge", "le", "eq", "ne", "isnan", "isinf", "isfinite", "logical_not", "logical_and", "logical_or")
    + ["_operator.gt", "_operator.lt", "_operator.ge", "_operator.le", "_operator.eq", "_operator.ne", "_operator.invert", "_operator.and_", "_operator.or_"],
    bounded(),
)
primitive(
    "Elementwise max / min / where",
    "max(q_a, q_b)",
    "Each output entry is one of the inputs' entries: Theorem 9(ii) bounds it.",
    _targets("maximum", "minimum", "fmax", "fmin", "where", "masked_fill", "masked_fill_", "_masked_fill") + ["method:masked_fill_"],
    summed,
)
primitive(
    "Dtype casts and copies",
    "q",
    "A cast or copy changes the representation, not the value's magnitude.",
    [
        "method:to",
        "method:float",
        "method:double",
        "method:half",
        "method:bfloat16",
        "method:type",
        "method:type_as",
        "method:contiguous",
        "method:clone",
        "method:detach",
        "method:requires_grad_",
        "method:cpu",
        "method:cuda",
        "torch.clone",
        "torch.detach",
        "aten._to_copy",
        "aten.to",
        "aten.clone",
        "aten.contiguous",
        "aten.detach",
        "aten.alias",
        "aten.lift_fresh_copy",
        "aten.type_as",
    ],
    passthrough,
    plumbing=True,
)

