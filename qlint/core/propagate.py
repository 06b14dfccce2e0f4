"""Propagate growth bounds through a traced graph, shaped like fx's ShapeProp.

:class:`GrowthProp` is an ``fx.Interpreter`` whose values are :class:`Growth`s instead
of tensors; its one override, :meth:`GrowthProp.run_node`, maps a node to a Growth with
the node's registry entry (read from ``node.meta["qlint"]``, see :mod:`.graph`). One
whole-graph pass (:meth:`GrowthProp.run_graph`) seeds every data input at q = 1 and
gives each node its facts relative to the model's inputs; a block's pass
(:func:`qlint.core.graph.run_cone` over the block's region) seeds the block input, so
the cost of all blocks together stays linear in the graph size.

Fail closed: an op outside the registry with an input-dependent argument is unknown; a
transfer that ignores an input-dependent argument, or a non-default parameter it was
not written for, gives unknown (:meth:`qlint.core.ops.Call.unread`).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Iterable, Optional

import torch
import torch.fx as fx

from qlint.core import algebra, domain
from qlint.core.domain import ANY, CONSTANT, Growth, Range, unknown
from qlint.core.graph import GraphFacts, NodeFacts, dtype_of, facts, indeterminate, lifted_constant, run_cone, tensor_meta
from qlint.core.ops import Call
from qlint.core.relations import Normalisation, OwnMaxShift, OwnSumRatio

Value = Any  # a Growth, or a tuple of Values for multi-output ops


def leading(value: Value) -> Growth:
    """The growth of a node's main output (tuples: the first element)."""
    while isinstance(value, tuple):
        value = value[0] if value else CONSTANT
    return value if isinstance(value, Growth) else CONSTANT


def joint(value: Value) -> Growth:
    """One Growth bounding every tensor of a (possibly tuple) value."""
    if isinstance(value, tuple):
        parts = [joint(v) for v in value]
        dependent = [p for p in parts if p.depends]
        if not dependent:
            return CONSTANT
        return Growth(algebra.parallel_sum(p.q for p in dependent), real=None,
                      culprit=next((p.culprit for p in dependent if not p.known), None))
    return value if isinstance(value, Growth) else CONSTANT


class GrowthProp(fx.Interpreter):
    """Maps each node to a Growth through its registry entry (node.meta["qlint"])."""

    def __init__(self, module: fx.GraphModule, graph_facts: GraphFacts, *, training: bool, assume_real: bool = True,
                 trainable: frozenset[str] = frozenset()) -> None:
        super().__init__(module, garbage_collect_values=False)
        self.graph_facts = graph_facts
        self.training = training
        self.assume_real = assume_real  # inputs without a recorded dtype are taken as real (said in the report)
        self.trainable = trainable  # attributes aliasing a tensor the model trains, whatever the graph's copy says
        self._fixed_nodes: Optional[frozenset[fx.Node]] = None
        self._exact_values: dict[fx.Node, Optional[Growth]] = {}

    def is_trainable(self, target: str, value: torch.Tensor) -> bool:
        """A tensor an optimizer given the model trains: requires_grad, on the graph's copy or on the model's."""
        return value.requires_grad or target in self.trainable

    def run_graph(self) -> dict[fx.Node, Value]:
        """Every node relative to the model's data inputs, each seeded at q = 1."""
        self.env = {}
        for node in self.graph_facts.nodes:
            self.env[node] = self.run_node(node)
        return self.env

    def seed(self, node: fx.Node, base: dict, *, stream: bool) -> Growth:
        """A seeded value of a pass, with the facts the whole-graph pass proved for it.

        The block input (``stream``) has q = 1 by definition. Another input-derived value
        the block reads is an extra input of the block's map, measured in its own
        magnitude (q = 1), unless the whole-graph pass shows it is bounded whatever the
        model's inputs are (a mask, a normalised encoder output): q = 0.
        """
        known = leading(base[node])
        if not stream and known.q == 0:
            return Growth(0.0, depends=True, real=known.real, range=known.range)
        # a free variable of any magnitude: its sign is kept, no bound on its size
        r = known.range
        sign = Range(lo=0.0 if r.nonneg else -math.inf, hi=0.0 if r.nonpos else math.inf, pos=r.pos, neg=r.neg)
        return Growth(1.0, depends=True, real=known.real, range=sign)

    def propagate(self, seeds: dict[fx.Node, Value], nodes: Iterable[fx.Node], base: dict[fx.Node, Value]) -> dict[fx.Node, Value]:
        return run_cone(self, seeds, nodes, base)

    # -- the one override ---------------------------------------------------------------------

    def run_node(self, n: fx.Node) -> Value:
        if n.op == "placeholder":
            return self._placeholder(n)
        if n.op == "get_attr":
            return self._attribute(n)
        if n.op == "output":
            return CONSTANT
        info = facts(n)
        if info.meta_output:  # a size or a dtype: fixed, unless it is the size of a value qlint could not bound
            unbounded = next((g for p in n.all_input_nodes if (g := joint(self.env[p])).depends and g.q is None), None)
            if unbounded is not None:
                return unknown(f"the size of a value qlint cannot bound (its length may grow with the input): {unbounded.culprit}")
            return CONSTANT
        if info.declared is not None:
            inputs = info.region_inputs if info.region_inputs else n.all_input_nodes
            return self._declared(info, [self.env[p] for p in inputs])
        if info.primitive is None:
            dependent = [p for p in n.all_input_nodes if joint(self.env[p]).depends]
            if not dependent:
                return CONSTANT
            return unknown(f"unknown op `{info.label}`")
        exact = self._exact(n)  # its exact range: a safe divisor, a finite log
        if exact is not None:
            return exact
        value = apply(n, info, self.env, self.training)
        if info.relation is not None:
            value = self._relation(info.relation, value)
        return value

    def _exact(self, n: fx.Node) -> Optional[Growth]:
        """A fixed node's value bounded by its evaluated entries (once per node), or None."""
        if n not in self._fixed():
            return None
        if n not in self._exact_values:
            self._exact_values[n] = _by_value(self.graph_facts.constant(n))
        return self._exact_values[n]

    def _fixed(self) -> frozenset[fx.Node]:
        """Nodes computed from shapes and literals alone: no input, no parameter or buffer, no
        random draw or uninitialised memory (:func:`~qlint.core.graph.indeterminate`). Each has
        one value whatever the input and the parameters, so it is bounded by its entries, as a
        lifted tensor constant is (T5's relative-position buckets take the log of 0 and select
        past it with ``where``: the buckets themselves are finite)."""
        if self._fixed_nodes is None:
            fixed: set[fx.Node] = set()
            for node in self.graph_facts.nodes:
                if node.op == "get_attr":
                    ok = not self._arbitrary(str(node.target))
                elif node.op == "call_function":
                    target = node.target
                    ok = target is operator.getitem or (isinstance(target, torch._ops.OpOverload) and not indeterminate(node))
                    ok = ok and all(p in fixed for p in node.all_input_nodes)
                else:
                    ok = False
                if ok:
                    fixed.add(node)
            self._fixed_nodes = frozenset(fixed)
        return self._fixed_nodes

    def _arbitrary(self, target: str) -> bool:
        """An attribute training may move (a parameter, a buffer, a trainable alias), or one not read."""
        try:
            value = self.fetch_attr(target)
        except (AttributeError, RuntimeError):
            return True
        if not isinstance(value, torch.Tensor):
            return True
        return (isinstance(value, torch.nn.Parameter) or self.is_trainable(target, value)
                or (is_buffer(self.module, target) and not lifted_constant(target)) or value.is_meta)

    # -- leaves -------------------------------------------------------------------------------

    def _placeholder(self, n: fx.Node) -> Growth:
        if n in self.graph_facts.inputs:
            real = self._realness(n)
            dtype = dtype_of(n)
            r = domain.interval(0, 1) if dtype == torch.bool else ANY
            return Growth(1.0, depends=True, real=real, range=r)
        return CONSTANT

    def _realness(self, n: fx.Node) -> Optional[bool]:
        dtype = dtype_of(n)
        if dtype is None:
            return True if self.assume_real else None
        return not dtype.is_complex

    def _attribute(self, n: fx.Node) -> Growth:
        """Parameters and buffers are arbitrary (training moves them); fixed tensor
        constants (``torch.tensor(2.0)`` in a forward, lifted by the tracer) by value."""
        try:
            value = self.fetch_attr(str(n.target))
        except (AttributeError, RuntimeError):
            return CONSTANT
        if not isinstance(value, torch.Tensor):
            return CONSTANT
        if self._arbitrary(str(n.target)):
            return Growth(0.0, depends=False, real=not value.is_complex())
        # rsqrt(arange(8)) evaluated while tracing: inf
        return _by_value(value) or Growth(None, depends=False, real=True, culprit=f"the tensor constant `{n.target}` holds inf or NaN (or cannot be read)")

    def _declared(self, info: NodeFacts, inputs: list[Value]) -> Growth:
        dependent = [joint(v) for v in inputs if joint(v).depends]
        if not dependent:
            return CONSTANT
        q = algebra.parallel_sum(g.q for g in dependent)
        culprit = next((g.culprit for g in dependent if not g.known), None)
        return Growth(algebra.compose(float(info.declared.q), q), real=None, culprit=culprit)

    def _relation(self, relation: Any, computed: Value) -> Value:
        if isinstance(relation, Normalisation):
            x = leading(self.env[relation.numerator])
            if x.real is not True:
                return computed  # the proof squares real entries
            if not x.depends:
                return computed
            if not x.known:
                return Growth(None, culprit=x.culprit or "a normalisation of a value that overflows first")
            r = domain.interval(-relation.bound, relation.bound) if relation.bound is not None else ANY
            return Growth(algebra.normalize(x.q), depends=True, range=r)
        if isinstance(relation, OwnSumRatio):
            x = leading(self.env[relation.numerator])
            if x.real is True and (x.range.pos or ((relation.eps or relation.floored) and x.range.nonneg)) and x.known:
                return Growth(0.0, depends=x.depends, range=domain.interval(0.0, 1.0))
            return computed
        if isinstance(relation, OwnMaxShift):
            value = leading(computed)
            if value.real is True:
                r = value.range
                return Growth(value.q, depends=value.depends, range=Range(lo=r.lo, hi=0.0, below=r.below), culprit=value.culprit)
        return computed


def _by_value(value: Any) -> Optional[Growth]:
    """A fixed tensor bounded by its own entries; None when one is inf or NaN, or it cannot be read (meta)."""
    if not isinstance(value, torch.Tensor) or value.is_meta:
        return None
    real = not value.is_complex()
    if value.numel() == 0 or not real:
        return Growth(0.0, depends=False, real=real)
    try:
        data = value.detach().double()
        lo, hi = float(data.min()), float(data.max())
    except (RuntimeError, TypeError):
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return Growth(0.0, depends=False, real=real, range=Range(lo=lo, hi=hi, pos=lo > 0, neg=hi < 0))


def is_buffer(module: torch.nn.Module, target: str) -> bool:
    owner_path, _, name = target.rpartition(".")
    try:
        owner = module.get_submodule(owner_path) if owner_path else module
    except AttributeError:
        return False
    return name in getattr(owner, "_buffers", {})


def apply(n: fx.Node, info: NodeFacts, env: Any, training: bool, overrides: Optional[dict[str, Value]] = None) -> Value:
    """Run a node's transfer on its arguments' values and enforce that nothing was ignored.

    ``overrides`` replaces named arguments (a block's velocity is its join with the skip
    argument replaced by zero).
    """
    return run_transfer(n, info, env, training, overrides)[0]


def run_transfer(n: fx.Node, info: NodeFacts, env: Any, training: bool, overrides: Optional[dict[str, Value]] = None) -> tuple[Value, Call]:
    """:func:`apply`, with the :class:`Call` that records what the transfer read (the registry self-check)."""
    primitive = info.primitive
    bound = info.bound
    arguments = {name: fx.node.map_arg(value, lambda node: env[node]) for name, value in bound.arguments.items()}
    if overrides:
        arguments.update(overrides)
    call = Call(n, arguments, bound.defaults, module=info.module, training=training, positional=bound.positional)
    try:
        value = primitive.transfer(call, primitive)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as exc:
        return unknown(f"the rule for {call.label()} could not read its arguments ({type(exc).__name__}: {exc})"), call
    reason = call.unread(primitive.meta_args, primitive.params if "*" not in primitive.params else frozenset(call.arguments))
    if reason is not None:
        return unknown(reason), call
    poisoned = _unknown_argument(arguments, primitive.meta_args)  # selectors too: an unknown one may be NaN or of unknown length
    if poisoned is not None and joint(value).q is not None:
        return Growth(None, culprit=poisoned.culprit), call  # an unknown argument is never certified away
    if call.ignored_constants(primitive.meta_args):
        value = _without_ranges(value)
    return value, call


def _unknown_argument(arguments: dict[str, Any], meta: frozenset[str]) -> Optional[Growth]:
    """A value argument whose growth is unknown (input-dependent or a parameter hazard)."""
    for name, value in arguments.items():
        if name in meta:
            continue
        for growth in _flatten(value):
            if isinstance(growth, Growth) and growth.q is None:
                return growth
    return None


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [g for item in value for g in _flatten(item)]
    return [value]


def _without_ranges(value: Value) -> Value:
    """A transfer that skipped a parameter tensor keeps its exponent but claims no order fact."""
    if isinstance(value, tuple):
        return tuple(_without_ranges(v) for v in value)
    if isinstance(value, Growth) and value.range != ANY:
        return Growth(value.q, depends=value.depends, real=value.real, culprit=value.culprit)
    return value


__all__ = ["GrowthProp", "Value", "apply", "joint", "leading", "run_transfer", "tensor_meta"]
