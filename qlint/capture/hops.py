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

A **custom op** whose body is known is inlined the same way (:func:`inline_custom_ops`): one made with
``torch.library.custom_op`` and no kernel of its own for a device (its Python function is what runs), or
one with a ``CompositeImplicitAutograd`` kernel (its decomposition is what runs). The body is traced by
make_fx on tensors of the call's shapes and dtypes, and the graph check then compares the graph with
the model, which calls the op itself. Any other custom op (a C++ or Triton kernel) stays one node.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional

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
    """Copy the body graph named by ``body_node`` (a node or a ``.target`` holder) before ``at``, its
    placeholders bound to ``operands``."""
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


# operator namespaces of torch's own kernels: never inlined (the registry bounds them, or they are unknown)
_TORCH_NAMESPACES = frozenset({"aten", "prims", "quantized", "quantized_decomposed", "_quantized", "c10d",
                               "_c10d_functional", "profiler", "higher_order", "inductor", "fbgemm", "mkldnn",
                               "torchvision", "image", "_torchvision"})


def custom_body(target: Any) -> Optional[Callable[..., Any]]:
    """What a custom op computes, as a Python function of its arguments, when that is known: the function
    of a ``torch.library.custom_op`` without a device kernel of its own, or the op's
    ``CompositeImplicitAutograd`` decomposition; None otherwise."""
    op = target.default if isinstance(target, torch._ops.OpOverloadPacket) and hasattr(target, "default") else target
    if not isinstance(op, torch._ops.OpOverload) or op.namespace in _TORCH_NAMESPACES:
        return None
    from torch._library.custom_ops import OPDEFS

    definition = OPDEFS.get(f"{op.namespace}::{op._opname}")
    if definition is not None:  # its own function, unless a device has a kernel of its own (a Triton one)
        return definition._init_fn if set(getattr(definition, "_backend_fns", {})) <= {None} else None
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return op.decompose
    return None


def inline_custom_ops(module: fx.GraphModule, inputs: Optional[tuple],
                      known: Callable[[Any], bool] = lambda target: False) -> frozenset[str]:
    """Replace each call of a custom op whose body is known (:func:`custom_body`) and that the registry does
    not bound itself (``known``: transformers' grouped_mm_fallback has its rule) by the body's ops, traced
    by make_fx on fake tensors of the call's arguments' shapes and dtypes (read from the graph's recorded
    values, or from one run on ``inputs``); returns the ops inlined. A call whose arguments are not
    plain tensors and numbers stays one node, and so does a body that reads its arguments' values (a branch
    on ``u.nonzero().numel()``) or branches on their sizes (found by a trace on symbolic sizes): traced on
    one value or size, it would stand for the path that one takes."""
    calls = [n for n in module.graph.nodes
             if n.op == "call_function" and not known(n.target) and custom_body(n.target) is not None]
    if not calls:
        return frozenset()
    if inputs is not None and any(_example(a) is None for n in calls for a in n.all_input_nodes):
        from torch.fx.passes.shape_prop import ShapeProp

        try:
            ShapeProp(module).propagate(*inputs)
        except Exception:  # noqa: BLE001  (no shapes: the calls stay as they are)
            return frozenset()
    from torch.fx.experimental.proxy_tensor import make_fx

    inlined = set()
    for number, node in enumerate(calls):
        if node.kwargs or any(isinstance(a, (list, tuple, dict)) for a in node.args):
            continue
        examples = [_example(a) if isinstance(a, fx.Node) else a for a in node.args]
        if any(isinstance(a, fx.Node) for a in node.args if _example(a) is None):
            continue
        tensors = [i for i, a in enumerate(node.args) if isinstance(a, fx.Node)]
        body_fn = custom_body(node.target)

        def call(*values: Any, body_fn: Any = body_fn, examples: list = examples, tensors: list = tensors) -> Any:
            arguments = list(examples)
            for i, value in zip(tensors, values):
                arguments[i] = value
            return body_fn(*arguments)

        try:
            if _reads_sizes(make_fx(call, tracing_mode="symbolic")(*[examples[i] for i in tensors])):
                continue  # traced at one size it would stand for that size's path only
            body = make_fx(call, tracing_mode="fake")(*[examples[i] for i in tensors])
        except Exception:  # noqa: BLE001  (a body make_fx cannot follow: the call stays one node)
            continue
        name, op = f"_qlint_custom_op_{number}", str(getattr(node.target, "_opname", node.target))
        module.add_submodule(name, body)
        outputs = _inline(module, node, _Named(name), tuple(node.args[i] for i in tensors))
        if len(outputs) == 1 and not isinstance(node.meta.get("val"), (tuple, list)):
            node.replace_all_uses_with(outputs[0])
            module.graph.erase_node(node)
        elif _items_only(node):
            _replace_outputs(module, node, outputs)
        else:
            continue
        inlined.add(op)
    if inlined:
        module.graph.lint()
        module.recompile()
    return frozenset(inlined)


class _Named:
    """What :func:`_inline` reads of a body's node: the path of the submodule holding it."""

    def __init__(self, target: str) -> None:
        self.target = target


def _reads_sizes(body: fx.GraphModule) -> bool:
    """Whether a body traced on symbolic sizes guarded on them: Python that branches on a size (a short input's
    path), so one trace stands for some sizes only."""
    for node in body.graph.nodes:
        for size in getattr(node.meta.get("val"), "shape", ()):
            if isinstance(size, torch.SymInt):
                return bool(size.node.shape_env.guards)
    return False


def _example(node: Any) -> Optional[torch.Tensor]:
    """A zero tensor of a node's recorded shape and dtype (ShapeProp's ``tensor_meta``, export's ``val`` when its
    sizes are numbers)."""
    value = (node.meta.get("tensor_meta") or node.meta.get("val")) if isinstance(node, fx.Node) else None
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or not all(isinstance(s, int) for s in shape):
        return None
    return torch.zeros(tuple(shape), dtype=dtype)


__all__ = ["REGIONS", "custom_body", "has_regions", "hop_name", "inline_bodies", "inline_custom_ops"]
