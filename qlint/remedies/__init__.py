"""Remedies qlint has re-checked: from "q = 5" to a change that certifies the block.

For a failing block, candidate changes follow the paper's procedure (000, Section
4.2 step 3: wrap the highest-q primitive with a normalization, or replace it by a
Lipschitz substitute) and its Mamba example (Section 5: the linear-growth
modification). Each candidate is applied to a copy of the traced graph (a
GraphModule that runs), the analysis is re-run on it, and only candidates after
which the block certifies (q <= threshold) are kept: a remedy is never shown on
the strength of the arithmetic alone. Kept remedies are ranked by new trainable
parameters, then new graph nodes, then the exponent reached.

Kinds (``qlint.remedy(..., kind=...)``):

  preln                 norm(X_k) on the block input, fed only to the offending branches
  periln                preln, plus a norm on each offending velocity term (Peri-LN)
  norm_primitive        a norm on the output of the highest-q primitive
  gate_sigmoid          silu(z) * y -> sigmoid(z) * y on the highest Hadamard product
  lipschitz_activation  h ** p -> gelu(h) (Table 1 Lipschitz activation, q = 1)
  bounded_exp           exp(a) -> exp(-softplus(a)), a contraction (q = 0)
  linear_growth         L2-normalise the selective-parameter projection's input, plus
                        gate_sigmoid: the paper's normalization-free modification

The norm kind follows the model's own (RMSNorm if it uses one, else LayerNorm).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from qlint.analysis import Options, run
from qlint.core import algebra
from qlint.core.algebra import Exponent
from qlint.core.blocks import Block as ResidualBlock
from qlint.core.engine import Analysis, dominant_parent, primitive_name, source_of
from qlint.core.graph import facts, module_path
from qlint.core.ops import op_name
from qlint.core.propagate import leading
from qlint.core.results import Block, Source
from qlint.core.trace import TracedGraph

KINDS = ("preln", "periln", "norm_primitive", "gate_sigmoid", "lipschitz_activation", "bounded_exp", "linear_growth")


class NotApplicable(Exception):
    """A remedy kind has nothing to act on in this block (the message says why)."""


@dataclass(frozen=True)
class Remedy:
    """A change qlint applied to a copy of the graph and re-checked."""

    kind: str
    block: str
    target: str
    source: Optional[Source]
    sketch: str
    q_after: Exponent
    new_params: int
    new_nodes: int

    @property
    def rank(self) -> tuple:
        return (self.new_params, self.new_nodes, math.inf if self.q_after is None else self.q_after)

    def to_dict(self) -> dict[str, Any]:
        finite = self.q_after is not None and not math.isinf(self.q_after)
        return {
            "kind": self.kind,
            "target": self.target,
            "q_after": self.q_after if finite else None,
            "new_params": self.new_params,
            "new_nodes": self.new_nodes,
            "sketch": self.sketch,
            "source": self.source.to_dict() if self.source else None,
        }


@dataclass(frozen=True)
class _Plan:
    """A candidate before it is checked: what it changes and how to edit a copy."""

    kind: str
    target: str
    source: Optional[Source]
    sketch: str
    edit: Callable[["_Surgery"], None]


# --- public API ---------------------------------------------------------------------------


def remedy(
    model: nn.Module,
    example_inputs: Optional[tuple] = None,
    *,
    block: Optional[str] = None,
    kind: str = "preln",
    mode: Optional[str] = None,
    tracer: Optional[str] = None,
    threshold: float = 1.0,
) -> nn.Module:
    """The model with one remedy applied, as a GraphModule that trains like any module.

    ``block=None`` applies ``kind`` to every failing block. Raises ValueError when the
    block or kind is unknown, when the kind does not apply, or when the result does
    not certify every remedied block.

    >>> fixed = qlint.remedy(model, (x,), block="layers.0", kind="preln")
    >>> fixed(x).sum().backward()
    """
    _check_kind(kind)
    options = Options(mode=mode, tracer=tracer, threshold=threshold)
    return apply(run(model, example_inputs, spec=type(model).__name__, options=options), kind, block=block)


def apply(analysis: Analysis, kind: str, *, block: Optional[str] = None) -> nn.Module:
    """:func:`remedy` for a model already analysed (build several variants from one trace)."""
    _check_kind(kind)
    names = _targets(analysis.report.blocks, block)
    base = _base_module(analysis)
    plans = []
    for name in names:
        try:
            plans.append(_BlockContext(analysis, name, base).plan(kind))
        except NotApplicable as exc:
            raise ValueError(f"remedy {kind!r} does not apply to block `{name}`: {exc}") from None
    surgery, checked = _apply(analysis, base, plans)
    _runs(surgery.module, analysis.inputs, kind)
    for name in names:
        q = checked.get(name)
        if not algebra.is_certified(q, analysis.options.threshold):
            raise ValueError(f"remedy {kind!r} does not certify block `{name}`: q = {algebra.format_q(q)} after the change")
    copied = copy.deepcopy(surgery.module)  # independent of the analysed model's weights
    remedied = fx.GraphModule(copied, copied.graph, class_name=type(analysis.model).__name__)
    remedied.train(copied.training)
    _restore_outputs(remedied, analysis.model, analysis.inputs)
    return remedied


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown remedy kind {kind!r}; expected one of {', '.join(KINDS)}")


def _runs(module: nn.Module, inputs: Optional[tuple], kind: str) -> None:
    """The remedied module must run on the example inputs (skipped without weights)."""
    parameter = next(iter(module.parameters()), None)
    if inputs is None or (parameter is not None and parameter.device.type == "meta"):
        return
    try:
        with torch.no_grad():
            module(*inputs)
    except Exception as exc:
        raise ValueError(f"remedy {kind!r} produced a graph that does not run: {exc}") from exc


def propose(analysis: Analysis, name: str, base: Optional[fx.GraphModule] = None) -> list[Remedy]:
    """The remedies that certify block ``name``, best first."""
    threshold = analysis.options.threshold
    kept = [r for r in candidates(analysis, name, base) if algebra.is_certified(r.q_after, threshold)]
    return sorted(kept, key=lambda r: r.rank)


def candidates(
    analysis: Analysis, name: str, base: Optional[fx.GraphModule] = None, kinds: Sequence[str] = KINDS
) -> list[Remedy]:
    """Every applicable candidate of ``kinds`` for block ``name``, re-checked; certifying or not."""
    base = base if base is not None else _base_module(analysis)
    context = _BlockContext(analysis, name, base)
    results = []
    for kind in kinds:
        _check_kind(kind)
        try:
            plan = context.plan(kind)
        except NotApplicable:
            continue
        try:
            surgery, checked = _apply(analysis, base, [plan])
        except NotApplicable:  # e.g. a size the norm needs is unknown
            continue
        results.append(
            Remedy(plan.kind, name, plan.target, plan.source, plan.sketch, checked.get(name), surgery.new_params, surgery.new_nodes)
        )
    return results


def attach(analysis: Analysis) -> None:
    """``block.extra["remedies"]`` for every failing block (``--show-remedies``)."""
    failing = [b for b in analysis.report.blocks if b.status != "ok"]
    if not failing:
        return
    base = _base_module(analysis)
    for block in failing:
        block.extra["remedies"] = [r.to_dict() for r in propose(analysis, block.name, base)]


def _targets(blocks: list[Block], name: Optional[str]) -> list[str]:
    if name is not None:
        if name not in {b.name for b in blocks}:
            known = ", ".join(b.name for b in blocks) or "none"
            raise ValueError(f"unknown block {name!r}; blocks: {known}")
        return [name]
    failing = [b.name for b in blocks if b.status != "ok"]
    if not failing:
        raise ValueError("every block is already certified: nothing to remedy (name a block to change it anyway)")
    return failing


# --- applying and re-checking -----------------------------------------------------------------


def _base_module(analysis: Analysis) -> fx.GraphModule:
    """A copy of the traced graph whose tensor nodes carry shapes (norms need sizes)."""
    base = _light_copy(analysis.traced.module, type(analysis.model).__name__)
    exported = any("val" in n.meta for n in base.graph.nodes)  # torch.export / make_fx record shapes
    if not exported and analysis.inputs is not None:
        from torch.fx.passes.shape_prop import ShapeProp

        try:
            with torch.no_grad():
                ShapeProp(base).propagate(*analysis.inputs)
        except Exception:  # shapes stay unknown: the norm remedies then do not apply
            pass
    return base


def _light_copy(module: fx.GraphModule, class_name: str) -> fx.GraphModule:
    """A new GraphModule over a copy of the graph; parameters are shared, not copied."""
    result = fx.GraphModule(module, copy.deepcopy(module.graph), class_name=class_name)
    result.train(module.training)
    return result


def _apply(analysis: Analysis, base: fx.GraphModule, plans: Sequence[_Plan]) -> tuple["_Surgery", dict[str, Exponent]]:
    """Edit a copy of ``base`` with every plan and re-analyse it: block name -> q."""
    surgery = _Surgery(base, _norm_class(analysis.model))
    for plan in plans:
        plan.edit(surgery)
    surgery.finish()
    mode = "train" if analysis.model.training else "eval"
    options = replace(analysis.options, remedies=False, mode=mode)
    traced = TracedGraph(surgery.module, tracer=analysis.traced.tracer)
    checked = run(surgery.module, analysis.inputs, spec=analysis.report.spec, options=options, traced=traced)
    return surgery, {b.name: b.q for b in checked.report.blocks}


def _restore_outputs(module: fx.GraphModule, model: nn.Module, inputs: Optional[tuple]) -> None:
    """Return what the model returns (a tensor), not the flat tuple the tracer recorded."""
    codegen = module.graph._codegen
    info = getattr(codegen, "pytree_info", None)
    if info is None or inputs is None:
        return
    from torch.utils import _pytree as pytree

    with torch.no_grad():
        leaves, spec = pytree.tree_flatten(model(*inputs))
    if spec.num_leaves == info.out_spec.num_leaves and all(isinstance(x, torch.Tensor) for x in leaves):
        codegen.pytree_info = info._replace(out_spec=spec)
        module._out_spec = spec
        module.recompile()


def _norm_class(model: nn.Module) -> type[nn.Module]:
    """The model's own normalization kind: RMSNorm if it uses one, else LayerNorm."""
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            return nn.RMSNorm
        if name.endswith("LayerNorm"):
            return nn.LayerNorm
    return nn.LayerNorm


def _tensor_meta(node: fx.Node) -> Optional[tuple[torch.Size, torch.dtype]]:
    """(shape, dtype) of a node's value from export's ``val`` or ShapeProp's ``tensor_meta``."""
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.shape, value.dtype
    info = node.meta.get("tensor_meta")
    if info is not None and hasattr(info, "shape"):
        return info.shape, info.dtype
    return None


def _example_length(size: Any) -> int:
    """An axis length as the example has it: a dynamic export's symbolic length by its example value
    (``int()`` would specialise the trace's shapes)."""
    if isinstance(size, torch.SymInt):
        return int(size.node.hint)
    return int(size)


def _meta_like(template: fx.Node, value: fx.Node) -> dict[str, Any]:
    """``template``'s metadata (module path, stack trace: names and sources stay stable)
    with ``value``'s shape: every inserted op preserves its input's shape."""
    meta = dict(template.meta)
    for key in ("val", "tensor_meta"):
        if key in value.meta:
            meta[key] = value.meta[key]
        else:
            meta.pop(key, None)
    return meta


class _Surgery:
    """Edits on one copy of the traced graph, addressed by node name."""

    def __init__(self, base: fx.GraphModule, norm_class: type[nn.Module]) -> None:
        self.module = _light_copy(base, type(base).__name__)
        self.graph = self.module.graph
        self.norm_class = norm_class
        self.nodes = {n.name: n for n in self.graph.nodes}
        self.new_params = 0
        self._nodes_before = len(self.nodes)
        parameter = next(iter(base.parameters()), None)
        self.device = parameter.device if parameter is not None else torch.device("cpu")

    @property
    def new_nodes(self) -> int:
        return len(self.graph.nodes) - self._nodes_before

    def node(self, name: str) -> fx.Node:
        return self.nodes[name]

    def insert_norm(self, value: str, users: Sequence[str], meta_from: str, label: str) -> None:
        """A new norm on ``value`` (its parameters in a new submodule), read by ``users``."""
        source, readers = self.node(value), [self.node(u) for u in users]
        shape, dtype = _tensor_meta(source) or (None, None)
        if not shape:
            raise NotApplicable(f"the size of `{value}` is unknown (give example inputs)")
        width = _example_length(shape[-1])
        norm = self.norm_class(width).to(device=self.device, dtype=dtype)
        target = self._free_name(f"qlint_{label}")
        self.module.add_submodule(target, norm)
        self.new_params += sum(p.numel() for p in norm.parameters() if p.requires_grad)
        size = (width,)
        with self.graph.inserting_before(self._first(readers)):
            weight = self.graph.get_attr(f"{target}.weight")
            if isinstance(norm, nn.RMSNorm):
                node = self.graph.call_function(F.rms_norm, (source, size, weight, norm.eps))
            else:
                bias = self.graph.get_attr(f"{target}.bias")
                node = self.graph.call_function(F.layer_norm, (source, size, weight, bias, norm.eps))
        node.meta = _meta_like(self.node(meta_from), source)
        for reader in readers:
            reader.replace_input_with(source, node)

    def insert_call(self, fn: Callable, value: str, user: str, **kwargs: Any) -> None:
        """``fn(value, **kwargs)`` read by ``user`` instead of ``value``."""
        source, reader = self.node(value), self.node(user)
        with self.graph.inserting_before(reader):
            node = self.graph.call_function(fn, (source,), kwargs)
        node.meta = _meta_like(reader, source)
        reader.replace_input_with(source, node)

    def substitute(self, name: str, chain: Sequence[Callable]) -> None:
        """Replace node ``name`` by ``chain[-1](... chain[0](its input))``."""
        old = self.node(name)
        value = _main_input(old)
        with self.graph.inserting_before(old):
            for fn in chain:
                value = self.graph.call_function(fn, (value,))
                value.meta = _meta_like(old, old)
        old.replace_all_uses_with(value)
        self.graph.erase_node(old)

    def finish(self) -> None:
        self.graph.lint()
        self.module.recompile()

    def _first(self, nodes: Sequence[fx.Node]) -> fx.Node:
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        return min(nodes, key=order.__getitem__)

    def _free_name(self, stem: str) -> str:
        existing = {name for name, _ in self.module.named_children()}
        index = 0
        while f"{stem}_{index}" in existing:
            index += 1
        return f"{stem}_{index}"


def _main_input(node: fx.Node) -> fx.Node:
    value = node.args[0] if node.args else node.kwargs.get("input")
    if not isinstance(value, fx.Node):
        raise NotApplicable(f"`{node.name}` has no tensor input to keep")
    return value


# --- finding what to change -------------------------------------------------------------------


class _BlockContext:
    """One block of an analysis and the graph facts its remedies need."""

    def __init__(self, analysis: Analysis, name: str, base: fx.GraphModule) -> None:
        matches = [(r, b) for r, b in zip(analysis.stream.blocks, analysis.report.blocks) if b.name == name]
        if not matches:
            raise ValueError(f"unknown block {name!r}")
        self.analysis = analysis
        pair: tuple[ResidualBlock, Block] = matches[0]
        self.residual, self.block = pair
        self.env = analysis.envs[name]
        self.nodes = {n.name: n for n in analysis.traced.graph.nodes}
        self.submodules = dict(analysis.traced.module.named_modules())
        self.norm = _norm_class(analysis.model).__name__
        self.shapes = {n.name: _tensor_meta(n) for n in base.graph.nodes}

    # -- facts ------------------------------------------------------------------------------

    def q(self, node: fx.Node) -> Exponent:
        return leading(self.env[node]).q if node in self.env else 0.0

    def depends(self, node: Any) -> bool:
        return isinstance(node, fx.Node) and node in self.env and leading(self.env[node]).depends

    def offending_terms(self) -> list[fx.Node]:
        """Velocity terms above the threshold (all dependent terms of a certified block)."""
        threshold = self.analysis.options.threshold
        dependent = [t.node for t in self.residual.terms if self.depends(t.node)]
        failing = [t for t in dependent if not algebra.is_certified(self.q(t), threshold)]
        return failing or dependent

    def branch_cone(self) -> set[fx.Node]:
        """The cone nodes that feed an offending term: other branches stay untouched."""
        seen: set[fx.Node] = set()
        stack = list(self.offending_terms())
        while stack:
            node = stack.pop()
            if node in seen or node not in self.residual.region_set:
                continue
            seen.add(node)
            stack.extend(node.all_input_nodes)
        return seen

    def stream_readers(self) -> list[fx.Node]:
        cone = self.branch_cone()
        return [user for user in self.residual.stream.users if user in cone]

    def sum_nodes(self) -> list[fx.Node]:
        """The residual join and the sums folded into it (``x + a(x) + b(x)``)."""
        terms = [self.residual.skip, *self.residual.terms]
        return list(dict.fromkeys([self.residual.join] + [node for term in terms for node, _ in term.path]))

    def dominant(self) -> fx.Node:
        """The highest-q primitive: the derivation step where q reached its final value."""
        for step in self.block.derivation[1:]:
            if step.q == self.block.q and step.node in self.nodes and not facts(self.nodes[step.node]).plumbing:
                return self.nodes[step.node]
        raise NotApplicable("no primitive raises the exponent")

    def is_hadamard(self, node: fx.Node) -> bool:
        return facts(node).op == "mul" and len(self.factors(node)) >= 2

    def factors(self, node: fx.Node) -> list[fx.Node]:
        """The operands of a product that grow with the input (q > 0)."""
        return [a for a in node.all_input_nodes if self.depends(a) and self.q(a) != 0]

    def top_hadamard(self) -> fx.Node:
        """The last Hadamard product along the derivation (the gate of a gated block)."""
        for step in reversed(self.block.derivation):
            node = self.nodes.get(step.node)
            if node is not None and self.is_hadamard(node):
                return node
        raise NotApplicable("no Hadamard product raises the exponent")

    def through_plumbing(self, node: fx.Node) -> fx.Node:
        """The value a view/cast/selection of it carries (``x[..., None]`` -> ``x``)."""
        while node in self.env and facts(node).plumbing:
            parent = dominant_parent(node, self.env, self.analysis.graph)
            if parent is None:
                break
            node = parent
        return node

    def module_of(self, node: fx.Node) -> Optional[nn.Module]:
        return self.submodules.get(str(node.target)) if node.op == "call_module" else None

    def is_silu(self, node: fx.Node) -> bool:
        return op_name(node) in ("silu", "silu_") or isinstance(self.module_of(node), nn.SiLU)

    def is_linear(self, node: fx.Node) -> bool:
        return op_name(node) == "linear" or isinstance(self.module_of(node), nn.Linear)

    def gates(self) -> list[fx.Node]:
        """SiLU factors of the highest Hadamard product."""
        gates = [g for g in (self.through_plumbing(f) for f in self.factors(self.top_hadamard())) if self.is_silu(g)]
        if not gates:
            raise NotApplicable("the highest Hadamard product has no SiLU gate")
        return gates

    def nearest_linear(self, node: fx.Node) -> Optional[fx.Node]:
        """Walk back along single-input ops (views, activations) to a Linear layer."""
        while node is not self.residual.stream:
            if self.is_linear(node):
                return node
            inputs = [a for a in node.all_input_nodes if self.depends(a)]
            if len(inputs) != 1:
                return None
            node = inputs[0]
        return None

    def selective_projection(self) -> fx.Node:
        """The Linear that computes input-dependent parameters (Mamba's x_proj: Δ, B, C).

        Selectivity is a product ``P(s) ⊙ s``: parameters projected from a signal that
        is itself a factor. Among Linears that produce Hadamard factors and read such a
        signal, the one producing the most factors.
        """
        cone = self.branch_cone()
        factors = [f for n in self.residual.region if n in cone and self.is_hadamard(n) for f in self.factors(n)]
        signals = {self.through_plumbing(f) for f in factors}
        produced: dict[fx.Node, int] = {}
        for factor in factors:
            linear = self.nearest_linear(factor)
            if linear is not None and self.through_plumbing(_main_input(linear)) in signals:
                produced[linear] = produced.get(linear, 0) + 1
        if not produced:
            raise NotApplicable("no selective-parameter projection (a Linear of a signal it multiplies)")
        order = {n: i for i, n in enumerate(self.residual.region)}
        return max(produced, key=lambda n: (produced[n], -order[n]))

    def where(self, node: fx.Node) -> str:
        return module_path(node) or self.block.name

    def size(self, node: fx.Node) -> str:
        meta = self.shapes.get(node.name)
        return str(meta[0][-1]) if meta and len(meta[0]) else "d"

    def branch_name(self) -> str:
        """The child module that computes the offending branch (``ssm``), or ``f``."""
        block_path = module_path(self.residual.join)
        prefix = f"{block_path}." if block_path else ""
        names = set()
        for term in self.offending_terms():
            path = module_path(term)
            relative = path[len(prefix) :].split(".") if path.startswith(prefix) else []
            names.add(relative[0] if len(relative) >= 2 else "f")
        return names.pop() if len(names) == 1 else "f"

    # -- plans ------------------------------------------------------------------------------

    def plan(self, kind: str) -> _Plan:
        """The candidate of this kind, or NotApplicable."""
        return getattr(self, f"_plan_{kind}")()

    def _plan_preln(self) -> _Plan:
        return self._norm_plan("preln", output=False)

    def _plan_periln(self) -> _Plan:
        return self._norm_plan("periln", output=True)

    def _norm_plan(self, kind: str, *, output: bool) -> _Plan:
        stream, root = self.residual.stream.name, self.residual.join.name
        readers = [n.name for n in self.stream_readers()]
        if not readers:
            raise NotApplicable("the offending branch does not read the block input")
        terms = [t.name for t in self.offending_terms()]
        sums = self.sum_nodes()
        term_readers = {t: [s.name for s in sums if t in {a.name for a in s.all_input_nodes}] for t in terms}
        label = self.block.name.replace(".", "_").replace(":", "_").replace("#", "_")

        def edit(surgery: _Surgery) -> None:
            surgery.insert_norm(stream, readers, meta_from=root, label=f"{kind}_in_{label}")
            if output:
                for term in terms:
                    surgery.insert_norm(term, term_readers[term], meta_from=term, label=f"{kind}_out_{label}")

        f, norm = self.branch_name(), f"nn.{self.norm}({self.size(self.residual.stream)})"
        only = f" (the `{f}` branch only)" if len(terms) < len([t for t in self.residual.terms if self.depends(t.node)]) else ""
        if output:
            target = f"input and output of {self.block.name}{only}"
            sketch = f"{f}(x) → norm_out({f}(norm_in(x))), norm_in = norm_out = {norm}"
        else:
            target = f"input of {self.block.name}{only}"
            sketch = f"{f}(x) → {f}(norm(x)), norm = {norm}"
        return _Plan(kind, target, self.block.source, sketch, edit)

    def _plan_norm_primitive(self) -> _Plan:
        node = self.dominant()
        users = [u.name for u in node.users]
        if not users:
            raise NotApplicable("the highest-q primitive has no users")
        label = node.name

        def edit(surgery: _Surgery) -> None:
            surgery.insert_norm(label, users, meta_from=label, label=f"norm_{label}")

        expression = _expression(self, node)
        step = primitive_name(node)
        sketch = f"{expression} → norm({expression}), norm = nn.{self.norm}({self.size(node)})"
        return _Plan("norm_primitive", f"output of the {step} in {self.where(node)}", source_of(node), sketch, edit)

    def _plan_gate_sigmoid(self) -> _Plan:
        gates = [g.name for g in self.gates()]

        def edit(surgery: _Surgery) -> None:
            for gate in gates:
                surgery.substitute(gate, [torch.sigmoid])

        node = self.nodes[gates[0]]
        return _Plan("gate_sigmoid", f"SiLU gate in {self.where(node)}", source_of(node), "F.silu(z) * y → torch.sigmoid(z) * y", edit)

    def _plan_lipschitz_activation(self) -> _Plan:
        node = self.dominant()
        power = _power(node)
        if power is None or power <= 1:
            raise NotApplicable("the highest-q primitive is not a power x**p with p > 1")
        name = node.name

        def edit(surgery: _Surgery) -> None:
            surgery.substitute(name, [F.gelu])

        return _Plan(
            "lipschitz_activation", f"h ** {power:g} in {self.where(node)}", source_of(node), f"h ** {power:g} → F.gelu(h)  (Lipschitz, q = 1)", edit
        )

    def _plan_bounded_exp(self) -> _Plan:
        node = self.dominant()
        if "exponential" not in facts(node).family:
            raise NotApplicable("the highest-q primitive is not an exponential")
        name = node.name

        def edit(surgery: _Surgery) -> None:
            surgery.substitute(name, [F.softplus, torch.neg, torch.exp])

        return _Plan(
            "bounded_exp", f"{op_name(node)} in {self.where(node)}", source_of(node), "torch.exp(a) → torch.exp(-F.softplus(a))  (in (0, 1])", edit
        )

    def _plan_linear_growth(self) -> _Plan:
        projection = self.selective_projection()
        signal, reader = _main_input(projection).name, projection.name
        try:
            gates = [g.name for g in self.gates()]
        except NotApplicable:
            gates = []

        def edit(surgery: _Surgery) -> None:
            surgery.insert_call(F.normalize, signal, reader, dim=-1)
            for gate in gates:
                surgery.substitute(gate, [torch.sigmoid])

        name = self.where(projection).rsplit(".", 1)[-1]
        sketch = f"{name}(x) → {name}(F.normalize(x, dim=-1))"
        if gates:
            sketch += "; F.silu(z) * y → torch.sigmoid(z) * y"
        target = f"input of {self.where(projection)}" + (" and the SiLU gate" if gates else "")
        return _Plan("linear_growth", target, source_of(projection), sketch, edit)


def _power(node: fx.Node) -> Optional[float]:
    """p of ``h ** p`` / ``h.pow(p)`` / ``square(h)`` with a constant p, else None."""
    if facts(node).op == "square":
        return 2.0
    if "power" not in facts(node).family:
        return None
    exponent = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
    return float(exponent) if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) else None


def _expression(context: _BlockContext, node: fx.Node) -> str:
    """A short code rendering of the primitive for a sketch."""
    power = _power(node)
    if power is not None:
        return f"h ** {power:g}"
    if context.is_hadamard(node):
        return "a * b"
    if context.is_linear(node):
        return f"{context.where(node).rsplit('.', 1)[-1]}(h)"
    name = op_name(node) or type(context.module_of(node)).__name__
    return f"{name}(h)"
