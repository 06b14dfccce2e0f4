"""QL202-QL205: where the norms and branch scales sit in the stack (source 001, Parts III-V)."""

from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.fx as fx

from qlint.core.algebra import format_q
from qlint.core.blocks import Block as StreamBlock
from qlint.core.engine import Analysis, source_of
from qlint.core.graph import module_path
from qlint.core.propagate import leading
from qlint.core.results import Finding
from qlint.lint.rule import checker, rule
from qlint.lint.graph_queries import argument, common_path, constant_value, family, is_normalizer, normalised_input, op, uses_running_stats

DEEP_STACK = 8  # residual blocks (branches) from which an unscaled stack is reported


# --- QL202 ------------------------------------------------------------------------------------


@checker("QL202")
def post_ln_stack(analysis: Analysis) -> Iterable[Finding]:
    post = [b for b in analysis.stream.blocks if b.post == "post-norm"]
    if len(post) < 2:
        return
    stack = common_path([module_path(b.join) for b in post]) or type(analysis.model).__name__
    yield rule("QL202").finding(stack, source_of(post[0].join), stack=stack, count=len(post))


# --- QL203 ------------------------------------------------------------------------------------


def pre_norm(block: StreamBlock) -> bool:
    """The velocity starts with a normalization of the stream X_k."""
    return any(is_normalizer(node) and normalised_input(node) is block.stream for node in block.region)


@checker("QL203")
def missing_final_norm(analysis: Analysis) -> Iterable[Finding]:
    blocks = [b for b in analysis.stream.blocks if pre_norm(b)]
    if len(blocks) < 2:
        return
    graph = analysis.graph
    last = max(blocks, key=lambda b: graph.order[b.join])
    # a path from the last block to an output that passes no normalizer
    stack, seen = [last.join], set()
    reaches = False
    while stack and not reaches:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in graph.sinks:
            reaches = True
            break
        stack.extend(c for c in graph.children.get(node, ()) if not is_normalizer(c))
    if not reaches:
        return
    stack_name = common_path([module_path(b.join) for b in blocks]) or type(analysis.model).__name__
    yield rule("QL203").finding(stack_name, source_of(last.join), stack=stack_name, count=len(blocks), last=last.name)


# --- QL204 ------------------------------------------------------------------------------------

_DEFAULT_GAIN = 1 / math.sqrt(3)  # std(W)·sqrt(fan_in) of nn.Linear / nn.ConvNd's default init


def branch_scale(term: fx.Node, analysis: Analysis) -> float:
    """How much smaller than a default-initialised branch this velocity term enters the stream.

    The product of the constant or parameter factors at the branch's end (LayerScale,
    ReZero) and of its last projection's gain relative to the default init.
    """
    data = analysis.graph.data
    scale, node = 1.0, term
    while True:
        kind = op(node)
        if "carrier" in family(node) and isinstance(argument(node, "input"), fx.Node):
            node = argument(node, "input")
            continue
        if kind in ("mul", "div"):
            a, b = argument(node, "input"), argument(node, "other")
            dependent = [x for x in (a, b) if isinstance(x, fx.Node) and x in data]
            if len(dependent) == 1:
                data_first = a is dependent[0]
                value = constant_value(b if data_first else a, analysis)
                if value is None or value.numel() == 0 or (kind == "div" and not data_first):
                    return scale
                magnitude = value.abs()
                scale *= float(magnitude.max()) if kind == "mul" else 1 / max(float(magnitude.min()), 1e-30)
                node = dependent[0]
                continue
        weight = _projection_weight(node, analysis)
        if weight is not None:
            fan_in = weight[0].numel() if weight.shape[0] else 1
            gain = float(weight.float().std()) * math.sqrt(fan_in) if weight.numel() > 1 else float(weight.abs().max())
            return scale * gain / _DEFAULT_GAIN
        return scale


def _projection_weight(node: fx.Node, analysis: Analysis) -> Optional[torch.Tensor]:
    kind = op(node)
    if kind == "addmm":  # x @ W + b with W (fan_in, fan_out): HF's Conv1D
        weight = constant_value(argument(node, "mat2"), analysis)
        return weight.t() if weight is not None and weight.dim() == 2 else None
    if kind in ("linear", "convolution"):
        return constant_value(argument(node, "weight"), analysis)
    return None


@checker("QL204")
def unscaled_deep_residual(analysis: Analysis) -> Iterable[Finding]:
    blocks = analysis.stream.blocks
    if len(blocks) < DEEP_STACK:
        return
    if any(p.is_meta for p in analysis.module.parameters()):
        return  # built on meta: the initialisation has no values to inspect
    limit = 2 / math.sqrt(len(blocks))
    unscaled = [b for b in blocks if max((branch_scale(t.entry or t.node, analysis) for t in b.terms), default=0.0) > limit]
    if not unscaled:
        return
    stack = common_path([module_path(b.join) for b in blocks]) or type(analysis.model).__name__
    yield rule("QL204").finding(stack, source_of(unscaled[0].join), stack=stack, unscaled=len(unscaled), count=len(blocks),
                                limit=f"{limit:.2f}", first=unscaled[0].name)


# --- QL205 ------------------------------------------------------------------------------------


@checker("QL205")
def batchnorm_eval(analysis: Analysis) -> Iterable[Finding]:
    if analysis.report.mode != "eval":
        return
    for residual, block in zip(analysis.stream.blocks, analysis.report.blocks):
        if block.q is not None and block.q == 0:
            continue
        env = analysis.envs[residual.name]
        affine = [module_path(node) or str(node.target) for node in residual.region
                  if uses_running_stats(node) and _carries_signal(env.get(node))]
        if affine:
            yield rule("QL205").finding(block.name, block.source, name=block.name, norm=affine[0], q=format_q(block.q))


def _carries_signal(value) -> bool:
    growth = leading(value) if value is not None else None
    return growth is not None and growth.depends and (growth.q is None or growth.q > 0)
