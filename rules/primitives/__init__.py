"""The primitive registry: every op qlint can bound, with the reason it holds.

A :class:`Primitive` names an op, states its exponent the way Table 1 does, says
why the exponent holds, and carries a *transfer* function that maps the growth of
the op's inputs to the growth of its output. Entries are keyed by what the traced
graph holds: a torch function, an ATen op, a tensor method name or a module class.

Nothing outside this registry is ever treated as safe: :func:`lookup` returns
``None`` and the block that contains the op is reported as uncertified.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

from qlint import algebra
from qlint.growth import ANY_SIGN, CONSTANT, NONNEG, NONPOS, Growth, constant

Value = Union[Growth, tuple]


@dataclass
class Call:
    """One application of a primitive during propagation."""

    node: Any  # torch.fx.Node
    args: tuple
    kwargs: dict
    module: Any = None  # the nn.Module for call_module nodes
    training: bool = False

    def get(self, index: int, name: str, default: Any = None) -> Any:
        """Argument by position or keyword, as the user may have passed either."""
        if index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)

    def growth(self, index: int, name: str = "", default: Any = None) -> Growth:
        value = self.get(index, name, default)
        return value if isinstance(value, Growth) else constant(value)

    def inputs(self) -> list[Growth]:
        """Every Growth among the arguments (numbers as constants), lists and tuples flattened."""
        found: list[Growth] = []

        def walk(value: Any) -> None:
            if isinstance(value, Growth):
                found.append(value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                found.append(constant(value))  # literals carry their sign
            elif isinstance(value, (list, tuple)):
                for item in value:
                    walk(item)
            elif isinstance(value, dict):
                for item in value.values():
                    walk(item)

        walk(self.args)
        walk(self.kwargs)
        return found


Transfer = Callable[[Call], Value]


@dataclass(frozen=True)
class Primitive:
    """A registry entry, documented like a Table 1 row."""

    name: str
    q: str
    why: str
    transfer: Transfer
    coefficient: str = ""
    table1: bool = False
    targets: tuple[str, ...] = field(default_factory=tuple)
    plumbing: bool = False  # moves entries around (views, casts): skipped in derivations


class Registry:
    """Maps graph targets to primitives; targets are given as dotted strings.

    ``"torch.nn.functional.relu"`` names a function, ``"aten.relu"`` an ATen op
    (all overloads), ``"method:relu"`` a tensor method, ``"module:torch.nn.ReLU"``
    a module class. Names missing from the installed torch are skipped.
    """

    def __init__(self) -> None:
        self.primitives: list[Primitive] = []
        self._by_key: dict[tuple[str, Any], Primitive] = {}
        self.unresolved: list[str] = []

    def add(self, primitive: Primitive) -> Primitive:
        self.primitives.append(primitive)
        for target in primitive.targets:
            key = _resolve(target)
            if key is None:
                self.unresolved.append(target)
            else:
                self._by_key[key] = primitive
        return primitive

    def add_module_class(self, cls: type, primitive: Primitive) -> None:
        """Register a module class object directly (user-declared exponents)."""
        self.primitives.append(primitive)
        self._by_key[("module", cls)] = primitive

    def lookup(self, op: str, target: Any) -> Optional[Primitive]:
        """The primitive for a node's (op, target), or None when it is unknown."""
        if op == "call_function":
            packet = getattr(target, "overloadpacket", None)
            return self._by_key.get(("function", packet if packet is not None else target))
        if op == "call_method":
            return self._by_key.get(("method", target))
        if op == "call_module":
            return self._by_key.get(("module", target))
        return None

    def knows(self, op: str, target: Any) -> bool:
        return self.lookup(op, target) is not None

    def keys(self) -> Iterable[tuple[str, Any]]:
        return self._by_key.keys()


def _resolve(target: str) -> Optional[tuple[str, Any]]:
    if target.startswith("method:"):
        return ("method", target[len("method:") :])
    kind = "function"
    if target.startswith("module:"):
        kind, target = "module", target[len("module:") :]
    if target.startswith("aten."):
        import torch

        packet = getattr(torch.ops.aten, target[len("aten.") :], None)
        return None if packet is None else ("function", packet)
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        break
    else:
        return None
    return (kind, obj)


# --- transfer builders shared by the rule modules ------------------------------------


def first(call: Call) -> Growth:
    """The main tensor argument (input / self)."""
    return call.growth(0, "input")


def composed(p: float, *, sign: int = ANY_SIGN, floor: bool = False) -> Transfer:
    """An entrywise map with exponent p applied to the first argument: q = p * q_in."""

    def transfer(call: Call) -> Growth:
        x = first(call)
        if not x.depends:
            return Growth(0.0, depends=False, sign=sign, floor=floor)
        return Growth(algebra.compose(p, x.q), sign=sign, floor=floor, culprit=x.culprit)

    return transfer


def bounded(*, sign: int = ANY_SIGN) -> Transfer:
    """A map whose output is bounded whatever its input (q = 0)."""
    return composed(0.0, sign=sign)


def normalizing(call: Call) -> Growth:
    """An outer normalization: q = 0 (Theorem 9(v)); unknown inputs stay unknown."""
    x = first(call)
    return Growth(algebra.normalize(x.q), depends=x.depends, culprit=x.culprit)


def passthrough(call: Call) -> Growth:
    """Shape, copy and selection ops: the output's norm is at most the input's."""
    return first(call)


def summed(call: Call) -> Growth:
    """Sums, concatenations, where/max: q = max of the inputs (Theorem 9(ii))."""
    inputs = call.inputs()
    dependent = [g for g in inputs if g.depends]
    if not dependent:
        return CONSTANT
    q = algebra.parallel_sum(g.q for g in dependent)
    signs = {g.sign for g in inputs}
    sign = signs.pop() if len(signs) == 1 else ANY_SIGN
    floor = all(g.sign == NONNEG for g in inputs) and any(g.floor for g in inputs)
    return Growth(q, sign=sign, floor=floor, culprit=_culprit(dependent))


def multiplied(call: Call) -> Growth:
    """Hadamard and bilinear products: q = sum of the factors' exponents (Theorem 9(iii))."""
    inputs = call.inputs()
    dependent = [g for g in inputs if g.depends]
    sign = NONNEG
    for g in inputs:
        if g.sign == ANY_SIGN:
            sign = ANY_SIGN
            break
        sign *= g.sign
    floor = all(g.floor and g.sign == NONNEG for g in inputs)
    if not dependent:
        return Growth(0.0, depends=False, sign=sign, floor=floor)
    return Growth(algebra.hadamard(g.q for g in dependent), sign=sign, floor=floor, culprit=_culprit(dependent))


def _culprit(inputs: Iterable[Growth]) -> Optional[str]:
    for g in inputs:
        if g.culprit and (g.q is None or not g.known):
            return g.culprit
    return None


def unbounded(reason: str) -> Callable[[Call], Growth]:
    """For ops that are registered so they can be *named* as unbounded."""

    def transfer(call: Call) -> Growth:
        return Growth(None, culprit=reason)

    return transfer


REGISTRY = Registry()


def primitive(
    name: str,
    q: str,
    why: str,
    targets: Iterable[str],
    transfer: Transfer,
    *,
    coefficient: str = "",
    table1: bool = False,
    plumbing: bool = False,
) -> Primitive:
    """Define a registry entry (used by the rule modules at import time)."""
    return REGISTRY.add(
        Primitive(
            name=name,
            q=q,
            why=" ".join(why.split()),
            transfer=transfer,
            coefficient=coefficient,
            table1=table1,
            targets=tuple(targets),
            plumbing=plumbing,
        )
    )


def register(cls: type, *, q: float, why: str, name: Optional[str] = None) -> type:
    """Declare the exponent of a module class; qlint treats it as an opaque leaf.

    ``q`` bounds the module's output in terms of its largest input:
    ``||M(x)|| <= c*||x||**q + b``. The justification is shown in reports, so say why
    it holds. Usable as ``qlint.register(MyGate, q=0, why="output in [0, 1]")``, as
    a class decorator ``@functools.partial(qlint.register, q=0, why=...)``, or from
    ``pyproject.toml``: ``[tool.qlint.primitives] "pkg.mod.MyGate" = { q = 0, why = "..." }``.
    symbolic_trace keeps the class as one leaf node; torch.export inlines it, and the ops
    its forward produced form one opaque region instead (``qlint.propagate.leaf_regions``).
    """
    if q < 0:
        raise ValueError("an exponent is >= 0")

    def transfer(call: Call) -> Growth:
        dependent = [g for g in call.inputs() if g.depends]
        if not dependent:
            return CONSTANT
        return Growth(algebra.compose(q, algebra.parallel_sum(g.q for g in dependent)))

    entry = Primitive(
        name=name or cls.__name__,
        q=f"{q:g}",
        why=f"declared by the user: {why}",
        transfer=transfer,
        targets=(f"module:{cls.__module__}.{cls.__qualname__}",),
    )
    REGISTRY.add_module_class(cls, entry)
    USER_DECLARED[cls] = entry
    return cls


USER_DECLARED: dict[type, Primitive] = {}


def load() -> Registry:
    """Import every rule module once; returns the populated registry."""
    from qlint.rules.primitives import elementwise, extra_ops, layers, tensor_ops  # noqa: F401

    return REGISTRY


__all__ = [
    "ANY_SIGN",
    "NONNEG",
    "NONPOS",
    "Call",
    "Primitive",
    "REGISTRY",
    "bounded",
    "composed",
    "first",
    "load",
    "multiplied",
    "normalizing",
    "passthrough",
    "primitive",
    "register",
    "summed",
]
