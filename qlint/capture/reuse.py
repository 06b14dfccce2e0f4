"""Identical layers traced once: torch.export records the first of a run of identical layers and
replays it for the others, whose ops are then copied, with their own parameters, from the first.

The cost of a deep model is torch.export running every layer's Python on fake tensors. Here
the siblings in a ``ModuleList`` / ``Sequential`` are grouped by structure: the same class and
submodule tree, the same parameter and buffer names, shapes, dtypes, devices and
``requires_grad``, the same ``training`` flags, no hooks, and, in torch's own modules (whose
forward reads them: ``eps``, ``p``, ``normalized_shape`` ...), equal attributes. While the model
is exported, the group's first member (the representative) runs for real with its inputs and
outputs passed through an identity marker (``qlint::mark``); every later member whose call has
the representative's argument structure, equal non-tensor arguments and tensors of equal shape,
stride, dtype and device is one opaque ``qlint::replay`` node (its fake kernel returns tensors
like the representative's outputs). After the export, :func:`expand` replaces each replay by a
copy of the representative's ops, the representative's parameters swapped for the member's and
its module paths renamed, so the analysis sees the whole model as if it had been traced layer
by layer: the stream between the layers is the traced one.

Why the copy is the member's graph. The members have the same code and the same state shapes;
what may still differ are plain attributes of the layer's own (non-torch) modules, such as
Hugging Face's ``self.layer_idx``. Those are replaced, in the representative only and only while
it is traced, by a poison value whose every use (a comparison, arithmetic, hashing, indexing,
formatting, truth, a C function taking it as a number, an attribute read) raises: a trace that
completes did not read them, so its ops do not depend on them (a read the forward catches still
counts, and a poison it stored anywhere is taken back). A poison passes
``isinstance(value, type(original))`` (it reports the original's class), so such a check takes
the same branch as the real value; what it cannot answer, identity and type tests, is kept
out: values that ``is None`` / ``is True`` / an enum or a type could tell apart are never
poisoned (such layers are grouped by equal values instead), nor are attributes named by code
that loads ``type`` or ``id``. The state a forward can read beyond its own attributes is
compared at every call: each member is replayed only when its plain attributes, the contents
of the objects they hold (a shared config, a context a parent updates), the globals its
forwards name and its non-tensor arguments (plain values only) equal the representative's at
its call, and the grad and autocast modes too. What stays outside the argument: state reached
two objects deep, or through a helper's globals, changed by the caller between layers.
A poison that is read, a representative called twice, a replayed member whose ops escape the
region (a tensor read from outside its arguments, a write to its inputs, a view of them as an
output, a higher-order op, a tied weight) all abandon reuse: the model is exported again in
full (:func:`qlint.capture.pipeline.capture`), and ``qlint -v`` says why. On real weights the graph
check then runs the expanded graph against the eager model, as for any trace.
"""

from __future__ import annotations

import contextlib
import dis
import enum
import functools
import gc
import operator
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from qlint.core.graph import clean_path
from qlint.core.ops import attribute


class ReuseAbandoned(Exception):
    """Reuse cannot stand for the members: the caller exports the model in full."""


@torch.library.custom_op("qlint::mark", mutates_args=())
def _mark(x: torch.Tensor, role: str) -> torch.Tensor:
    """An identity that names a representative's input or output in the exported graph."""
    return x.clone()


@_mark.register_fake
def _(x: torch.Tensor, role: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("qlint::replay", mutates_args=())
def _replay(inputs: list[torch.Tensor], layer: str) -> list[torch.Tensor]:
    """A member's call, standing for the representative's ops (expanded before the graph runs)."""
    raise RuntimeError("qlint::replay is a placeholder that qlint.capture.reuse.expand replaces")


@_replay.register_fake
def _(inputs: list[torch.Tensor], layer: str) -> list[torch.Tensor]:
    group = _ACTIVE[-1].member_group[layer]
    return [torch.empty_strided(size, stride, dtype=dtype, device=device)
            for size, stride, dtype, device in group.out_metas]


MARK = torch.ops.qlint.mark.default
REPLAY = torch.ops.qlint.replay.default
_ACTIVE: list["Plan"] = []
_MODULE_INTERNALS = frozenset({"training", "_parameters", "_buffers", "_non_persistent_buffers_set", "_modules",
                               "_backward_pre_hooks", "_backward_hooks", "_is_full_backward_hook", "_forward_hooks",
                               "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
                               "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
                               "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"})
_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def abandoned(exc: BaseException) -> bool:
    """Whether an export under :func:`recording` failed because of the recording itself (a poisoned
    attribute read, copies that cannot stand for the layers), not because of the model: a dynamic-shape
    export that failed so must not be retried static in the same recording, but in full."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ReuseAbandoned):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return bool(_READS)


class _ReadDuringReuse(Exception):
    """A poisoned attribute was read: the representative's ops may depend on its value."""


class _Poison:
    """Stands for an attribute that differs between identical layers; any use raises."""

    __slots__ = ("_qlint_type", "_qlint_original")

    def __init__(self, original: Any) -> None:
        object.__setattr__(self, "_qlint_type", type(original))
        object.__setattr__(self, "_qlint_original", original)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(poison, int) holds when the original is an int
        return object.__getattribute__(self, "_qlint_type")

    def __getattr__(self, name: str) -> Any:
        _READS.append(name)
        raise _ReadDuringReuse(name)


def _raise(self: Any, *args: Any, **kwargs: Any) -> Any:
    _READS.append("use")  # kept even if the forward catches the exception
    raise _ReadDuringReuse("use")


_READS: list[str] = []


for _name in ("bool", "int", "index", "float", "complex", "hash", "eq", "ne", "lt", "le", "gt", "ge", "str", "repr",
              "format", "bytes", "len", "iter", "next", "reversed", "contains", "getitem", "setitem", "delitem", "call",
              "enter", "exit", "neg", "pos", "abs", "invert", "round", "trunc", "floor", "ceil", "setattr", "delattr",
              "reduce", "reduce_ex", "dir", "fspath", "buffer", "array", "torch_function", "getstate", "copy",
              "deepcopy",
              *(f"{prefix}{op}" for op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow",
                                           "lshift", "rshift", "and", "xor", "or") for prefix in ("", "r", "i"))):
    setattr(_Poison, f"__{_name}__", _raise)


@dataclass
class Group:
    """Identical sibling layers: the first is traced, the others replayed where their calls match."""

    representative: str
    members: list[str]
    differing: list[tuple[str, str]]  # (submodule path in the layer, attribute) poisoned while traced
    calls: int = 0
    in_spec: Any = None
    in_constants: list[Any] = field(default_factory=list)  # the call's non-tensor leaves (None at tensors)
    in_metas: list[tuple] = field(default_factory=list)
    context: tuple = ()
    state: Any = None  # the representative's readable state when it was called (:func:`_readable_state`)
    out_spec: Any = None
    out_metas: list[tuple] = field(default_factory=list)
    out_positions: list[int] = field(default_factory=list)  # where the output's tensors sit among its leaves
    out_leaves: int = 0
    replayed: list[str] = field(default_factory=list)


@dataclass
class Plan:
    groups: list[Group]
    member_group: dict[str, Group] = field(default_factory=dict)

    @property
    def replays(self) -> int:
        return sum(len(g.replayed) for g in self.groups)


def find_groups(model: torch.nn.Module) -> list[Group]:
    """Runs of structurally identical siblings in the model's ModuleLists and Sequentials."""
    groups: list[Group] = []
    claimed: set[str] = set()
    occurrences: dict[int, int] = {}
    for _, obj in [*model.named_modules(remove_duplicate=False), *model.named_parameters(remove_duplicate=False),
                   *model.named_buffers(remove_duplicate=False)]:
        occurrences[id(obj)] = occurrences.get(id(obj), 0) + 1
    for path, container in model.named_modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)) or any(
                path == c or path.startswith(c + ".") for c in claimed):
            continue
        by_structure: dict[Any, list[str]] = {}
        for name, child in container.named_children():
            structure = None if _shared(child, occurrences) else _structure(child)
            if structure is not None:
                by_structure.setdefault(structure, []).append(f"{path}.{name}" if path else name)
        for names in by_structure.values():
            while len(names) > 1:  # the layers a poison cannot cover form the next group (Gemma 2's two kinds)
                first = model.get_submodule(names[0])
                found = {name: _differing(first, model.get_submodule(name)) for name in names[1:]}
                differing = set().union(*(f for f in found.values() if f))
                if differing and _tests_types(first, {key for _, key in differing}):
                    # type(v) / id(v) would see the poison
                    found = {name: f if not f else None for name, f in found.items()}
                    differing = set()
                members = [name for name, f in found.items() if f is not None]
                if members:
                    groups.append(Group(names[0], members, sorted(differing)))
                    claimed.update([names[0], *members])
                names = [name for name, f in found.items() if f is None]
    return groups


def _tests_types(layer: torch.nn.Module, attributes: set[str]) -> bool:
    """Does the code that names one of ``attributes`` (a method of the layer's classes), or any
    function it names in turn, load the builtin ``type`` or ``id``? A poison cannot answer those
    as its value would."""
    work: list[tuple[types.CodeType, dict, type]] = []
    for module in layer.modules():
        for cls in type(module).__mro__:
            if _torch_class(cls) or cls is object:
                continue
            for method in vars(cls).values():
                if isinstance(method, types.FunctionType) and attributes & _names(method.__code__):
                    work.append((method.__code__, method.__globals__, type(module)))
    seen: set[int] = set()
    while work:
        code, scope, cls = work.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        for instruction in dis.get_instructions(code):
            if (instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and instruction.argval in ("type", "id")
                and instruction.argval not in scope):
                return True
        for name in code.co_names:
            target = scope.get(name) if name in scope else getattr(cls, name, None)
            if isinstance(target, types.FunctionType) and not (target.__module__ or "").startswith("torch"):
                work.append((target.__code__, target.__globals__, cls))
        work.extend((c, scope, cls) for c in code.co_consts if isinstance(c, types.CodeType))
    return False


def _names(code: types.CodeType) -> set[str]:
    """The names a code object and the functions nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _shared(layer: torch.nn.Module, occurrences: dict[int, int]) -> bool:
    """Does the layer hold a module, parameter or buffer the model also reaches another way (tied)?
    Export names such a tensor once, possibly outside the layer, so a copy could not be re-pointed."""
    objects = [*layer.modules(), *layer.parameters(), *layer.buffers()]
    return any(occurrences.get(id(obj), 0) > 1 for obj in objects)


def _structure(layer: torch.nn.Module) -> Optional[tuple]:
    """What identical layers share; None for a layer that is never replayed (hooks, an instance forward)."""
    rows = []
    for name, module in layer.named_modules(remove_duplicate=False):
        if module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module):
            return None
        tensors = tuple((kind, key,
                         None if t is None
                         else (tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad,
                               key in module._non_persistent_buffers_set))
                        for kind, table in (("p", module._parameters), ("b", module._buffers))
                        for key, t in table.items())
        attributes = tuple(sorted(k for k in vars(module) if k not in _MODULE_INTERNALS))
        rows.append((name, type(module), module.training, tensors, attributes))
    return tuple(rows)


def _torch_class(cls: type) -> bool:
    return (cls.__module__ or "").startswith("torch.")


def _differing(first: torch.nn.Module, other: torch.nn.Module) -> Optional[set[tuple[str, str]]]:
    """The plain attributes in which ``other`` differs from ``first``; None if they may not be poisoned
    (a difference in one of torch's modules, whose forward reads them)."""
    found = set()
    others = dict(other.named_modules(remove_duplicate=False))
    for name, module in first.named_modules(remove_duplicate=False):
        twin = others[name]
        for key, value in vars(module).items():
            if key in _MODULE_INTERNALS or _same(value, vars(twin)[key]):
                continue
            if _torch_class(type(module)) or not _poisonable(value, vars(twin)[key]):
                return None
            found.add((name, key))
    return found


def _poisonable(a: Any, b: Any) -> bool:
    """Can a poison stand for both values? Not when ``type(v) is ...`` or ``v is None`` / ``is True``
    / an enum member could tell them apart: identity and type tests cannot be intercepted."""
    return (type(a) is type(b)
            and not any(v is None or v is Ellipsis or isinstance(v, (bool, enum.Enum)) for v in (a, b)))


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (float, complex)):
        return repr(a) == repr(b)  # 0.0 and -0.0 differ (copysign tells them apart)
    if isinstance(a, _PLAIN):
        return a == b
    if isinstance(a, (tuple, list)) and len(a) == len(b):
        return all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, functools.partial):  # transformers' activations: partial(F.gelu, approximate="tanh") per instance
        return _same(a.func, b.func) and _same(a.args, b.args) and _same(a.keywords, b.keywords)
    return False


def _meta(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device


def _context() -> tuple:
    """The modes a call's ops depend on besides its arguments: grad, inference, autocast."""
    autocast = tuple((device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                     for device in ("cpu", "cuda"))
    return torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast


@contextlib.contextmanager
def recording(model: torch.nn.Module, groups: list[Group]) -> Iterator[Plan]:
    """While exporting: representatives marked and poisoned, members replayed (restored afterwards)."""
    plan = Plan(groups, {m: g for g in groups for m in g.members})
    saved: list[tuple[torch.nn.Module, str, Any]] = []
    poisons: list[_Poison] = []
    wrapped: list[torch.nn.Module] = []
    try:
        for group in groups:
            rep = model.get_submodule(group.representative)
            for path, key in group.differing:
                module = rep.get_submodule(path) if path else rep
                saved.append((module, key, vars(module)[key]))
                poisons.append(_Poison(vars(module)[key]))
                object.__setattr__(module, key, poisons[-1])
            rep.forward = _representative_forward(rep, group)  # type: ignore[method-assign]
            wrapped.append(rep)
            for name in group.members:
                member = model.get_submodule(name)
                member.forward = _member_forward(member, name, group)  # type: ignore[method-assign]
                wrapped.append(member)
        _ACTIVE.append(plan)
        _READS.clear()
        yield plan
    except _ReadDuringReuse as exc:
        raise ReuseAbandoned(f"a layer attribute that differs between layers was read ({exc})") from exc
    finally:
        if _ACTIVE and _ACTIVE[-1] is plan:
            _ACTIVE.pop()
        for module in wrapped:
            vars(module).pop("forward", None)
        for module, key, value in saved:
            object.__setattr__(module, key, value)
        copied = _reclaim(poisons)
    if _READS:
        raise ReuseAbandoned(f"a layer attribute that differs between layers was read ({_READS[0]})")
    if copied:
        raise ReuseAbandoned(f"a layer kept an attribute that differs between layers (in a {copied})")


def _reclaim(poisons: list[_Poison]) -> Optional[str]:
    """Put the original back wherever a forward stored a poison (``self.i = self.layer_idx``,
    ``LOG.append(self.layer_idx)``): a list, a dict, an object's ``__dict__``; what held one, if any.
    Only ``poisons`` should refer to them now, which the reference count tells cheaply."""
    if all(sys.getrefcount(p) <= 3 for p in poisons):  # the list, the loop variable, the argument
        return None
    held = None
    frozen = gc.get_freeze_count()  # get_referrers does not search frozen objects (qlint.api freezes the
    if frozen:                      # model and the modules while it is analysed): search them too
        gc.unfreeze()
    try:
        holders = gc.get_referrers(*poisons)
    finally:
        if frozen:
            gc.freeze()
    for holder in holders:
        if holder is poisons or isinstance(holder, types.FrameType):
            continue
        if isinstance(holder, list):
            holder[:] = [_original(v) for v in holder]
        elif isinstance(holder, dict):
            for key, value in list(holder.items()):
                holder[key] = _original(value)
        held = held or type(holder).__name__
    return held or "an object qlint could not restore"


def _original(value: Any) -> Any:
    return object.__getattribute__(value, "_qlint_original") if type(value) is _Poison else value


def _symbolic_size(node: fx.Node) -> bool:
    """A length of a dynamic export (``sym_size`` of an input, arithmetic on it): the same symbol
    for every layer whose call matched the representative's shapes, so a copy may read it too."""
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def _representative_forward(rep: torch.nn.Module, group: Group) -> Any:
    original = type(rep).forward.__get__(rep)

    def forward(*args: Any, **kwargs: Any) -> Any:
        group.calls += 1
        if group.calls > 1:
            raise ReuseAbandoned(f"`{group.representative}` is called more than once")
        leaves, group.in_spec = pytree.tree_flatten((args, kwargs))
        group.in_constants = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        group.in_metas = [_meta(v) for v in leaves if isinstance(v, torch.Tensor)]
        group.context = _context()
        group.state = _readable_state(rep, group)
        count = iter(range(len(leaves)))
        marked = [_mark(v, f"in:{group.representative}:{next(count)}") if isinstance(v, torch.Tensor) else v
                  for v in leaves]
        args, kwargs = pytree.tree_unflatten(marked, group.in_spec)
        versions = [v._version for v in marked if isinstance(v, torch.Tensor)]
        out = original(*args, **kwargs)
        if versions != [v._version for v in marked if isinstance(v, torch.Tensor)]:
            raise ReuseAbandoned(f"`{group.representative}` writes to one of its arguments in place")
        out_leaves, group.out_spec = pytree.tree_flatten(out)
        if not all(v is None or isinstance(v, torch.Tensor) for v in out_leaves):
            raise ReuseAbandoned(f"`{group.representative}` returns a value that is neither a tensor nor None")
        group.out_leaves = len(out_leaves)
        group.out_positions = [i for i, v in enumerate(out_leaves) if isinstance(v, torch.Tensor)]
        group.out_metas = [_meta(out_leaves[i]) for i in group.out_positions]
        marked_out = list(out_leaves)
        for index, position in enumerate(group.out_positions):
            marked_out[position] = _mark(out_leaves[position], f"out:{group.representative}:{index}")
        return pytree.tree_unflatten(marked_out, group.out_spec)

    return forward


def _readable_state(layer: torch.nn.Module, group: Group) -> list[tuple[str, str, Any]]:
    """What the layer's forward can read besides its arguments and tensors, when it is called:
    every plain attribute of its modules (not the poisoned ones), one level into the plain
    objects they hold (a shared config, a context object a parent updates between calls), and
    the globals its forwards name (a mode flag a parent sets before each call)."""
    poisoned = set(group.differing)
    rows: list[tuple[str, str, Any]] = []
    for path, module in layer.named_modules(remove_duplicate=False):
        for key, value in vars(module).items():
            if key in _MODULE_INTERNALS or (key == "forward" and not path):  # our own wrapper
                continue
            if (path, key) in poisoned and type(value) is _Poison:
                rows.append((path, key, _UNREAD))  # proven unread: any member's value will do
            else:
                rows.append((path, key, _shallow(value)))
        forward = getattr(type(module).forward, "__code__", None)
        scope = getattr(type(module).forward, "__globals__", {})
        for name in forward.co_names if forward is not None else ():
            if name in scope:
                rows.append((f"{type(module).__module__}:", name, _shallow(scope[name])))
    return rows


def _shallow(value: Any) -> Any:
    """A value, with the contents of a mutable container or plain object (one level) beside it."""
    if isinstance(value, (dict, list, set)):
        return _Held(value, list(value.items()) if isinstance(value, dict) else list(value))
    if hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type, types.ModuleType,
                                                             types.FunctionType, types.BuiltinFunctionType,
                                                             functools.partial)):
        return _Held(value, list(vars(value).items()))
    return value


def _same_state(member: list, representative: list) -> bool:
    return len(member) == len(representative) and all(
        x[:2] == y[:2] and (y[2] is _UNREAD or _same_held(x[2], y[2])) for x, y in zip(member, representative))


def _same_held(a: Any, b: Any) -> bool:
    """Equal values; a container or object held by both, with equal contents now."""
    if isinstance(a, _Held) and isinstance(b, _Held):
        if a.value is not b.value and not _same(a.value, b.value):
            return False
        return len(a.contents) == len(b.contents) and all(x is y or _same(x, y) for x, y in zip(a.contents, b.contents))
    return not isinstance(a, _Held) and not isinstance(b, _Held) and _same(a, b)


@dataclass
class _Held:
    value: Any
    contents: list


_UNREAD = object()


def _member_forward(member: torch.nn.Module, name: str, group: Group) -> Any:
    original = type(member).forward.__get__(member)

    def forward(*args: Any, **kwargs: Any) -> Any:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        same = (group.calls == 1 and group.out_spec is not None and spec == group.in_spec and tensors
                and [_meta(t) for t in tensors] == group.in_metas and _context() == group.context
                and all(isinstance(v, torch.Tensor) or (isinstance(v, _PLAIN) and _same(v, c))
                        for v, c in zip(leaves, group.in_constants))
                and _same_state(_readable_state(member, group), group.state))
        if not same:
            return original(*args, **kwargs)  # traced for real
        group.replayed.append(name)
        outs = iter(_replay(tensors, name))
        out_leaves: list[Any] = [None] * group.out_leaves
        for position in group.out_positions:
            out_leaves[position] = next(outs)
        return pytree.tree_unflatten(out_leaves, group.out_spec)

    return forward


# --- after the export ------------------------------------------------------------------------------


def expand(gm: fx.GraphModule, model: torch.nn.Module, plan: Plan) -> None:
    """Replace every replay by a copy of its representative's ops; remove the markers.

    Raises ReuseAbandoned when a representative's ops are not a closed region of the graph."""
    graph = gm.graph
    for name, sub in gm.named_modules():
        if (sub is not gm and isinstance(sub, fx.GraphModule)
            and any(n.target in (MARK, REPLAY) for n in sub.graph.nodes)):
            raise ReuseAbandoned(f"a layer was called inside the body `{name}` of a higher-order op")
    written = next((n for n in graph.nodes if n.op == "call_function"
                    and getattr(getattr(n.target, "_schema", None), "is_mutable", False)), None)
    if written is not None:  # a buffer update or an input write is not inside the copied ops
        raise ReuseAbandoned(f"the graph writes in place ({written.target})")
    marks = {node.args[1]: node for node in graph.nodes if node.op == "call_function" and node.target is MARK}
    replays = [node for node in graph.nodes if node.op == "call_function" and node.target is REPLAY]
    attributes: dict[str, fx.Node] = {n.target: n for n in graph.nodes if n.op == "get_attr"}  # type: ignore[misc]
    for group in plan.groups:
        mine = [r for r in replays if plan.member_group.get(r.args[1]) is group]
        if not mine:
            continue
        region, inputs, outputs = _region(group, marks)
        for replay in mine:
            _copy_region(gm, model, group, replay, region, inputs, outputs, attributes)
    for node in marks.values():
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
    if any(node.target is REPLAY for node in graph.nodes if node.op == "call_function"):
        raise ReuseAbandoned("a replayed layer's representative left no ops in the graph")
    renumber(gm)


def renumber(gm: fx.GraphModule) -> None:
    """Name the ops densely in graph order (``linear``, ``linear_1``, ...; export skips the names of
    the ops it removed), so that a graph with copied layers and a full trace read the same. The
    names are reassigned in place from a fresh namespace; placeholders, attributes and the output
    keep theirs (claimed first)."""
    graph = gm.graph
    names = fx.graph._Namespace()
    kept = [node for node in graph.nodes if node.op != "call_function"]
    for node in kept:
        names.create_name(node.name, node)
    for node in graph.nodes:
        if node.op == "call_function":
            node.name = names.create_name(re.sub(r"_\d+$", "", node.name), node)
    graph._graph_namespace = names
    graph.lint()
    gm.recompile()


def _region(group: Group, marks: dict[str, fx.Node]) -> tuple[list[fx.Node], dict[int, fx.Node], dict[int, fx.Node]]:
    """The representative's ops (those whose module stack holds its call), its marked inputs by
    tensor index and its marked outputs by output index; checked closed."""
    prefix = f"in:{group.representative}:"
    inputs = {int(role[len(prefix):]): node for role, node in marks.items() if role.startswith(prefix)}
    prefix_out = f"out:{group.representative}:"
    outputs = {int(role[len(prefix_out):]): node for role, node in marks.items() if role.startswith(prefix_out)}
    if len(outputs) != len(group.out_metas):
        raise ReuseAbandoned(f"an output of `{group.representative}` is not in the graph")
    keys = {key for node in outputs.values() for key, (path, _) in (node.meta.get("nn_module_stack") or {}).items()
            if clean_path(path) == group.representative}
    if len(keys) != 1:
        raise ReuseAbandoned(f"the call of `{group.representative}` is not one module call in the graph")
    key = keys.pop()
    for node in outputs.values():
        if _aliases(node.args[0], set(inputs.values())):
            raise ReuseAbandoned(f"an output of `{group.representative}` is a view of its input")
    marked = set(inputs.values()) | set(outputs.values())
    graph_nodes = list(next(iter(outputs.values())).graph.nodes)
    region = [n for n in graph_nodes if n.op == "call_function" and n not in marked
              and key in (n.meta.get("nn_module_stack") or {})]
    inside = set(region)
    for node in region:
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            raise ReuseAbandoned(f"`{group.representative}` holds a higher-order op ({node.target.name()}), whose body "
                                 "reads its own state")
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            raise ReuseAbandoned(f"`{group.representative}` writes in place ({node.target})")
        for source in node.all_input_nodes:
            if (source not in inside and source not in inputs.values() and source.op != "get_attr"
                and not _symbolic_size(source)):
                raise ReuseAbandoned(f"`{group.representative}` reads `{source.name}`, which is not one of its "
                                     "arguments")
        for user in node.users:
            if user not in inside and user not in outputs.values():
                raise ReuseAbandoned(f"`{group.representative}`'s `{node.name}` is used outside the layer")
    return region, inputs, outputs


def _aliases(node: fx.Node, inputs: set[fx.Node]) -> bool:
    """Is ``node`` one of ``inputs`` or a view of one (ops whose result aliases an argument)?"""
    while node not in inputs:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None or not schema.returns or schema.returns[0].alias_info is None or not node.args:
            return False
        node = node.args[0]
    return True


def _copy_region(gm: fx.GraphModule, model: torch.nn.Module, group: Group, replay: fx.Node, region: list[fx.Node],
                 inputs: dict[int, fx.Node], outputs: dict[int, fx.Node], attributes: dict[str, fx.Node]) -> None:
    graph = gm.graph
    member = replay.args[1]
    arguments = replay.args[0]
    env: dict[fx.Node, Any] = {node: arguments[index] for index, node in inputs.items()}

    def remap(node: fx.Node) -> Any:
        if node in env:
            return env[node]
        if (node.op == "get_attr"
            and (node.target == group.representative or node.target.startswith(group.representative + "."))):
            return _attribute(gm, model, member + node.target[len(group.representative):], node, attributes)
        return node

    stacks: dict[tuple, dict] = {}
    with graph.inserting_before(replay):
        for node in region:
            copy = graph.node_copy(node, remap)
            stack = node.meta.get("nn_module_stack") or {}
            key = tuple(stack.items())
            if key not in stacks:
                stacks[key] = _renamed(stack, group.representative, member)
            copy.meta = {**node.meta, "nn_module_stack": stacks[key]}
            env[node] = copy
    for user in list(replay.users):
        if user.op != "call_function" or user.target is not operator.getitem:
            raise ReuseAbandoned(f"`{member}`'s replay is used whole")
        user.replace_all_uses_with(env[outputs[user.args[1]].args[0]])
        graph.erase_node(user)
    graph.erase_node(replay)


def _attribute(gm: fx.GraphModule, model: torch.nn.Module, target: str, like: fx.Node,
               attributes: dict[str, fx.Node]) -> fx.Node:
    """A get_attr node for the member's own tensor (the model's object, registered on ``gm`` if absent)."""
    if target in attributes:
        return attributes[target]
    owner_path, _, name = target.rpartition(".")
    try:
        attribute(gm, target)
    except AttributeError:
        tensor = attribute(model, target)
        owner = gm
        for part in owner_path.split(".") if owner_path else ():
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        if isinstance(tensor, torch.nn.Parameter):
            owner.register_parameter(name, tensor)
        elif isinstance(tensor, torch.Tensor):
            owner.register_buffer(name, tensor)
        else:
            raise ReuseAbandoned(f"`{target}` is not a tensor of the model") from None
    with gm.graph.inserting_before(like):
        node = gm.graph.get_attr(target)
    node.meta = dict(like.meta)
    attributes[target] = node
    return node


def _renamed(stack: dict[str, tuple[str, Any]], old: str, new: str) -> dict[str, tuple[str, Any]]:
    """The module stack of a copied op: the representative's path (and below) renamed to the member's."""
    out = {}
    for key, (path, cls) in stack.items():
        clean = clean_path(path)
        if clean == old or clean.startswith(old + "."):
            out[f"{key}@{new}"] = (new + clean[len(old):], cls)
        else:
            out[key] = (path, cls)
    return out
