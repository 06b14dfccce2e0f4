"""Capture a model's graph faithfully: torch.fx first, torch.export when fx cannot be trusted.

The traced graph must *be* the model, so every path refuses what it cannot see:

- ``symbolic_trace`` keeps nn modules as nodes and needs no inputs, but it never runs
  forward hooks and it records in-place writes without their aliasing. A model with
  forward hooks or pre-hooks (on any module, or global ones), or whose graph mutates a
  value that is read elsewhere, a view, an input or a buffer, or writes through ``out=``,
  goes to torch.export instead. Parameters are symbolic under fx (``float(self.p)``
  fails the trace); a torch.nn module is a leaf only when the registry has a rule for
  its exact class, every other one is traced through.
- ``torch.export`` (non-strict) runs the real forward with hooks on fake parameters, so
  ``.item()`` / ``float()`` / ``bool()`` of anything parameter-derived fails the trace
  instead of becoming a constant; its graph is functionalised when it has in-place ops.
- ``make_fx`` runs on fake tensors with the parameters passed in (never baked in).

When example inputs exist, the graph is run on them and compared with the eager model
(:func:`compare_with_eager`); a graph that differs is not used.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import operator
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

import torch
import torch.fx as fx

from qlint.core.errors import QlintError

from qlint.core.ops import declared_name

TRACERS = ("symbolic_trace", "export", "make_fx")


class TraceFailure(QlintError):
    """No tracer gave a faithful graph; the message is one actionable line."""


@dataclass
class TracedGraph:
    """A traced model: the runnable GraphModule and how it was obtained."""

    module: fx.GraphModule
    tracer: str
    attempts: list[str] = field(default_factory=list)
    graph_check: str = "not compared: no example inputs"
    data_inputs: Optional[list[fx.Node]] = None

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph


class _Tracer(fx.Tracer):
    """symbolic_trace that records user stack frames and keeps only registered modules as leaves.

    fx's own ``record_stack_traces`` imports torch._dynamo (2.5 s on a cold start); the
    user's frames are all qlint needs, and walking the stack costs microseconds.
    """

    def __init__(self, registry: Any) -> None:
        super().__init__()
        self.registry = registry

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.stack_trace = _outside_torch_stack()
        return node

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return self.registry.is_leaf(type(m))


_TORCH_DIR = torch.__file__.rsplit("/", 1)[0]


def _outside_torch_stack() -> str:
    """The current Python stack outside torch and this module, formatted as fx stack traces are."""
    lines = []
    frame = sys._getframe(2)
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(_TORCH_DIR) and not file.endswith("/qlint/core/trace.py"):
            lines.append(f'  File "{file}", line {frame.f_lineno}, in {frame.f_code.co_name}')
        frame = frame.f_back
    return "\n".join(reversed(lines))


# --- what fx cannot see ----------------------------------------------------------------------------


def forward_hooks(model: torch.nn.Module) -> Optional[str]:
    """Where forward hooks or pre-hooks are registered (fx would skip them), if anywhere."""
    module_globals = torch.nn.modules.module
    if getattr(module_globals, "_global_forward_hooks", None) or getattr(module_globals, "_global_forward_pre_hooks", None):
        return "global forward hooks"
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
            kind = "forward hooks" if module._forward_hooks else "forward pre-hooks"
            return f"{kind} on `{name or type(model).__name__}`"
    return None


_IN_PLACE_FUNCTIONS = {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow,
                       operator.iand, operator.ior, operator.ixor, operator.imatmul, operator.ifloordiv, operator.imod}
_VIEWS = {"getitem", "view", "reshape", "transpose", "permute", "t", "select", "narrow", "expand", "expand_as", "unsqueeze",
          "squeeze", "split", "chunk", "unbind", "as_strided", "diagonal", "unflatten", "flatten", "view_as", "movedim",
          "swapaxes", "real", "imag", "view_as_real", "view_as_complex", "unfold", "T", "mT", "detach", "alias",
          "__getitem__", "split_with_sizes", "tensor_split", "indices", "values", "H", "mH", "data"}


def unsafe_mutation(graph: fx.Graph) -> Optional[fx.Node]:
    """An in-place write whose effect the graph does not show (fx keeps pointing readers at
    the old value): on a value read elsewhere, on a view, on an input, on a buffer that is
    read, or through ``out=``. A write nothing else can observe is harmless."""
    for node in graph.nodes:
        target = _mutated(node)
        if target is None:
            continue
        if node.kwargs.get("out") is not None:
            return node
        if not isinstance(target, fx.Node):
            continue
        others = [u for u in target.users if u is not node]
        if target.op == "get_attr":
            if others or node.users:
                return node
            continue
        if target.op == "placeholder" or others or _is_view(target):
            return node
    return None


def _mutated(node: fx.Node) -> Any:
    if node.kwargs.get("out") is not None:
        return node.kwargs["out"]
    if node.op == "call_function" and node.target in _IN_PLACE_FUNCTIONS:
        return node.args[0] if node.args else None
    if node.op == "call_method" and isinstance(node.target, str) and node.target.endswith("_") and not node.target.endswith("__"):
        return node.args[0] if node.args else None
    if node.kwargs.get("inplace") is True or (node.op == "call_function" and getattr(node.target, "__name__", "").endswith("_")
                                              and not getattr(node.target, "__name__", "").endswith("__")):
        return node.args[0] if node.args else None
    return None


def _is_view(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _VIEWS
    if node.op == "call_function":
        if node.target is operator.getitem or node.target is getattr:
            return True
        return getattr(node.target, "__name__", "") in _VIEWS
    return False


def _defaults_beyond(model: torch.nn.Module, inputs: Optional[tuple]) -> Optional[dict[str, Any]]:
    """The forward parameters the example call ``model(*inputs)`` leaves at their defaults.

    symbolic_trace makes every forward parameter a placeholder, i.e. a model input; a flag
    like ``is_causal=False`` would then count as input-dependent. The example call fixes
    them at their defaults, so they are traced as those constants (fx's concrete_args).
    Without example inputs every parameter stays an input.
    """
    if inputs is None:
        return None
    parameters = list(inspect.signature(model.forward).parameters.values())
    return {
        p.name: p.default
        for p in parameters[len(inputs) :]
        if p.default is not inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    } or None


def _symbolic_trace(model: torch.nn.Module, registry: Any, inputs: Optional[tuple]) -> fx.GraphModule:
    hooks = forward_hooks(model)
    if hooks is not None:
        raise RuntimeError(f"the model has {hooks}, which symbolic_trace would skip")
    tracer = _Tracer(registry)
    graph = tracer.trace(model, concrete_args=_defaults_beyond(model, inputs))
    mutation = unsafe_mutation(graph)
    if mutation is not None:
        raise RuntimeError(f"in-place mutation `{mutation.format_node()}` is not visible to symbolic_trace's readers")
    return fx.GraphModule(tracer.root, graph, model.__class__.__name__)


# --- export and make_fx -------------------------------------------------------------------------


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a model output, in order; anything else (a KV cache object) is dropped."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):  # Hugging Face ModelOutput is an OrderedDict
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


def is_hugging_face(model: torch.nn.Module) -> bool:
    """A transformers PreTrainedModel (checked by name: transformers is not imported)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.") for c in type(model).__mro__)


@contextlib.contextmanager
def tensor_outputs(model: torch.nn.Module) -> Iterator[None]:
    """Make ``model`` return a flat tuple of tensors while it is traced.

    torch.export and make_fx reject outputs that are not pytrees, such as the
    ``DynamicCache`` Hugging Face models return; the analysis only needs the graph, so
    non-tensor outputs are dropped. A forward hook registered last does it: the model's
    own forward and hooks (a root hook included) see its real output first, and every
    node's module path stays relative to the model itself. A Hugging Face model does
    not build that cache at all (``use_cache=False``): it is an output only.
    """
    handle = model.register_forward_hook(lambda module, args, output: tuple(_tensors(output)))
    config = getattr(model, "config", None) if is_hugging_face(model) else None
    caching = getattr(config, "use_cache", False) is True
    if caching:
        config.use_cache = False
    try:
        yield
    finally:
        if caching:
            config.use_cache = True
        handle.remove()


def _export(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    with tensor_outputs(model):
        program = torch.export.export(model, inputs, strict=False)
    if any(_mutates(node) for node in program.graph.nodes):
        program = program.run_decompositions({})  # functionalise: writes through views become scatters
    try:
        return program.module(check_guards=False)  # no `_guards_fn` call: the graph is analysed
    except TypeError:  # torch < 2.9
        return program.module()


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _make_fx(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    """make_fx on fake tensors, the parameters and buffers passed in (never baked in as values)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    named = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    names = list(named)

    def call(state: dict, *args: Any) -> Any:
        return torch.func.functional_call(model, state, args)

    call._orig_mod = model  # make_fx records nn_module_stack only for a function that names its module

    with tensor_outputs(model):
        gm = make_fx(call, tracing_mode="fake", record_module_stack=True)(named, *inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    parameters = set(dict(model.named_parameters(remove_duplicate=False)))
    for i, (node, name) in enumerate(zip(placeholders, names)):
        attribute = f"_qlint_state_{i}"
        tensor = named[name]
        if name in parameters:
            gm.register_parameter(attribute, torch.nn.Parameter(tensor.detach(), requires_grad=tensor.requires_grad))
        else:
            gm.register_buffer(attribute, tensor.detach())
        with gm.graph.inserting_before(node):
            replacement = gm.graph.get_attr(attribute)
        replacement.meta.update(node.meta)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
    gm.graph._codegen = fx.graph.CodeGen()  # the remaining placeholders are the inputs, positionally
    gm.recompile()
    return gm


# --- the chain ------------------------------------------------------------------------------------


class _NoLeaves:
    """Without a registry, symbolic_trace traces through every module."""

    @staticmethod
    def is_leaf(cls: type) -> bool:
        return False


def capture(model: torch.nn.Module, inputs: Optional[tuple], registry: Any = None, *, prefer: Optional[str] = None) -> TracedGraph:
    """The first faithful graph: ``prefer`` first; a preferred tracer that fails is reported.

    ``registry`` decides which nn modules symbolic_trace keeps as leaves (its module rules
    and user declarations); without one every module is traced through.
    """
    registry = registry if registry is not None else _NoLeaves()
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
            with quiet():
                if name == "symbolic_trace":
                    module = _symbolic_trace(model, registry, inputs)
                elif name == "export":
                    module = _export(model, inputs)  # type: ignore[arg-type]
                else:
                    module = _make_fx(model, inputs)  # type: ignore[arg-type]
                check = compare_with_eager(model, module, inputs, shape_only=name == "symbolic_trace")
        except Exception as exc:  # every tracer failure is reported, none is fatal here
            attempts.append(f"{name}: {first_line(exc)}")
            errors.append((name, exc))
            continue
        return TracedGraph(module=module, tracer=name, attempts=attempts, graph_check=check)
    raise TraceFailure(explain(model, errors, inputs is None))


class GraphMismatch(Exception):
    """The traced graph does not compute what the eager model computes."""


def compare_with_eager(model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple], *, shape_only: bool = False) -> str:
    """Run the graph and the eager model on the example inputs and compare the outputs.

    Also records each node's shape and dtype on symbolic_trace graphs (ShapeProp), which
    the shape-dependent proofs use. Raises GraphMismatch when the outputs differ.
    """
    if inputs is None:
        return "not compared: no example inputs"
    from torch.fx.passes.shape_prop import ShapeProp

    meta = any(isinstance(x, torch.Tensor) and x.is_meta for x in inputs) or any(p.is_meta for p in model.parameters())
    state = torch.random.get_rng_state()
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            if shape_only or not meta:
                graph_out = ShapeProp(module).propagate(*inputs) if shape_only else module(*inputs)
            if meta:
                return "not compared: meta tensors have no values"
            torch.manual_seed(0)
            with tensor_outputs(model):
                eager_out = model(*inputs)
            mine, theirs = _tensors(graph_out), _tensors(eager_out)
            if len(mine) != len(theirs):
                raise GraphMismatch(f"the graph returns {len(mine)} tensors, the model {len(theirs)}")
            for a, b in zip(mine, theirs):
                if a.shape != b.shape or not _close(a, b):
                    torch.manual_seed(0)
                    with tensor_outputs(model):
                        again = _tensors(model(*inputs))
                    if not all(_close(x, y) for x, y in zip(again, theirs)):
                        return "not compared: the model's outputs are random"
                    raise GraphMismatch("the traced graph's output differs from the eager model's on the example inputs")
    finally:
        torch.random.set_rng_state(state)
    return f"matches the eager model on the example inputs ({len(mine)} output{'s' if len(mine) != 1 else ''})"


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype and not (a.is_floating_point() and b.is_floating_point()):
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a.to(b.dtype), b, rtol=1e-4, atol=1e-5, equal_nan=True))
    return bool(torch.equal(a, b))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence tracing chatter: torch logs warnings and prints partial graphs to stderr on
    failure; qlint explains a failure in one line instead."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


# (phrases of a tracer's error, the Python construct they mean)
_CONSTRUCTS = (
    (
        ("data-dependent", "_local_scalar_dense", "control flow", "'Proxy'", "Proxy object", "Proxy)", "GuardOnDataDependent"),
        "uses a tensor's value in Python (`if`, `int()`, `float()`, `.item()`, a loop bound)",
    ),
    (("numpy",), "converts a tensor to NumPy"),
    (("not a known type", "pytree"), "passes a value of a type torch cannot flatten"),
    (("in-place mutation",), "mutates a tensor in place and reads it again"),
    (("forward hooks", "forward pre-hooks"), "registers forward hooks (give --input-shape so torch.export runs them)"),
)
_TRACER_PREFERENCE = ("export", "make_fx", "symbolic_trace")


def explain(model: torch.nn.Module, errors: list[tuple[str, BaseException]], no_inputs: bool) -> str:
    """One line: which submodule and which Python construct stopped tracing, and what helps."""
    if not errors:
        return "could not trace the model: symbolic_trace needs no inputs but export/make_fx do; give --input-shape"
    by_tracer = dict(errors)
    name = next((t for t in _TRACER_PREFERENCE if t in by_tracer), errors[-1][0])
    exc = by_tracer[name]
    if isinstance(exc, GraphMismatch):
        return f"could not trace {type(model).__name__} faithfully: {exc} ({name})"
    path, owner = _failing_submodule(model, exc)
    subject = f"`{path}` ({type(owner).__name__})" if path else "its forward"
    where = _user_frame(exc)
    location = f" at {where}" if where else ""
    text = str(exc)
    construct = next((what for phrases, what in _CONSTRUCTS if any(p in text for p in phrases)), None)
    if construct is None:
        return (
            f"could not trace {type(model).__name__}: {subject}{location} raised {first_line(exc)} ({name}); "
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
    """The innermost traceback frame outside torch and qlint: the user's construct."""
    import traceback

    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith(_TORCH_DIR) and "/qlint/core/" not in frame.filename and "/qlint/analysis" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} `{(frame.line or '').strip()}`"
    return None


__all__ = ["TRACERS", "GraphMismatch", "TraceFailure", "TracedGraph", "capture", "compare_with_eager", "forward_hooks",
           "is_hugging_face", "quiet", "tensor_outputs", "unsafe_mutation"]
