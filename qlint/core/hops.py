"""Higher-order ops whose bodies are analysed, not taken as opaque calls.

torch.export records some Python constructs as a higher-order op (HOP) holding a body graph.
Each kind that qlint can see through is rewritten so that the body's ops are ordinary nodes
of the traced graph, and the rewrite computes what the HOP computes (the graph check then
compares it with the eager model like any other graph):

- **autocast and grad-mode regions** (``wrap_with_autocast``, ``wrap_with_set_grad_enabled``):
  re-tracing the program at the dispatcher level inlines the body, autocast's casts written
  out as ``_to_copy`` nodes (:func:`has_regions` tells the exporter to do so). A dtype or
  grad mode changes rounding and gradients, not the value's growth.
- **activation checkpointing and subgraph calls** (``tag_activation_checkpoint``,
  ``invoke_subgraph``): the body is called once on the operands, so it is inlined.
- **torch.cond**: each output is one branch's output, so it becomes ``where(pred, t_i, f_i)``
  with both branches inlined. ``|where(p, a, b)| <= max(|a|, |b|)``: the sum rule of
  Theorem 9(ii), so the exponent is the larger of the two branches', whichever is taken.

Every other HOP (``while_loop``, ``scan``, ``map``, ``flex_attention`` ...) stays one node,
which no registry entry bounds: the block that holds it is uncertified, by name.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

REGIONS = frozenset({"wrap_with_autocast", "wrap_with_set_grad_enabled"})
_CALLS = {"tag_activation_checkpoint": 0, "invoke_subgraph": 0}  # HOP name -> index of its body argument


def hop_name(node: fx.Node) -> str:
    """The name of a higher-order op node's operator, or ``""`` for any other node."""
    target = node.target
    if node.op == "call_function" and isinstance(target, torch._ops.HigherOrderOperator):
        return target.__name__
    return ""


def has_regions(graph: fx.Graph) -> bool:
    """Whether the graph holds an autocast or grad-mode region (inlined by ``run_decompositions``)."""
    return any(hop_name(node) in REGIONS for node in graph.nodes)


def inline_bodies(module: fx.GraphModule) -> None:
    """Rewrite every cond, checkpoint and subgraph call of ``module`` into plain nodes, in place
    (until none is left: an inlined body may hold another one)."""
    while _inline_once(module):
        pass


def _inline_once(module: fx.GraphModule) -> bool:
    changed = False
    for node in list(module.graph.nodes):
        name = hop_name(node)
        if (name not in _CALLS and name != "cond") or not _items_only(node):
            continue  # not one of these, or its output tuple is used whole: it stays one (unknown) node
        if name == "cond":
            pred, true_body, false_body, operands = node.args[:4]
            taken = _inline(module, node, true_body, operands)
            other = _inline(module, node, false_body, operands)
            with module.graph.inserting_before(node):
                outputs = [module.graph.call_function(torch.ops.aten.where.self, (pred, a, b))
                           for a, b in zip(taken, other)]
            _replace_outputs(module, node, outputs)
            changed = True
        elif name in _CALLS:
            index = _CALLS[name]
            body = node.args[index]
            operands = node.args[index + 1 :] if name == "tag_activation_checkpoint" else node.args[index + 2 :]
            _replace_outputs(module, node, _inline(module, node, body, tuple(operands)))
            changed = True
    if changed:
        module.graph.lint()
        module.recompile()
    return changed


def _inline(module: fx.GraphModule, at: fx.Node, body_node: Any, operands: Any) -> list[Any]:
    """Copy the body graph named by ``body_node`` before ``at``, its placeholders bound to ``operands``."""
    body = module.get_submodule(body_node.target)
    values = iter(operands)
    env: dict[fx.Node, Any] = {}
    outputs: Any = None
    with module.graph.inserting_before(at):
        for node in body.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(values)
            elif node.op == "output":
                outputs = fx.node.map_arg(node.args[0], lambda n: env[n])
            elif node.op == "get_attr":
                copy = module.graph.get_attr(f"{body_node.target}.{node.target}")
                copy.meta.update(node.meta)
                env[node] = copy
            else:
                env[node] = copy = module.graph.node_copy(node, lambda n: env[n])
                copy.stack_trace = _user_frames(copy.stack_trace) or at.stack_trace
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _user_frames(trace: Any) -> str:
    """A body node's stack trace without the frames of the code dynamo generated for the HOP
    (``<eval_with_key>``): its last frame is then the user's line."""
    lines = (trace or "").split("\n")
    cut = next((i for i, line in enumerate(lines) if line.lstrip().startswith('File "<eval_with_key>')), len(lines))
    return "\n".join(lines[:cut]).strip("\n")


def _items_only(node: fx.Node) -> bool:
    return all(user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int)
               for user in node.users)


def _replace_outputs(module: fx.GraphModule, hop: fx.Node, outputs: list[Any]) -> None:
    """Point each ``hop[i]`` at ``outputs[i]`` and drop the HOP node."""
    values = hop.meta.get("val")
    for i, output in enumerate(outputs):
        if isinstance(output, fx.Node) and "val" not in output.meta and isinstance(values, (tuple, list)):
            output.meta.update({k: v for k, v in hop.meta.items() if k in ("stack_trace", "nn_module_stack")},
                               val=values[i])
    for user in list(hop.users):
        user.replace_all_uses_with(outputs[user.args[1]])
        module.graph.erase_node(user)
    module.graph.erase_node(hop)


__all__ = ["REGIONS", "has_regions", "hop_name", "inline_bodies"]
