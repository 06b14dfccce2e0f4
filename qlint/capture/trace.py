"""The three tracers, each turning a model into a graph or refusing: symbolic_trace, torch.export, make_fx.

The traced graph must *be* the model, so every tracer refuses what it cannot see:

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

Which tracer runs, and the stages around it (identical layers, the check against the eager
model), is the pipeline's business (:mod:`qlint.capture.pipeline`); this module knows no other stage.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
import torch.fx as fx

from qlint.core.errors import QlintError

from qlint.capture import hops, shapes
from qlint.capture.harness import argument_names, has_meta, model_state, restore, snapshot, tensor_outputs, tensors
from qlint.core.graph import TORCH_DIR, storage_key
from qlint.core.ops import attribute

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
    replayed: list[str] = field(default_factory=list)  # layers whose ops were copied from an identical one
    reuse_abandoned: str = ""  # why identical layers were traced one by one after all
    shapes: Optional["shapes.ShapeCoverage"] = None  # the input shapes an export graph was checked on
    example: Optional[tuple] = None  # the inputs it was traced on, when they are not the factory's
    specialised: list[str] = field(default_factory=list)  # input values read in Python, fixed to the example's
    in_modes: list["ModeGraph"] = field(default_factory=list)  # other graphs in the global modes the forward reads
    conditions: list[Any] = field(default_factory=list)  # process state the forward reads (process_state.Condition)

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph


@dataclass
class ModeGraph:
    """The model traced in a global mode its forward asks about, where that gives another graph."""

    what: str  # "in inference mode"
    line: str  # where the forward asks: "model.py:40 `if torch.is_inference_mode_enabled():`"
    traced: Optional[TracedGraph]  # None: the model could not be traced in the mode
    failure: str = ""


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
        """A registered class is a leaf unless this instance replaced its forward (the rule
        describes the class's forward; the instance's own is traced through)."""
        return "forward" not in m.__dict__ and self.registry.is_leaf(type(m))


_QLINT_TRACING_FILES = ("/qlint/capture/trace.py", "/qlint/capture/pipeline.py")


def _outside_torch_stack() -> str:
    """The current Python stack outside torch and this module, formatted as fx stack traces are."""
    lines = []
    frame = sys._getframe(2)
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(TORCH_DIR) and not file.endswith(_QLINT_TRACING_FILES):
            lines.append(f'  File "{file}", line {frame.f_lineno}, in {frame.f_code.co_name}')
        frame = frame.f_back
    return "\n".join(reversed(lines))


# --- what fx cannot see ----------------------------------------------------------------------------


def forward_hooks(model: torch.nn.Module) -> Optional[str]:
    """Where forward hooks or pre-hooks are registered (fx would skip them), if anywhere."""
    module_globals = torch.nn.modules.module
    if (getattr(module_globals, "_global_forward_hooks", None)
        or getattr(module_globals, "_global_forward_pre_hooks", None)):
        return "global forward hooks"
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
            kind = "forward hooks" if module._forward_hooks else "forward pre-hooks"
            return f"{kind} on `{name or type(model).__name__}`"
    return None


_IN_PLACE_FUNCTIONS = {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow,
                       operator.iand, operator.ior, operator.ixor, operator.imatmul, operator.ifloordiv, operator.imod}
_IN_PLACE_METHODS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__", "__iand__",
                     "__ior__",
                     "__ixor__", "__imatmul__", "__ifloordiv__", "__imod__", "__ilshift__", "__irshift__"}


def unsafe_mutation(graph: fx.Graph, root: torch.nn.Module,
                    storages: Optional[dict[fx.Node, set[int]]] = None) -> Optional[fx.Node]:
    """An in-place write whose effect the graph does not show, if any.

    fx keeps every reader pointing at the value as it was, so a write is safe only when
    nothing reads the written storage afterwards except through the write's own result.
    ``storages`` (each node's tensor storages, from running the graph on the example
    inputs) says exactly which values share the written storage: a view, ``.contiguous()``
    of a contiguous tensor, ``.to()`` its own dtype, dropout in eval. Without it, only a
    write into the fresh output of a parametrised module (``conv -> bn -> relu(inplace)``)
    that nothing else reads is accepted. A value computed from the write's result (a view taken
    after it) sees the new value. Writes into inputs, parameters and buffers, and through
    ``out=``, are never accepted.
    """
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in graph.nodes:
        for target in _written(node, root):
            if node.kwargs.get("out") is not None or not isinstance(target, fx.Node):
                return node
            if target.op in ("placeholder", "get_attr"):
                return node
            if storages is None:
                if any(u is not node for u in target.users) or not _fresh(target, root):
                    return node
                continue
            written = storages.get(target)
            if written is None:
                return node
            for other in graph.nodes:
                if other is node or not (storages.get(other, set()) & written):
                    continue
                if other.op in ("placeholder", "get_attr"):
                    return node
                if order[other] > order[node] and _derived_from(other, node, order):
                    continue  # a view of the write's result: it sees the new value
                if any(u is not node and order[u] > order[node] for u in other.users):
                    return node
    return None


def _derived_from(node: fx.Node, source: fx.Node, order: dict[fx.Node, int]) -> bool:
    """Whether ``source`` is among the values ``node`` is computed from (nodes before ``source`` are not)."""
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current is source:
            return True
        if current in seen or order[current] < order[source]:
            continue
        seen.add(current)
        stack.extend(current.all_input_nodes)
    return False


def _written(node: fx.Node, root: torch.nn.Module) -> list[Any]:
    """The arguments ``node`` writes in place: by the op's schema when it has one (ATen
    overloads, ``torch.ops.aten.mul_.Tensor``), else by PyTorch's naming (``mul_``,
    ``operator.iadd``, ``inplace=True``, a module with ``inplace = True``) and ``out=``.
    ``operator.and_`` and ``or_`` are named so only to avoid the keywords: they do not write."""
    if node.kwargs.get("out") is not None:
        return [node.kwargs["out"]]
    first = [node.args[0]] if node.args else []
    if node.op == "call_function":
        schemas = _schemas(node.target)
        if schemas:
            written = []
            for schema in schemas:
                for index, argument in enumerate(schema.arguments):
                    if argument.alias_info is not None and argument.alias_info.is_write:
                        value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
                        written.append(value)
            return list(dict.fromkeys(w for w in written if w is not None))
        name = getattr(node.target, "__name__", "")
        named_in_place = (name.endswith("_") and not name.endswith("__")
                          and getattr(node.target, "__module__", "") not in ("_operator", "operator"))
        if node.target in _IN_PLACE_FUNCTIONS or named_in_place or node.kwargs.get("inplace") is True:
            return first
    if node.op == "call_method" and isinstance(node.target, str):
        in_place = node.target in _IN_PLACE_METHODS or (node.target.endswith("_") and not node.target.endswith("__"))
        if in_place or node.kwargs.get("inplace") is True:
            return first
    if node.op == "call_module" and getattr(root.get_submodule(str(node.target)), "inplace", False) is True:
        return first
    return []


def _state_as_constant(module: fx.GraphModule, model: torch.nn.Module) -> Optional[str]:
    """A parameter or buffer that fx baked into the graph as a tensor constant (a second read
    of a buffer, ``m._parameters["p"]``), by shared storage: the graph would keep today's value."""
    if any(p.is_meta for p in model.parameters()):
        return None
    owners = {storage_key(t): name for name, t in model_state(model).items() if t.numel()}
    for node in module.graph.nodes:
        if node.op == "get_attr" and str(node.target).startswith("_tensor_constant"):
            value = getattr(module, str(node.target))
            if isinstance(value, torch.Tensor) and value.numel() and storage_key(value) in owners:
                return owners[storage_key(value)]
    return None


def trainable_attributes(module: fx.GraphModule, model: torch.nn.Module) -> frozenset[str]:
    """The graph's tensor attributes that alias a model tensor training may move, by shared storage:
    one an optimizer trains (requires_grad: torch.export lifts a plain ``self.p = torch.tensor(..,
    requires_grad=True)`` as a detached constant), or a floating tensor the model holds in any object
    (a ``SimpleNamespace``, a dict: symbolic_trace lifts it as a constant, but a training loop can set
    it like a buffer). Neither may be read by value."""
    trained = {storage_key(t) for sub in model.modules() for t in vars(sub).values()
               if isinstance(t, torch.Tensor) and t.requires_grad and not t.is_meta and t.numel()}
    trained |= {storage_key(t) for t in _held_tensors(model) if (t.is_floating_point() or t.is_complex())
                and not t.is_meta and t.numel()}
    trained |= {storage_key(p) for p in model.parameters() if p.requires_grad and not p.is_meta
                and p.numel()}
    found = set()
    for node in module.graph.nodes:
        if node.op == "get_attr":
            try:
                value = attribute(module, str(node.target))
            except AttributeError:
                continue
            if (isinstance(value, torch.Tensor) and not value.is_meta and value.numel()
                and storage_key(value) in trained):
                found.add(str(node.target))
    return frozenset(found)


def _held_tensors(model: torch.nn.Module, depth: int = 4) -> list[torch.Tensor]:
    """Tensors the model's modules hold outside their parameters and buffers, through plain objects,
    dicts, lists and tuples (``depth`` levels down)."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def walk(value: Any, level: int) -> None:
        if id(value) in seen or level > depth or isinstance(value, torch.nn.Module):
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item, level + 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                walk(item, level + 1)
        elif hasattr(value, "__dict__") and not isinstance(value, type) and type(value).__module__ != "builtins":
            for item in vars(value).values():
                walk(item, level + 1)

    for sub in model.modules():
        for name, value in vars(sub).items():
            if name not in ("_parameters", "_buffers", "_modules"):
                walk(value, 0)
    return found


def _schemas(target: Any) -> list[Any]:
    """The schemas of an ATen overload, or of every overload of a packet."""
    if isinstance(target, torch._ops.OpOverload):
        return [target._schema]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return [getattr(target, name)._schema for name in target.overloads()]
    return []


def _fresh(node: fx.Node, root: torch.nn.Module) -> bool:
    """Certainly a new tensor: the output of a module with parameters (conv, linear, norm)."""
    return (node.op == "call_module"
            and any(True for _ in root.get_submodule(str(node.target)).parameters(recurse=False)))


def storages(module: fx.GraphModule, inputs: tuple) -> Optional[dict[fx.Node, set[int]]]:
    """Each node's tensor storages when the graph runs on (copies of) the example inputs;
    None when that cannot be known (meta tensors, a failing run). Parameters and buffers
    are restored after the run, which may write to them."""
    if any(isinstance(x, torch.Tensor) and x.is_meta for x in inputs) or any(p.is_meta for p in module.parameters()):
        return None
    found: dict[fx.Node, set[int]] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            found[n] = {storage_key(t) for t in tensors(out)}
            return out

    saved = snapshot(module)
    state = torch.random.get_rng_state()
    try:
        with torch.no_grad():
            # every value kept alive: a freed tensor's storage address is reused, and would alias a later one
            Recorder(module, garbage_collect_values=False).run(
                *(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs))
    except Exception:  # noqa: BLE001  (no storages: the caller falls back to the strict rule)
        return None
    finally:
        restore(module, saved)
        torch.random.set_rng_state(state)
    return found


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


def symbolic_trace_module(model: torch.nn.Module, registry: Any, inputs: Optional[tuple]) -> fx.GraphModule:
    hooks = forward_hooks(model)
    if hooks is not None:
        raise RuntimeError(f"the model has {hooks}, which symbolic_trace would skip")
    tracer = _Tracer(registry)
    graph = tracer.trace(model, concrete_args=_defaults_beyond(model, inputs))
    module = fx.GraphModule(tracer.root, graph, model.__class__.__name__)
    baked = _state_as_constant(module, model)
    if baked is not None:
        raise RuntimeError(f"the graph holds the value of `{baked}` as a constant (read outside fx's proxies)")
    if any(_written(node, tracer.root) for node in graph.nodes):
        mutation = unsafe_mutation(graph, tracer.root, storages(module, inputs) if inputs is not None else None)
        if mutation is not None:
            raise RuntimeError(f"in-place mutation `{mutation.format_node()}` is not visible to symbolic_trace's "
                               "readers")
    return module


# --- export and make_fx -------------------------------------------------------------------------


def export_module(model: torch.nn.Module, inputs: tuple, *,
                  fatal: Callable[[BaseException], bool] = lambda exc: False) -> fx.GraphModule:
    """The exported graph, every input axis dynamic where the model allows it (:mod:`qlint.capture.shapes`),
    else static; the module's meta records which and the export's shape guards. On meta tensors, where
    no other shape can be compared (``graph_check.shape_coverage``), static: symbolic sizes would cost time
    only. A dynamic export's failure that is ``fatal`` is raised instead of retried static (the caller's
    own stage failed inside the export, e.g. copied layers: :func:`qlint.capture.reuse.abandoned`)."""
    dynamic = None if has_meta(model, inputs) else shapes.automatic(model, inputs)
    program = None
    if dynamic is not None:
        try:
            with tensor_outputs(model), _dynamic_marks_removed(inputs):
                program = torch.export.export(model, inputs, strict=False, dynamic_shapes=dynamic)
        except Exception as exc:  # noqa: BLE001  (a model that cannot be traced symbolically: the static export below)
            if fatal(exc):
                raise
            program = None
    if program is None:
        with tensor_outputs(model):
            program = torch.export.export(model, inputs, strict=False)
    guards = [str(g) for g in (getattr(program, "_guards_code", None) or [])]
    if any(_mutates(node) for node in program.graph.nodes) or hops.has_regions(program.graph):
        program = program.run_decompositions({})  # functionalise (writes through views become scatters), inline regions
    try:
        module = program.module(check_guards=False)  # no `_guards_fn` call: the graph is analysed
    except TypeError:  # torch < 2.9
        module = program.module()
    hops.inline_bodies(module)
    module.meta["qlint_shape_guards"] = guards
    module.meta["qlint_compiling"] = True  # traced with torch.compiler.is_compiling() True, as torch.compile runs it
    module.meta["qlint_dynamic"] = dynamic is not None and any(
        not isinstance(size, int) for n in module.graph.nodes if n.op == "placeholder"
        for size in getattr(n.meta.get("val"), "shape", ()))
    return module


@contextlib.contextmanager
def _dynamic_marks_removed(inputs: tuple) -> Iterator[None]:
    """Export marks the example tensors dynamic (``_dynamo_*`` attributes); the marks outlive a
    failed dynamic export and would make the static one that follows symbolic too."""
    leaves = [leaf for leaf in torch.utils._pytree.tree_leaves(inputs) if isinstance(leaf, torch.Tensor)]
    before = [set(vars(leaf)) for leaf in leaves]
    try:
        yield
    finally:
        for leaf, kept in zip(leaves, before):
            for name in [n for n in vars(leaf) if n not in kept and "dynamo" in n]:
                delattr(leaf, name)


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def make_fx_module(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    """make_fx on fake tensors; where that fails (a read of a tensor's value in Python, a size
    computed from one), make_fx on the example's values, accepted only when every value read is a
    constant or comes from a non-float input (:func:`_specialisations`); the graph check follows."""
    try:
        return _make_fx_graph(model, inputs, real=False)
    except Exception:  # noqa: BLE001  (a value read, or a size computed from one: trace the example's values)
        if has_meta(model, inputs):
            raise
    module = _make_fx_graph(model, inputs, real=True)
    module.meta["qlint_specialised"] = _specialisations(module, model, inputs)  # first: it names the value read
    written = unsafe_mutation(module.graph, module, storages(module, inputs))
    if written is not None:
        raise ValueSpecialised(f"writes in place (`{written.target}`)", written,
                               "an alias taken before the write reads the value afterwards, which the graph does not "
                               "show",
                               "write out of place (h = h + ...)", declare=False)
    return module


def _make_fx_graph(model: torch.nn.Module, inputs: tuple, *, real: bool) -> fx.GraphModule:
    """make_fx with the parameters and buffers passed in (never baked in as values), on fake
    tensors or, ``real``, on the example's values: a read of a value in Python then records the
    read and goes on with the example's value, and in-place writes are left to the caller, who
    can see from the storages which are safe (:func:`unsafe_mutation`)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    named = {**dict(model.named_parameters(remove_duplicate=False)),
             **dict(model.named_buffers(remove_duplicate=False))}
    names = list(named)

    def call(state: dict, *args: Any) -> Any:
        return torch.func.functional_call(model, state, args)

    call._orig_mod = model  # make_fx records nn_module_stack only for a function that names its module

    with tensor_outputs(model):
        gm = make_fx(call, tracing_mode="real" if real else "fake", record_module_stack=True, pre_dispatch=real,
                     _error_on_data_dependent_ops=not real)(named, *inputs)  # pre-dispatch: ops as export has them
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    parameters = set(dict(model.named_parameters(remove_duplicate=False)))
    state_names = {}
    for i, (node, name) in enumerate(zip(placeholders, names)):
        attribute = f"_qlint_state_{i}"
        state_names[attribute] = name
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
    gm.meta["qlint_state_names"] = state_names
    gm.meta["qlint_parameters"] = parameters
    gm.recompile()
    written = None if real else next((node for node in gm.graph.nodes if _mutates(node)), None)
    if written is not None:  # the tensor written reads as the write's result after it, an older alias does not
        raise RuntimeError(f"in-place `{written.target}` in the make_fx graph, whose readers do not see it")
    hops.inline_bodies(gm)
    return gm


class ValueSpecialised(RuntimeError):
    """A graph traced on the example's values is not the model: the forward reads, in Python, a
    value that scales with the input or is a parameter (the graph would hold only the path those
    values took), or it writes in place into a value an older alias reads. ``declare``: declaring
    the module's exponent is a remedy (its reads are then not traced)."""

    def __init__(self, what: str, node: fx.Node, why: str, remedy: str, *, declare: bool) -> None:
        self.what, self.where, self.why, self.remedy, self.declare = what, _stack_line(node), why, remedy, declare
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        self.path = str(stack[-1][0]) if stack else ""
        super().__init__(f"{what} at {self.where} ({why})")


def _specialisations(module: fx.GraphModule, model: torch.nn.Module, inputs: tuple) -> list[str]:
    """The input values a graph traced on the example's values holds for, one line each
    (``lengths = [16, 12] (read at conformer.py:40 `...`)``); the reads are then removed.

    A read of a value in Python (``.item()``, ``int()``, ``if t:``) and an op whose output shape
    depends on values (``nonzero``) fix the graph to the example's values. That is sound for what
    cannot change with the input's scale or with training: shapes, literals, buffers (the graph
    check refuses a forward that writes them) -- constants, said nowhere -- and integer or bool
    inputs (lengths, masks, ids), whose values the report names: the certificate is for them.
    A read that depends on a float input, on a parameter or on a random draw raises
    :class:`ValueSpecialised`: a branch on ``x.norm() > 1e9``, on a gate's value or on LayerDrop's
    coin would be certified on one side only.
    """
    leaves = torch.utils._pytree.tree_leaves(inputs)
    owners = [i for i, x in enumerate(inputs) for _ in torch.utils._pytree.tree_leaves(x)]
    arguments = argument_names(model, len(inputs))
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    state_names, parameters = module.meta["qlint_state_names"], module.meta["qlint_parameters"]
    found: dict[int, str] = {}
    reads = [n for n in module.graph.nodes if _reads_value(n)]
    for node in reads:
        sources = _sources(node)
        drawn = next((n for n in sources if _random(n)), None)
        if drawn is not None:
            raise ValueSpecialised(f"reads a random draw (`{drawn.target}`) in Python", node,
                                   "a graph traced on one draw holds the path it took only",
                                   "compute it with tensor ops (torch.where)", declare=True)
        read = [(placeholders.index(n), n) for n in sources if n.op == "placeholder" and n in placeholders]
        for index, _ in read:
            value = leaves[index] if index < len(leaves) else None
            top = owners[index] if index < len(owners) else index
            name = arguments[top] if top < len(arguments) else f"input {top}"
            if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
                raise ValueSpecialised(f"reads the value of the input `{name}` in Python", node,
                                       "a graph traced on the example holds the path its values took only",
                                       "compute it with tensor ops (torch.where)", declare=True)
            if isinstance(value, torch.Tensor) and top not in found:
                shown = value.tolist() if value.numel() <= 16 else f"a {tuple(value.shape)} {value.dtype} tensor"
                found[top] = f"{name} = {shown} (read at {_stack_line(node)})"
        learned = next((state_names[n.target] for n in sources
                        if n.op == "get_attr" and state_names.get(n.target) in parameters), None)
        if learned is not None:
            raise ValueSpecialised(f"reads the value of the parameter `{learned}` in Python", node,
                                   "a graph traced on today's value holds one path only, and training changes it",
                                   "compute it with tensor ops (torch.where)", declare=True)
    for node in reversed(reads):
        if not node.users and not _reshapes(node):
            module.graph.erase_node(node)
    module.graph.eliminate_dead_code()
    module.recompile()
    return [found[i] for i in sorted(found)]


def _reads_value(node: fx.Node) -> bool:
    """A read of a tensor's value into Python, or an op whose output shape depends on values."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    return _reshapes(node) or torch.Tag.data_dependent_output in node.target.tags


def _reshapes(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and torch.Tag.dynamic_output_shape in node.target.tags


def _sources(node: fx.Node) -> list[fx.Node]:
    """The placeholders, attributes and random draws ``node`` is computed from."""
    seen, stack, out = set(), [node], []
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op in ("placeholder", "get_attr") or _random(current):
            out.append(current)
        stack.extend(current.all_input_nodes)
    return out


def _random(node: fx.Node) -> bool:
    """A seeded random op that draws here: not dropout (or attention's) at p = 0 or outside training."""
    if not isinstance(node.target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded not in node.target.tags:
        return False
    values = {a.name: (node.args[i] if i < len(node.args) else node.kwargs.get(a.name, a.default_value))
              for i, a in enumerate(node.target._schema.arguments)}
    return not (values.get("train") is False or values.get("dropout_p", values.get("p")) == 0)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)')


def _stack_line(node: fx.Node) -> str:
    """The innermost frame of the node's recorded stack outside torch: ``file.py:40 `code```."""
    frames = [f for f in _FRAME.findall(node.meta.get("stack_trace") or "") if not f[0].startswith(TORCH_DIR)]
    if not frames:
        return "an unknown line"
    path, line, code = frames[-1]
    return f"{path}:{line} `{code.strip()}`"


# --- preconditions: what the pipeline refuses before any tracer runs ------------------------------


def redefining_tensor(model: torch.nn.Module, inputs: Optional[tuple]) -> Optional[str]:
    """The first parameter, buffer or input whose class overrides ``__torch_function__`` or
    ``__torch_dispatch__`` (a Parameter subclass squaring its output in ``F.linear``): the graph's
    ``linear`` node would be read as an affine map it is not."""
    def redefines(tensor: Any) -> bool:
        cls = type(tensor)
        if not isinstance(tensor, torch.Tensor) or cls in (torch.Tensor, torch.nn.Parameter):
            return False
        function = getattr(cls, "__torch_function__", None)
        dispatch = getattr(cls, "__torch_dispatch__", None)
        plain = (torch._C._disabled_torch_function_impl, torch.Tensor.__torch_function__)
        return getattr(function, "__func__", function) not in [getattr(f, "__func__", f) for f in plain] or \
            dispatch not in (None, torch._C._disabled_torch_dispatch_impl)

    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if redefines(tensor):
            return f"`{name}` ({type(tensor).__name__})"
    for index, value in enumerate(inputs or ()):
        if redefines(value):
            return f"input {index} ({type(value).__name__})"
    return None


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """The floating parameters holding inf or nan (meta ones have no values)."""
    with torch.no_grad():
        return [name for name, p in model.named_parameters()
                if (p.is_floating_point() or p.is_complex()) and not p.is_meta and not bool(torch.isfinite(p).all())]
