"""Capture a model's graph: torch.fx first, torch.export when Python control flow stops it.

``symbolic_trace`` keeps nn modules as call_module nodes and needs no inputs, but
cannot run Python loops over tensor shapes (the usual selective scan). torch.export
(non-strict) runs the example inputs, so such loops unroll; make_fx is the last
resort. Every path keeps each node's module path (``nn_module_stack``) and stack
trace, which is how blocks get their names and findings their source lines.
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence

import torch
import torch.fx as fx

from qlint.loader import declared_name

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
    """symbolic_trace that records stack traces and treats declared classes as leaves.

    fx's own ``record_stack_traces`` imports torch._dynamo (2.5 s on a cold start);
    the user's frames are all qlint needs, and walking the stack costs microseconds.
    """

    def __init__(self, leaf_classes: Iterable[type] = ()) -> None:
        super().__init__()
        self.leaf_classes = tuple(leaf_classes)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.stack_trace = _outside_torch_stack()
        return node

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if self.leaf_classes and isinstance(m, self.leaf_classes):
            return True
        return super().is_leaf_module(m, module_qualified_name)


_TORCH_DIR = torch.__file__.rsplit("/", 1)[0]


def _outside_torch_stack() -> str:
    """The current Python stack outside torch and qlint, formatted as fx stack traces are."""
    lines = []
    frame = sys._getframe(2)
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(_TORCH_DIR) and "/qlint/trace.py" not in file:
            lines.append(f'  File "{file}", line {frame.f_lineno}, in {frame.f_code.co_name}')
        frame = frame.f_back
    return "\n".join(reversed(lines))


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


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a model output, in order; anything else (a KV cache object) is dropped."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):  # Hugging Face ModelOutput is an OrderedDict
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


@contextlib.contextmanager
def _tensor_outputs(model: torch.nn.Module) -> Iterator[None]:
    """Make ``model`` return a flat tuple of tensors while it is traced.

    torch.export and make_fx reject outputs that are not pytrees, such as the
    ``DynamicCache`` Hugging Face models return; the analysis only needs the graph, so
    non-tensor outputs are dropped. Patching the instance's ``forward`` (rather than
    wrapping the model) keeps every node's module path relative to the model itself.
    A Hugging Face model does not build that cache at all (``use_cache=False``): it is
    an output only, and building it costs a tenth of the export time.
    """
    own_forward = "forward" in vars(model)
    forward = model.forward
    model.forward = lambda *args, **kwargs: tuple(_tensors(forward(*args, **kwargs)))
    config = getattr(model, "config", None) if is_hugging_face(model) else None
    caching = getattr(config, "use_cache", False) is True
    if caching:
        config.use_cache = False
    try:
        yield
    finally:
        if caching:
            config.use_cache = True
        if own_forward:
            model.forward = forward
        else:
            del model.forward


def _export(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    with _tensor_outputs(model):
        program = torch.export.export(model, inputs, strict=False)
    try:
        return program.module(check_guards=False)  # no `_guards_fn` call: the graph is analysed, not run
    except TypeError:  # torch < 2.9
        return program.module()


def _make_fx(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    def call(*args: Any) -> Any:
        return model(*args)

    call._orig_mod = model  # make_fx records nn_module_stack only for a function that names its module
    with _tensor_outputs(model):
        try:
            return make_fx(call, record_module_stack=True)(*inputs)
        except TypeError:  # older torch: no record_module_stack
            return make_fx(model)(*inputs)


def is_hugging_face(model: torch.nn.Module) -> bool:
    """A transformers PreTrainedModel (checked by name: transformers is not imported)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.") for c in type(model).__mro__)


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
        if name == "symbolic_trace" and not prefer and inputs is not None and is_hugging_face(model):
            attempts.append("symbolic_trace: skipped (Hugging Face models branch on tensor values; torch.export follows them)")
            continue
        try:
            with _quiet():
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


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence tracing chatter: torch logs warnings and prints partial graphs to stderr on
    failure, and qlint explains a failure in one line instead."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')

# (phrases of a tracer's error, the Python construct they mean)
_CONSTRUCTS = (
    (
        ("data-dependent", "_local_scalar_dense", "control flow", "'Proxy'", "Proxy object", "Proxy)"),
        "uses a tensor's value in Python (`if`, `int()`, `.item()`, a loop bound)",
    ),
    (("numpy",), "converts a tensor to NumPy"),
    (("not a known type", "pytree"), "passes a value of a type torch cannot flatten"),
    (("in-place mutation",), "mutates a tensor in place and reads it again"),
)
_TRACER_PREFERENCE = ("export", "make_fx", "symbolic_trace")


def _explain(model: torch.nn.Module, errors: list[tuple[str, BaseException]], no_inputs: bool) -> str:
    """One line: which submodule and which Python construct stopped tracing, and what helps.

    The error explained is torch.export's when there is one (it traces the most), else
    the last tracer's. A construct torch cannot trace is fixed by declaring the
    submodule an opaque leaf; any other exception is the model failing on its inputs.
    """
    if not errors:
        return "could not trace the model: symbolic_trace needs no inputs but export/make_fx do; give --input-shape"
    by_tracer = dict(errors)
    name = next((t for t in _TRACER_PREFERENCE if t in by_tracer), errors[-1][0])
    exc = by_tracer[name]
    path, owner = _failing_submodule(model, exc)
    subject = f"`{path}` ({type(owner).__name__})" if path else "its forward"
    where = _user_frame(exc)
    location = f" at {where}" if where else ""
    text = str(exc)
    construct = next((what for phrases, what in _CONSTRUCTS if any(p in text for p in phrases)), None)
    if construct is None:
        return (
            f"could not trace {type(model).__name__}: {subject}{location} raised {_first_line(exc)} ({name}); "
            "check that the model runs on its example inputs (--traceback shows where)"
        )
    hint = "give --input-shape so torch.export can run it, or " if no_inputs else ""
    leaf = type(owner if path else model)
    key = declared_name(leaf)
    return (
        f"could not trace {type(model).__name__}: {subject}{location} {construct} ({name}); "
        f"{hint}declare its exponent so qlint treats it as an opaque leaf: "
        f"qlint.register({leaf.__name__}, q=..., why=...) or [tool.qlint.primitives] \"{key}\" = {{ q = ..., why = \"...\" }}"
    )


def _failing_submodule(model: torch.nn.Module, exc: BaseException) -> tuple[str, Optional[torch.nn.Module]]:
    """The innermost submodule of ``model`` whose method was running when ``exc`` was raised."""
    paths = {id(module): path for path, module in model.named_modules()}
    found: tuple[str, Optional[torch.nn.Module]] = ("", None)
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module) and paths.get(id(owner)):
            found = (paths[id(owner)], owner)
        tb = tb.tb_next
    return found


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
