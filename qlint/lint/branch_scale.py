"""How small each residual branch enters the stream, next to the model's own layers (source 001, Part V).

One measurement for QL204, QL206 (DeepNorm's beta) and the probe's init diagnostics.
A branch's scale is the product of the constant or parameter factors at its end
(LayerScale, ReZero) and of its output projection's gain std(W)·sqrt(fan_in) (the
square root of Part I's n_in·sigma_w^2), divided by the median gain of the model's
*reference layers*. A branch that does not end in a weight layer enters at its factors.

The reference layers are those no branch-scaling scheme touches: the weight layers
off every branch's value path, i.e. attention's Q and K (they reach the output only
through the softmax, DeepNet's Lemma 4.1), stems and heads. GPT-2 scales only the
output projections, DeepNorm every layer on the value path (FFN, V, O), so only these
layers tell either from the model's base init. A model with none (all its weight
layers lie on a value path, as with HF GPT-2's fused c_attn) is measured against its
layers other than the output projections, which GPT-2's recipe leaves alone.

What an unscaled projection's gain is depends on the model's base init: the same as
the reference layers' under a fan-in init (PyTorch's default, xavier, kaiming), but
sqrt(n / n_ref) times it under one fixed std (GPT-2's 0.02) for a projection with n
inputs against the reference layers' n_ref (GPT-2's MLP projection reads 4d: twice).
The output projections tell which: every recipe treats them alike (GPT-2 and DeepNorm
scale them all, LayerScale none), so where they come in several fan_ins, a std that
does not fall with fan_in means a fixed std; one fan_in alone says nothing, and the
fan-in init is assumed. The scale is then taken against the gain that init gives a
layer of the projection's fan_in.

A branch is scaled when its scale is closer, in log scale, to 1/sqrt(N) for the N
residual branches of the stack (GPT-2's 1/sqrt(2L): two per layer) than to 1, the
unscaled value: at most N^(-1/4).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.fx as fx

from qlint.growth.stream import Term
from qlint.growth.engine import Analysis
from qlint.core.graph import module_path
from qlint.lint.graph_queries import (argument, constant_value, family, is_normalizer, once_per_graph, op, stacks,
                                     uses_running_stats)


@dataclass
class BranchScale:
    """One block's branch against the 1/sqrt(N) convention."""

    block: str
    projection: Optional[str]  # module path of the output projection; None when the branch ends in none
    relative_std: Optional[float]  # multiplier x gain / reference gain; None when a weight cannot be read
    expected: float  # 1/sqrt(N), N residual branches in the block's stack
    multiplier: float = 1.0  # the constant or parameter factors at the branch's end
    fixed_std: bool = False  # the base init read off the output projections: one std for every fan_in

    @property
    def limit(self) -> float:
        """N^(-1/4): halfway in log scale between the unscaled 1 and 1/sqrt(N)."""
        return math.sqrt(self.expected)

    @property
    def scaled(self) -> Optional[bool]:
        """At most :attr:`limit`; None when a weight cannot be read."""
        if self.relative_std is None:
            return None
        return self.relative_std <= self.limit


@once_per_graph
def branch_scales(analysis: Analysis) -> list[BranchScale]:
    """Every block's branch scale (the largest of its velocity terms), in stream order."""
    blocks = analysis.stream.blocks
    ends = {b.name: [_branch_end(_entering(t), analysis) for t in b.terms] for b in blocks}
    projections = {node for terms in ends.values() for _, node in terms if _weight(node, analysis)[0]}
    reference, reference_fan_in = _reference(analysis, projections)

    def weights(nodes: set[fx.Node]) -> list[torch.Tensor]:
        return [w for w in (_weight(n, analysis)[1] for n in nodes) if w is not None]

    # one recipe per stack: DeepNet scales an encoder and a decoder by different betas, which mixed would
    # read as one std for every fan_in; a stack whose projections share one fan_in takes the model's answer
    model_fixed = bool(_fixed_std(weights(projections)))
    fixed_in: dict[int, bool] = {}
    for stack in stacks(analysis):
        own = _fixed_std(weights({node for b in stack for _, node in ends[b.name] if node in projections}))
        fixed_in.update({id(b): model_fixed if own is None else own for b in stack})

    def base(weight: torch.Tensor, fixed: bool) -> float:
        """The gain the model's base init gives a layer with this weight's fan_in."""
        return reference * (math.sqrt(_fan_in(weight) / reference_fan_in) if fixed else 1.0)

    depth = {id(b): len(stack) for stack in stacks(analysis) for b in stack}  # N counts the block's own stack
    out = []
    for block in blocks:
        expected, fixed = 1 / math.sqrt(depth[id(block)]), fixed_in[id(block)]
        measure = functools.partial(base, fixed=fixed) if reference else None
        scales = [(_relative(multiplier, node, measure, analysis), multiplier, node)
                  for multiplier, node in ends[block.name]]
        known = [s for s in scales if s[0] is not None]
        if not known:
            out.append(BranchScale(block.name, None, None, expected))
            continue
        relative, multiplier, node = max(known, key=lambda s: s[0])
        projection = (module_path(node) or node.name) if _weight(node, analysis)[0] else None
        out.append(BranchScale(block.name, projection, relative, expected, multiplier, fixed))
    return out


def gain(weight: torch.Tensor) -> float:
    """std(W)·sqrt(fan_in): a layer's output RMS for a unit-variance input."""
    weight = weight.detach().double()
    if weight.numel() <= 1:
        return float(weight.abs().max()) if weight.numel() else 0.0
    return float(weight.std()) * math.sqrt(_fan_in(weight))


def _fan_in(weight: torch.Tensor) -> int:
    return weight[0].numel() if weight.dim() > 1 else 1


def _relative(multiplier: Optional[float], node: fx.Node, base: Optional[Callable[[torch.Tensor], float]],
              analysis: Analysis) -> Optional[float]:
    if multiplier is None or base is None:
        return None
    is_layer, weight = _weight(node, analysis)
    if not is_layer:
        return multiplier
    return None if weight is None else multiplier * gain(weight) / base(weight)


def _fixed_std(projections: list[torch.Tensor]) -> Optional[bool]:
    """Whether the output projections keep one std across their fan_ins (GPT-2's 0.02) rather
    than a std falling like fan_in^(-1/2) (a fan-in init): the slope of log std against
    log fan_in between the narrowest and the widest, nearer 0 than -1/2; None with one fan_in."""
    by_fan_in: dict[int, list[float]] = {}
    for weight in projections:
        std = float(weight.double().std()) if weight.numel() > 1 else 0.0
        if std > 0:
            by_fan_in.setdefault(_fan_in(weight), []).append(std)
    if len(by_fan_in) < 2:
        return None
    low, high = min(by_fan_in), max(by_fan_in)
    slope = math.log(statistics.median(by_fan_in[high]) / statistics.median(by_fan_in[low])) / math.log(high / low)
    return slope > -0.25


def _entering(term: Term) -> fx.Node:
    """The value that carries a velocity term into the join: ``gamma * (pool(y) - y)`` for the
    term pool(y) of PoolFormer's LayerScaled token mixer, whose scale sits above the split."""
    if term.path:
        join, name = term.path[0]
        value = argument(join, name)
        if isinstance(value, fx.Node):
            return value
    return term.entry or term.node


def _branch_end(term: fx.Node, analysis: Analysis) -> tuple[Optional[float], fx.Node]:
    """The product of the constant or parameter factors at a branch's end and the node they
    scale (through carriers such as dropout); None for a factor whose value cannot be read."""
    data = analysis.graph.data
    scale, node = 1.0, term
    while True:
        kind = op(node)
        if "carrier" in family(node) and isinstance(argument(node, "input"), fx.Node):
            node = argument(node, "input")
            continue
        if is_normalizer(node):
            gain = _norm_gain(node, analysis)
            return (None if gain is None else scale * gain), node
        if uses_running_stats(node) and isinstance(argument(node, "input"), fx.Node):
            gain = _affine_gain(node, analysis)
            if gain is None:
                return None, node
            scale, node = scale * gain, argument(node, "input")
            continue
        if kind not in ("mul", "div"):
            return scale, node
        a, b = argument(node, "input"), argument(node, "other")
        dependent = [x for x in (a, b) if isinstance(x, fx.Node) and x in data]
        if len(dependent) != 1 or (kind == "div" and a is not dependent[0]):
            return scale, node  # a product of two signals, or c / f(x): not a scaling
        value = constant_value(b if a is dependent[0] else a, analysis)
        if value is None:
            return None, node
        if value.numel() == 0:
            return scale, node
        magnitude = _magnitude(value)
        scale *= float(magnitude.max()) if kind == "mul" else 1 / max(float(magnitude.min()), 1e-30)
        node = dependent[0]


def _norm_gain(node: fx.Node, analysis: Analysis) -> Optional[float]:
    """A normalization ending a branch sets its scale by its affine gamma (1 without one): a
    zero-initialised gamma (timm's ResNet zero_init_last, Swin v2's res-post-norm) enters at 0."""
    if node.op == "call_module":
        weight = getattr(analysis.module.get_submodule(str(node.target)), "weight", None)
        value = weight.detach() if isinstance(weight, torch.Tensor) else None
    else:
        weight = argument(node, "weight")
        value = constant_value(weight, analysis) if isinstance(weight, fx.Node) else None
    if weight is None:
        return 1.0
    if value is None or value.is_meta:
        return None
    return float(_magnitude(value).max()) if value.numel() else 1.0


def _magnitude(value: torch.Tensor) -> torch.Tensor:
    """|value| entrywise, in floating point: a factor may be a bool mask (DAC's residual
    quantizer multiplies by ``full(...) < n``) or an integer tensor, whose abs torch lacks or
    would overflow."""
    if not (value.is_floating_point() or value.is_complex()):
        value = value.to(torch.float64)
    return value.abs()


def _affine_gain(node: fx.Node, analysis: Analysis) -> Optional[float]:
    """BatchNorm on running statistics is gamma (x - mu) / sqrt(var + eps) + beta: its largest
    gain max|gamma| / sqrt(min var + eps) (a zero-initialised last BatchNorm, timm's RegNet and
    ResNet zero_init_last, enters at 0); None when a statistic cannot be read, or when var + eps
    reaches 0 (the division has no finite gain; the propagation reports that block by itself)."""
    weight, variance = argument(node, "weight"), argument(node, "running_var")
    gamma = constant_value(weight, analysis) if isinstance(weight, fx.Node) else None
    var = constant_value(variance, analysis) if isinstance(variance, fx.Node) else None
    eps = argument(node, "eps", 1e-5)
    if var is None or var.is_meta or not var.numel() or not isinstance(eps, (int, float)):
        return None
    if weight is None:
        top: Optional[float] = 1.0
    elif gamma is None or gamma.is_meta:
        top = None
    else:
        top = float(_magnitude(gamma).max()) if gamma.numel() else 1.0
    floor = max(float(var.to(torch.float64).min()), 0.0) + eps
    if top is None or floor <= 0:
        return None
    return top / math.sqrt(floor)


def _weight(node: fx.Node, analysis: Analysis) -> tuple[bool, Optional[torch.Tensor]]:
    """Whether the node is a weight layer (Linear, convolution, HF's Conv1D addmm with a
    weight that does not depend on the input) and its weight as (fan_out, fan_in, ...)."""
    kind = op(node)
    name = {"linear": "weight", "convolution": "weight", "addmm": "mat2"}.get(kind)
    weight = argument(node, name) if name else None
    if not isinstance(weight, fx.Node) or weight in analysis.graph.data:
        return False, None
    value = constant_value(weight, analysis)
    if value is not None and kind == "addmm":
        value = value.t() if value.dim() == 2 else None  # x @ W + b with W (fan_in, fan_out)
    return True, value


def _value_path(analysis: Analysis) -> set[fx.Node]:
    """The weight layers whose output reaches a branch's term other than through a softmax
    (attention weights are row-stochastic) or a normalizer (it removes the scale behind it)."""
    found: set[fx.Node] = set()
    parents = analysis.graph.parents
    for block in analysis.stream.blocks:
        region = block.region_set
        stack, seen = [t.node for t in block.terms], set()
        while stack:
            node = stack.pop()
            if node in seen or node not in region:
                continue
            seen.add(node)
            if _weight(node, analysis)[0]:
                found.add(node)
            if "softmax" in family(node) or is_normalizer(node):
                continue
            value = argument(node, "value") if op(node) == "attention" else None
            stack.extend([value] if isinstance(value, fx.Node) else parents.get(node, ()))
    return found


def _reference(analysis: Analysis, projections: set[fx.Node]) -> tuple[Optional[float], float]:
    """The median gain and fan_in of the reference layers (module docstring), each weight
    counted once; the gain is None when no weight can be read (a model built on meta)."""
    layers = [n for n in analysis.graph.nodes if n in analysis.graph.data and _weight(n, analysis)[0]]
    on_path = _value_path(analysis)
    chosen = [n for n in layers if n not in on_path] or [n for n in layers if n not in projections]
    weights: dict[fx.Node, torch.Tensor] = {}
    for node in chosen:
        key = argument(node, {"addmm": "mat2"}.get(op(node), "weight"))
        value = _weight(node, analysis)[1]
        if value is not None and gain(value) > 0:  # a zero-initialised layer has no scale to compare with
            weights.setdefault(key, value)
    if not weights:
        return None, 1.0
    return statistics.median(gain(w) for w in weights.values()), statistics.median(_fan_in(w) for w in weights.values())
