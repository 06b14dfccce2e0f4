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
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
import torch.fx as fx

from qlint.core.errors import QlintError

from qlint.core import hops, shapes
from qlint.core import reuse as reuse_layers
from qlint.core.graph import TORCH_DIR
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
    replayed: list[str] = field(default_factory=list)  # layers whose ops were copied from an identical one
    reuse_abandoned: str = ""  # why identical layers were traced one by one after all
    shapes: Optional["shapes.ShapeCoverage"] = None  # the input shapes an export graph was checked on
    example: Optional[tuple] = None  # the inputs it was traced on, when they are not the factory's
    specialised: list[str] = field(default_factory=list)  # input values read in Python, fixed to the example's

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
        """A registered class is a leaf unless this instance replaced its forward (the rule
        describes the class's forward; the instance's own is traced through)."""
        return "forward" not in m.__dict__ and self.registry.is_leaf(type(m))


def _outside_torch_stack() -> str:
    """The current Python stack outside torch and this module, formatted as fx stack traces are."""
    lines = []
    frame = sys._getframe(2)
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(TORCH_DIR) and not file.endswith("/qlint/core/trace.py"):
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
_IN_PLACE_METHODS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__", "__iand__", "__ior__",
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
        named_in_place = name.endswith("_") and not name.endswith("__") and getattr(node.target, "__module__", "") not in ("_operator", "operator")
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
    owners = {t.untyped_storage().data_ptr(): name for name, t in _state(model).items() if t.numel()}
    for node in module.graph.nodes:
        if node.op == "get_attr" and str(node.target).startswith("_tensor_constant"):
            value = getattr(module, str(node.target))
            if isinstance(value, torch.Tensor) and value.numel() and value.untyped_storage().data_ptr() in owners:
                return owners[value.untyped_storage().data_ptr()]
    return None


def trainable_attributes(module: fx.GraphModule, model: torch.nn.Module) -> frozenset[str]:
    """The graph's tensor attributes that alias a model tensor an optimizer trains (requires_grad),
    by shared storage: torch.export lifts a plain ``self.p = torch.tensor(.., requires_grad=True)``
    as a detached constant, which must not be read by value."""
    trained = {t.untyped_storage().data_ptr() for sub in model.modules() for t in vars(sub).values()
               if isinstance(t, torch.Tensor) and t.requires_grad and not t.is_meta and t.numel()}
    trained |= {p.untyped_storage().data_ptr() for p in model.parameters() if p.requires_grad and not p.is_meta and p.numel()}
    found = set()
    for node in module.graph.nodes:
        if node.op == "get_attr":
            try:
                value = _attribute(module, str(node.target))
            except AttributeError:
                continue
            if isinstance(value, torch.Tensor) and not value.is_meta and value.numel() and value.untyped_storage().data_ptr() in trained:
                found.add(str(node.target))
    return frozenset(found)


def _attribute(module: torch.nn.Module, target: str) -> Any:
    owner, _, name = target.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, name)


def _schemas(target: Any) -> list[Any]:
    """The schemas of an ATen overload, or of every overload of a packet."""
    if isinstance(target, torch._ops.OpOverload):
        return [target._schema]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return [getattr(target, name)._schema for name in target.overloads()]
    return []


def _fresh(node: fx.Node, root: torch.nn.Module) -> bool:
    """Certainly a new tensor: the output of a module with parameters (conv, linear, norm)."""
    return node.op == "call_module" and any(True for _ in root.get_submodule(str(node.target)).parameters(recurse=False))


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
            found[n] = {t.untyped_storage().data_ptr() for t in _tensors(out)}
            return out

    saved = _snapshot(module)
    state = torch.random.get_rng_state()
    try:
        with torch.no_grad():
            # every value kept alive: a freed tensor's storage address is reused, and would alias a later one
            Recorder(module, garbage_collect_values=False).run(*(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs))
    except Exception:  # noqa: BLE001  (no storages: the caller falls back to the strict rule)
        return None
    finally:
        _restore(module, saved)
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


def _symbolic_trace(model: torch.nn.Module, registry: Any, inputs: Optional[tuple]) -> fx.GraphModule:
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
            raise RuntimeError(f"in-place mutation `{mutation.format_node()}` is not visible to symbolic_trace's readers")
    return module


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


def _export(model: torch.nn.Module, inputs: tuple, *, reuse: bool = True) -> fx.GraphModule:
    """torch.export (non-strict), identical layers traced once and copied (:mod:`qlint.core.reuse`)
    unless ``reuse`` is off or reuse is abandoned, when the model is exported in full."""
    groups = reuse_layers.find_groups(model) if reuse else []
    abandoned = ""
    if groups:
        try:
            with reuse_layers.recording(model, groups) as plan:
                module = _exported_module(model, inputs)
            reuse_layers.expand(module, model, plan)
            module.meta["qlint_replayed"] = [name for group in plan.groups for name in group.replayed]
            return module
        except Exception as exc:  # noqa: BLE001  (a poison read, an open region, an export error: trace in full)
            abandoned = first_line(exc)
    module = _exported_module(model, inputs)
    reuse_layers.renumber(module)
    module.meta["qlint_reuse_abandoned"] = abandoned
    return module


def _exported_module(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    """The exported graph, every input axis dynamic where the model allows it (:mod:`qlint.core.shapes`),
    else static; the module's meta records which and the export's shape guards. On meta tensors, where
    no other shape can be compared (:func:`shape_coverage`), static: symbolic sizes would cost time only."""
    dynamic = None if _has_meta(model, inputs) else shapes.automatic(model, inputs)
    program = None
    if dynamic is not None:
        try:
            with tensor_outputs(model), _dynamic_marks_removed(inputs):
                program = torch.export.export(model, inputs, strict=False, dynamic_shapes=dynamic)
        except Exception as exc:  # noqa: BLE001  (a model that cannot be traced symbolically: the static export below)
            if _caused_by(exc, reuse_layers.ReuseAbandoned) or reuse_layers.poison_read():
                raise  # the layer copies failed, not the dynamic shapes: the caller traces every layer
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


def _caused_by(exc: BaseException, kind: type) -> bool:
    """Whether ``exc`` or an exception it was raised from (or during) is a ``kind``."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _make_fx(model: torch.nn.Module, inputs: tuple) -> fx.GraphModule:
    """make_fx on fake tensors; where that fails (a read of a tensor's value in Python, a size
    computed from one), make_fx on the example's values, accepted only when every value read is a
    constant or comes from a non-float input (:func:`_specialisations`); the graph check follows."""
    try:
        return _make_fx_graph(model, inputs, real=False)
    except Exception:  # noqa: BLE001  (a value read, or a size computed from one: trace the example's values)
        if _has_meta(model, inputs):
            raise
    module = _make_fx_graph(model, inputs, real=True)
    module.meta["qlint_specialised"] = _specialisations(module, model, inputs)  # first: it names the value read
    written = unsafe_mutation(module.graph, module, storages(module, inputs))
    if written is not None:
        raise ValueSpecialised(f"writes in place (`{written.target}`)", written,
                               "an alias taken before the write reads the value afterwards, which the graph does not show",
                               "write out of place (h = h + ...)", declare=False)
    return module


def _make_fx_graph(model: torch.nn.Module, inputs: tuple, *, real: bool) -> fx.GraphModule:
    """make_fx with the parameters and buffers passed in (never baked in as values), on fake
    tensors or, ``real``, on the example's values: a read of a value in Python then records the
    read and goes on with the example's value, and in-place writes are left to the caller, who
    can see from the storages which are safe (:func:`unsafe_mutation`)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    named = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
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
    arguments = _argument_names(model, len(inputs))
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


# --- the chain ------------------------------------------------------------------------------------


class _NoLeaves:
    """Without a registry, symbolic_trace traces through every module."""

    @staticmethod
    def is_leaf(cls: type) -> bool:
        return False


def capture(model: torch.nn.Module, inputs: Optional[tuple], registry: Any = None, *, prefer: Optional[str] = None,
            reuse: bool = True, shapes_too: bool = True) -> TracedGraph:
    """The first faithful graph of symbolic_trace, export, make_fx; ``prefer``: that tracer only.
    ``reuse``: export traces identical layers once (:mod:`qlint.core.reuse`). ``shapes_too``: check
    an export or make_fx graph on other input shapes too (:func:`shape_coverage`).

    A tracer the user asked for is a requirement, as an explicit flag is in mypy or ruff:
    when it fails, the TraceFailure says so instead of another tracer's graph being used
    under a header the user did not ask for. When every tracer fails on example inputs,
    the model itself is run on them: a model that does not run (inputs of the wrong
    shape) is reported as such, naming the submodule that failed and the input shapes.

    ``registry`` decides which nn modules symbolic_trace keeps as leaves (its module rules
    and user declarations); without one every module is traced through.
    """
    registry = registry if registry is not None else _NoLeaves()
    own_call = not (getattr(type(model).__call__, "__module__", "") or "").startswith("torch")  # GraphModule's is torch's
    if own_call or "forward" in model.__dict__:
        what = "__call__" if own_call else "forward (on the instance)"
        raise TraceFailure(f"{type(model).__name__} overrides {what}: qlint traces the class's forward, which is then "
                           "not what calling the model runs; wrap it in a module whose forward does the work")
    if prefer and prefer not in TRACERS:
        raise TraceFailure(f"unknown tracer {prefer!r}; choose one of {', '.join(TRACERS)}")
    if prefer and prefer != "symbolic_trace" and inputs is None:
        raise TraceFailure(f"the tracer {prefer} was asked for (--tracer / tracer = ...) and needs example inputs: "
                           "give --input-shape, or return (model, example_inputs) from the factory")
    redefined = redefining_tensor(model, inputs)
    if redefined is not None:
        raise TraceFailure(f"{redefined} is a tensor subclass that redefines the ops it enters (`__torch_function__` or "
                           "`__torch_dispatch__`): a graph of torch ops does not say what they compute; use plain tensors")
    broken = non_finite_parameters(model) if inputs is not None else []
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise TraceFailure(f"the parameter `{broken[0]}` holds inf or nan{more}, so the graph cannot be checked against "
                           "the model's outputs; analyse the model with finite weights (a fresh init, or --device meta)")
    attempts: list[str] = []
    errors: list[tuple[str, BaseException]] = []
    for name in [prefer] if prefer else TRACERS:
        if name != "symbolic_trace" and inputs is None:
            attempts.append(f"{name}: needs example inputs")
            continue
        if name == "symbolic_trace" and not prefer and inputs is not None and is_hugging_face(model):
            attempts.append("symbolic_trace: skipped (Hugging Face models branch on tensor values; torch.export follows them)")
            continue
        try:
            with quiet(), grad_state(model.training):
                if name == "symbolic_trace":
                    module = _symbolic_trace(model, registry, inputs)
                elif name == "export":
                    module = _export(model, inputs, reuse=reuse)  # type: ignore[arg-type]
                else:
                    module = _make_fx(model, inputs)  # type: ignore[arg-type]
                try:
                    check = compare_with_eager(model, module, inputs, shape_only=name == "symbolic_trace")
                except GraphMismatch:
                    if not module.meta.get("qlint_replayed"):
                        raise
                    module = _export(model, inputs, reuse=False)  # the copied layers are not the model's: trace each
                    module.meta["qlint_reuse_abandoned"] = "the graph check refuted the copied layers"
                    check = compare_with_eager(model, module, inputs)
        except Exception as exc:  # every tracer failure is reported, none is fatal here
            attempts.append(f"{name}: {first_line(exc)}")
            errors.append((name, exc))
            continue
        coverage = shape_coverage(model, module, inputs, name) if shapes_too else None
        return TracedGraph(module=module, tracer=name, attempts=attempts, graph_check=check,
                           replayed=list(module.meta.get("qlint_replayed", [])),
                           reuse_abandoned=module.meta.get("qlint_reuse_abandoned", ""), shapes=coverage,
                           specialised=list(module.meta.get("qlint_specialised", [])))
    refused = _eager_failure(model, inputs) if inputs is not None and not _has_meta(model, inputs) else None
    if refused is not None:
        raise TraceFailure(f"{type(model).__name__} does not run on its example inputs {shapes_of(inputs)}: "
                           f"{_culprit(model, refused)} raised {first_line(refused)}; "
                           "give inputs the model accepts (--input-shape, or the factory's example inputs)") from refused
    message = explain(model, errors, inputs)
    if prefer:
        message += f"; {prefer} was asked for (--tracer / tracer = ...), so no other tracer was tried"
    raise TraceFailure(message) from (_explained(errors)[1] if errors else None)


def shape_coverage(model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple], tracer: str) -> Optional[shapes.ShapeCoverage]:
    """The shapes the graph computes the model on (:mod:`qlint.core.shapes`); None for symbolic_trace,
    whose graph records no shape (a branch on a size stops it), or without values to compare."""
    if tracer == "symbolic_trace" or inputs is None or _has_meta(model, inputs):
        return None

    def runs(other: tuple) -> bool:
        return _eager_failure(model, other) is None

    return shapes.probe(model, inputs, bool(module.meta.get("qlint_dynamic")), list(module.meta.get("qlint_shape_guards", [])),
                        shapes.symbolic_axes(module, inputs), runs, lambda other: computes(model, module, other),
                        _argument_names(model, len(inputs)))


def _argument_names(model: torch.nn.Module, count: int) -> list[str]:
    """The names export's guards give the positional inputs (``L['x']``): the forward's parameters."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:count]


def computes(model: torch.nn.Module, module: fx.GraphModule, inputs: tuple) -> bool:
    """Whether the graph runs on ``inputs`` and gives the eager model's output there (in the
    analysed mode's grad state; the model's state and the RNG are restored)."""
    saved, state = _snapshot(model), torch.random.get_rng_state()
    try:
        with quiet(), grad_state(model.training):
            _compare_again(module, model, inputs, "on inputs of another shape")
        return True
    except GraphMismatch:
        return False
    finally:
        _restore(model, saved)
        torch.random.set_rng_state(state)


def shapes_of(inputs: tuple) -> str:
    """``(2, 4, 99) float32, (2, 4) int64``: each example input's shape and dtype (else its type)."""
    return ", ".join(f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}" if isinstance(x, torch.Tensor)
                     else type(x).__name__ for x in inputs)


def _eager_failure(model: torch.nn.Module, inputs: tuple) -> Optional[BaseException]:
    """What the eager model raises on ``inputs``, if anything (no gradients; the parameters,
    buffers and RNG state are restored). Not on meta tensors: there a value read raises too,
    so a tracer's failure could not be told from inputs the model does not accept."""
    saved = _snapshot(model)
    state = torch.random.get_rng_state()
    try:
        with quiet(), torch.no_grad():
            _eager(model, inputs)
    except Exception as exc:  # noqa: BLE001  (returned: the caller reports it)
        return exc
    finally:
        _restore(model, saved)
        torch.random.set_rng_state(state)
    return None


class GraphMismatch(Exception):
    """The traced graph does not compute what the eager model computes."""


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


def compare_with_eager(model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple], *, shape_only: bool = False) -> str:
    """Run the graph and the eager model and compare their outputs: on the example inputs,
    on them scaled up, and with the parameters redrawn.

    The analysis reads the graph, so the graph must compute what the model computes for
    every input size and every parameter value, not only today's: a forward that
    branches on a parameter's value (``if self.gate.item():``), bakes one in
    (``x ** float(self._parameters["p"])``), notices the tracer, or keeps state across
    calls gives a graph that matches on the example and differs here. Also records each
    node's shape and dtype on symbolic_trace graphs (ShapeProp), which the shape-dependent
    proofs use. Raises GraphMismatch when the outputs differ; the model's parameters,
    buffers and RNG state are restored afterwards.
    """
    if inputs is None:
        return "not compared: no example inputs"
    from torch.fx.passes.shape_prop import ShapeProp

    if _has_meta(model, inputs):
        if shape_only:
            ShapeProp(module).propagate(*inputs)
        return "not compared: meta tensors have no values"
    saved = _snapshot(model)
    state = torch.random.get_rng_state()
    try:
        with grad_state(model.training):
            torch.manual_seed(0)
            graph_out = ShapeProp(module).propagate(*inputs) if shape_only else module(*inputs)
            first = _eager(model, inputs)
            module.meta["qlint_written_buffers"] = frozenset(  # buffers the forward writes (BatchNorm's statistics in training)
                b.untyped_storage().data_ptr() for name, b in model.named_buffers() if b.numel() and not _same_tensor(b, saved[name]))
            _require_same(graph_out, first, "on the example inputs")
            if not _agree(first, _eager(model, inputs)):
                raise GraphMismatch("the model's output changes between identical calls (state kept across calls, "
                                    "or unseeded randomness): no graph can stand for it")
            floats = any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs)
            if model.training and floats:  # in training every block after the first reads a value that requires grad
                wanting = tuple(x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                for x in inputs)
                if _eager_runs(model, wanting):  # a model that cannot take them (no CPU backward) never runs so
                    _compare_again(module, model, wanting, "on inputs that require grad (as in training)")
            for scale in SCALES if floats else ():
                scaled = tuple(x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
                _compare_again(module, model, scaled, f"on the inputs scaled by {scale:g}", scaled=True)
            if not shares_parameters(module, model):  # redrawing the model's would not redraw the graph's
                raise GraphMismatch("the graph holds its own copy of the parameters: it cannot be checked with redrawn ones")
            for redraw in _redraws(model, saved):  # each redraw overwrites every float parameter
                _compare_again(module, model, inputs, f"with the parameters {redraw}")
                _restore(model, saved, buffers_only=True)  # what the forward may have updated (BatchNorm's statistics)
    finally:
        _restore(model, saved)
        torch.random.set_rng_state(state)
    count = len(_tensors(graph_out))
    return (f"matches the eager model on the example inputs, scaled by {', '.join(f'{s:g}' for s in SCALES)}, "
            f"and with redrawn parameters ({count} output{'s' if count != 1 else ''})")


SCALES = (1e3, 1e6)


def grad_state(training: bool) -> Any:
    """The grad mode the analysed mode runs in: training computes gradients, evaluation is
    inference. The graph is traced and checked in it, so a forward that branches on
    ``torch.is_grad_enabled()`` or ``x.requires_grad`` is seen taking the path it takes there."""
    return torch.enable_grad() if training else torch.no_grad()


def _has_meta(model: torch.nn.Module, inputs: tuple) -> bool:
    """Meta inputs or parameters: shapes without values."""
    return any(isinstance(x, torch.Tensor) and x.is_meta for x in inputs) or any(p.is_meta for p in model.parameters())


def _run(module: fx.GraphModule, inputs: tuple) -> Any:
    torch.manual_seed(0)
    return module(*inputs)


def _eager(model: torch.nn.Module, inputs: tuple) -> Any:
    torch.manual_seed(0)
    with tensor_outputs(model):
        return model(*inputs)


def _eager_runs(model: torch.nn.Module, inputs: tuple) -> bool:
    try:
        _eager(model, inputs)
        return True
    except Exception:  # noqa: BLE001
        return False


def _compare_again(module: fx.GraphModule, model: torch.nn.Module, inputs: tuple, where: str, *, scaled: bool = False) -> None:
    try:
        graph_out, eager_out = _run(module, inputs), _eager(model, inputs)
    except Exception as exc:  # e.g. an assert in the model on other values: fail closed
        raise GraphMismatch(f"the graph and the model could not be compared {where}: {first_line(exc)}") from exc
    _require_same(graph_out, eager_out, where, scaled=scaled)


def _agree(a: Any, b: Any, *, scaled: bool = False) -> bool:
    mine, theirs = _tensors(a), _tensors(b)
    if len(mine) != len(theirs):
        return False
    for x, y in zip(mine, theirs):
        if x.shape != y.shape:
            return False
        if scaled and (x.is_floating_point() or x.is_complex()) and not (torch.isfinite(x).all() and torch.isfinite(y).all()):
            continue  # overflow at this scale: inconclusive, not a mismatch
        if not _close(x, y):
            return False
    return True


def _require_same(graph_out: Any, eager_out: Any, where: str, *, scaled: bool = False) -> None:
    mine, theirs = _tensors(graph_out), _tensors(eager_out)
    if len(mine) != len(theirs):
        raise GraphMismatch(f"the graph returns {len(mine)} tensors, the model {len(theirs)}")
    if not _agree(graph_out, eager_out, scaled=scaled):
        raise GraphMismatch(f"the traced graph's output differs from the eager model's {where}")


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter and buffer (a forward in train mode updates BatchNorm's)."""
    return {name: tensor.detach().clone() for name, tensor in _state(model).items()}


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _restore(model: torch.nn.Module, saved: dict[str, torch.Tensor], *, buffers_only: bool = False) -> None:
    """Put the saved values back; a tensor the forward replaced by one of another shape (a table of
    positions regrown for a longer input) is replaced by the saved one again."""
    state = dict(model.named_buffers()) if buffers_only else _state(model)
    with torch.no_grad():
        for name, tensor in state.items():
            if name not in saved:
                continue  # registered by the forward itself: nothing to go back to
            if tensor.shape == saved[name].shape:
                tensor.copy_(saved[name])
                continue
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            if leaf in module._buffers:
                module._buffers[leaf] = saved[name].clone()
            else:
                tensor.data = saved[name].clone()


def shares_parameters(module: fx.GraphModule, model: torch.nn.Module) -> bool:
    """Whether every parameter of the graph is a parameter of the model (same storage), so that
    redrawing the model's redraws the graph's (symbolic_trace, export and make_fx all share)."""
    owned = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return all(p.untyped_storage().data_ptr() in owned for p in module.parameters())


def _redraws(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> Iterator[str]:
    """Put other values into the floating-point parameters, in place (the graph shares them):
    each one plus noise of its own spread, then negated plus noise. A zero-initialised gate
    becomes non-zero, a positive scalar negative."""
    generator = torch.Generator().manual_seed(1)
    parameters = [(p, saved[name]) for name, p in model.named_parameters() if p.is_floating_point()]
    if not parameters:
        return
    with torch.no_grad():
        spreads = [float(original.abs().max()) if original.numel() else 0.0 for _, original in parameters]
    for sign, label in ((1.0, "redrawn"), (-1.0, "negated and redrawn")):
        with torch.no_grad():
            for (parameter, original), spread in zip(parameters, spreads):  # in place, in the parameter's dtype
                parameter.normal_(0.0, 0.1 * max(spread, 0.1), generator=generator).add_(original, alpha=sign)
        yield label


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True, rtol=0, atol=0)))


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


def explain(model: torch.nn.Module, errors: list[tuple[str, BaseException]], inputs: Optional[tuple]) -> str:
    """One line: which submodule and which Python construct stopped tracing, and what helps."""
    if not errors:
        return "could not trace the model: symbolic_trace needs no inputs but export/make_fx do; give --input-shape"
    name, exc = _explained(errors)
    if isinstance(exc, ValueSpecialised):
        owner = model.get_submodule(exc.path) if exc.path else model
        subject = f"`{exc.path}` ({type(owner).__name__})" if exc.path else "its forward"
        remedy = f"{exc.remedy}{_declare(type(owner), model, ', or ')}" if exc.declare else exc.remedy
        return (f"could not trace {type(model).__name__}: {subject} at {exc.where} {exc.what} (make_fx on the example's "
                f"values: {exc.why}); {remedy}")
    if isinstance(exc, GraphMismatch):
        return f"could not trace {type(model).__name__} faithfully: {exc} ({name})"
    path, owner = _failing_submodule(model, exc)
    subject = _culprit(model, exc)
    text = str(exc)
    construct = next((what for phrases, what in _CONSTRUCTS if any(p in text for p in phrases)), None)
    if construct is None:
        return (
            f"could not trace {type(model).__name__}: {subject} raised {first_line(exc)} ({name}); "
            f"check that the model runs on its example inputs{f' {shapes_of(inputs)}' if inputs else ''} (--traceback shows where)"
        )
    hint = "give --input-shape so torch.export can run it, or " if inputs is None else ""
    remedy = _declare(type(owner if path else model), model, "; " + hint)
    return f"could not trace {type(model).__name__}: {subject} {construct} ({name}){remedy}"


def _declare(leaf: type, model: torch.nn.Module, joint: str) -> str:
    """The remedy that makes ``leaf`` an opaque module with a declared exponent, after ``joint``; for a
    Hugging Face model, which symbolic_trace (the tracer that keeps declared modules opaque) cannot
    trace, that it would not help."""
    if is_hugging_face(model):
        return ("; declaring its exponent would not help: Hugging Face models are traced by torch.export and make_fx, "
                "which keep no module opaque")
    return (f"{joint}declare its exponent so qlint treats it as an opaque leaf: qlint.register({leaf.__name__}, q=..., "
            f"why=...) or [tool.qlint.primitives] \"{declared_name(leaf)}\" = {{ q = ..., why = \"...\" }}")


def _explained(errors: list[tuple[str, BaseException]]) -> tuple[str, BaseException]:
    """The tracer failure that explains best (export's and make_fx's run the real forward; a value
    read that make_fx on the example's values found names the read)."""
    by_tracer = dict(errors)
    if isinstance(by_tracer.get("make_fx"), ValueSpecialised):
        return "make_fx", by_tracer["make_fx"]
    name = next((t for t in _TRACER_PREFERENCE if t in by_tracer), errors[-1][0])
    return name, by_tracer[name]


def _culprit(model: torch.nn.Module, exc: BaseException) -> str:
    """The submodule and the user's line that raised, e.g. ```w1` (Linear) at model.py:30 `return self.w1(x)```."""
    path, owner = _failing_submodule(model, exc)
    subject = f"`{path}` ({type(owner).__name__})" if path else "its forward"
    where = _user_frame(exc)
    return f"{subject} at {where}" if where else subject


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
        if not frame.filename.startswith(TORCH_DIR) and "/qlint/core/" not in frame.filename and "/qlint/analysis" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} `{(frame.line or '').strip()}`"
    return None


__all__ = ["TRACERS", "GraphMismatch", "TraceFailure", "TracedGraph", "capture", "compare_with_eager", "forward_hooks",
           "is_hugging_face", "quiet", "tensor_outputs", "unsafe_mutation"]
