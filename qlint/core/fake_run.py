"""Whether a node's output length depends on its inputs' values, found by running the graph on fake tensors.

A fake tensor (torch's ``FakeTensorMode``) has a shape and a dtype but no values. Run with a shape
environment, an op that needs a value to size its output gives a length that is a new *unbacked* symbol:
``x[mask]`` and ``torch.where(mask)`` (a nonzero) have ``u0`` rows, ``torch.eye(1, m)`` with m a tensor the input
computes has ``u1`` columns, and what is computed from them carries the symbol on (``x[mask].view(-1, 4)``)
or drops it where the length no longer matters (``zeros(n, d).index_add(0, idx, rows)``, a sum over the rows:
an MoE's dispatch and combine). An op that would have to decide something about such a value (``x.size(d)``,
``conv1d(padding=m)``) raises instead. So this asks what each op does with the values it is given, in every
spelling a Python function, a method or an aten overload has, instead of a list of argument names. What does
not depend on the input is passed as it is (a parameter as a fake copy, a size read off the example's
shape). A node whose length carries an unbacked symbol, or that cannot run, depends on the values: fail closed.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from qlint.core.ops import attribute


class _NoStandIn(Exception):
    """A data input has no recorded shape to stand in for it."""


_SCALARS = {int: torch.int64, float: torch.float64, bool: torch.bool}  # a number the input computes (``.item()``)


class FakeRun:
    """Runs a graph's nodes in order on fake stand-ins: data inputs from their recorded shapes and dtypes, each
    data node's output then standing in for it downstream."""

    def __init__(self, module: fx.GraphModule, data: set[fx.Node], constant: Callable[[fx.Node], Any],
                 device: torch.device) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.module, self.data, self.constant, self.device = module, data, constant, device
        self.mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        self._stand_ins: dict[fx.Node, Any] = {}

    def values_set_length(self, node: fx.Node) -> bool:
        """Whether ``node``'s output (its length, or the number it is) depends on its data inputs' values: it
        carries an unbacked symbol, or it cannot run on stand-ins. Call in graph order: the output stands in for
        the node in the runs of the nodes after it."""
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        try:
            output = self._run(node)
        except Exception:  # noqa: BLE001  (a value needed, or a run that says nothing: the length is not known)
            return True
        self._stand_ins[node] = output
        lengths: list[Any] = []  # every length of every tensor it gives, and every symbolic number

        def collect(value: Any) -> None:
            if isinstance(value, torch.Tensor):
                lengths.extend(value.shape)
            elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                lengths.append(value)

        fx.node.map_aggregate(output, collect)
        return bool(free_unbacked_symbols(tuple(lengths)))

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
            return self._faked(attribute(self.module, node.target))
        if node not in self.data:
            value = self.constant(node)
            if value is not None and not _on_meta(value):
                return self._faked(value)
            if node.op != "placeholder":
                try:  # no value to read (meta weights): what it computes from stand-ins (x.dtype, x.shape[0])
                    return self._run(node)
                except Exception:  # noqa: BLE001  (then its recorded shape stands in, if there is one)
                    pass
        return self._fake(node.meta.get("val", node.meta.get("example_value", node.meta.get("tensor_meta"))),
                          node.meta.get("type"))

    def _faked(self, value: Any) -> Any:
        """A tensor the model holds, as a fake copy: nothing the run does (an in-place op) reaches the model."""
        if isinstance(value, (tuple, list)):
            return type(value)(self._faked(item) for item in value)
        return self.mode.from_tensor(value) if isinstance(value, torch.Tensor) else value

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


def _on_meta(value: Any) -> bool:
    items = value if isinstance(value, (tuple, list)) else (value,)
    return any(isinstance(item, torch.Tensor) and item.is_meta for item in items)
