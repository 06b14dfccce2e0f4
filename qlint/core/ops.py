"""How a graph node's arguments bind to names, and the call object transfers read.

Every spelling of an op binds to one signature: an ATen overload to its schema, a
torch builtin or Tensor method to the schemas of ``aten::<name>`` (first argument
``input``), a Python function to ``inspect.signature``, an nn module to its
``forward``. A transfer then reads arguments *by name* through :class:`Call`, which
records what it read: an input-dependent argument the transfer never read, or a
non-default parameter it never looked at, makes the result unknown
(:meth:`Call.unread`). That is how a rule written for ``layer_norm(x)`` cannot
silently ignore ``layer_norm(x, weight=w(x))``.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.fx as fx

from qlint.core.domain import CONSTANT, Growth, constant

# Arguments that never change a magnitude bound: where a result lives, its layout,
# which axes a reduction folds (the bound of a sum or mean does not depend on it),
# whether a copy or an in-place write is made (the trace handles mutation).
NEUTRAL = frozenset(
    {
        "dim", "dims", "keepdim", "dtype", "layout", "device", "pin_memory", "memory_format",
        "non_blocking", "copy", "names", "requires_grad", "inplace", "generator", "out",
        "cudnn_enable", "cudnn_enabled", "is_causal", "enable_gqa", "align_corners", "antialias",
        "recompute_scale_factor", "_stacklevel", "ceil_mode", "count_include_pad",
        "return_indices", "stride", "padding", "dilation", "groups", "output_padding", "kernel_size",
        "size", "sizes", "shape", "scale_factor", "mode", "implicit", "sym", "implicit_ok",
    }
)

OPERATOR_SIGNATURES: dict[Callable, inspect.Signature] = {}


def _positional(*names: str) -> inspect.Signature:
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])


OPERATOR_SIGNATURES[operator.pow] = OPERATOR_SIGNATURES[operator.ipow] = inspect.Signature(
    [inspect.Parameter("input", inspect.Parameter.POSITIONAL_ONLY),
     inspect.Parameter("exponent", inspect.Parameter.POSITIONAL_ONLY)])
for _op in (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
            operator.mod, operator.matmul, operator.and_, operator.or_, operator.xor, operator.gt, operator.ge,
            operator.lt, operator.le, operator.eq, operator.ne, operator.iadd, operator.isub, operator.imul,
            operator.itruediv, operator.lshift, operator.rshift):
    OPERATOR_SIGNATURES[_op] = _positional("input", "other")
for _op in (operator.neg, operator.pos, operator.abs, operator.invert, operator.not_, operator.truth):
    OPERATOR_SIGNATURES[_op] = _positional("input")
OPERATOR_SIGNATURES[operator.getitem] = _positional("input", "index")
OPERATOR_SIGNATURES[operator.setitem] = _positional("input", "index", "value")
OPERATOR_SIGNATURES[getattr] = _positional("input", "name")


@functools.lru_cache(maxsize=None)
def _schema_signatures(name: str) -> tuple[inspect.Signature, ...]:
    """Python signatures of every overload of ``aten::<name>``."""
    from torch.fx.operator_schemas import _torchscript_schema_to_signature

    try:
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
    except RuntimeError:
        return ()
    out = []
    for schema in schemas:
        try:
            out.append(_torchscript_schema_to_signature(schema))
        except Exception:  # a schema with a type fx cannot express: skip that overload
            continue
    return tuple(out)


def _function_signatures(target: Any) -> tuple[inspect.Signature, ...]:
    if target in OPERATOR_SIGNATURES:
        return (OPERATOR_SIGNATURES[target],)
    if isinstance(target, torch._ops.OpOverload):
        from torch.fx.operator_schemas import _torchscript_schema_to_signature

        return (_torchscript_schema_to_signature(target._schema),)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return tuple(s for name in target.overloads() for s in _function_signatures(getattr(target, name)))
    dispatched = torch._jit_internal.boolean_dispatched.get(target)
    if dispatched is not None:  # F.max_pool2d and kin are `fn(*args, **kwargs)`: bind to what they dispatch to
        return (inspect.signature(dispatched["if_false"]),)
    try:
        return (inspect.signature(target),)
    except (TypeError, ValueError):
        pass
    name = getattr(target, "__name__", "")
    return _schema_signatures(name) if name else ()


_SIGNATURES: dict[Any, tuple[inspect.Signature, ...]] = {}


def signatures(node: fx.Node, module: Optional[torch.nn.Module] = None) -> tuple[inspect.Signature, ...]:
    """Candidate signatures of a node's op (several for overloaded builtins)."""
    if node.op == "call_module":
        forward = type(module).forward if module is not None else None
        if forward is None:
            return ()
        sig = inspect.signature(forward)
        return (sig.replace(parameters=list(sig.parameters.values())[1:]),)
    key: Any = ("method", node.target) if node.op == "call_method" else node.target
    try:
        cached = _SIGNATURES.get(key)
    except TypeError:  # an unhashable target
        return _function_signatures(node.target) if node.op == "call_function" else ()
    if cached is None:
        if node.op == "call_method":
            name = str(node.target)
            dunder = {"__add__": operator.add, "__radd__": operator.add, "__sub__": operator.sub,
                      "__mul__": operator.mul,
                      "__rmul__": operator.mul, "__truediv__": operator.truediv, "__neg__": operator.neg,
                      "__pow__": operator.pow, "__matmul__": operator.matmul, "__getitem__": operator.getitem}
            cached = (OPERATOR_SIGNATURES[dunder[name]],) if name in dunder else _schema_signatures(name)
        else:
            cached = _function_signatures(node.target)
        _SIGNATURES[key] = cached
    return cached


@dataclass
class Bound:
    """A node's arguments by name: what was passed, and the defaults of the rest."""

    arguments: dict[str, Any]
    defaults: dict[str, Any]
    positional: bool = False  # bound by position only (no signature known)

    def nodes(self, names: Optional[set[str]] = None) -> Iterator[fx.Node]:
        """Graph nodes inside the (selected) arguments, nested lists included."""
        for name, value in self.arguments.items():
            if names is None or name in names:
                yield from _nodes_in(value)


def _nodes_in(value: Any) -> Iterator[fx.Node]:
    if isinstance(value, fx.Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _nodes_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _nodes_in(item)
    elif isinstance(value, slice):
        yield from _nodes_in((value.start, value.stop, value.step))


def bind(node: fx.Node, module: Optional[torch.nn.Module] = None, aliases: Optional[dict[str, str]] = None) -> Bound:
    """Bind a node's args/kwargs to parameter names (``self`` is called ``input``)."""
    args, kwargs = node.args, dict(node.kwargs)
    for sig in signatures(node, module):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            continue
        arguments = dict(bound.arguments)
        if node.op == "call_method" and args:  # a method's first argument is the tensor itself
            first = next(iter(sig.parameters))
            if first in arguments and first not in ("self", "input"):
                arguments["input"] = arguments.pop(first)
        for name, param in sig.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD and name in arguments:
                arguments.update(arguments.pop(name))
            elif param.kind is inspect.Parameter.VAR_POSITIONAL and name in arguments:
                arguments[name] = list(arguments[name])
        defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
        return Bound(_renamed(arguments, aliases), _renamed(defaults, aliases))
    # no signature binds: name the arguments by position so nothing is lost
    arguments = {f"arg{i}": a for i, a in enumerate(args)}
    if args:
        arguments["input"] = arguments.pop("arg0")
    arguments.update(kwargs)
    return Bound(_renamed(arguments, aliases), {}, positional=True)


def _renamed(mapping: dict[str, Any], aliases: Optional[dict[str, str]]) -> dict[str, Any]:
    out = {}
    for name, value in mapping.items():
        name = "input" if name == "self" else name
        if aliases:
            name = aliases.get(name, name)
        out[name] = value
    return out


class Call:
    """One application of a transfer: named arguments (Growths for graph values).

    Every access is recorded so :meth:`unread` can tell what the transfer ignored. Two
    kinds of access are told apart: an argument is *read* when the transfer looked at
    it (a plain parameter, a number), and *consumed* when its value entered the rule's
    arithmetic (as an operand, a selector or for its metadata). An argument that
    depends on the input must be consumed: one read as a plain parameter (a leaky
    slope computed from x, read by :meth:`param` as "not a number") was not accounted
    for, and the result is unknown. The one place that enforces it is :meth:`unread`.
    """

    def __init__(self, node: fx.Node, arguments: dict[str, Any], defaults: dict[str, Any], *,
                 module: Optional[torch.nn.Module] = None, training: bool = False, positional: bool = False) -> None:
        self.node = node
        self.arguments = arguments
        self.defaults = defaults
        self.module = module
        self.training = training
        self.positional = positional
        self.op = op_name(node) if node is not None else ""
        self.read: set[str] = set()
        self.consumed: set[str] = set()
        self.selected: frozenset[str] = frozenset()
        self.hazards: list[tuple[str, str, Callable[[Any], bool]]] = []  # (why, argument, is the value bad)
        self.picked: set[str] = set()  # tuple arguments the rule took one element of (its result carries that one)

    # -- reading arguments ---------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self.arguments

    def value(self, name: str, default: Any = None) -> Any:
        """The raw argument (a Growth for graph values, else the Python value), read but not
        consumed: use :meth:`operand` when the rule computes with it."""
        self.read.add(name)
        if name in self.arguments:
            return self.arguments[name]
        return self.defaults.get(name, default)

    def operand(self, name: str, default: Any = None) -> Any:
        """The raw argument, which the rule's arithmetic uses (a Growth, a number or a tuple of them)."""
        self.consumed.add(name)
        return self.value(name, default)

    def growth(self, name: str, default: Any = None) -> Optional[Growth]:
        """A tensor argument as a Growth (numbers as constants); None only when the argument is
        absent (not passed, default None). A list or tuple where the rule reads one tensor is
        unknown, never absent."""
        value = self.operand(name, default)
        if value is None:
            return None
        if isinstance(value, Growth):
            return value
        if isinstance(value, (list, tuple)):
            return Growth(None,
                          culprit=f"argument `{name}` of {self.label()} holds {len(value)} values where its rule reads "
                                  "one tensor")
        return constant(value)

    def param(self, name: str, default: Any = None) -> Any:
        """A non-tensor parameter; a graph value here (a SymInt from data) reads as None and is
        not consumed, so one that depends on the input makes the result unknown."""
        value = self.value(name, default)
        return None if isinstance(value, Growth) else value

    def meta(self, *names: str) -> None:
        """Mark arguments read for their shape, dtype or device only."""
        self.read.update(names)
        self.consumed.update(names)

    def accept_params(self) -> None:
        """Mark every non-tensor argument read: the transfer's bound holds whatever their
        values (strides, dims, eps already checked...). Tensor arguments are not touched: each
        must be read for what it is, or the result is unknown."""
        self.read.update(name for name, value in self.arguments.items() if not _is_tensor_like(value))

    def selectors(self, *names: str) -> None:
        """Mark tensor arguments that only select entries (indices, masks, a grid): their
        values say which entries are taken, never how large they are. A selector qlint
        could not bound is still contagious (it may be NaN, or of a length that grows with
        the input)."""
        self.read.update(names)
        self.consumed.update(names)
        self.selected = self.selected | frozenset(names)

    def growths(self, name: str) -> list[Growth]:
        """Every Growth inside an argument (a list of tensors for cat, stack, ...)."""
        self.read.add(name)
        self.consumed.add(name)
        return list(growths_in(self.arguments.get(name)))

    def depends_any(self) -> bool:
        """Whether any argument depends on the input (reads nothing)."""
        return any(g.depends for g in growths_in(list(self.arguments.values())))

    def every(self) -> list[Growth]:
        """Every Growth among all arguments, marking them consumed."""
        self.read.update(self.arguments)
        self.consumed.update(self.arguments)
        return list(growths_in(list(self.arguments.values())))

    def hazard(self, why: str, argument: str, bad: Callable[[Any], bool]) -> None:
        """Record that a parameter-only argument may make the result inf or NaN at some parameter
        values (a divisor that may be 0): a numerical hazard, not growth. The propagation checks
        ``bad`` on the argument's value at the model's own parameters."""
        self.hazards.append((why, argument, bad))

    # -- what was ignored ----------------------------------------------------------------

    def unread(self, meta_args: frozenset[str] = frozenset(), accepted: frozenset[str] = frozenset()) -> Optional[str]:
        """Why the transfer's result cannot be trusted, or None when it read enough.

        An argument that depends on the input must have been consumed; a non-tensor
        parameter that differs from its default must have been read or be one the
        entry declares harmless; a tensor argument independent of the input may be
        skipped only by transfers that claim no order facts (the propagation then drops them).
        """
        for name, value in self.arguments.items():
            if name in meta_args:
                continue
            if any(g.depends for g in growths_in(value)):
                if name in self.consumed:
                    continue
                how = "reads it as a plain parameter" if name in self.read else "does not account for it"
                return f"argument `{name}` depends on the input and the rule for {self.label()} {how}"
            if name in self.read or name in NEUTRAL or name in accepted or _is_tensor_like(value):
                continue
            if name in self.defaults and _same(value, self.defaults[name]):
                continue
            return f"parameter `{name}={_short(value)}` of {self.label()} is not one its rule handles"
        return None

    def ignored_constants(self, meta_args: frozenset[str] = frozenset()) -> bool:
        """Whether some input-independent tensor argument went unread (its sign is unknown)."""
        return any(
            name not in self.consumed and name not in meta_args and _is_tensor_like(value)
            for name, value in self.arguments.items()
        )

    def label(self) -> str:
        return f"`{describe(self.node, self.module)}`" if self.node is not None else f"`{self.op or 'the op'}`"


def growths_in(value: Any) -> Iterator[Growth]:
    """Every Growth inside an argument (nested lists, tuples and dicts)."""
    if isinstance(value, Growth):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from growths_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from growths_in(item)


def _is_tensor_like(value: Any) -> bool:
    return any(True for _ in growths_in(value))


def _same(a: Any, b: Any) -> bool:
    try:
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return bool(a == b)
    except Exception:
        return False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- naming ------------------------------------------------------------------------------

_PUBLIC_NAMESPACES = {"nn": "torch.nn.functional", "VariableFunctions": "torch", "C": "torch",
                      "special": "torch.special",
                      "linalg": "torch.linalg", "fft": "torch.fft"}


def describe(node: fx.Node, module: Any = None) -> str:
    """The op of a node in user terms: a module class, a function, a method, an op overload."""
    if node.op == "call_module":
        cls = type(module) if module is not None else None
        name = f"{cls.__module__}.{cls.__qualname__}" if cls else "module"
        return f"{name} ({node.target})"
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        packet = getattr(target, "overloadpacket", target)
        namespace = getattr(target, "namespace", None) or getattr(packet, "_qualified_op_name", "aten::").split("::")[0]
        return f"torch.ops.{namespace}.{packet.__name__}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"torch.ops.higher_order.{target.__name__}"
    module_name = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", str(target))
    if module_name in ("_operator", "operator"):
        return f"operator.{name}"
    if module_name.startswith("torch._C"):
        namespace = module_name.rsplit("._", 1)[-1]
        public = _PUBLIC_NAMESPACES.get(namespace, f"torch.{namespace}")
        return f"{public}.{name.removeprefix(namespace + '_')}"
    return f"{module_name}.{name}" if module_name else name


def op_name(node: Any) -> str:
    """The bare name of a node's operation: ``add`` for every spelling of an addition."""
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
        return ""
    if node.op == "call_method":
        target = str(node.target)
        if target.startswith("__r") and target.endswith("__"):
            return target[3:-2]
        return target.strip("_") if target.startswith("__") else target
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return packet.__name__
    if target in _OPERATOR_NAMES:
        return _OPERATOR_NAMES[target]
    return getattr(target, "__name__", str(target))


_OPERATOR_NAMES = {
    operator.add: "add", operator.iadd: "add", operator.sub: "sub", operator.isub: "sub",
    operator.mul: "mul", operator.imul: "mul", operator.truediv: "div", operator.itruediv: "div",
    operator.pow: "pow", operator.ipow: "pow", operator.neg: "neg", operator.matmul: "matmul",
    operator.getitem: "getitem", operator.abs: "abs",
}


def source_value(value: Any) -> Growth:
    """The Growth of a raw argument value (numbers and None included)."""
    if isinstance(value, Growth):
        return value
    return constant(value) if value is not None else CONSTANT


__all__ = ["NEUTRAL", "Bound", "Call", "bind", "describe", "op_name", "signatures", "source_value"]


def declared_name(cls: type) -> str:
    """How ``[tool.qlint.primitives]`` names a class: ``module.Class``, where a class from a
    file loaded by path (module ``qlint_user_<stem>_<hash>``) is ``<stem>.Class``."""
    module = cls.__module__
    if module.startswith("qlint_user_"):
        module = module[len("qlint_user_") :].rpartition("_")[0]
    return f"{module}.{cls.__qualname__}"


def attribute(root: torch.nn.Module, target: str) -> Any:
    """The attribute a get_attr node's dotted target names (``layers.0.weight``), read off the module tree."""
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value
