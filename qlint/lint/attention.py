"""QL201: attention logits without QK-norm or soft-capping (source 001, Parts VI and XII)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch.fx as fx

from qlint.growth.engine import Analysis, relative, source_of
from qlint.core.graph import GraphFacts, facts, module_path
from qlint.core.ops import op_name
from qlint.growth.annotated import strip
from qlint.growth.relations import OwnSumRatio
from qlint.core.results import Finding, Source
from qlint.lint.rule import Rule, checker
from qlint.lint.graph_queries import argument, family, is_normalizer, op

# ops between Q·K and the softmax that leave the logits' magnitude in the weights' hands
# scaled, shifted, masked or recast logits are still logits, and so are logits with extra columns
# (gpt-oss's attention sinks: softmax(cat([q·k, sinks]) - max), an off-by-one softmax's zero column)
_LOGIT_PLUMBING = frozenset({"carrier", "scale", "sum", "mask", "concat"})
# ops between a projection and the Q·K product that carry q (or k) unchanged in magnitude:
# head splits, casts, scaling by constants, rotary embeddings (x*cos + rotate_half(x)*sin)
_HEAD_PLUMBING = frozenset({"carrier", "scale", "sum", "concat"})  # head splits, RoPE, scaling: not a normalization
# the projection itself: reaching it before a normalization means q (or k) is not normalised after it,
# whatever normalised the block's input (HF GPT-2's fused c_attn is an addmm, a "sum" with a bias)
_PROJECTION = frozenset({"matmul", "layer"})


@dataclass
class _Attention:
    """One attention found in the graph: the op computing its logits and what bounds them."""

    node: fx.Node
    path: str
    operands: list[fx.Node]  # q and k
    capped: str  # how every path to the softmax is capped: "tanh", "clamp" (some path hard-clamped only), or ""
    opaque: str = ""  # the torch.nn module class computing the logits internally


def _attentions(analysis: Analysis) -> Iterator[_Attention]:
    root = type(analysis.model).__name__
    data = analysis.graph.data
    for node in analysis.graph.nodes:
        kind = op(node)
        if kind == "mha_module":
            yield _Attention(node, str(node.target), [], "", type(analysis.module.get_submodule(node.target)).__name__)
        elif kind == "attention":
            operands = [argument(node, name) for name in ("query", "key")]
            yield _Attention(node, module_path(node) or root, [o for o in operands if isinstance(o, fx.Node)], "")
        elif kind == "mha_functional":
            yield _Attention(node, module_path(node) or root, [], "", "multi_head_attention_forward")
        elif kind == "window_attention" and argument(node, "logit_scale") is None:
            # torchvision's Swin attention, one call under symbolic_trace: q·k scaled by 1/sqrt(d) (V1);
            # with a logit_scale it is Swin V2's cosine attention, normalize(q)·normalize(k) (QK-normed)
            yield _Attention(node, module_path(node) or root, [], "", "shifted_window_attention")
        elif "softmax" in family(node):
            yield from softmax_attentions(node, data, root)
        elif _written_softmax(node) is not None:
            yield from logit_products(_written_softmax(node), node, data, root)


def _written_softmax(node: fx.Node) -> Optional[fx.Node]:
    """The logits of a softmax written out, ``exp(s - max s) / sum(exp(s - max s))`` (over a row, or
    over a graph's edges with scatters as torch_geometric writes it): the argument of the exp that a
    proved own-sum ratio divides by its group's sum."""
    relation = facts(node).relation if "qlint" in node.meta else None
    if not isinstance(relation, OwnSumRatio):
        return None
    numerator = strip(relation.numerator)
    if not (isinstance(numerator, fx.Node) and op(numerator) == "exp"):
        return None
    logits = argument(numerator, "input")
    return logits if isinstance(logits, fx.Node) else None


def softmax_attentions(softmax: fx.Node, data: set, root: str) -> Iterator[_Attention]:
    """The Q·K products whose logits reach this softmax."""
    logits = argument(softmax, "input")
    if isinstance(logits, fx.Node):
        yield from logit_products(logits, softmax, data, root)


def logit_products(logits: fx.Node, softmax: fx.Node, data: set, root: str) -> Iterator[_Attention]:
    """The Q·K products whose logits reach a softmax, and how every path is capped: a matmul of two
    values, or a dot product written out (``(q * k).sum(-1)``).

    A tanh soft-cap bounds the logits and keeps their gradient; a hard clamp bounds them
    too, but its gradient is zero past the cap, which is reported differently.
    """
    stack: list[tuple[fx.Node, str]] = [(logits, "")]
    seen: set[tuple[fx.Node, str]] = set()
    found: dict[fx.Node, list[str]] = {}
    while stack:
        node, capped = stack.pop()
        if (node, capped) in seen or node not in data:
            continue
        seen.add((node, capped))
        kind = op(node)
        operands = [a for a in node.all_input_nodes if a in data]
        if "matmul" in family(node) and len(operands) >= 2:
            found.setdefault(node, []).append(capped)
        elif op(node) == "sum" and _dot_product(node, data) is not None:
            found.setdefault(_dot_product(node, data), []).append(capped)
        elif kind == "saturating" and op_name(node) == "tanh":
            stack.extend((a, "tanh") for a in operands)
        elif _hard_cap(node) and argument(node, "input") in operands:
            stack.append((argument(node, "input"), capped or "clamp"))
        elif family(node) & _LOGIT_PLUMBING:
            stack.extend((a, capped) for a in operands)
    for product, caps in found.items():
        operands = [a for a in product.all_input_nodes if a in data][-2:]
        capped = "" if "" in caps else "clamp" if "clamp" in caps else "tanh"
        yield _Attention(product, module_path(product) or module_path(softmax) or root, operands, capped)


def _dot_product(reduction: fx.Node, data: set) -> Optional[fx.Node]:
    """The Hadamard product of two input-dependent values that a sum reduces: a dot product written out."""
    product = argument(reduction, "input")
    if (isinstance(product, fx.Node) and "product" in family(product)
            and len([a for a in product.all_input_nodes if a in data]) == 2):
        return product
    return None


def _normalised(operand: fx.Node, graph: GraphFacts) -> bool:
    """Every data path into this Q (or K) operand passes a normalization after the projection.

    The paths are the value inputs: a dtype or shape reference (the un-normalised ``x`` of
    Gemma's RMSNorm ``(...).type_as(x)``) carries no value into the logits."""
    stack, seen = [operand], set()
    while stack:
        node = stack.pop()
        if node in seen or node not in graph.data:
            continue
        seen.add(node)
        if is_normalizer(node):
            continue
        if family(node) & _PROJECTION or not family(node) & _HEAD_PLUMBING:
            return False  # the projection (or an op that is no head plumbing) before any normalization
        stack.extend(graph.parents.get(node, ()))
    return True


def _hard_cap(node: fx.Node) -> bool:
    """clamp with both bounds, or hardtanh: the logits are bounded with a zero gradient past the bounds."""
    if op(node) == "hardtanh":
        return True
    return op(node) == "clamp" and argument(node, "min") is not None and argument(node, "max") is not None


_GROWTH = "the logits grow with ||W_Q||·||W_K|| (entropy collapse, fp16 overflow)"


def _unbounded(attention: _Attention, graph: GraphFacts) -> Optional[str]:
    """What is wrong with the attention's logits, or None when they are bounded and keep their gradient."""
    if attention.opaque:
        return f"`{attention.opaque}` computes its logits internally without QK-norm or soft-capping; {_GROWTH}"
    if attention.capped == "tanh":
        return None
    if len(attention.operands) == 2 and all(_normalised(o, graph) for o in attention.operands):
        return None
    if attention.capped == "clamp":
        return ("its logits are hard-clamped: bounded, but the gradient is zero past the cap, so a saturated logit "
                "stops learning; soft-cap them with c·tanh(z/c) (Gemma 2) or normalise q and k")
    return f"its logits q·k have neither QK-norm nor tanh soft-capping; {_GROWTH}"


@checker("QL201")
def unbounded_attention_logits(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    reported: set[str] = set()
    for attention in _attentions(analysis):
        reason = _unbounded(attention, analysis.graph)
        if reason is None or attention.path in reported:
            continue
        reported.add(attention.path)
        yield rule.finding(attention.path, _source(attention, analysis), path=attention.path, reason=reason)


def _source(attention: _Attention, analysis: Analysis) -> Optional[Source]:
    """The line that computes the logits; where the trace kept none (a call symbolic_trace keeps
    whole, recorded without the frames of the module that made it), the module's forward."""
    found = source_of(attention.node)
    if found is not None:
        return found
    try:
        forward = type(analysis.model.get_submodule(attention.path)).forward
        file, (_, line) = inspect.getsourcefile(forward), inspect.getsourcelines(forward)
    except (AttributeError, TypeError, OSError):
        return None
    return Source(relative(file), line) if file else None
