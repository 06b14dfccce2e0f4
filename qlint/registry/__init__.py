"""The primitive registry: every op qlint can bound, each with the reason it holds.

Entries are declarative, in ``rules/primitives/*.toml`` (one table per primitive: its
exponent as Table 1 writes it, the justification, the ops it covers). An entry with a
numeric ``q`` gets the default transfer (``q * q_input``, the declared output range);
the rest name a transfer in :mod:`qlint.registry.transfers`. Every spelling of an op
(ATen overload, torch function, Tensor method, ``torch.nn.functional``) resolves to the
same entry; a target that resolves to nothing is an error (``tests/registry/test_registry.py``).

Nothing outside the registry is treated as safe: :meth:`Registry.lookup` returns
``None`` and the block that contains the op is uncertified. Ops deliberately left
out (poles such as ``tan``, products such as ``prod`` without shapes) are listed in
``rules/primitives/unbounded.toml`` with their reason, so ``qlint coverage`` can say so.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

from qlint.core.domain import ANY, Growth, Range
from qlint.core.domain import union as domain_union

Value = Union[Growth, tuple]
Transfer = Callable[..., Value]

from qlint.core.toml import tomllib


FAMILIES = {
    "plumbing": "moves or retypes values without computing (views, casts, copies): skipped in derivations",
    "carrier": "passes its input's value on, up to layout, dtype or a dropout mask: names and scales are read through "
               "it",
    "view": "a view of its input's storage",
    "cast": "a dtype conversion",
    "sum": "a weighted sum of its tensor arguments (add, sub, addcmul, lerp, addmm): a possible stream join",
    "product": "an entrywise or matrix product of its arguments",
    "matmul": "a matrix product (a bilinear form such as attention logits q·k)",
    "scale": "multiplies or divides by a factor",
    "mask": "selects entries by a condition (where, masked_fill)",
    "concat": "concatenates tensors",
    "norm": "a normalization layer or function (LayerNorm, RMSNorm, GroupNorm, L2-normalize)",
    "batch_norm": "batch normalization: a norm on batch statistics, affine on running ones",
    "softmax": "a softmax over a dimension",
    "squashing": "bounded by 1 in absolute value whatever its input (sigmoid, tanh, ...)",
    "power": "a power x**p",
    "exponential": "an exponential",
    "layer": "a learned linear layer (Linear, convolution)",
    "reduction": "reduces over dimensions",
    "complex": "accepts complex inputs",
    "preserves_range": "keeps its input's entrywise range",
}


@dataclass(frozen=True)
class Primitive:
    """A registry entry, documented like a Table 1 row."""

    id: str
    name: str
    q: str
    why: str
    transfer: Transfer
    exponent: Optional[float] = None  # the numeric exponent of a default-transfer entry
    coefficient: str = ""
    table1: bool = False
    family: frozenset[str] = frozenset()  # the op vocabulary, see FAMILIES
    meta_args: frozenset[str] = frozenset()  # arguments read for their shape / dtype / device only
    meta_output: bool = False  # the result is metadata (a size, a dtype), not a value
    params: frozenset[str] = frozenset()  # parameters the rule accepts whatever their value
    range: Any = None  # declared output range: (lo, hi), "input", or None
    real: Optional[str] = None  # "real": the output is real; "complex": complex
    aliases: tuple[tuple[str, str], ...] = ()
    targets: tuple[str, ...] = ()
    source: str = ""  # the TOML file that declares it
    unbounded: bool = False  # registered only to say why no bound exists (rules/primitives/unbounded.toml)

    @property
    def plumbing(self) -> bool:
        return "plumbing" in self.family


    def declared_range(self, input_range: Range) -> Range:
        if self.range == "input":
            return input_range
        if self.range == "input_or_zero":
            return domain_union(input_range, Range(lo=0.0, hi=0.0))
        if isinstance(self.range, (list, tuple)):
            lo, hi = (float(v) for v in self.range[:2])
            is_open = len(self.range) > 2 and self.range[2] == "open"
            return Range(lo=lo, hi=hi, lo_open=is_open, hi_open=is_open)
        return ANY


@dataclass(frozen=True)
class Declared:
    """A user-declared opaque module: ``||M(x)|| <= c*||x||**q + b`` on its largest input."""

    q: float
    why: str
    name: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.q, (int, float)) and self.q >= 0 and not math.isnan(self.q)):
            raise ValueError(f"a declared exponent is a number >= 0, got {self.q!r}")
        if not self.why.strip():
            raise ValueError("a declared exponent needs a justification (why=...)")


DECLARATION = "__qlint_primitive__"


def register(cls: Optional[type] = None, *, q: float, why: str, name: str = "") -> Any:
    """Declare a module class's exponent; qlint then treats it as an opaque leaf.

    The declaration is stored on the class (not in a global registry), applies to that
    exact class only (a subclass with its own forward is traced), and is shown in
    reports with its justification. Use ``qlint.register(MyGate, q=0, why="output in
    [0, 1]")`` or as a decorator ``@qlint.register(q=0, why=...)``; per call, pass
    ``primitives={"pkg.mod.MyGate": {"q": 0, "why": "..."}}`` to ``qlint.analyze``; per
    project, ``[tool.qlint.primitives]`` in pyproject.toml.
    """
    declared = Declared(q=q, why=why, name=name)

    def apply(target: type) -> type:
        setattr(target, DECLARATION, declared)
        return target

    return apply(cls) if cls is not None else apply


def declared_of(cls: type) -> Optional[Declared]:
    """The declaration made on exactly this class (subclasses do not inherit it)."""
    value = vars(cls).get(DECLARATION)
    return value if isinstance(value, Declared) else None


class Registry:
    """Maps graph targets to primitives; one key scheme: the resolved target.

    ``("op", "aten::add")`` for dispatcher ops, by their canonical qualified name, so every
    overload (``aten.add.Tensor``, ``aten.add.Scalar``) and a custom op of a library that is
    imported after the registry was built (``transformers::grouped_mm_fallback``) find one
    entry; ``("function", obj)`` for torch functions and Python functions; ``("method",
    name)`` for Tensor methods; ``("module", cls)`` for the few nn modules that are leaves
    (their forward cannot be traced through). The function and method spellings of an op
    are generated from its ATen name (:func:`spellings`), so they share its entry.
    """

    def __init__(self, primitives: Iterable[Primitive] = (), declared: Optional[dict[type, Declared]] = None) -> None:
        self.primitives: list[Primitive] = []
        self.by_id: dict[str, Primitive] = {}
        self._by_key: dict[tuple[str, Any], Primitive] = {}
        self.unresolved: list[tuple[str, str]] = []
        self.deferred: dict[str, Primitive] = {}  # targets in libraries not imported yet, by dotted name
        self.declared: dict[type, Declared] = dict(declared or {})
        for primitive in primitives:
            self.add(primitive)

    def add(self, primitive: Primitive) -> Primitive:
        if primitive.id in self.by_id:
            raise ValueError(f"primitive id {primitive.id!r} is declared twice ({primitive.source})")
        self.primitives.append(primitive)
        self.by_id[primitive.id] = primitive
        for target in primitive.targets:
            if _in_unloaded_library(target):
                if self.deferred.setdefault(target, primitive) is not primitive:
                    raise ValueError(f"{target} is claimed by both {self.deferred[target].id!r} and {primitive.id!r}")
                continue
            key = resolve(target)
            if key is None:
                self.unresolved.append((primitive.id, target))
                continue
            previous = self._by_key.get(key)
            if previous is not None and previous is not primitive:
                raise ValueError(f"{target} is claimed by both {previous.id!r} and {primitive.id!r}")
            self._by_key[key] = primitive
        return primitive

    def with_declared(self, declared: dict[type, Declared]) -> "Registry":
        """This registry with more user declarations layered on top (no mutation)."""
        layered = Registry.__new__(Registry)
        layered.primitives, layered.by_id, layered._by_key = self.primitives, self.by_id, self._by_key
        layered.unresolved, layered.deferred = self.unresolved, self.deferred
        layered.declared = {**self.declared, **declared}
        return layered

    def declaration(self, cls: type) -> Optional[Declared]:
        return self.declared.get(cls) or declared_of(cls)

    def lookup(self, op: str, target: Any) -> Optional[Primitive]:
        """The primitive for a node's (op, target), or None when it is unknown."""
        if op == "call_function":
            name = qualified_op_name(target)
            try:
                return self._by_key.get(("op", name)) if name else self._keyed("function", target)
            except TypeError:
                return None
        if op == "call_method":
            return self._by_key.get(("method", target)) if _torch_method(target) else None
        if op == "call_module":
            return self._keyed("module", target)
        return None

    def _keyed(self, kind: str, obj: Any) -> Optional[Primitive]:
        """The entry of a function or class, resolving a deferred target on first sight.

        A target in a library that was not imported when the registry was built (torchvision
        costs a second) is found by the object's ``__module__.__qualname__`` and accepted only
        if that dotted name resolves to this very object, so a look-alike name is not enough.
        """
        found = self._by_key.get((kind, obj))
        if found is not None or not self.deferred:
            return found
        name = f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', None)}"
        primitive = self.deferred.get(name if kind == "function" else f"module:{name}")
        if primitive is None:
            return None
        key = resolve(name)
        if key is None or key[1] is not obj:
            return None
        self._by_key[(kind, obj)] = primitive
        return primitive

    def knows(self, op: str, target: Any) -> bool:
        """Whether an entry bounds the op (the deliberately unbounded entries do not)."""
        primitive = self.lookup(op, target)
        return primitive is not None and not primitive.unbounded

    def is_leaf(self, cls: type) -> bool:
        """Whether symbolic_trace keeps an instance of this exact class as one node."""
        return self._keyed("module", cls) is not None or self.declaration(cls) is not None

    def keys(self) -> Iterable[tuple[str, Any]]:
        return self._by_key.keys()


def _in_unloaded_library(target: str) -> bool:
    """A dotted-path target whose top-level package is not imported (and is not torch)."""
    path = target.removeprefix("module:")
    if ":" in path or path.startswith(("aten.", "torch.")):
        return False
    return path.split(".", 1)[0] not in sys.modules


def qualified_op_name(target: Any) -> Optional[str]:
    """``"aten::add"`` for a dispatcher op (an overload or its packet), else None."""
    packet = getattr(target, "overloadpacket", target)
    name = getattr(packet, "_qualified_op_name", None)
    return name if isinstance(name, str) else None


def _torch_method(name: Any) -> bool:
    """``Tensor.<name>`` is torch's own (C, or Python in torch's files), not a monkeypatch:
    a method is matched by name, so a replaced ``Tensor.relu`` must not pass as ReLU."""
    import torch

    method = getattr(torch.Tensor, str(name), None)
    if method is None or not callable(method):
        return True  # not a Tensor attribute (a method of another object): the name decides
    module = (getattr(method, "__module__", None) or getattr(getattr(method, "__objclass__", None), "__module__", "")
              or "")
    return inspect.isbuiltin(method) or type(method).__name__ in _C_METHODS or module.startswith("torch")


_C_METHODS = {"method_descriptor", "wrapper_descriptor", "getset_descriptor", "builtin_function_or_method",
              "method-wrapper"}


def resolve(target: str) -> Optional[tuple[str, Any]]:
    """``"method:relu"``, ``"module:torch.nn.LSTM"``, ``"aten.relu"`` or a dotted path."""
    if target.startswith("method:"):
        return ("method", target[len("method:") :])
    kind = "function"
    if target.startswith("module:"):
        kind, target = "module", target[len("module:") :]
    if target.startswith("aten.") or target.startswith("torch.ops."):
        import torch

        namespace, _, name = target.removeprefix("torch.ops.").partition(".")
        if not namespace or not name or "." in name:
            return None
        if namespace == "higher_order":  # a higher-order op is one object, keyed as a function
            hop = getattr(torch.ops.higher_order, name, None)
            return ("function", hop) if hop is not None else None
        if namespace == "aten" and getattr(torch.ops.aten, name, None) is None:
            return None  # a conventional spelling this torch lacks; other libraries register theirs on import
        return ("op", f"{namespace}::{name}")
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
        return (kind, obj)
    return None


# --- loading the declarative entries ------------------------------------------------------

def rules_dir() -> Path:
    """The ``rules/`` folder: ``qlint/_rules`` in a built install, the checkout's ``rules/`` otherwise."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "_rules", package.parent / "rules"):
        if (candidate / "primitives").is_dir():
            return candidate
    raise FileNotFoundError("qlint's rules/ folder is missing from this installation")


def entries() -> list[dict[str, Any]]:
    """The raw TOML tables of every primitive (torch-free: ``qlint rules`` prints them)."""
    out = []
    for path in sorted((rules_dir() / "primitives").glob("*.toml")):
        with path.open("rb") as handle:
            data = tomllib.load(handle)
        for table in data.get("primitive", []):
            out.append({**table, "source": f"rules/primitives/{path.name}"})
    return out


def spellings(op: str) -> list[str]:
    """Every public spelling of an ATen op name, plus its in-place twin.

    ``add`` -> aten.add, torch.add, method:add, torch.nn.functional.add, and the same for
    ``add_``; ``special_erf`` -> torch.special.erf; ``linalg_vector_norm`` ->
    torch.linalg.vector_norm; ``fft_rfft`` -> torch.fft.rfft. Only the ones that exist
    are kept (:func:`resolve` decides); the loader drops the rest silently because
    they are conventions, not claims.
    """
    names = [op] + ([f"{op}_"] if not op.endswith("_") else [])
    out = []
    for name in names:
        out += [f"aten.{name}", f"torch.{name}", f"method:{name}", f"torch.nn.functional.{name}",
                f"torch._C._nn.{name}"]
        for prefix, namespace in (("special_", "torch.special."), ("linalg_", "torch.linalg."), ("fft_", "torch.fft.")):
            if name.startswith(prefix):
                out.append(namespace + name[len(prefix) :])
    return out


_DEFAULT: Optional[Registry] = None


def default() -> Registry:
    """The registry built from rules/primitives (once per process)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = build(entries())
    return _DEFAULT


def build(tables: Iterable[dict[str, Any]]) -> Registry:
    from qlint.registry import transfers

    registry = Registry()
    for table in tables:
        registry.add(_primitive(table, transfers))
    return registry


_FIELDS = {"id", "name", "q", "why", "ops", "targets", "modules", "transfer", "coefficient", "table1", "family",
           "meta_args", "meta_output", "params", "range", "real", "aliases", "source", "spell"}


def _primitive(table: dict[str, Any], transfers: Any) -> Primitive:
    unknown = set(table) - _FIELDS
    if unknown:
        raise ValueError(f"{table.get('source')}: primitive {table.get('id')!r} has unknown keys {sorted(unknown)}")
    strange = set(table.get("family", [])) - set(FAMILIES)
    if strange:
        raise ValueError(f"{table.get('source')}: primitive {table.get('id')!r} has unknown families {sorted(strange)}")
    ops = list(table.get("ops", []))
    spelled = table.get("spell", True)
    targets: list[str] = []
    for op in ops:
        targets += [t for t in (spellings(op) if spelled else [f"aten.{op}"]) if _exists(t)]
    explicit = list(table.get("targets", [])) + [f"module:{m}" for m in table.get("modules", [])]
    exponent = table.get("q")
    name = table.get("transfer")
    if name is None:
        if not isinstance(exponent, (int, float)):
            raise ValueError(f"{table.get('source')}: {table['id']!r} needs a numeric q or a transfer")
        transfer = transfers.default
    else:
        transfer = transfers.TRANSFERS[name]
    primitive = Primitive(
        id=table["id"],
        name=table["name"],
        q=str(exponent) if not isinstance(exponent, str) else exponent,
        why=" ".join(table["why"].split()),
        transfer=transfer,
        exponent=float(exponent) if isinstance(exponent, (int, float)) else None,
        coefficient=table.get("coefficient", ""),
        table1=bool(table.get("table1", False)),
        family=frozenset(table.get("family", [])),
        meta_args=frozenset(table.get("meta_args", [])),
        meta_output=bool(table.get("meta_output", False)),
        params=frozenset(table.get("params", [])),
        range=_range(table.get("range")),
        real=table.get("real"),
        aliases=tuple(sorted(table.get("aliases", {}).items())),
        targets=tuple(dict.fromkeys(targets + explicit)),
        source=table.get("source", ""),
        unbounded=name == "unbounded",
    )
    return primitive


def _exists(target: str) -> bool:
    """Whether a conventional spelling names something in the installed torch."""
    if target.startswith("method:"):
        import torch

        return hasattr(torch.Tensor, target[len("method:") :])
    return resolve(target) is not None


def _range(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(float(v) if not isinstance(v, str) or v in ("inf", "-inf") else v for v in value)
    return value


__all__ = ["Declared", "Primitive", "Registry", "default", "declared_of", "entries", "qualified_op_name", "register",
           "resolve", "rules_dir", "spellings"]
