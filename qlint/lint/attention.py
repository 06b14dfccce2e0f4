"""QL201: attention logits without QK-norm or soft-capping (source 001, Parts VI and XII)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch.fx as fx

from qlint.core.engine import Analysis, source_of
from qlint.core.graph import module_path
from qlint.core.ops import op_name
from qlint.core.results import Finding
from qlint.lint.rule import checker, rule
from qlint.lint.graph_queries import argument, family, is_normalizer, op

# ops between Q·K and the softmax that leave the logits' magnitude in the weights' hands
_LOGIT_PLUMBING = frozenset({"carrier", "scale", "sum", "mask"})  # scaled, shifted, masked or recast logits are still logits
# ops between a projection and the Q·K product that carry q (or k) unchanged in magnitude:
# head splits, casts, scaling by constants, rotary embeddings (x*cos + rotate_half(x)*sin)
_HEAD_PLUMBING = frozenset({"carrier", "scale", "sum", "concat"})  # head splits, RoPE, scaling: not a normalization


@dataclass
class _Attention:
    """One attention found in the graph: the op computing its logits and what bounds them."""

    node: fx.Node
    path: str
    operands: list[fx.Node]  # q and k
    capped: bool
    opaque: str = ""  # the torch.nn module class computing the logits internally


def _attentions(analysis: Analysis) -> Iterator[_Attention]:
    root = type(analysis.model).__name__
    data = analysis.graph.data
    for node in analysis.graph.nodes:
        kind = op(node)
        if kind == "mha_module":
            yield _Attention(node, str(node.target), [], False, type(analysis.module.get_submodule(node.target)).__name__)
        elif kind == "attention":
            operands = [argument(node, name) for name in ("query", "key")]
            yield _Attention(node, module_path(node) or root, [o for o in operands if isinstance(o, fx.Node)], False)
        elif kind == "mha_functional":
            yield _Attention(node, module_path(node) or root, [], False, "multi_head_attention_forward")
        elif "softmax" in family(node):
            yield from _softmax_attentions(node, data, root)


def _softmax_attentions(softmax: fx.Node, data: set, root: str) -> Iterator[_Attention]:
    """The Q·K products whose logits reach this softmax, and whether every path is tanh-capped."""
    logits = argument(softmax, "input")
    if not isinstance(logits, fx.Node):
        return
    stack: list[tuple[fx.Node, bool]] = [(logits, False)]
    seen: set[tuple[fx.Node, bool]] = set()
    found: dict[fx.Node, bool] = {}
    while stack:
        node, capped = stack.pop()
        if (node, capped) in seen or node not in data:
            continue
        seen.add((node, capped))
        kind = op(node)
        operands = [a for a in node.all_input_nodes if a in data]
        if "matmul" in family(node) and len(operands) >= 2:
            found[node] = found.get(node, True) and capped
        elif kind == "saturating" and op_name(node) == "tanh":
            stack.extend((a, True) for a in operands)
        elif family(node) & _LOGIT_PLUMBING:
            stack.extend((a, capped) for a in operands)
    for product, capped in found.items():
        operands = [a for a in product.all_input_nodes if a in data][-2:]
        yield _Attention(product, module_path(product) or module_path(softmax) or root, operands, capped)


def _normalised(operand: fx.Node, data: set) -> bool:
    """Every data path into this Q (or K) operand passes a normalization after the projection."""
    stack, seen = [operand], set()
    while stack:
        node = stack.pop()
        if node in seen or node not in data:
            continue
        seen.add(node)
        if is_normalizer(node):
            continue
        if not family(node) & _HEAD_PLUMBING:
            return False
        stack.extend(node.all_input_nodes)
    return True


def _unbounded(attention: _Attention, data: set) -> Optional[str]:
    """Why the attention's logits are unbounded in the weights, or None when they are bounded."""
    if attention.opaque:
        return f"`{attention.opaque}` computes its logits internally without QK-norm or soft-capping"
    if attention.capped:
        return None
    if len(attention.operands) == 2 and all(_normalised(o, data) for o in attention.operands):
        return None
    return "its logits q·k have neither QK-norm nor tanh soft-capping"


@checker("QL201")
def unbounded_attention_logits(analysis: Analysis) -> Iterable[Finding]:
    reported: set[str] = set()
    for attention in _attentions(analysis):
        reason = _unbounded(attention, analysis.graph.data)
        if reason is None or attention.path in reported:
            continue
        reported.add(attention.path)
        yield rule("QL201").finding(attention.path, source_of(attention.node), path=attention.path, reason=reason)
