"""Where the forward reads, in Python, the value of a float tensor the model holds.

A graph records tensor ops; a value read into Python (``if float(self.mix) != 0``, ``w.item()``,
``.tolist()``) is not an op: the graph holds the value the tensor had while it was traced, and the
path that value took. For an input, a tracer sees the read (symbolic_trace and export stop there,
make_fx names it). For a tensor the model holds -- a parameter reached around fx's proxies, a
floating-point buffer, a tensor in a closure, a global or a plain attribute -- symbolic_trace and
export read the real value silently. A float buffer or held tensor is a parameter (a training loop
may ramp a mixing weight from 0 to 1), so such a read certifies one value only.

This follows values, not spellings: one eager forward under a dispatch mode marks every tensor
computed from a held float tensor, whatever ops it went through, and a read of a marked value is
reported with its line. Shapes, literals, integer and bool tensors (sizes, masks, counters) are
constants; a float computed from them only (Mimi's padding from integer buffers) is one too.
"""

from __future__ import annotations

import linecache
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from qlint.core.graph import TORCH_DIR

_INPUT = "input"  # an input's value: the tracers see those reads themselves
# ops whose result is a tensor's value in Python (item, float(), bool(), int(), torch.equal)
_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.equal.default,
          torch.ops.aten.is_nonzero.default}
_LITERALS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}  # torch.tensor(0.5) in a forward
_READING_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__}  # read without an aten op


@dataclass(frozen=True)
class HeldRead:
    """A read of a held float tensor's value: what was read and where."""

    what: str  # "the buffer `mix`"
    where: str  # "model.py:40 `if float(self.mix) != 0:`"


class _Origins(TorchDispatchMode):
    """Marks each tensor an op returns with the held float tensors it was computed from."""

    def __init__(self, model: torch.nn.Module, inputs: tuple) -> None:
        super().__init__()
        self.marks: dict[int, tuple[weakref.ref, frozenset[str]]] = {}
        self.inputs = {_storage(x) for x in tree_leaves(inputs) if isinstance(x, torch.Tensor)}
        self.held = {}
        for kind, named in (("buffer", model.named_buffers()), ("parameter", model.named_parameters())):
            for name, tensor in named:
                self.held.setdefault(_storage(tensor), f"the {kind} `{name}`")
        self.read: Optional[HeldRead] = None

    def origins(self, tensor: torch.Tensor) -> frozenset[str]:
        mark = self.marks.get(id(tensor))
        if mark is not None and mark[0]() is tensor:
            return mark[1]
        storage = _storage(tensor)
        if storage in self.inputs:
            return frozenset({_INPUT})
        if not (tensor.is_floating_point() or tensor.is_complex()):
            return frozenset()  # a size, a mask, a counter: a constant (the graph check sees it move)
        return frozenset({self.held.get(storage, "a float tensor held outside the module's parameters and buffers "
                                                 "(a closure, a global, a plain attribute)")})

    def note_read(self, tensors: list[torch.Tensor]) -> None:
        held = sorted({o for t in tensors for o in self.origins(t)} - {_INPUT})
        if held and self.read is None:
            self.read = HeldRead(held[0], _user_line())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        arguments = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func in _READS:
            self.note_read(arguments)
        out = func(*args, **kwargs)
        origins = frozenset() if func in _LITERALS else frozenset().union(*(self.origins(t) for t in arguments))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                key = id(tensor)
                self.marks[key] = (weakref.ref(tensor, lambda _, key=key: self.marks.pop(key, None)), origins)
        return out


class _Methods(torch.overrides.TorchFunctionMode):
    """The reads that reach no aten op (``tolist``, ``numpy``)."""

    def __init__(self, origins: _Origins) -> None:
        super().__init__()
        self.origins_mode = origins

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if func in _READING_METHODS and args and isinstance(args[0], torch.Tensor):
            self.origins_mode.note_read([args[0]])
        return func(*args, **(kwargs or {}))


def held_value_read(model: torch.nn.Module, inputs: tuple) -> Optional[HeldRead]:
    """The first read, in one eager forward on ``inputs``, of a value computed from a held float
    tensor; None when there is none (or the forward fails: the tracers report that). The caller
    runs it in the analysed grad mode and restores the model's state."""
    origins = _Origins(model, inputs)
    try:
        with origins, _Methods(origins):
            model(*inputs)
    except Exception:  # noqa: BLE001  (a forward that fails here fails in the tracers too, with its reason)
        return origins.read
    return origins.read


def _storage(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
        return -id(tensor)


def _user_line() -> str:
    """The innermost frame outside torch and qlint: ``file.py:40 `code```."""
    frame = sys._getframe(1)
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(TORCH_DIR) and "/qlint/core/" not in file:
            code = linecache.getline(file, frame.f_lineno).strip()
            return f"{file}:{frame.f_lineno} `{code}`"
        frame = frame.f_back
    return "an unknown line"


__all__ = ["HeldRead", "held_value_read"]
