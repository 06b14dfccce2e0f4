"""Capture a model's graph: torch.fx first, torch.export when Python control flow stops it.

``symbolic_trace`` keeps nn modules as call_module nodes and needs no inputs, but
cannot run Python loops over tensor shapes (the usual selective scan). torch.export
(non-strict) runs the example inputs, so such loops unroll; make_fx is the last
resort. Every path keeps each node's module path (``nn_module_stack``) and stack
trace, which is how blocks get their names and findings their source lines.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import torch
import torch.fx as fx

TRACERS = ("symbolic_trace", "export", "make_fx")


class TraceFailure(Exception):
    """Every tracer failed; the message is one actionable line."""


@dataclass
class TracedGraph:
    """A traced model: the runnable GraphModule and how it was obtained."""

    module: fx.GraphModule
    tracer: str
    attempts: list[str] = field(default_factory=list)

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph


class _Tracer(fx.Tracer):
    """symbolic_trace that records stack traces and treats declared classes as leaves."""

    def __init__(self, leaf_classes: Iterable[type] = ()) -> None:
        super().__init__()
        self.record_stack_traces = True
        self.leaf_classes = tuple(leaf_classes)

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if self.leaf_classes and isinstance(m, self.leaf_classes):
            return True
        return super().is_leaf_module(m, module_qualified_name)


_MUTATING_FUNCTIONS = {operator.setitem, operator.iadd, operator.imul, operator.isub, operator.itruediv}


def _mutates_shared_value(graph: fx.Graph) -> Optional[fx.Node]:
    """An in-place op whose mutated operand is read again later hides a data dependence.

    fx records ``x[i] = y`` or ``x.add_(y)`` as a node, but later readers of ``x`` point
    at the old node; the propagation would miss ``y``. Such graphs go to torch.export,
    which functionalises mutation.
    """
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in graph.nodes:
        in_place = (node.op == "call_function" and node.target in _MUTATING_FUNCTIONS) or (
            node.op == "call_method" and node.target.endswith("_") and not node.target.endswith("__")
        )
        if not in_place or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        mutated = node.args[0]
        if any(order[user] > order[node] for user in mutated.users if user is not node):
            return node
    return None


def _symbolic_trace(model: torch.nn.Module, leaf_classes: Sequence[type]) -> fx.GraphModule:
    tracer = _Tracer(leaf_classes)
    graph = tracer.trace(model)
    mutation = _mutates_shared_value(graph)
    if mutation is not None:
        raise RuntimeError(f"in-place mutation `{mutation.format_node()}` hides a data dependence")
    return fx.GraphModule(tracer.root, graph, model.__class__.__name__)


def _export(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    program = torch.export.export(model, inputs, strict=False)
    return program.module()


def _make_fx(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        return make_fx(model, record_module_stack=True)(*inputs)
    except TypeError:  # older torch: no record_module_stack
        return make_fx(model)(*inputs)


def capture(
    model: torch.nn.Module,
    inputs: Optional[tuple],
    *,
    prefer: Optional[str] = None,
    leaf_classes: Sequence[type] = (),
) -> TracedGraph:
    """Trace with the first tracer that succeeds (``prefer`` goes first)."""
    order = list(TRACERS)
    if prefer:
        if prefer not in TRACERS:
            raise TraceFailure(f"unknown tracer {prefer!r}; choose one of {', '.join(TRACERS)}")
        order.remove(prefer)
        order.insert(0, prefer)
    attempts: list[str] = []
    errors: list[tuple[str, BaseException]] = []
    for name in order:
        if name != "symbolic_trace" and inputs is None:
            attempts.append(f"{name}: needs example inputs")
            continue
        try:
            if name == "symbolic_trace":
                module = _symbolic_trace(model, leaf_classes)
            elif name == "export":
                module = _export(model, inputs)
            else:
                module = _make_fx(model, inputs)
        except Exception as exc:  # every tracer failure is reported, none is fatal here
            attempts.append(f"{name}: {_first_line(exc)}")
            errors.append((name, exc))
            continue
        return TracedGraph(module=module, tracer=name, attempts=attempts)
    raise TraceFailure(_explain(model, errors, inputs is None))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def _explain(model: torch.nn.Module, errors: list[tuple[str, BaseException]], no_inputs: bool) -> str:
    """One line: which submodule and which Python construct stopped the last tracer."""
    if not errors:
        return "could not trace the model: symbolic_trace needs no inputs but export/make_fx do; give --input-shape"
    name, exc = errors[-1]
    where = _user_frame(exc)
    hint = (
        "give --input-shape so torch.export can unroll it"
        if no_inputs
        else "mark the submodule as an opaque leaf with a declared exponent ([tool.qlint.primitives] or qlint.register)"
    )
    location = f" at {where}" if where else ""
    return f"could not trace {type(model).__name__} ({name}{location}): {_first_line(exc)}; {hint}"


def _user_frame(exc: BaseException) -> Optional[str]:
    """The innermost traceback frame outside torch: the user's construct."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    for frame in reversed(frames):
        if not frame.filename.startswith(torch_dir) and "/qlint/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} `{(frame.line or '').strip()}`"
    return None


def module_path(node: fx.Node) -> str:
    """The path of the innermost module whose forward created this node ('' at top)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    return _clean_path(path)


def module_stack(node: fx.Node) -> list[tuple[str, Any]]:
    """(path, class or class name) from the outermost to the innermost module."""
    stack = node.meta.get("nn_module_stack") or {}
    return [(_clean_path(path), cls) for path, cls in stack.values()]


def _clean_path(path: str) -> str:
    # export writes "L['self'].layers[0]" style paths in some versions
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return re.sub(r"\[(\d+)\]", r".\1", path).strip(".")


def user_frames(node: fx.Node) -> list[tuple[str, int, str]]:
    """(file, line, function) frames of the node's stack trace outside torch."""
    trace = node.meta.get("stack_trace") or getattr(node, "stack_trace", None) or ""
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    frames = []
    for match in _FRAME.finditer(trace):
        file = match.group("file")
        if file.startswith(torch_dir) or "/qlint/trace.py" in file or "/qlint/analysis.py" in file:
            continue
        frames.append((file, int(match.group("line")), match.group("func")))
    return frames
