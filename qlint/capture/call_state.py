"""The Python state a forward can keep across calls, as data two snapshots of it compare by.

One traced call stands for every call only if the forward keeps no state that changes its path (a step counter,
a depth unlocked after N calls). Such a count can live anywhere the forward reaches: a module's attribute, a
container, an object with ``__slots__``, a function's closure, defaults or attributes, a bound method's object,
an iterator's position, a class attribute, a global. Rather than list those holders, :func:`python_state` follows
what the garbage collector knows each object refers to (``gc.get_referents``), from each module attribute, each
class attribute of the model's own classes and each global the model's own code names, and keeps a flat sequence
of what it finds; an object that refers to nothing it can follow shows its state through its own ``repr`` or its
``__reduce_ex__`` (``count(3)``, a range iterator's index). Parameters and buffers are not part of it (their
writes are checked as writes); a float tensor held elsewhere is compared by value (a count kept there is state,
though any value of it is analysed)."""

from __future__ import annotations

import gc
import sys
import types
from collections import deque
from typing import Any, Callable, Mapping, Optional

import torch

from qlint.capture.process_state import own_code

_PLAIN = (bool, int, float, complex, str, bytes, type(None))
MAX_COMPARED_ELEMENTS = 100_000  # an integer tensor or an array compared by value up to this size (else by version)
MAX_DEPTH = 6  # references followed this far from a module's attribute (a count in a list in a default argument)
MAX_OBJECTS = 200_000  # objects followed in one snapshot
# a module's own that are not followed: its weights are checked as writes, its submodules are roots themselves
_SKIPPED = ("_parameters", "_buffers", "_modules")


def python_state(model: torch.nn.Module, roots: Optional[Mapping[str, Callable[[], Any]]] = None) -> dict[str, Any]:
    """A snapshot of what the forward can count its calls in: name (a module attribute, a class attribute, a
    global of ``roots``: :attr:`qlint.capture.eager_record.EagerRecord.state_roots`) -> comparable data."""
    walk = _Walk({id(t) for t in [*model.parameters(), *model.buffers()]})
    state: dict[str, Any] = {}
    classes: set[type] = set()
    for path, module in model.named_modules():
        for key, value in vars(module).items():
            if key not in _SKIPPED:
                state[f"{path}.{key}" if path else key] = walk.snapshot(value)
        for cls in type(module).__mro__:
            if cls not in classes and not cls.__module__.startswith("torch"):
                classes.add(cls)
                for key, value in vars(cls).items():
                    if not key.startswith("__"):
                        state[f"{cls.__qualname__}.{key} (a class attribute)"] = walk.snapshot(value)
    for name, read in (roots or {}).items():
        state[name] = walk.snapshot(read())
    return state


def first_change(before: Any, after: Any) -> str:
    """Where two snapshots of one name first differ, for the message."""
    for old, new in zip(before, after):
        if old != new:
            return f"{_short(old)} -> {_short(new)}"
    return f"{len(before)} -> {len(after)} objects"


def _short(value: Any, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class _Walk:
    """Breadth-first over references from each root, each object once per snapshot (a later root that reaches
    it records where it was first met)."""

    def __init__(self, held: set[int]) -> None:
        self.held, self.seen, self.kept = held, {}, []

    def snapshot(self, value: Any) -> tuple:
        found: list[Any] = []
        queue = deque([(value, 0)])
        while queue and len(self.seen) < MAX_OBJECTS:
            item, depth = queue.popleft()
            if id(item) in self.seen:
                found.append(("met", self.seen[id(item)]))
                continue
            self.seen[id(item)] = len(self.seen)
            self.kept.append(item)  # alive until the snapshot is done: no id is reused meanwhile
            what, refers = self._describe(item)
            found.append(what)
            if depth < MAX_DEPTH:
                queue.extend((other, depth + 1) for other in refers)
        return tuple(found)

    def _describe(self, item: Any) -> tuple[Any, list]:
        """(what the object is, as data; the objects it refers to that are followed)."""
        if isinstance(item, _PLAIN):
            return item, []
        if isinstance(item, torch.Tensor):
            return _tensor(item, id(item) in self.held), []
        if type(item).__module__ == "numpy" and hasattr(item, "tobytes") and hasattr(item, "shape"):
            return ("array", item.shape, item.tobytes() if item.size <= MAX_COMPARED_ELEMENTS else item.size), []
        if isinstance(item, dict):
            return ("dict", len(item)), [x for pair in item.items() for x in pair]
        if isinstance(item, (list, tuple, deque)):
            return (type(item).__name__, len(item)), list(item)
        if isinstance(item, (set, frozenset)):
            return (type(item).__name__, len(item)), sorted(item, key=repr)
        if isinstance(item, type):
            return ("class", item.__qualname__), (
                [v for k, v in vars(item).items() if not k.startswith("__")] if _own(item) else [])
        if isinstance(item, types.FunctionType):
            if not own_code(item.__code__.co_filename):
                return ("function", item.__qualname__), []
            cells = [_contents(cell) for cell in item.__closure__ or ()]
            return ("function", item.__qualname__), [*cells, item.__defaults__, item.__kwdefaults__, vars(item)]
        if isinstance(item, types.MethodType):
            return ("method", item.__func__.__qualname__), [item.__func__, item.__self__]
        if isinstance(item, (types.BuiltinMethodType, types.MethodWrapperType)):
            owner = getattr(item, "__self__", None)
            return ("builtin", item.__name__), [] if isinstance(owner, types.ModuleType) else [owner]
        if isinstance(item, types.GeneratorType):
            frame = item.gi_frame
            return ("generator", frame.f_lasti if frame else None), list(frame.f_locals.values()) if frame else []
        if isinstance(item, torch.nn.Module):
            return ("module", type(item).__qualname__), [v for k, v in vars(item).items() if k not in _SKIPPED]
        if isinstance(item, (types.ModuleType, types.CodeType, types.FrameType, types.CellType)) or \
                type(item).__module__.startswith("torch"):
            return ("opaque", type(item).__qualname__), []
        attributes = getattr(item, "__dict__", None)  # asked first: Python makes an instance's dict when asked
        refers = [r for r in gc.get_referents(item) if r is not type(item) and r is not attributes]
        if attributes is not None or hasattr(type(item), "__slots__"):  # a Python object refers to all it holds
            return ("object", type(item).__qualname__), [*([attributes] if attributes is not None else []), *refers]
        return ("object", type(item).__qualname__, _own_state(item)), refers  # a C object keeps counts unreferenced


def _tensor(tensor: torch.Tensor, held: bool) -> Any:
    if held or isinstance(tensor, torch.nn.Parameter):
        return ("parameter or buffer",)
    if tensor.is_meta or type(tensor) is not torch.Tensor:
        return ("tensor", type(tensor).__qualname__)
    if tensor.is_floating_point() or tensor.is_complex():
        return _TensorValue(tensor)
    return ("tensor", tuple(tensor.shape), tensor.tolist() if tensor.numel() <= MAX_COMPARED_ELEMENTS
            else tensor._version)


class _TensorValue:
    """A float tensor's values, equal to another's where every element is (NaN to NaN)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor.detach().clone()

    def __eq__(self, other: object) -> bool:
        a, b = self.tensor, getattr(other, "tensor", None)
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and bool(((a == b) | (a.isnan() & b.isnan())).all()))

    def __repr__(self) -> str:
        return f"tensor of {tuple(self.tensor.shape)} {self.tensor.flatten()[:4].tolist()}"


def _own_state(item: Any) -> str:
    """What an object that refers to nothing followable shows of itself: its own ``repr`` (``count(3)``), else what
    it pickles as (a range iterator's index)."""
    if type(item).__repr__ is not object.__repr__:
        return repr(item)[:500]
    try:
        return repr(item.__reduce_ex__(4))[:500]
    except Exception:  # noqa: BLE001  (an object that does not pickle shows nothing)
        return ""


def _own(cls: type) -> bool:
    place = getattr(sys.modules.get(cls.__module__), "__file__", None) or ""
    return bool(place) and own_code(place)


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


__all__ = ["first_change", "python_state"]
