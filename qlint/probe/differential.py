"""Random residual blocks drawn from the op vocabulary, for the differential soundness law.

A *recipe* is a small expression tree over the block input ``x`` (shape :data:`SHAPE`),
built from the registry's ops in every argument role: the main input, a second operand,
a weight or bias computed from ``x`` (``layer_norm(a, weight=w(b))``), a bound
(``clamp(a, min=b)``), an interpolation weight (``lerp(a, b, c)``), an exponent or a
``beta`` parameter, a tensor-valued parameter of either sign, numbers of both signs,
zero and infinity; complex intermediates (``view_as_complex``); and every way of
writing the stream update (``x + v``, ``x - v``, ``alpha * x + v`` with a learned
alpha, ``lerp(x, v, w)``, ``addcmul``, ``torch.add(x, v, alpha=c)``, ``sum([x, v])``,
``stack([x, v]).sum(0)``, an ``nn.Identity`` skip, or no skip at all).

:func:`check` is the law: whenever qlint certifies a generated model, its eager float64
velocity, measured by :mod:`qlint.probe.witness` along adversarial directions and under
adversarial parameter values, is finite and grows at most linearly (and at most like
the block's static q when there is one block). ``tests/probe/test_differential.py`` runs it
for a bounded number of examples in CI; ``bench/differential_long.py`` for minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

D = 6
SHAPE = (2, 3, D)
TOLERANCE = 0.25  # on measured exponents, as the adversarial corpus's truth script

Recipe = tuple  # ("x",) | ("lin", r) | ("param", sign) | ("const", c) | (op, *operands, params)

INF = math.inf


# --- the vocabulary ----------------------------------------------------------------------------


def _hand_rms(a: torch.Tensor, eps: float) -> torch.Tensor:
    return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps)


def _hand_ln(a: torch.Tensor, eps: float) -> torch.Tensor:
    centred = a - a.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps)


def _hand_l2(a: torch.Tensor, eps: float) -> torch.Tensor:
    return a / (a.norm(dim=-1, keepdim=True) + eps)


def _stable_softmax(a: torch.Tensor) -> torch.Tensor:
    e = torch.exp(a - a.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _complex_square_real(a: torch.Tensor) -> torch.Tensor:
    z = torch.view_as_complex(a.reshape(*a.shape[:-1], D // 2, 2).contiguous())
    return torch.view_as_real(z * z).reshape(a.shape)


def _complex_abs(a: torch.Tensor) -> torch.Tensor:
    z = torch.view_as_complex(a.reshape(*a.shape[:-1], D // 2, 2).contiguous())
    return z.abs().repeat_interleave(2, dim=-1)


# name: (function of (operands..., params), arity, parameter choices)
UNARY: dict[str, tuple[Callable, tuple]] = {
    "relu": (lambda a: torch.relu(a), ()),
    "gelu": (lambda a: F.gelu(a), ()),
    "silu": (lambda a: F.silu(a), ()),
    "tanh": (lambda a: torch.tanh(a), ()),
    "sigmoid": (lambda a: torch.sigmoid(a), ()),
    "softsign": (lambda a: F.softsign(a), ()),
    "logsigmoid": (lambda a: F.logsigmoid(a), ()),
    "erf": (lambda a: torch.erf(a), ()),
    "erfc": (lambda a: torch.erfc(a), ()),
    "atan": (lambda a: torch.atan(a), ()),
    "sin": (lambda a: torch.sin(a), ()),
    "abs": (lambda a: torch.abs(a), ()),
    "neg": (lambda a: -a, ()),
    "floor": (lambda a: torch.floor(a), ()),
    "frac": (lambda a: torch.frac(a), ()),
    "sign": (lambda a: torch.sign(a), ()),
    "exp": (lambda a: torch.exp(a), ()),
    "expm1": (lambda a: torch.expm1(a), ()),
    "log": (lambda a: torch.log(a), ()),
    "log1p": (lambda a: torch.log1p(a), ()),
    "sqrt": (lambda a: torch.sqrt(a), ()),
    "rsqrt": (lambda a: torch.rsqrt(a), ()),
    "reciprocal": (lambda a: torch.reciprocal(a), ()),
    "square": (lambda a: torch.square(a), ()),
    "sinh": (lambda a: torch.sinh(a), ()),
    "softmax": (lambda a: F.softmax(a, dim=-1), ()),
    "log_softmax": (lambda a: F.log_softmax(a, dim=-1), ()),
    "layer_norm": (lambda a: F.layer_norm(a, (D,)), ()),
    "rms_norm": (lambda a: F.rms_norm(a, (D,), eps=1e-6), ()),
    "stable_softmax": (_stable_softmax, ()),
    "complex_square": (_complex_square_real, ()),
    "complex_abs": (_complex_abs, ()),
    "mean": (lambda a: a.mean(-1, keepdim=True).expand_as(a), ()),
    "amax": (lambda a: a.amax(-1, keepdim=True).expand_as(a), ()),
    "var": (lambda a: a.var(-1, keepdim=True).expand_as(a), ()),
    "cumsum": (lambda a: a.cumsum(-1), ()),
    "flip": (lambda a: a.flip(-1), ()),
    "half_roundtrip": (lambda a: a.float().double(), ()),
    "softplus": (lambda a, beta: F.softplus(a, beta=beta), (1.0, 2.0, -1.0)),
    "leaky_relu": (lambda a, slope: F.leaky_relu(a, slope), (0.1, -2.0)),
    "elu": (lambda a, alpha: F.elu(a, alpha), (1.0, -1.0)),
    "hardtanh": (lambda a, bounds: F.hardtanh(a, *bounds), ((-1.0, 1.0), (0.0, 5.0), (-INF, INF))),
    "clamp_min": (lambda a, c: torch.clamp(a, min=c), (0.0, 1.0, -1.0, -INF)),
    "clamp_max": (lambda a, c: torch.clamp(a, max=c), (0.0, 4.0, -1.0, INF)),
    "clamp_both": (lambda a, c: torch.clamp(a, -c, c), (1.0, INF)),
    "pow": (lambda a, p: a ** p, (2, 3, 0.5, -1, 1.5)),
    "scale": (lambda a, c: a * c, (3.0, -2.0, 0.0)),
    "shift": (lambda a, c: a + c, (1.0, -1.0, 1e-3)),
    "normalize": (lambda a, p: F.normalize(a, p=p, dim=-1), (2.0, 1.0, INF, 0.0)),
    "hand_rms": (_hand_rms, (1e-6, -1e-3)),
    "hand_ln": (_hand_ln, (1e-5, -1e-5)),
    "hand_l2": (_hand_l2, (1e-6, -1e-6)),
    # multi-output ops read through their named outputs (a rule's tuple must match the op's)
    "max_values": (lambda a: torch.max(a, -1, keepdim=True).values.expand_as(a), ()),
    "sort_values": (lambda a: torch.sort(a, -1).values, ()),
    "topk_values": (lambda a: torch.topk(a, 2, -1).values.repeat(1, 1, D // 2), ()),
    "var_mean_first": (lambda a: torch.var_mean(a, -1, keepdim=True)[0].expand_as(a), ()),
    "split_cat": (lambda a: torch.cat(a.split(2, -1)[::-1], -1), ()),
    "embedding_bag": (
        lambda a: F.embedding_bag(torch.arange(4).view(2, 2), a.reshape(-1, D), mode="sum")[:, None, :].expand_as(a), ()
    ),
    # branches the example's grad mode or shape decides: the graph check must see the other path
    "grad_dispatch": (lambda a: a * a if a.requires_grad else a, ()),
    "grad_enabled_dispatch": (lambda a: a * a if torch.is_grad_enabled() else a, ()),
    "shape_dispatch": (lambda a: a * a if a.shape[-2] > SHAPE[-2] else a, ()),
    "bits": (lambda a: (a.float().view(torch.int32) * 2).view(torch.float32).to(a.dtype), ()),
}

BINARY: dict[str, tuple[Callable, tuple]] = {
    "add": (lambda a, b: a + b, ()),
    "sub": (lambda a, b: a - b, ()),
    "mul": (lambda a, b: a * b, ()),
    "div": (lambda a, b: a / b, ()),
    "maximum": (lambda a, b: torch.maximum(a, b), ()),
    "minimum": (lambda a, b: torch.minimum(a, b), ()),
    "atan2": (lambda a, b: torch.atan2(a, b), ()),
    "hypot": (lambda a, b: torch.hypot(a, b), ()),
    "logaddexp": (lambda a, b: torch.logaddexp(a, b), ()),
    "fmod": (lambda a, b: torch.fmod(a, b), ()),
    "where": (lambda a, b: torch.where(a > 0, a, b), ()),
    "clamp_by": (lambda a, b: torch.clamp(a, min=b), ()),
    "clamp_cap": (lambda a, b: torch.clamp(a, max=b), ()),
    "ln_weight": (lambda a, b: F.layer_norm(a, (D,), weight=b.mean((0, 1))), ()),
    "ln_bias": (lambda a, b: F.layer_norm(a, (D,), bias=b.mean((0, 1))), ()),
    "attention": (lambda a, b: torch.softmax(a @ b.transpose(-1, -2), -1) @ b, ()),
    "bilinear": (lambda a, b: (a * b).sum(-1, keepdim=True) * a, ()),
    "cat": (lambda a, b: torch.cat([a, b], -1)[..., :D], ()),
    "add_alpha": (lambda a, b, alpha: torch.add(a, b, alpha=alpha), (2.0, -1.0)),
    "lerp": (lambda a, b, w: torch.lerp(a, b, w), (0.5, 2.0, -1.0)),
    # a 0-dim tensor computed from the input in a parameter's place
    "leaky_by": (lambda a, b: F.leaky_relu(a, b.mean()), ()),
    "elu_by": (lambda a, b: F.elu(a, b.abs().mean()), ()),
    "clamp_min_by": (lambda a, b: torch.clamp(a, min=b.mean()), ()),
    "pow_by": (lambda a, b: a.abs() ** (1 + torch.sigmoid(b.mean())), ()),
    "threshold_by": (lambda a, b: F.threshold(a, 0.0, b.mean()), ()),
}

TERNARY: dict[str, Callable] = {
    "lerp_tensor": lambda a, b, c: torch.lerp(a, b, c),
    "addcmul": lambda a, b, c: torch.addcmul(a, b, c),
    "addcdiv": lambda a, b, c: torch.addcdiv(a, b, c),
}

# how the block writes its update of the stream x with velocity v (and two more branches)
STREAMS = ("plus", "minus", "plus_left", "add_kwargs", "add_alpha", "two_x", "alpha_param", "lerp_const", "lerp_param",
           "addcmul", "python_sum", "stack_sum", "identity_skip", "carry", "no_skip", "slice_skip", "row_broadcast",
           "token_broadcast", "stem_head")


@dataclass(frozen=True)
class Example:
    """One generated block: how it updates the stream, its velocity recipe(s), a seed."""

    stream: str
    velocity: Recipe
    extra: Recipe
    seed: int

    def __str__(self) -> str:
        return f"stream={self.stream} v={_show(self.velocity)} extra={_show(self.extra)} seed={self.seed}"


def _show(recipe: Recipe) -> str:
    kind = recipe[0]
    if kind == "x":
        return "x"
    if kind == "lin":
        return f"W({_show(recipe[1])})"
    if kind == "param":
        return f"p{'+' if recipe[1] > 0 else '-'}"
    if kind == "const":
        return f"{recipe[1]:g}"
    name, *rest = recipe
    operands = [r for r in rest if isinstance(r, tuple) and r and isinstance(r[0], str)]
    params = [r for r in rest if r not in operands]
    return f"{name}({', '.join([_show(o) for o in operands] + [repr(p) for p in params])})"


# --- hypothesis strategies ---------------------------------------------------------------------


def recipes(depth: int = 3):
    """Expression trees over x: every op in every argument role, leaves of both signs."""
    from hypothesis import strategies as st

    leaves = st.one_of(
        st.just(("x",)),
        st.just(("lin", ("x",))),
        st.sampled_from([("param", 1.0), ("param", -1.0)]),
        st.sampled_from([("const", 2.0), ("const", -0.5)]),
    )

    def extend(children):
        unary = st.tuples(st.sampled_from(sorted(UNARY)), children).flatmap(
            lambda t: st.sampled_from(UNARY[t[0]][1]).map(lambda p: (t[0], t[1], p)) if UNARY[t[0]][1] else st.just(t))
        binary = st.tuples(st.sampled_from(sorted(BINARY)), children, children).flatmap(
            lambda t: st.sampled_from(BINARY[t[0]][1]).map(lambda p: (*t, p)) if BINARY[t[0]][1] else st.just(t))
        ternary = st.tuples(st.sampled_from(sorted(TERNARY)), children, children, children)
        linear = children.map(lambda c: ("lin", c))
        return st.one_of(unary, binary, ternary, linear)

    return st.recursive(leaves, extend, max_leaves=depth * 2)


def examples(depth: int = 3):
    from hypothesis import strategies as st

    return st.builds(Example, st.sampled_from(STREAMS), recipes(depth), recipes(2), st.integers(0, 2**16))


# --- building the model --------------------------------------------------------------------------


class Generated(nn.Module):
    """The eager model of an Example: forward writes the stream update the example names."""

    def __init__(self, example: Example) -> None:
        super().__init__()
        self.example = example
        generator = torch.Generator().manual_seed(example.seed)
        self.linears = nn.ModuleList()
        self.params = nn.ParameterList()
        self._plan: dict[int, int] = {}
        for recipe in (example.velocity, example.extra):
            self._allocate(recipe, generator)
        self.alpha = nn.Parameter(torch.tensor(1.3))
        self.carry = nn.Parameter(torch.full((D,), 0.7))
        self.skip = nn.Identity()
        self.stem, self.head = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def _allocate(self, recipe: Recipe, generator: torch.Generator) -> None:
        kind = recipe[0]
        if kind == "lin":
            linear = nn.Linear(D, D)
            with torch.no_grad():
                linear.weight.copy_(torch.randn(D, D, generator=generator) / math.sqrt(D))
                linear.bias.copy_(torch.randn(D, generator=generator) * 0.1)
            self._plan[id(recipe)] = len(self.linears)
            self.linears.append(linear)
        elif kind == "param":
            value = recipe[1] * (torch.rand(D, generator=generator) + 0.5)
            self._plan[id(recipe)] = len(self.params)
            self.params.append(nn.Parameter(value))
        for child in recipe[1:]:
            if isinstance(child, tuple) and child and isinstance(child[0], str):
                self._allocate(child, generator)

    def evaluate(self, recipe: Recipe, x: torch.Tensor) -> torch.Tensor:
        kind = recipe[0]
        if kind == "x":
            return x
        if kind == "lin":
            return self.linears[self._plan[id(recipe)]](self.evaluate(recipe[1], x))
        if kind == "param":
            return self.params[self._plan[id(recipe)]].expand_as(x)
        if kind == "const":
            return torch.full_like(x, recipe[1])
        name, *rest = recipe
        operands = [self.evaluate(r, x) for r in rest if isinstance(r, tuple) and r and isinstance(r[0], str)]
        params = [r for r in rest if not (isinstance(r, tuple) and r and isinstance(r[0], str))]
        if name in UNARY:
            return UNARY[name][0](*operands, *params)
        if name in BINARY:
            return BINARY[name][0](*operands, *params)
        return TERNARY[name](*operands)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.evaluate(self.example.velocity, x)
        stream = self.example.stream
        if stream == "plus":
            return x + v
        if stream == "minus":
            return x - v
        if stream == "plus_left":
            return v + x
        if stream == "add_kwargs":
            return torch.add(input=x, other=v)
        if stream == "add_alpha":
            return torch.add(x, v, alpha=0.5)
        if stream == "two_x":
            return 2 * x + v
        if stream == "alpha_param":
            return self.alpha * x + v
        if stream == "lerp_const":
            return torch.lerp(x, v, 0.3)
        if stream == "lerp_param":
            return torch.lerp(x, v, torch.sigmoid(self.alpha))
        if stream == "addcmul":
            return torch.addcmul(x, v, self.evaluate(self.example.extra, x))
        if stream == "python_sum":
            return sum([x, v, self.evaluate(self.example.extra, x)])
        if stream == "stack_sum":
            return torch.stack([x, v]).sum(0)
        if stream == "identity_skip":
            return self.skip(x) + v
        if stream == "carry":
            return self.carry * x + v
        if stream == "slice_skip":
            return x[..., :] * 1.0 + v
        if stream == "row_broadcast":  # one value per token, broadcast back over the channels
            return x + v.sum(-1, keepdim=True)
        if stream == "token_broadcast":  # one value per channel, pooled over the tokens
            return x + v.mean(-2, keepdim=True)
        if stream == "stem_head":  # the update between a stem and a head of another width
            h = self.stem(x)
            return self.head(h + self.evaluate(self.example.velocity, h[..., :D]).sum(-1, keepdim=True))
        return v  # no_skip


# --- the law -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    example: Example
    verdict: str  # qlint's: certified / supercritical / uncertified / refused (could not trace)
    q_static: Optional[float]
    measured: Optional[float]
    nonfinite: bool
    violation: str = ""

    @property
    def sound(self) -> bool:
        return not self.violation


LONGER = (*SHAPE[:-2], SHAPE[-2] + 2, SHAPE[-1])  # a second length the witness measures at (shape dispatch)


def inputs(seed: int = 0, shape: tuple = SHAPE) -> tuple[torch.Tensor]:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)),)


def check(example: Example, *, quick: bool = True) -> Outcome:
    """qlint's verdict on the example against the eager witness (see the module docstring)."""
    from qlint.analysis import Options, run
    from qlint.capture.trace import TraceFailure
    from qlint.probe.witness import witness

    model = Generated(example)
    try:
        with torch.no_grad():
            model(*inputs())
    except Exception:  # not a model (shapes, dtypes): nothing to check
        return Outcome(example, "invalid", None, None, False)
    try:
        report = run(model, inputs(), spec="generated", options=Options()).report
    except TraceFailure:
        return Outcome(example, "refused", None, None, False)
    outcome = Outcome(example, report.verdict, report.max_q, None, False)
    if report.verdict != "certified":
        return outcome

    measured = None
    for shape in (SHAPE, LONGER):  # the example's length, and a longer one the trace never saw

        def build(shape: tuple = shape) -> tuple[nn.Module, torch.Tensor]:
            fresh = Generated(example).double()
            return fresh, inputs(shape=shape)[0].double()

        try:
            found = witness(build, quick=quick, grad=model.training)  # in the grad mode training runs in
        except Exception:  # noqa: BLE001  (the model does not run at the longer length: nothing there)
            continue
        if measured is None:
            measured = found
        else:
            measured.rays += found.rays
    outcome.measured, outcome.nonfinite = measured.measured, measured.nonfinite
    bound = 1.0
    if len(report.blocks) == 1 and not report.transitions and report.blocks[0].q is not None:
        bound = max(report.blocks[0].q, 0.0)
    if measured.nonfinite:
        bad = next(r for r in measured.rays if r.nonfinite_at is not None)
        outcome.violation = (f"certified, but v is not finite at scale {bad.nonfinite_at:.3g} "
                             f"({bad.perturbation}, {bad.direction})")
    elif outcome.measured is not None and outcome.measured > bound + TOLERANCE:
        worst = measured.worst()
        where = f" ({worst.perturbation}, {worst.direction})" if worst else ""
        outcome.violation = f"certified with q <= {bound:g}, but v grows like s^{outcome.measured:.2f}{where}"
    return outcome


__all__ = ["D", "Example", "Generated", "Outcome", "SHAPE", "STREAMS", "check", "examples", "inputs", "recipes"]
