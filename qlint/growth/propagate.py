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

import dataclasses
import math
from typing import Any, Iterable, Optional

import torch
import torch.fx as fx

from qlint.core import algebra, domain
from qlint.growth import support
from qlint.core.domain import ANY, CONSTANT, Growth, Range, point, unknown
from qlint.core.graph import (GraphFacts, NodeFacts, dtype_of, facts, indeterminate, lifted_constant, pure_call,
                              run_cone, shape_of, size_term, storage_key, strided,
                              tensor_meta)
from qlint.core.ops import Call, op_name
from qlint.growth.relations import Normalisation, OwnMaxShift, OwnShiftRatio, OwnSumRatio, Selection

Value = Any  # a Growth, or a tuple of Values for multi-output ops


def leading(value: Value) -> Growth:
    """The growth of a node's main output (tuples: the first element)."""
    while isinstance(value, tuple):
        value = value[0] if value else CONSTANT
    return value if isinstance(value, Growth) else unknown(f"no value ({type(value).__name__})")


def joint(value: Value) -> Growth:
    """One Growth bounding every tensor of a (possibly tuple) value."""
    if isinstance(value, tuple):
        parts = [joint(v) for v in value]
        dependent = [p for p in parts if p.depends]
        if not dependent:
            return CONSTANT
        return Growth(algebra.parallel_sum(p.q for p in dependent), real=None,
                      culprit=next((p.culprit for p in dependent if not p.known), None))
    return value if isinstance(value, Growth) else unknown(f"no value ({type(value).__name__})")


class GrowthProp(fx.Interpreter):
    """Maps each node to a Growth through its registry entry (node.meta["qlint"])."""

    def __init__(self, module: fx.GraphModule, graph_facts: GraphFacts, *, training: bool, assume_real: bool = True,
                 trainable: frozenset[str] = frozenset()) -> None:
        super().__init__(module, garbage_collect_values=False)
        self.graph_facts = graph_facts
        self.training = training
        self.assume_real = assume_real  # inputs without a recorded dtype are taken as real (said in the report)
        self.trainable = trainable  # attributes aliasing a tensor the model trains, whatever the graph's copy says
        self.hazards: dict[fx.Node, str] = {}  # parameter-only values that may be inf or NaN for some parameter values
        self._shape_only: dict[fx.Node, bool] = {}
        self._supports: Optional[dict] = None
        self._fixed_nodes: dict[bool, frozenset[fx.Node]] = {}
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

    def seed(self, node: fx.Node, base: dict, *, stream: bool, composite: bool = False) -> Growth:
        """A seeded value of a pass, with the facts the whole-graph pass proved for it.

        The block input (``stream``) has q = 1 by definition. Another input-derived value
        the block reads is an extra input of the block's map, measured in its own
        magnitude (q = 1), unless the whole-graph pass shows it is bounded whatever the
        model's inputs are (a mask, a normalised encoder output): q = 0. ``composite``: a
        stream value read by a map applied once (a head) keeps its growth in the model's
        inputs when that is known and at most 1.
        """
        known = leading(base[node])
        if not stream and known.q == 0:
            return Growth(0.0, depends=True, real=known.real, range=known.range)
        if composite and known.known and known.depends and known.q <= 1:
            return Growth(known.q, depends=True, real=known.real, range=known.range)
        # a free variable of any magnitude: its sign is kept, no bound on its size
        r = known.range
        sign = Range(lo=0.0 if r.nonneg else -math.inf, hi=0.0 if r.nonpos else math.inf, pos=r.pos, neg=r.neg)
        return Growth(1.0, depends=True, real=known.real, range=sign)

    def propagate(self, seeds: dict[fx.Node, Value], nodes: Iterable[fx.Node],
                  base: dict[fx.Node, Value]) -> dict[fx.Node, Value]:
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
        if info.meta_output:
            return self.sizes(n)
        if info.declared is not None:
            inputs = info.region_inputs if info.region_inputs else n.all_input_nodes
            return self._declared(info, [self.env[p] for p in inputs])
        if info.primitive is None:
            dependent = [p for p in n.all_input_nodes if joint(self.env[p]).depends]
            if not dependent:
                return self._parameter_value(n, None)
            return unknown(f"unknown op `{info.label}`")
        exact = self._exact(n)  # its exact range: a safe divisor, a finite log
        if exact is not None:
            return exact
        value, call = run_transfer(n, info, self.env, self.training)
        for why, argument, bad in call.hazards:
            node = info.bound.arguments.get(argument)
            if self._bad_at_own_parameters(node, bad):
                return unknown(f"{why}, and it is at the model's own parameter values (or the example's shape)")
            # 0 at some input shape only: no parameter hazard
            if not (isinstance(node, fx.Node) and self.from_shapes(node)):
                self.hazards[n] = why
        if info.relation is not None:
            value = self._relation(n, info.relation, value)
        if isinstance(value, Growth) and value.q is None and not value.depends and n not in self.graph_facts.data:
            return self._parameter_value(n, value.culprit)
        return self._supported(n, value)

    def _supported(self, n: fx.Node, value: Value) -> Value:
        """A value that is 0 unless an input entry lies in a bounded interval, each entry a continuous
        function of that entry with a known exponent (:mod:`qlint.growth.support`): bounded, q = 0."""
        if not isinstance(value, Growth) or not value.depends or not value.known or value.q == 0:
            return value  # an unknown value stays unknown (a division by a fixed 0): support bounds only what is known
        if self._supports is None:
            self._supports = support.find(
                self.graph_facts, lambda node: self.graph_facts.constant(node) if node in self._fixed() else None,
                lambda node: self.graph_facts.constant(node) if node in self._fixed(thresholds=True) else None)
        found = self._supports.get(n)
        if found is None or not found.bounded:
            return value
        if not all(joint(self.env[p]).known for p in self.graph_facts.parents.get(n, ())):
            return value
        return Growth(0.0, depends=True, real=value.real, range=value.range)

    def _drawn(self, n: fx.Node) -> bool:
        """A random draw or uninitialised memory in the value's cone: a value of its own at every call."""
        stack, seen = [n], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current.op == "call_function" and indeterminate(current):
                return True
            stack.extend(current.all_input_nodes)
        return False

    def from_shapes(self, n: fx.Node) -> bool:
        """Computed from sizes and literals alone (``H // window``, ``math.sqrt(x.shape[-1])``): no
        input value, no parameter or buffer. Such a value is one number per input shape."""
        if n not in self._shape_only:
            info = facts(n) if "qlint" in n.meta else None
            if (n.op in ("placeholder", "get_attr", "output") or info is None or n in self.graph_facts.data
                or indeterminate(n)):
                self._shape_only[n] = False
            elif info.meta_output:
                self._shape_only[n] = not any(p in self.graph_facts.variable_length for p in n.all_input_nodes)
            else:
                self._shape_only[n] = all(self.from_shapes(p) for p in n.all_input_nodes)
        return self._shape_only[n]

    def _bad_at_own_parameters(self, argument: Any, bad: Any) -> bool:
        """Whether a parameter-only argument is already bad (a 0 divisor) as the model is built."""
        if isinstance(argument, fx.Node):
            value = self.graph_facts.constant(argument)
        else:
            value = argument
        if value is None or (isinstance(value, torch.Tensor) and value.is_meta):
            return False
        try:
            return bool(bad(value))
        except Exception:  # noqa: BLE001  (a value the check cannot read: not known to be bad)
            return False

    def _parameter_value(self, n: fx.Node, hazard: Optional[str]) -> Value:
        """A value computed from parameters alone (no input): one constant for each parameter value,
        so its exponent in the input is 0 (Table 1's coefficients are such values). When a rule says
        it may be inf or NaN for some parameter values (``hazard``: a division by a parameter, the
        inverse of a parameter matrix), that is a numerical hazard, not growth: the value is taken
        at today's parameters: not finite there, it is unknown (a pole at the model as built);
        finite, a constant, and the hazard is recorded for QL108 (a warning). On meta weights it
        cannot be read: a constant, and the hazard says so. An op outside the registry on
        parameters alone is read the same way."""
        value = self.graph_facts.constant(n)
        tensors = [t for t in (value if isinstance(value, (tuple, list)) else (value,)) if isinstance(t, torch.Tensor)]
        readable = value is not None and all(not t.is_meta for t in tensors)
        what = hazard or f"`{facts(n).label}`"
        if (readable
            and not all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point() or t.is_complex())):
            if self.from_shapes(n):
                return unknown(f"`{facts(n).label}`, computed from sizes and literals alone, is inf or NaN at the "
                               "example's shape")
            return unknown(f"{what}: inf or NaN at the model's own parameter values")
        if not readable and (self.from_shapes(n) or self._drawn(n)) and hazard is not None:
            return unknown(f"{what}: a value of the input's shape or of a random draw that qlint cannot read")
        if hazard is not None and not self.from_shapes(n):  # 0 at some input shape only is no parameter hazard
            self.hazards[n] = hazard if readable else f"{hazard} (not checked: the weights have no values)"
        real = not any(t.is_complex() for t in tensors) if tensors else True
        return Growth(0.0, depends=False, real=real)

    def sizes(self, n: fx.Node) -> Value:
        """A shape query (``x.shape``, ``x.size(d)``, ``sym_size``, ``numel``): lengths do not scale
        with the input's magnitude, so each is a constant, at least 1 (an empty input has no
        magnitude to grow). A length a trace fixed (an int in an export's shapes, guarded) is that
        number; a symbolic one lies in its range; symbolic_trace records no shape, so its lengths
        are only >= 1. The size of a value whose length may depend on the input's values
        (:attr:`GraphFacts.variable_length`) is unknown."""
        if any(p in self.graph_facts.variable_length for p in n.all_input_nodes):
            return unknown("the size of a value whose length may depend on the input's values")
        if n in self.graph_facts.data:
            return unknown("a size read at a dim the input's values choose")
        name = op_name(n)
        bound = facts(n).bound
        argument = bound.arguments.get("name") if bound is not None else None
        source = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        if ("val" in n.meta and not isinstance(n.meta["val"], (torch.Tensor, tuple, list))
            and name in ("sym_size", "size", "sym_numel", "numel")):
            return _length(n.meta["val"], exact=True)
        shape = shape_of(source) if source is not None else None
        exact = source is not None and "val" in source.meta
        if (name == "getattr" and argument == "shape" or name == "size"
            and (bound is None or bound.arguments.get("dim") is None)):
            return (tuple(_length(t, exact) for t in shape) if shape is not None
                    else Growth(0.0, depends=False, range=Range(lo=1.0)))
        if name in ("size", "sym_size"):
            dim = bound.arguments.get("dim") if bound is not None else None
            if shape is not None and isinstance(dim, int) and -len(shape) <= dim < len(shape):
                return _length(shape[dim], exact)
            return Growth(0.0, depends=False, range=Range(lo=1.0))
        if name in ("numel", "sym_numel", "nelement"):
            return Growth(0.0, depends=False, range=Range(lo=1.0))
        if name in ("dim", "ndimension") or (name == "getattr" and argument == "ndim"):
            return Growth(0.0, depends=False, range=point(float(len(shape)))) if shape is not None else CONSTANT
        return CONSTANT

    def _exact(self, n: fx.Node) -> Optional[Growth]:
        """A fixed node's value bounded by its evaluated entries (once per node), or None."""
        if n not in self._fixed():
            return None
        if n not in self._exact_values:
            self._exact_values[n] = _by_value(self.graph_facts.constant(n))
        return self._exact_values[n]

    def _fixed(self, thresholds: bool = False) -> frozenset[fx.Node]:
        """Nodes computed from shapes and literals alone: no input value, no parameter or buffer, no
        random draw or uninitialised memory (:func:`~qlint.core.graph.indeterminate`). Each has
        one value whatever the input's values and the parameters, so it is bounded by its entries,
        as a lifted tensor constant is (T5's relative-position buckets take the log of 0 and select
        past it with ``where``: the buckets themselves are finite). A size a dynamic export keeps
        symbolic is the example's: the value is the one at the example's shape, as every constant
        of the input's shape is (a hazard at some other shape only is none in the input's magnitude).

        ``thresholds``: also values of floating buffers the forward never writes, read at today's
        values, for the compact-support proof's interval ends only: an interval between two finite
        ends is bounded whatever the ends are (a spline grid a training loop moved is still a grid)."""
        if thresholds not in self._fixed_nodes:
            fixed: set[fx.Node] = set()
            for node in self.graph_facts.nodes:
                if node.op == "get_attr":
                    target = str(node.target)
                    ok = not self._arbitrary(target) or (thresholds and self._frozen_float(target))
                elif node.op in ("call_function", "call_method") and "qlint" in node.meta and facts(node).meta_output:
                    # a size of the input (a dynamic export's sym_size): one number per shape, the example's here
                    ok = (self.graph_facts.example is not None and node not in self.graph_facts.data
                          and not any(p in self.graph_facts.variable_length for p in node.all_input_nodes))
                elif node.op in ("call_function", "call_method"):
                    ok = pure_call(node) and all(p in fixed for p in node.all_input_nodes)
                else:
                    ok = False
                if ok:
                    fixed.add(node)
            self._fixed_nodes[thresholds] = frozenset(fixed)
        return self._fixed_nodes[thresholds]

    def _arbitrary(self, target: str) -> bool:
        """An attribute training may move (a parameter, a trainable alias, a floating-point buffer, a
        buffer the forward writes or one not known to be left alone), or one not read.

        A floating-point buffer may be moved by a training loop the forward never sees (a mixing weight
        ramped 0 -> 1, an exponent annealed 1 -> 2), so it is a parameter: an expression in it alone is
        a constant of exponent 0 whose possible inf or NaN is a QL108 hazard, never a value read off
        today's buffer. An integer or bool buffer the forward never writes (a causal mask, an index
        table, a bucket map: the graph check ran the forward and compared) is a constant, read by value."""
        try:
            value = self.fetch_attr(target)
        except (AttributeError, RuntimeError):
            return True
        if not isinstance(value, torch.Tensor):
            return True
        if isinstance(value, torch.nn.Parameter) or self.is_trainable(target, value) or value.is_meta:
            return True
        if not is_buffer(self.module, target) or lifted_constant(target):
            return False
        return value.is_floating_point() or value.is_complex() or not self._frozen(value)

    def _frozen_float(self, target: str) -> bool:
        """A floating-point buffer the forward never writes (arbitrary only as training may move it)."""
        try:
            value = self.fetch_attr(target)
        except (AttributeError, RuntimeError):
            return False
        return (isinstance(value, torch.Tensor) and value.is_floating_point() and not value.is_meta
                and not isinstance(value, torch.nn.Parameter) and not self.is_trainable(target, value)
                and is_buffer(self.module, target) and not lifted_constant(target) and self._frozen(value))

    def _frozen(self, value: torch.Tensor) -> bool:
        written = self.module.meta.get("qlint_written_buffers")
        return written is not None and value.numel() > 0 and storage_key(value) not in written

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
        value = strided(value)
        written = self.module.meta.get("qlint_written_buffers")
        if written and value.numel() and storage_key(value) in written and \
                any("batch_norm" not in facts(user).family and not _writes_into(user, n) for user in n.users):
            return unknown(f"the buffer `{n.target}` is written by the forward (running statistics) and read as a "
                           "value: it holds what the input wrote")
        if self._arbitrary(str(n.target)):
            if (value.is_floating_point() or value.is_complex()) and not value.is_meta \
                    and not bool(torch.isfinite(value).all()):  # a parameter like this is refused by capture
                return Growth(None, depends=False, real=not value.is_complex(),
                              culprit=f"the buffer `{n.target}` holds inf or NaN: no constant bounds what it meets")
            return Growth(0.0, depends=False, real=not value.is_complex())
        # rsqrt(arange(8)) evaluated while tracing: inf
        return (_by_value(value)
                or Growth(None, depends=False, real=True,
                          culprit=f"the tensor constant `{n.target}` holds inf or NaN (or cannot be read)"))

    def _declared(self, info: NodeFacts, inputs: list[Value]) -> Growth:
        dependent = [joint(v) for v in inputs if joint(v).depends]
        if not dependent:
            return CONSTANT
        q = algebra.parallel_sum(g.q for g in dependent)
        culprit = next((g.culprit for g in dependent if not g.known), None)
        return Growth(algebra.compose(float(info.declared.q), q), real=None, culprit=culprit)

    def _relation(self, n: fx.Node, relation: Any, computed: Value) -> Value:
        if isinstance(relation, Normalisation):
            x = leading(self.env[relation.numerator])
            if x.real is not True:
                return computed  # the proof squares real entries
            if not x.depends:
                return computed
            if not x.known:
                return Growth(None, culprit=x.culprit or "a normalisation of a value that overflows first")
            r = domain.interval(-relation.bound, relation.bound) if relation.bound is not None else ANY
            if relation.factor is not None:
                g = leading(self.env[relation.factor])
                if g.real is not True or not g.known:
                    return computed
                if not g.range.bounded:  # |g_i x_i| / ||x|| <= B |g_i|: the factor's growth, whatever x's
                    return Growth(g.q, depends=True, range=ANY, culprit=g.culprit)
                top = max(abs(g.range.lo), abs(g.range.hi))
                r = domain.interval(-relation.bound * top, relation.bound * top) \
                    if relation.bound is not None and math.isfinite(top) else ANY
            return Growth(algebra.normalize(x.q), depends=True, range=r)
        if isinstance(relation, OwnShiftRatio):
            n = leading(self.env[relation.numerator])
            if n.real is True and n.range.nonneg and n.known:
                return Growth(0.0, depends=n.depends, range=Range(lo=0.0, hi=1.0, hi_open=True))
            return computed
        if isinstance(relation, OwnSumRatio):
            x = leading(self.env[relation.numerator])
            if relation.addend is not None:
                extra = leading(self.env.get(relation.addend, CONSTANT))
                if not (extra.real is True and extra.known and extra.range.nonneg):
                    return computed  # the further term must not cancel the sum
                if not extra.range.pos and not relation.eps and not x.range.pos:
                    return computed  # both may be 0: 0 / 0
                relation = dataclasses.replace(relation, eps=True)
            if x.real is True and (x.range.pos or ((relation.eps or relation.floored) and x.range.nonneg)) and x.known:
                # a positive numerator over a sum of positive entries is positive (a Sinkhorn step divides it again)
                top = 1.0 if not relation.mean else float(relation.group) if relation.group else math.inf
                r = Range(lo=0.0, hi=top, pos=True, lo_open=True) if x.range.pos else Range(lo=0.0, hi=top)
                return Growth(0.0, depends=x.depends, range=r)
            return computed
        if isinstance(relation, Selection):
            return self._selected(n, relation, computed)
        if isinstance(relation, OwnMaxShift):
            value = leading(computed)
            if value.real is True:
                r = value.range
                return Growth(value.q, depends=value.depends, range=Range(lo=r.lo, hi=0.0, below=r.below),
                              culprit=value.culprit)
        return computed


    def _finite_parameter(self, node: fx.Node) -> bool:
        """A parameter, or a float buffer the forward never writes and that is finite now, up to sign and
        copies: independent of the input and finite (capture refuses a parameter that is not; a constant,
        or an expression that may overflow, may be inf)."""
        while op_name(node) in ("abs", "neg", "clone", "detach", "alias", "contiguous", "positive"):
            node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
            if node is None:
                return False
        if node.op != "get_attr":
            return False
        target = str(node.target)
        try:
            value = self.fetch_attr(target)
        except (AttributeError, RuntimeError):
            return False
        return isinstance(value, torch.nn.Parameter) or (self._frozen_float(target)
                                                         and bool(torch.isfinite(value).all()))

    def _selected(self, node: fx.Node, selection: Selection, computed: Value) -> Value:
        """``where(v > t, a, b)``: each branch propagated again from v restricted to the set where it is
        taken (entry by entry, so only through elementwise ops from v), then combined as ``where``
        combines (Theorem 9(ii)). Anything else keeps the transfer's value."""
        v = leading(self.env[selection.base])
        if not (isinstance(computed, Growth) and v.real is True and v.known and v.depends):
            return computed
        held = selection.threshold
        if held is not None and not self._finite_parameter(held):
            return computed  # a threshold that moves with the input, or may be inf, bounds nothing
        values = []
        for name, taken, base in (("input", selection.taken, selection.base),
                                  ("other", selection.left, selection.left_base or selection.base)):
            branch = facts(node).bound.arguments.get(name)
            if not isinstance(branch, fx.Node) or taken is None:
                values.append(leading(self.env[branch]) if isinstance(branch, fx.Node) else domain.constant(branch))
                continue
            cone = _elementwise_cone(base, branch, self.graph_facts.nodes)
            v = leading(self.env[base])
            if base is not selection.base and (cone is None or not (v.real is True and v.known)):
                values.append(leading(self.env[branch]))  # |v| >= t is a fact about |v| only: read as taken anywhere
                continue
            if cone is None:
                return computed
            lo, hi, lo_open, hi_open = taken
            r = v.range
            if held is not None:  # bounded on its finite sides per parameter value, at no known number
                bounds = dataclasses.replace(r, below=r.below or lo > -math.inf, above=r.above or hi < math.inf)
            else:
                bounds = Range(lo=max(r.lo, lo), hi=min(r.hi, hi), pos=r.pos or (lo >= 0 and (lo_open or lo > 0)),
                               neg=r.neg or (hi <= 0 and (hi_open or hi < 0)), below=r.below or lo > -math.inf,
                               above=r.above or hi < math.inf, floor=r.floor, ceil=r.ceil)
            restricted = Growth(v.q, depends=True, real=True, range=bounds)
            local = self.propagate({base: restricted}, cone, self.env) if cone else {}
            values.append(leading(local.get(branch, restricted if branch is base else self.env[branch])))
        dependent = [g for g in values if g.depends]
        if not all(g.known for g in dependent) or not all(g.real is True for g in values):
            return computed
        q = max((g.q for g in dependent), default=0.0)
        before = leading(computed)
        selected = domain.union(*(g.range for g in values))  # each branch where it is taken: a range as valid
        if before.known and before.q <= q:
            return dataclasses.replace(before, range=selected) if before.real is True else computed
        return Growth(q, depends=bool(dependent), range=selected)


_ENTRYWISE = frozenset({"add", "sub", "rsub", "mul", "div", "neg", "abs", "pow", "square", "sqrt", "rsqrt", "exp",
                        "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid", "relu", "gelu", "silu", "elu",
                        "selu", "celu", "softplus", "sin", "cos", "clamp", "clamp_min", "clamp_max", "minimum",
                        "maximum", "where", "to", "_to_copy", "float", "double", "type_as", "sign", "reciprocal",
                        "erf", "floor", "ceil", "round", "trunc", "leaky_relu", "hardtanh", "mish", "atan", "asinh",
                        "sinh", "cosh", "alias", "clone", "detach", "contiguous", "gt", "ge", "lt", "le"})


def _elementwise_cone(base: fx.Node, target: fx.Node, ordered: list[fx.Node]) -> Optional[list[fx.Node]]:
    """The nodes on paths from ``base`` to ``target`` in graph order (empty when target is base), when every
    one computes entry by entry (:data:`_ENTRYWISE`: each entry of the target reads base at its own entry
    only); None when one does not, or target does not depend on base."""
    if target is base:
        return []
    above, stack = {target}, [target]  # target and its ancestors
    while stack:
        for parent in stack.pop().all_input_nodes:
            if parent not in above:
                above.add(parent)
                stack.append(parent)
    if base not in above:
        return None
    below = {base}  # descendants of base among them, in graph order
    cone = []
    for n in ordered:
        if n in above and n is not base and any(p in below for p in n.all_input_nodes):
            below.add(n)
            cone.append(n)
    if not all(op_name(n) in _ENTRYWISE for n in cone):
        return None
    return cone


def _writes_into(user: fx.Node, target: fx.Node) -> bool:
    """``user`` writes into ``target`` (``copy_(buffer, new)``: export's write-back of running statistics)."""
    schema = getattr(user.target, "_schema", None)
    if schema is None:
        return False
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = user.args[position] if position < len(user.args) else user.kwargs.get(argument.name)
            if value is target:
                return True
    return False


def _length(term: Any, exact: bool) -> Growth:
    """One axis length as a constant: the number itself when the trace fixed it, else its range."""
    from qlint.core.graph import least_size

    if isinstance(term, (torch.SymInt, int)) and not isinstance(term, bool):
        value = size_term(term)
        if isinstance(value, int) and exact:
            return Growth(0.0, depends=False, range=point(float(value)))
        least = least_size(term) if isinstance(term, torch.SymInt) else 1
        return Growth(0.0, depends=False, range=Range(lo=float(max(1, least))))
    return Growth(0.0, depends=False, range=Range(lo=1.0))


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


def run_transfer(n: fx.Node, info: NodeFacts, env: Any, training: bool,
                 overrides: Optional[dict[str, Value]] = None) -> tuple[Value, Call]:
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
    mismatch = structure_mismatch(value, n, primitive)
    if mismatch is not None:
        return unknown(f"the rule for {call.label()} {mismatch}"), call
    value = _expanded(value, n, primitive)
    reason = call.unread(primitive.meta_args,
                         primitive.params if "*" not in primitive.params else frozenset(call.arguments))
    if reason is not None:
        return unknown(reason), call
    # selectors too: an unknown one may be NaN or of unknown length
    poisoned = _unknown_argument(arguments, primitive.meta_args | frozenset(call.picked))
    if poisoned is not None and joint(value).q is not None:
        return Growth(None, culprit=poisoned.culprit), call  # an unknown argument is never certified away
    if call.ignored_constants(primitive.meta_args):
        value = _without_ranges(value)
    return value, call


# --- the output's structure ------------------------------------------------------------------

TENSOR = "tensor"  # one tensor
SCALAR = "scalar"  # a Python number, a symbolic size, None: not a tensor value
ANY_LENGTH = -1  # a list of tensors whose length the schema does not fix (split, unbind)


def output_structure(node: fx.Node) -> Any:
    """What a node returns, as the trace recorded it (or the op's schema says): TENSOR, SCALAR,
    a tuple of structures, ``(ANY_LENGTH,)`` for a list of tensors of unknown length, or None
    when nothing says."""
    for key in ("val", "example_value"):
        if key in node.meta:
            return _structure_of(node.meta[key])
    if "tensor_meta" in node.meta:
        return _structure_of(node.meta["tensor_meta"])
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    kinds = tuple(ANY_LENGTH if str(r.type) in ("List[Tensor]", "Tensor[]") else TENSOR if "Tensor" in str(r.type)
                  else SCALAR
                  for r in schema.returns)
    if not kinds:
        return None
    if len(kinds) == 1:
        return (ANY_LENGTH,) if kinds[0] == ANY_LENGTH else kinds[0]
    return tuple(TENSOR if k == ANY_LENGTH else k for k in kinds)


def _structure_of(recorded: Any) -> Any:
    if isinstance(recorded, torch.Tensor) or type(recorded).__name__ == "TensorMetadata":
        return TENSOR
    if isinstance(recorded, (list, tuple)):
        return tuple(_structure_of(item) for item in recorded)
    if isinstance(recorded, dict):
        return None
    return SCALAR


def structure_mismatch(value: Value, node: fx.Node, primitive: Any) -> Optional[str]:
    """Why a transfer's result does not have the op's output structure, or None.

    A result is a Growth or a tuple of results; it has one Growth per tensor the op returns.
    The one lenient case: an op whose every output is entries of its input (``split``,
    ``unbind``: family ``view``) may give one Growth for all of them (:func:`_expanded`).
    """
    if not _is_value(value):
        return f"gave no value (`{type(value).__name__}`)"
    if isinstance(value, Growth) and value.q is None:
        return None  # unknown stands for any structure: each output is unknown
    return _mismatch(value, output_structure(node), "view" in primitive.family)


def _is_value(value: Any) -> bool:
    if isinstance(value, Growth):
        return True
    return isinstance(value, tuple) and all(_is_value(v) for v in value)


def _mismatch(value: Value, expected: Any, each: bool) -> Optional[str]:
    if expected is None or expected == SCALAR:
        return None
    if expected == TENSOR:
        return None if isinstance(value, Growth) else f"gives {len(value)} values for an op that returns one tensor"
    if isinstance(value, Growth):
        return None if each else f"gives one value for an op that returns {_count(expected)} tensors"
    if expected == (ANY_LENGTH,):
        return None
    if len(value) != len(expected):
        return f"gives {len(value)} values for an op that returns {len(expected)}"
    for item, structure in zip(value, expected):
        problem = _mismatch(item, structure, each)
        if problem is not None:
            return problem
    return None


def _count(expected: Any) -> str:
    return "several" if expected == (ANY_LENGTH,) else str(len(expected))


def _expanded(value: Value, node: fx.Node, primitive: Any) -> Value:
    """One Growth standing for every output of a view-family op, as one per output."""
    expected = output_structure(node)
    if (isinstance(value, Growth) and isinstance(expected, tuple) and expected != (ANY_LENGTH,)
        and "view" in primitive.family):
        return tuple(value for _ in expected)
    return value


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
