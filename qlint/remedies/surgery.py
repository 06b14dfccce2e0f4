"""Graph surgery for remedies: edits on a copy of the traced graph, addressed by node name.

Every inserted node takes its metadata (module path, stack trace) from a node it stands
beside, so block names and sources in the re-analysed report stay those of the model.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn


class NotApplicable(Exception):
    """A remedy kind has nothing to act on in this block (the message says why)."""


def light_copy(module: fx.GraphModule, class_name: str) -> fx.GraphModule:
    """A new GraphModule over a copy of the graph; parameters are shared, not copied."""
    result = fx.GraphModule(module, copy.deepcopy(module.graph), class_name=class_name)
    result.train(module.training)
    return result


def model_norm_class(model: nn.Module) -> type[nn.Module]:
    """The model's own normalization kind: RMSNorm if it uses one, else LayerNorm."""
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            return nn.RMSNorm
        if name.endswith("LayerNorm"):
            return nn.LayerNorm
    return nn.LayerNorm


def tensor_meta(node: fx.Node) -> Optional[tuple[torch.Size, torch.dtype]]:
    """(shape, dtype) of a node's value from export's ``val`` or ShapeProp's ``tensor_meta``."""
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.shape, value.dtype
    info = node.meta.get("tensor_meta")
    if info is not None and hasattr(info, "shape"):
        return info.shape, info.dtype
    return None


def main_input(node: fx.Node) -> fx.Node:
    """The tensor a node transforms (its first argument), or NotApplicable."""
    value = node.args[0] if node.args else node.kwargs.get("input")
    if not isinstance(value, fx.Node):
        raise NotApplicable(f"`{node.name}` has no tensor input to keep")
    return value


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


class Surgery:
    """Edits on one copy of the traced graph, addressed by node name."""

    def __init__(self, base: fx.GraphModule, norm_class: type[nn.Module]) -> None:
        self.module = light_copy(base, type(base).__name__)
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
        shape, dtype = tensor_meta(source) or (None, None)
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
        value = main_input(old)
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
