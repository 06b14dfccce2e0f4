"""Initialization diagnostics (source 001, Parts I-III and V).

* Through the stack: the RMS of each block's input and output for a unit-variance
  input, and the RMS of the gradient at each for a unit-variance cotangent on the
  output. A residual block adds variance (Part III), so a block that more than
  doubles (or halves) either RMS is flagged, with its name.
* Per layer: the weight gain ``n_in * sigma_w^2`` (Part I) and the gain of the
  nonlinearity that follows, from ``torch.nn.init.calculate_gain`` (or 1/E[phi(z)^2]
  under a unit Gaussian for GELU and SiLU, which it does not list); their ratio is
  the layer's variance gain at init, 1 at criticality.
* Per residual branch: whether it enters the stream scaled like 1/sqrt(2L) next to the
  model's own layers (Part V; 2L is the number of residual branches), by the measure
  QL204 uses, :mod:`qlint.lint.branch_scale`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from qlint.core.ops import op_name
from qlint.core.graph import facts, module_path
from qlint.lint.branch_scale import BranchScale, branch_scales

GROWTH_BAND = (0.5, 2.0)  # one block multiplying an RMS by more (or less) is flagged

_LAYER_TYPES = (torch.nn.Linear, torch.nn.modules.conv._ConvNd)
# torch.nn.init.calculate_gain's names for the activation that follows a layer (a vocabulary of
# gains, finer than the registry's: GELU and SiLU are one growth entry but two gains)
_ACTIVATION_MODULES = {"ReLU": "relu", "GELU": "gelu", "SiLU": "silu", "Tanh": "tanh", "Sigmoid": "sigmoid",
                       "LeakyReLU": "leaky_relu", "SELU": "selu"}
_ACTIVATION_OPS = {"relu": "relu", "relu_": "relu", "gelu": "gelu", "silu": "silu", "silu_": "silu", "tanh": "tanh",
                   "sigmoid": "sigmoid", "leaky_relu": "leaky_relu", "selu": "selu"}
_CALCULATE_GAIN = {"linear", "relu", "leaky_relu", "tanh", "sigmoid", "selu"}


@dataclass
class StackLayer:
    """RMS of a block's input and output, forward and backward, at init."""

    name: str
    rms_in: float
    rms_out: float
    grad_rms_in: Optional[float]
    grad_rms_out: Optional[float]

    @property
    def growth(self) -> float:
        return self.rms_out / self.rms_in if self.rms_in else math.inf

    @property
    def grad_growth(self) -> Optional[float]:
        """How much the block amplifies the gradient on its way down."""
        if self.grad_rms_in is None or not self.grad_rms_out:
            return None
        return self.grad_rms_in / self.grad_rms_out


@dataclass
class LayerGain:
    """``n_in * sigma_w^2`` and the nonlinearity's gain for one weight layer."""

    name: str
    fan_in: int
    weight_variance: float
    nonlinearity: str
    nonlinearity_gain: float
    gain_source: str  # "calculate_gain" or "E[phi(z)^2]"

    @property
    def gain(self) -> float:
        return self.fan_in * self.weight_variance

    @property
    def effective(self) -> float:
        """The forward variance gain of layer and nonlinearity: 1 at criticality."""
        return self.gain / self.nonlinearity_gain**2


@dataclass
class InitDiagnostics:
    stack: list[StackLayer] = field(default_factory=list)
    gains: list[LayerGain] = field(default_factory=list)
    branches: list[BranchScale] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": [{**asdict(layer), "growth": layer.growth, "grad_growth": layer.grad_growth}
                      for layer in self.stack],
            "layers": [{**asdict(gain), "gain": gain.gain, "effective": gain.effective} for gain in self.gains],
            "branches": [{**asdict(branch), "scaled": branch.scaled} for branch in self.branches],
            "flags": list(self.flags),
        }


def rms(value: torch.Tensor) -> float:
    return float(value.detach().double().pow(2).mean().sqrt())


def diagnose(analysis: Any, seed: int) -> InitDiagnostics:
    """All three diagnostics for an :class:`qlint.analysis.Analysis` of a model with weights."""
    diagnostics = InitDiagnostics()
    try:
        diagnostics.stack = _stack(analysis, seed)
    except RuntimeError as exc:  # a graph the autograd pass cannot replay (a train-mode in-place buffer update)
        reason = str(exc).splitlines()[0][:160]
        diagnostics.flags.append(f"the RMS pass through the stack could not run ({reason}): no stack figures")
    layers = _layer_nodes(analysis.traced.module, analysis.model)
    diagnostics.gains = [_gain(name, module, layers.get(name)) for name, module in analysis.model.named_modules()
                         if isinstance(module, _LAYER_TYPES)]
    diagnostics.branches = branch_scales(analysis)
    diagnostics.flags += _flags(diagnostics.stack)
    return diagnostics


# --- through the stack ----------------------------------------------------------------


def _stack(analysis: Any, seed: int) -> list[StackLayer]:
    """One forward and backward pass with unit-variance inputs and cotangents."""
    blocks = analysis.stream.blocks
    if not blocks:
        return []
    generator = torch.Generator().manual_seed(seed)
    inputs = tuple(
        torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device).requires_grad_(True)
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in analysis.inputs
    )
    interpreter = fx.Interpreter(analysis.traced.module, garbage_collect_values=False)
    with torch.enable_grad():
        output = interpreter.run(*inputs)
        watched = {node: interpreter.env[node] for rb in blocks for node in (rb.stream, rb.join)}
        for value in watched.values():
            if value.requires_grad and not value.is_leaf:
                value.retain_grad()
        outputs = [t for t in pytree.tree_leaves(output)
                   if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
        if outputs:
            loss = sum((t * torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)).sum()
                       for t in outputs)
            loss.backward()  # type: ignore[union-attr]

    def grad_rms(node: fx.Node) -> Optional[float]:
        grad = watched[node].grad
        return rms(grad) if grad is not None else None

    return [StackLayer(rb.name, rms(watched[rb.stream]), rms(watched[rb.join]), grad_rms(rb.stream), grad_rms(rb.join))
            for rb in blocks]


def _flags(stack: list[StackLayer]) -> list[str]:
    low, high = GROWTH_BAND
    flags = []
    for layer in stack:
        if layer.growth > high or layer.growth < low:
            kind = "exploding" if layer.growth > high else "vanishing"
            flags.append(f"{layer.name}: activation RMS x{layer.growth:.3g} in one block at init ({kind})")
        grad = layer.grad_growth
        if grad is not None and (grad > high or grad < low):
            kind = "exploding" if grad > high else "vanishing"
            flags.append(f"{layer.name}: gradient RMS x{grad:.3g} through the block at init ({kind} gradient)")
    return flags


# --- per layer ------------------------------------------------------------------------


def _layer_nodes(module: fx.GraphModule, model: torch.nn.Module) -> dict[str, fx.Node]:
    """Module path of each weight layer -> the graph node that computes its output."""
    found: dict[str, fx.Node] = {}
    for node in module.graph.nodes:
        if node.op == "call_module" and isinstance(module.get_submodule(node.target), _LAYER_TYPES):
            found[str(node.target)] = node
        elif "layer" in facts(node).family:
            path = module_path(node)
            try:
                owner = model.get_submodule(path)
            except AttributeError:
                continue
            if isinstance(owner, _LAYER_TYPES):
                found[path] = node
    return found


def _nonlinearity(node: Optional[fx.Node]) -> tuple[str, Optional[float]]:
    """The activation applied to the layer's output, through views and splits; 'linear' if none."""
    stack, seen = [node] if node is not None else [], set()
    while stack:
        current = stack.pop()
        for user in current.users:
            if user in seen:
                continue
            seen.add(user)
            name = _activation(user)
            if name:
                return name, _negative_slope(user)
            if facts(user).plumbing:
                stack.append(user)
    return "linear", None


def _activation(node: fx.Node) -> str:
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(node.target)
        return _ACTIVATION_MODULES.get(type(module).__name__, "")
    return _ACTIVATION_OPS.get(op_name(node), "")


def _negative_slope(node: fx.Node) -> Optional[float]:
    if node.op == "call_module":
        return getattr(node.graph.owning_module.get_submodule(node.target), "negative_slope", None)
    if _activation(node) == "leaky_relu":
        return node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
    return None


def nonlinearity_gain(name: str, param: Optional[float] = None) -> tuple[float, str]:
    """``calculate_gain`` where PyTorch defines it, else 1/sqrt(E[phi(z)^2]) for z ~ N(0, 1)."""
    if name in _CALCULATE_GAIN:
        return float(torch.nn.init.calculate_gain(name, param)), "calculate_gain"
    z = torch.linspace(-12.0, 12.0, 24001, dtype=torch.float64)
    density = torch.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    second_moment = torch.trapezoid(getattr(F, name)(z) ** 2 * density, z)
    return float(second_moment.rsqrt()), "E[phi(z)^2]"


def _gain(name: str, module: torch.nn.Module, node: Optional[fx.Node]) -> LayerGain:
    weight = module.weight.detach()
    activation, slope = _nonlinearity(node)
    gain, source = nonlinearity_gain(activation, slope)
    return LayerGain(name, weight[0].numel(), float(weight.double().var()), activation, gain, source)
