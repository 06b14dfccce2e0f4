"""Whether a node's output length depends on its inputs' values, found by running the node on fake tensors.

A fake tensor (torch's ``FakeTensorMode``) has a shape and a dtype but no values. An op that needs a value to
size its output cannot run on one and says so: ``x[mask]`` and ``torch.where(mask)`` (a nonzero), a length or a
dim given as a tensor the input computes (``torch.eye(1, m)``, ``fft2(s=(1, m))``, ``conv1d(padding=m)``,
``x.size(d)``: each reads the tensor's value). So this asks what the op does with the values it is given, in
every spelling a Python function, a method or an aten overload has, instead of a list of argument names. The
data inputs of the node are fake; what does not depend on the input is passed as it is (a parameter, a size
read off the example's shape), so a length that only the example's shape sets runs. A node that cannot run
for any other reason is reported as depending on the values too: fail closed.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx


class _NoStandIn(Exception):
    """A data input has no recorded shape to stand in for it."""


_SCALARS = {int: torch.int64, float: torch.float64, bool: torch.bool}  # a number the input computes (``.item()``)


class FakeRun:
    """Runs single nodes with their data inputs as fake tensors of their recorded shapes and dtypes."""

    def __init__(self, module: fx.GraphModule, data: set[fx.Node], constant: Callable[[fx.Node], Any],
                 device: torch.device) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.module, self.data, self.constant, self.device = module, data, constant, device
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self._stand_ins: dict[fx.Node, Any] = {}

    def needs_values(self, node: fx.Node) -> bool:
        """Whether ``node`` cannot compute its output (its length) without its data inputs' values."""
        try:
            self._run(node)
        except Exception:  # noqa: BLE001  (a value needed, or a run that says nothing: the length is not known)
            return True
        return False

    def _run(self, node: fx.Node) -> Any:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), self._stand_in)
        with self.mode, torch.no_grad():
            if node.op == "call_function":
                return node.target(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            return self.module.get_submodule(node.target)(*args, **kwargs)

    def _stand_in(self, node: fx.Node) -> Any:
        if node not in self._stand_ins:
            self._stand_ins[node] = self._make(node)
        return self._stand_ins[node]

    def _make(self, node: fx.Node) -> Any:
        if node.op == "get_attr":
            return _attribute(self.module, node.target)
        if node not in self.data:
            value = self.constant(node)
            if value is not None and not _on_meta(value):
                return value
            if node.op != "placeholder":
                try:  # no value to read (meta weights): what it computes from stand-ins (x.dtype, x.shape[0])
                    return self._run(node)
                except Exception:  # noqa: BLE001  (then its recorded shape stands in, if there is one)
                    pass
        return self._fake(node.meta.get("val", node.meta.get("example_value", node.meta.get("tensor_meta"))),
                          node.meta.get("type"))

    def _fake(self, recorded: Any, kind: Any) -> Any:
        """A fake tensor of a recorded shape and dtype (ShapeProp's TensorMetadata, export's value)."""
        shape, dtype = getattr(recorded, "shape", None), getattr(recorded, "dtype", None)
        device = getattr(recorded, "device", self.device)  # ShapeProp records none: the example's
        if shape is None and isinstance(recorded, (tuple, list)):  # several outputs (TensorMetadata is a tuple too)
            return type(recorded)(self._fake(item, None) for item in recorded)
        if shape is not None and dtype is not None:
            with self.mode:
                return torch.empty(tuple(_example_length(size) for size in shape), dtype=dtype, device=device)
        if kind in _SCALARS:
            with self.mode:
                return torch.empty((), dtype=_SCALARS[kind], device=self.device)
        raise _NoStandIn


def _example_length(size: Any) -> int:
    """A length at the example: a dynamic export's symbol by its hint (the example's length); an unbacked one
    (a length the data sets, which has none) has no stand-in."""
    hint = size if isinstance(size, int) else getattr(getattr(size, "node", None), "hint", None)
    if not isinstance(hint, int):
        raise _NoStandIn
    return hint


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _on_meta(value: Any) -> bool:
    items = value if isinstance(value, (tuple, list)) else (value,)
    return any(isinstance(item, torch.Tensor) and item.is_meta for item in items)
