"""The remedy kinds, one planner each: the paper's procedure (000, Section 4.2 step 3) and its Mamba fix.

A planner reads the block (:class:`~qlint.remedies.context.BlockContext`) and returns
what it would change and how to edit a copy of the graph (:class:`~qlint.remedies.surgery.Surgery`),
or raises NotApplicable. The norm a remedy inserts follows the model's own (RMSNorm if
it uses one, else LayerNorm). The order of definition here is the order kinds are tried.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from qlint.growth.engine import primitive_name, source_of
from qlint.core.graph import facts
from qlint.core.ops import op_name
from qlint.remedies.context import BlockContext
from qlint.remedies.registry import Plan, plan
from qlint.remedies.surgery import NotApplicable, Surgery, main_input


@plan("preln")
def norm_the_input(context: BlockContext, kind: str) -> Plan:
    """norm(X_k) on the block input, fed only to the offending branches."""
    return _norm_plan(context, kind, output=False)


@plan("periln")
def norm_the_input_and_output(context: BlockContext, kind: str) -> Plan:
    """preln, plus a norm on each offending velocity term (Peri-LN)."""
    return _norm_plan(context, kind, output=True)


def _norm_plan(context: BlockContext, kind: str, *, output: bool) -> Plan:
    residual, block = context.residual, context.block
    stream, root = residual.stream.name, residual.join.name
    readers = [n.name for n in context.stream_readers()]
    if not readers:
        raise NotApplicable("the offending branch does not read the block input")
    terms = [t.name for t in context.offending_terms()]
    sums = context.sum_nodes()
    term_readers = {t: [s.name for s in sums if t in {a.name for a in s.all_input_nodes}] for t in terms}
    label = block.name.replace(".", "_").replace(":", "_").replace("#", "_")

    def edit(surgery: Surgery) -> None:
        surgery.insert_norm(stream, readers, meta_from=root, label=f"{kind}_in_{label}")
        if output:
            for term in terms:
                surgery.insert_norm(term, term_readers[term], meta_from=term, label=f"{kind}_out_{label}")

    f, norm = context.branch_name(), f"nn.{context.norm}({context.size(residual.stream)})"
    dependent_terms = [t for t in residual.terms if context.depends(t.node)]
    only = f" (the `{f}` branch only)" if len(terms) < len(dependent_terms) else ""
    if output:
        target = f"input and output of {block.name}{only}"
        sketch = f"{f}(x) → norm_out({f}(norm_in(x))), norm_in = norm_out = {norm}"
    else:
        target = f"input of {block.name}{only}"
        sketch = f"{f}(x) → {f}(norm(x)), norm = {norm}"
    return Plan(kind, target, block.source, sketch, edit)


@plan("norm_primitive")
def norm_the_dominant_primitive(context: BlockContext, kind: str) -> Plan:
    """A norm on the output of the highest-q primitive."""
    node = context.dominant()
    users = [u.name for u in node.users]
    if not users:
        raise NotApplicable("the highest-q primitive has no users")
    label = node.name

    def edit(surgery: Surgery) -> None:
        surgery.insert_norm(label, users, meta_from=label, label=f"norm_{label}")

    expression = _expression(context, node)
    step = primitive_name(node)
    sketch = f"{expression} → norm({expression}), norm = nn.{context.norm}({context.size(node)})"
    return Plan(kind, f"output of the {step} in {context.where(node)}", source_of(node), sketch, edit)


@plan("gate_sigmoid")
def sigmoid_gate(context: BlockContext, kind: str) -> Plan:
    """silu(z) * y -> sigmoid(z) * y on the highest Hadamard product."""
    gates = [g.name for g in context.gates()]

    def edit(surgery: Surgery) -> None:
        for gate in gates:
            surgery.substitute(gate, [torch.sigmoid])

    node = context.nodes[gates[0]]
    sketch = "F.silu(z) * y → torch.sigmoid(z) * y"
    return Plan(kind, f"SiLU gate in {context.where(node)}", source_of(node), sketch, edit)


@plan("lipschitz_activation")
def gelu_for_the_power(context: BlockContext, kind: str) -> Plan:
    """h ** p -> gelu(h) (Table 1 Lipschitz activation, q = 1)."""
    node = context.dominant()
    power = _power(node)
    if power is None or power <= 1:
        raise NotApplicable("the highest-q primitive is not a power x**p with p > 1")
    name = node.name

    def edit(surgery: Surgery) -> None:
        surgery.substitute(name, [F.gelu])

    sketch = f"h ** {power:g} → F.gelu(h)  (Lipschitz, q = 1)"
    return Plan(kind, f"h ** {power:g} in {context.where(node)}", source_of(node), sketch, edit)


@plan("bounded_exp")
def contracting_exp(context: BlockContext, kind: str) -> Plan:
    """exp(a) -> exp(-softplus(a)), a contraction (q = 0)."""
    node = context.dominant()
    if "exponential" not in facts(node).family:
        raise NotApplicable("the highest-q primitive is not an exponential")
    name = node.name

    def edit(surgery: Surgery) -> None:
        surgery.substitute(name, [F.softplus, torch.neg, torch.exp])

    sketch = "torch.exp(a) → torch.exp(-F.softplus(a))  (in (0, 1])"
    return Plan(kind, f"{op_name(node)} in {context.where(node)}", source_of(node), sketch, edit)


@plan("linear_growth")
def normalised_selection(context: BlockContext, kind: str) -> Plan:
    """L2-normalise the selective-parameter projection's input, plus gate_sigmoid: the paper's
    normalization-free modification (Section 5)."""
    projection = context.selective_projection()
    signal, reader = main_input(projection).name, projection.name
    try:
        gates = [g.name for g in context.gates()]
    except NotApplicable:
        gates = []

    def edit(surgery: Surgery) -> None:
        surgery.insert_call(F.normalize, signal, reader, dim=-1)
        for gate in gates:
            surgery.substitute(gate, [torch.sigmoid])

    name = context.where(projection).rsplit(".", 1)[-1]
    sketch = f"{name}(x) → {name}(F.normalize(x, dim=-1))"
    if gates:
        sketch += "; F.silu(z) * y → torch.sigmoid(z) * y"
    target = f"input of {context.where(projection)}" + (" and the SiLU gate" if gates else "")
    return Plan(kind, target, source_of(projection), sketch, edit)


def _power(node: fx.Node) -> Optional[float]:
    """p of ``h ** p`` / ``h.pow(p)`` / ``square(h)`` with a constant p, else None."""
    if facts(node).op == "square":
        return 2.0
    if "power" not in facts(node).family:
        return None
    exponent = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
    return float(exponent) if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) else None


def _expression(context: BlockContext, node: fx.Node) -> str:
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
