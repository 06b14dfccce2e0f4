"""The registry checks itself: every entry resolves, names real arguments, and its transfer
obeys the laws every transfer must, on every ATen overload of every op it claims.

The laws, for each overload called with every tensor argument input-dependent:

* the transfer runs (an error it raises is reported as unknown, never a crash), and its result
  has the op's output structure (one Growth per tensor the schema returns);
* a dependent argument it did not read makes the result unknown (``Call.unread``);
* raising one argument's exponent never lowers the result's (monotone: Theorem 9's
  operations all are), and an unknown argument leaves the result unknown unless the
  entry reads it as a selector (indices, masks) or for its shape only;
* a numeric parameter moved off its default (``eps=-1``, ``p=0.5``, ``beta=-1``,
  ``min=inf``) is either one the entry declares harmless or yields a result the rule
  computed with it, otherwise unknown.
"""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
from typing import Any, Iterator, Optional

import pytest
import torch
import torch.fx as fx

from qlint.core.domain import Growth
from qlint.core.graph import annotate, facts
from qlint.core.ops import NEUTRAL, Call
from qlint.core.propagate import run_transfer, structure_mismatch
from qlint.registry import default, entries, resolve, spellings

REGISTRY = default()


def test_every_target_resolves():
    assert REGISTRY.unresolved == []


def test_library_targets_resolve_and_are_found_by_their_own_name():
    """A dotted-path target outside torch (deferred when its library is not imported yet) must
    exist and be reachable by its object's __module__.__qualname__."""
    library = [(t, p) for p in REGISTRY.primitives for t in p.targets
               if not t.startswith(("aten.", "torch.", "method:", "module:torch.")) and t.removeprefix("module:").split(".")[0] not in sys.stdlib_module_names]
    assert any(t.startswith("torchvision.") for t, _ in library)
    for target, primitive in library:
        kind, obj = resolve(target)
        assert f"{'module:' if kind == 'module' else ''}{obj.__module__}.{obj.__qualname__}" == target
        assert REGISTRY.lookup("call_module" if kind == "module" else "call_function", obj) is primitive, target


def test_building_the_registry_does_not_import_torchvision():
    code = ("import sys; from qlint.registry import default; r = default(); assert 'torchvision' not in sys.modules; "
            "import torchvision; from torchvision.ops import stochastic_depth as sd; "
            "print(len(r.deferred), r.lookup('call_function', sd).id)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, found = done.stdout.split()
    assert int(count) > 0 and found == REGISTRY.lookup("call_function", resolve("torchvision.ops.stochastic_depth.stochastic_depth")[1]).id


def test_a_look_alike_of_a_deferred_target_is_unknown():
    def stochastic_depth(input, p, mode, training=True):
        return input * 1e3

    stochastic_depth.__module__ = "torchvision.ops.stochastic_depth"
    assert REGISTRY.lookup("call_function", stochastic_depth) is None


def test_every_op_has_a_spelling_in_this_torch():
    missing = [(table["id"], op) for table in entries() for op in table.get("ops", []) if not any(resolve(t) for t in spellings(op) if not t.startswith("method:")) and not hasattr(torch.Tensor, op)]
    assert missing == []


def _aten_packets() -> Iterator[tuple[str, Any]]:
    for kind, name in REGISTRY.keys():
        if kind == "op" and name.startswith("aten::"):
            packet = _packet(name)
            yield REGISTRY.lookup("call_function", packet).id, packet


def _packet(name: str) -> Any:
    namespace, _, op = name.partition("::")
    return getattr(getattr(torch.ops, namespace), op, None)


def _argument_names(primitive_id: str) -> set[str]:
    """Every argument name any spelling of the entry's ops takes (schemas and signatures)."""
    names: set[str] = {"input", "self"}
    primitive = REGISTRY.by_id[primitive_id]
    for target in primitive.targets:
        key = resolve(target)
        if key is None:
            continue
        obj = _packet(key[1]) if key[0] == "op" else key[1]
        if obj is None:
            continue  # a library's custom op that is not loaded in this process
        if isinstance(obj, torch._ops.OpOverloadPacket):
            for overload in obj.overloads():
                names |= {a.name for a in getattr(obj, overload)._schema.arguments}
        elif key[0] == "module":
            names |= set(inspect.signature(obj.forward).parameters) | set(inspect.signature(obj.__init__).parameters)
        else:
            try:
                names |= set(inspect.signature(obj).parameters)
            except (TypeError, ValueError):
                pass
    return names | {alias for alias, _ in primitive.aliases} | {name for _, name in primitive.aliases}


@pytest.mark.parametrize("table", entries(), ids=lambda t: t["id"])
def test_declared_argument_names_exist(table):
    """A typo in ``params`` / ``meta_args`` would silently accept nothing (or the wrong thing)."""
    if not table.get("ops") and not table.get("targets") and not table.get("modules"):
        pytest.skip("no targets")
    declared = set(table.get("params", [])) - {"*"} | set(table.get("meta_args", []))
    assert declared <= _argument_names(table["id"]), sorted(declared - _argument_names(table["id"]))


# --- the transfer laws on every overload ----------------------------------------------------------

_REQUIRED = {"int": 1, "SymInt": 1, "float": 0.5, "bool": False, "List[int]": [1], "str": "none", "number": 1.0,
             "ScalarType": torch.float32}
_MOVED = {"float": (-1.0, 0.5, math.inf, 0.0), "int": (-1, 0, 3), "bool": (True, False), "number": (-1.0, math.inf, 0.0)}


def _kind(argument: Any) -> str:
    kind = str(argument.type)
    return kind[len("Optional[") : -1] if kind.startswith("Optional[") and kind != "Optional[Tensor]" else kind


def _call(overload: Any) -> Optional[tuple[fx.GraphModule, fx.Node, list[fx.Node], dict[str, tuple[str, Any]]]]:
    """One graph calling ``overload`` with a placeholder for every tensor; None when unbuildable."""
    schema = overload._schema
    if schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return None
    graph = fx.Graph()
    tensors: list[fx.Node] = []
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    numeric: dict[str, tuple[str, Any]] = {}

    def placeholder() -> fx.Node:
        node = graph.placeholder(f"t{len(tensors)}")
        tensors.append(node)
        return node

    for a in schema.arguments:
        kind, optional = _kind(a), str(a.type).startswith("Optional[")
        if kind in ("Tensor", "Optional[Tensor]"):
            value: Any = placeholder()
        elif kind in ("List[Tensor]", "List[Optional[Tensor]]"):
            value = [placeholder(), placeholder()]
        elif a.has_default_value() or optional:
            if kind in _MOVED:
                numeric[a.name] = (kind, a.default_value if a.has_default_value() else None)
            if a.has_default_value():
                continue
            value = None
        elif kind in _REQUIRED:
            value = _REQUIRED[kind]
            if kind in _MOVED:
                numeric[a.name] = (kind, value)
        else:
            return None
        (kwargs.__setitem__(a.name, value) if a.kwarg_only else args.append(value))
    if not tensors:
        return None
    node = graph.call_function(overload, tuple(args), kwargs)
    graph.output(node)
    module = fx.GraphModule(torch.nn.Module(), graph)
    annotate(module, REGISTRY)
    node = next(n for n in module.graph.nodes if n.op == "call_function")
    return module, node, [n for n in module.graph.nodes if n.op == "placeholder"], numeric


def _overloads() -> Iterator[tuple[str, Any]]:
    for primitive_id, packet in _aten_packets():
        if REGISTRY.by_id[primitive_id].unbounded:
            continue
        for name in packet.overloads():
            yield f"{primitive_id}:{packet._qualified_op_name}.{name}", getattr(packet, name)


OVERLOADS = list(_overloads())
CASES = [(label, overload) for label, overload in OVERLOADS if _call(overload) is not None]  # out= variants mutate: no transfer


_ABSENT = object()


def _q(value: Any) -> Optional[float]:
    growths = [v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, Growth)]
    if any(g.q is None for g in growths):
        return None
    return max((g.q for g in growths), default=0.0)


def _at_most(a: Optional[float], b: Optional[float]) -> bool:
    rank = lambda q: math.inf if q is None else q  # noqa: E731  unknown ranks with inf: never below a bound
    return rank(a) <= rank(b)


def test_the_laws_reach_every_entry_with_an_aten_op():
    reached = {label.split(":")[0] for label, _ in CASES}
    assert reached == {primitive_id for primitive_id, _ in _aten_packets() if not REGISTRY.by_id[primitive_id].unbounded}
    assert len(CASES) > 300, len(CASES)


@pytest.mark.parametrize("label, overload", CASES, ids=[label for label, _ in CASES])
def test_transfer_laws(label, overload):
    module, node, placeholders, numeric = _call(overload)
    info = facts(node)
    assert info.primitive is not None, label
    base = {p: Growth(1.0) for p in placeholders}
    arguments = {name: fx.node.map_arg(v, lambda n: base[n]) for name, v in info.bound.arguments.items()}
    try:
        raw = info.primitive.transfer(Call(node, arguments, info.bound.defaults), info.primitive)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError):
        raw = None
    if raw is not None:
        assert structure_mismatch(raw, node, info.primitive) is None, f"{label}: {structure_mismatch(raw, node, info.primitive)}"
    value, call = run_transfer(node, info, base, training=False)
    q = _q(value)
    read = call.read | info.primitive.meta_args
    for name, argument in info.bound.arguments.items():
        nodes = [n for n in fx.node.map_aggregate(argument, lambda a: a) if isinstance(n, fx.Node)] if isinstance(argument, (list, tuple)) else [argument] if isinstance(argument, fx.Node) else []
        if not nodes:
            continue
        if q is not None:
            assert name in read, f"{label}: `{name}` depends on the input, was not read, and the result is known"
        raised = {**base, **{n: Growth(3.0) for n in nodes}}
        assert _at_most(q, _q(run_transfer(node, info, raised, training=False)[0])), f"{label}: raising `{name}` lowered q"
        poisoned = {**base, **{n: Growth(None, culprit="test") for n in nodes}}
        if name not in info.primitive.meta_args | call.selected and "total" not in info.primitive.family:
            assert _q(run_transfer(node, info, poisoned, training=False)[0]) is None, f"{label}: unknown `{name}` was certified away"
    for name, (kind, default_value) in numeric.items():
        for moved in _MOVED[kind]:
            if moved == default_value:
                continue
            original = info.bound.arguments.get(name, _ABSENT)
            info.bound.arguments[name] = moved
            try:
                moved_value, moved_call = run_transfer(node, info, base, training=False)
            finally:
                if original is _ABSENT:
                    info.bound.arguments.pop(name)
                else:
                    info.bound.arguments[name] = original
            accepted = info.primitive.params | NEUTRAL
            if _q(moved_value) is not None and "*" not in accepted:
                assert name in moved_call.read or name in accepted, f"{label}: `{name}={moved}` was ignored"
