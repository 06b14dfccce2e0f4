"""QL201: attention logits that nothing bounds in the weights (source 001, Part VI).

The logits of an attention head are inner products q·k of learned projections.
Nothing in the loss penalises ||W_Q|| or ||W_K||, so training grows them; once the
logits are large, softmax is one-hot (entropy collapse), its Jacobian vanishes and
fp16 overflows. Two architectural fixes bound the logits whatever the weights do:
QK-norm (a normalization of q and of k after their projections) and soft-capping
(c·tanh(z/c) on the logits before the softmax).

The check finds each attention (a Q·K product feeding a softmax, a
scaled_dot_product_attention call, or a torch.nn attention module) and walks back
from it over *plumbing*: reshapes, casts, head splits, scaling by constants and
rotary embeddings (products with position tables). Anything else it meets first
(the projection itself, most often) means the operand is not normalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch.fx as fx
from torch import nn

from qlint.analysis import Analysis, source_of
from qlint.report import Finding
from qlint.rules.checks import Rule, check, define
from qlint.rules.checks.placement import data_dependent, is_normalizer
from qlint.rules.primitives.handwritten_norms import op_name
from qlint.trace import module_path

UNBOUNDED_LOGITS = define(
    Rule(
        code="QL201",
        name="unbounded-attention-logits",
        severity="warning",
        summary="""
            An attention whose logits q·k are unbounded in the weights: neither QK
            normalization (LayerNorm / RMSNorm / L2 of q and of k after their
            projections) nor logit soft-capping (c·tanh(z/c) before the softmax).
        """,
        rationale="""
            The 1/sqrt(d_h) factor is fixed at initialization and does not adapt, while
            nothing penalises ||W_Q|| and ||W_K||: over training the logits grow, the
            softmax becomes one-hot (entropy collapse, Zhai et al.), its Jacobian
            p_i(1 - p_i) vanishes and the head locks; large logits also overflow fp16
            (source 001, Part VI). QK-norm pins ||q|| and ||k||, so the logit is at
            most sqrt(d_h) whatever the weights; soft-capping bounds it by ±c.
            Exponent-wise the attention is certified either way (softmax weights are
            row-stochastic, q = 1): this is a training-dynamics risk, hence a warning.
            nn.MultiheadAttention and nn.Transformer*Layer compute their logits
            internally with neither fix.
        """,
        example="""
            q, k = self.q_proj(x), self.k_proj(x)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d_head)
            y = att.softmax(-1) @ v
        """,
        remedy="""
            Normalise q and k after their projections (OLMo 2, Gemma 3, Qwen 3):

                q, k = self.q_norm(self.q_proj(x)), self.k_norm(self.k_proj(x))

            or soft-cap the logits before the softmax (Gemma 2, c = 50):

                att = self.cap * torch.tanh(att / self.cap)
        """,
    )
)

_SOFTMAX = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}
_PRODUCTS = {"matmul", "bmm", "baddbmm", "einsum", "mm"}
_SDPA = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention", "flex_attention"}
# ops between Q·K and the softmax that leave the logits' magnitude in the weights' hands
_LOGIT_PLUMBING = {"div", "mul", "add", "sub", "masked_fill", "where", "to", "float", "half", "bfloat16", "type_as",
                   "_to_copy", "contiguous", "clone", "view", "reshape", "_unsafe_view", "expand", "alias", "dropout",
                   "native_dropout", "clamp", "clamp_min", "clamp_max"}
# ops between a projection and the Q·K product that carry q (or k) unchanged in magnitude:
# head splits, casts, scaling by constants, rotary embeddings (x*cos + rotate_half(x)*sin)
_HEAD_PLUMBING = {"view", "reshape", "_unsafe_view", "transpose", "permute", "unflatten", "flatten", "contiguous", "clone",
                  "to", "float", "half", "bfloat16", "type_as", "_to_copy", "alias", "expand", "repeat", "repeat_interleave",
                  "unsqueeze", "squeeze", "getitem", "split", "split_with_sizes", "chunk", "narrow", "slice", "select",
                  "t", "mul", "div", "add", "sub", "neg", "cat", "stack", "unbind", "movedim"}
_TORCH_ATTENTION_MODULES = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer,
                            nn.TransformerEncoder, nn.TransformerDecoder, nn.Transformer)


@dataclass
class _Attention:
    """One attention found in the graph: the op computing its logits and what bounds them."""

    node: fx.Node
    path: str
    operands: list[fx.Node]  # q and k
    capped: bool
    opaque: str = ""  # the torch.nn module class computing the logits internally


def _attentions(analysis: Analysis, dependent: set[fx.Node]) -> Iterator[_Attention]:
    root = type(analysis.model).__name__
    for node in analysis.traced.graph.nodes:
        if node.op == "call_module":
            module = analysis.traced.module.get_submodule(node.target)
            if isinstance(module, _TORCH_ATTENTION_MODULES):
                yield _Attention(node, str(node.target), [], False, type(module).__name__)
            elif isinstance(module, nn.Softmax):
                yield from _softmax_attentions(node, dependent, root)
        elif op_name(node) in _SDPA:
            operands = [a for a in node.args[:2] if isinstance(a, fx.Node)]
            yield _Attention(node, module_path(node) or root, operands, False)
        elif op_name(node) in _SOFTMAX:
            yield from _softmax_attentions(node, dependent, root)


def _softmax_attentions(softmax: fx.Node, dependent: set[fx.Node], root: str) -> Iterator[_Attention]:
    """The Q·K products whose logits reach this softmax, and whether every path is tanh-capped."""
    logits = softmax.args[0] if softmax.args else softmax.kwargs.get("input")
    if not isinstance(logits, fx.Node):
        return
    stack: list[tuple[fx.Node, bool]] = [(logits, False)]
    seen: set[tuple[fx.Node, bool]] = set()
    found: dict[fx.Node, bool] = {}
    while stack:
        node, capped = stack.pop()
        if (node, capped) in seen or node not in dependent:
            continue
        seen.add((node, capped))
        name = op_name(node)
        operands = [a for a in node.all_input_nodes if a in dependent]
        if name in _PRODUCTS and len(operands) >= 2:
            found[node] = found.get(node, True) and capped
        elif name == "tanh":
            stack.extend((a, True) for a in operands)
        elif name in _LOGIT_PLUMBING:
            stack.extend((a, capped) for a in operands)
    for product, capped in found.items():
        operands = [a for a in product.all_input_nodes if a in dependent][-2:]
        yield _Attention(product, module_path(product) or module_path(softmax) or root, operands, capped)


def _normalised(operand: fx.Node, analysis: Analysis, dependent: set[fx.Node]) -> bool:
    """Every data path into this Q (or K) operand passes a normalization after the projection."""
    stack, seen = [operand], set()
    while stack:
        node = stack.pop()
        if node in seen or node not in dependent:
            continue
        seen.add(node)
        if is_normalizer(node, analysis):
            continue
        if op_name(node) not in _HEAD_PLUMBING:
            return False
        stack.extend(node.all_input_nodes)
    return True


def _unbounded(attention: _Attention, analysis: Analysis, dependent: set[fx.Node]) -> Optional[str]:
    """Why the attention's logits are unbounded in the weights, or None when they are bounded."""
    if attention.opaque:
        return f"`{attention.opaque}` computes its logits internally without QK-norm or soft-capping"
    if attention.capped:
        return None
    if len(attention.operands) == 2 and all(_normalised(o, analysis, dependent) for o in attention.operands):
        return None
    return "its logits q·k have neither QK-norm nor tanh soft-capping"


@check("QL201")
def unbounded_attention_logits(analysis: Analysis) -> Iterable[Finding]:
    dependent = data_dependent(analysis.traced.graph)
    reported: set[str] = set()
    for attention in _attentions(analysis, dependent):
        reason = _unbounded(attention, analysis, dependent)
        if reason is None or attention.path in reported:
            continue
        reported.add(attention.path)
        yield Finding(
            "QL201",
            "warning",
            f"attention `{attention.path}`: {reason}; the logits grow with ||W_Q||·||W_K|| "
            "(entropy collapse, fp16 overflow)",
            attention.path,
            source_of(attention.node),
        )
