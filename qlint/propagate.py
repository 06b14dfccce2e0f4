"""Propagate growth bounds through a traced graph, fx.Interpreter style.

Like ``torch.fx.passes.shape_prop.ShapeProp``, the interpreter visits nodes in
order and computes a value per node, but the value is a :class:`Growth` (an
exponent relative to one chosen node, plus sign facts) instead of a tensor.

One pass over the whole graph treats every value as a constant; it gives the
sign facts of parameter expressions such as ``-exp(A_log)``. Each residual block
then re-runs only its *cone* (the nodes between X_k and the velocity) with X_k set
to q = 1, so the cost of all blocks together stays linear in the graph size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch.fx as fx

from qlint import algebra
from qlint.growth import CONSTANT, STREAM, Growth
from qlint.rules.primitives import USER_DECLARED, Call, Primitive, Registry, Value, handwritten_norms


@dataclass(frozen=True)
class Step:
    """How one node's value was obtained: the primitive and the input it followed."""

    primitive: str
    why: str
    parent: Optional[fx.Node]
    plumbing: bool = False


def leading(value: Value) -> Growth:
    """The growth of a node's main output (tuples: the first element)."""
    while isinstance(value, tuple):
        value = value[0] if value else CONSTANT
    return value


def describe(node: fx.Node, module: Any = None) -> str:
    """The op of a node in user terms: a module class, a function or a method name."""
    if node.op == "call_module":
        cls = type(module) if module is not None else None
        name = f"{cls.__module__}.{cls.__qualname__}" if cls else "module"
        return f"{name} ({node.target})"
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return f"aten.{packet.__name__}"
    module = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", str(target))
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module.startswith("torch._C"):  # builtins: name them as users write them
        namespace = module.rsplit("._", 1)[-1]
        public = _PUBLIC_NAMESPACES.get(namespace, f"torch.{namespace}")
        return f"{public}.{name.removeprefix(namespace + '_')}"
    return f"{module}.{name}" if module else name


_PUBLIC_NAMESPACES = {"nn": "torch.nn.functional", "VariableFunctions": "torch", "C": "torch"}


class GrowthInterpreter(fx.Interpreter):
    """Maps each node to a Growth through the primitive registry."""

    def __init__(self, module: fx.GraphModule, registry: Registry, *, training: bool) -> None:
        super().__init__(module, garbage_collect_values=False)
        self.registry = registry
        self.training = training
        self.normalizations = handwritten_norms.find(module.graph)
        self.leaf_regions = leaf_regions(module.graph, USER_DECLARED)
        self.constants: dict[fx.Node, Value] = {}
        self.steps: dict[fx.Node, Step] = {}
        self.unknown: dict[fx.Node, str] = {}
        self._current: Optional[fx.Node] = None
        self._env: dict[fx.Node, Value] = self.constants
        self._record = False
        for node in module.graph.nodes:
            self.constants[node] = self._evaluate(node)

    # -- the per-block pass ------------------------------------------------------------

    def propagate(self, source: fx.Node, cone: Iterable[fx.Node]) -> dict[fx.Node, Value]:
        """Growth of every cone node relative to ``source`` (which gets q = 1)."""
        env: dict[fx.Node, Value] = {source: STREAM}
        self.steps[source] = Step("block input X_k", "the residual stream entering the block", None)
        self._env, self._record = env, True
        try:
            for node in cone:
                env[node] = self._evaluate(node)
        finally:
            self._env, self._record = self.constants, False
        return env

    def _evaluate(self, node: fx.Node) -> Value:
        if node.op in ("placeholder", "get_attr", "output"):
            return CONSTANT
        self._current = node
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        return getattr(self, node.op)(node.target, args, kwargs)

    def fetch_args_kwargs_from_env(self, n: fx.Node) -> tuple[tuple, dict]:
        lookup = self._lookup
        return fx.node.map_arg(n.args, lookup), fx.node.map_arg(n.kwargs, lookup)

    def _lookup(self, node: fx.Node) -> Value:
        value = self._env.get(node)
        if value is None:
            value = self.constants.get(node, CONSTANT)
        return value

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Value:
        return self._apply(self._current, args, kwargs)

    def call_method(self, target: Any, args: tuple, kwargs: dict) -> Value:
        return self._apply(self._current, args, kwargs)

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Value:
        return self._apply(self._current, args, kwargs)

    def _apply(self, node: fx.Node, args: tuple, kwargs: dict) -> Value:
        region = self.leaf_regions.get(node)
        if region is not None:  # inside a declared opaque module: it reads the region's inputs
            args, kwargs = tuple(self._lookup(n) for n in region.inputs), {}
        call = Call(node, args, kwargs, training=self.training)
        plumbing = False
        dependent = [g for g in call.inputs() if g.depends]
        if region is None and node in self.normalizations:
            name, numerator = self.normalizations[node]
            signal = leading(self._lookup(numerator))
            value: Value = Growth(algebra.normalize(signal.q), depends=signal.depends, culprit=signal.culprit)
            why = "Theorem 9(v): divides by a magnitude statistic of the same tensor"
        else:
            target = node.target
            if node.op == "call_module":
                call.module = self.submodules[target]
                target = type(call.module)
            primitive = region.primitive if region else self.registry.lookup(node.op, target)
            if primitive is None:
                if not dependent:
                    return CONSTANT
                label = describe(node, call.module)
                if self._record:
                    self.unknown[node] = label
                value = Growth(None, culprit=f"unknown op `{label}`")
                name, why = label, "not in the primitive registry: growth unknown"
            else:
                value = primitive.transfer(call)
                name, why = primitive.name, _inputs_text(dependent)
                plumbing = primitive.plumbing
        if self._record:
            self.steps[node] = Step(name, why, _dominant(node, self._env), plumbing)
        return value


@dataclass(frozen=True)
class LeafRegion:
    """The nodes one call of a declared module left in a graph that inlines modules."""

    primitive: Primitive
    inputs: tuple[fx.Node, ...]  # the nodes outside the region that feed it


def leaf_regions(graph: fx.Graph, declared: dict[type, Primitive]) -> dict[fx.Node, LeafRegion]:
    """Opaque-leaf semantics where module boundaries vanish (torch.export, make_fx).

    symbolic_trace keeps a declared class as one call_module node; export inlines it.
    The ops whose ``nn_module_stack`` holds a call of a declared class form its region:
    each gets the declared transfer of the region's external inputs,
    compose(q_declared, max q_in), and none is looked up in the registry.
    """
    if not declared:
        return {}
    by_name = {f"{cls.__module__}.{cls.__qualname__}": primitive for cls, primitive in declared.items()}
    members: dict[str, list[fx.Node]] = {}
    primitives: dict[str, Primitive] = {}
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        for key, (_, cls) in (node.meta.get("nn_module_stack") or {}).items():
            primitive = declared.get(cls) if isinstance(cls, type) else by_name.get(cls)
            if primitive is not None:  # the outermost declared call contains this op
                members.setdefault(key, []).append(node)
                primitives[key] = primitive
                break
    regions = {}
    for key, nodes in members.items():
        inside = set(nodes)
        inputs = tuple(dict.fromkeys(p for n in nodes for p in n.all_input_nodes if p not in inside))
        region = LeafRegion(primitives[key], inputs)
        regions.update(dict.fromkeys(nodes, region))
    return regions


def _inputs_text(inputs: list[Growth]) -> str:
    if not inputs:
        return "independent of X_k"
    return "from q = " + ", ".join(algebra.format_q(g.q) for g in inputs)


def _rank(q: Optional[float]) -> float:
    return math.inf if q is None else q


def _dominant(node: fx.Node, env: dict[fx.Node, Value]) -> Optional[fx.Node]:
    """The input with the largest exponent: the one the derivation follows back."""
    best, best_q = None, -1.0
    for parent in node.all_input_nodes:
        value = env.get(parent)
        if value is None:
            continue
        growth = leading(value)
        if growth.depends and _rank(growth.q) > best_q:
            best, best_q = parent, _rank(growth.q)
    return best


