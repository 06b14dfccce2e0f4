"""Capture a model's graph faithfully: one pipeline of named stages, called top to bottom from
:func:`capture` in the order this file defines them. Each stage's module is entered once, on the way
down; it imports only the modules below it (``CAPTURE_ORDER`` in ``scripts/import_graph.py``, which
``tests/test_layering.py`` checks), never the pipeline.

1. **preconditions**: the model's class runs its own ``forward``, no tensor subclass redefines the
   ops it enters, the parameters are finite (:mod:`qlint.capture.trace`);
2. **eager record**: one eager forward refuses a read of a held float tensor into Python, counts the
   ops the model runs and records what it reads from the process (:mod:`qlint.capture.eager_record`,
   :mod:`qlint.capture.process_state`).

Then for each tracer in turn (symbolic_trace, then torch.export, then make_fx; the first faithful
graph wins):

3. **group** identical sibling layers (:func:`qlint.capture.reuse.find_groups`, export only);
4. **trace** (:mod:`qlint.capture.trace`), with the groups' copies recorded; custom ops whose body is
   known are inlined (:mod:`qlint.capture.hops`);
5. **expand** the copies into the graph, or number the full graph's layers
   (:func:`qlint.capture.reuse.expand` / :func:`~qlint.capture.reuse.renumber`);
6. **check against the model** (:mod:`qlint.capture.graph_check`): the graph must compute what the eager
   model computes on the example, scaled and redrawn; copies the check refutes are traced again, each;
7. **shape coverage** (:func:`qlint.capture.graph_check.shape_coverage`): the other input shapes the graph
   stands for (their axes and sizes: :mod:`qlint.capture.shapes`, which step 4 reads for export's dynamic axes);

and, for the graph kept:

8. **modes**: the model traced again in each global mode its forward asks about and under each
   environment value that changes it, kept where that graph differs.

What every stage shares (running the model quietly, in the analysed grad mode, its state saved and put
back) is :mod:`qlint.capture.harness`. When every tracer fails, :func:`explain` says in one line which
construct stopped tracing and what helps.
"""

from __future__ import annotations

import functools
import traceback
from typing import Any, Optional

import torch
import torch.fx as fx

from qlint.capture import eager_record, hops
from qlint.capture import reuse as layer_reuse
from qlint.core.graph import ENGINE_FOLDERS, TORCH_DIR
from qlint.capture.graph_check import (GraphMismatch, compare_with_eager, eager_failure, require_every_op,
                                      shape_coverage)
from qlint.core.ops import declared_name
from qlint.capture.process_state import answering, environment_set, own_caches_apart
from qlint.capture.harness import first_line, grad_state, has_meta, is_hugging_face, quiet, restore, snapshot
from qlint.capture.trace import (ModeGraph, TraceFailure, TracedGraph, ValueSpecialised, export_module, make_fx_module,
                                 non_finite_parameters, redefining_tensor, symbolic_trace_module)

TRACERS = ("symbolic_trace", "export", "make_fx")


class _NoLeaves:
    """Without a registry, symbolic_trace traces through every module."""

    @staticmethod
    def is_leaf(cls: type) -> bool:
        return False


def capture(model: torch.nn.Module, inputs: Optional[tuple], registry: Any = None, *, prefer: Optional[str] = None,
            reuse: bool = True, shapes_too: bool = True) -> TracedGraph:
    """The first faithful graph of symbolic_trace, export, make_fx; ``prefer``: that tracer only.
    ``reuse``: export traces identical layers once (:mod:`qlint.capture.reuse`). ``shapes_too``: check
    an export or make_fx graph on other input shapes too (``graph_check.shape_coverage``).

    A tracer the user asked for is a requirement, as an explicit flag is in mypy or ruff:
    when it fails, the TraceFailure says so instead of another tracer's graph being used
    under a header the user did not ask for. When every tracer fails on example inputs,
    the model itself is run on them: a model that does not run (inputs of the wrong
    shape) is reported as such, naming the submodule that failed and the input shapes.

    ``registry`` decides which nn modules symbolic_trace keeps as leaves (its module rules
    and user declarations); without one every module is traced through.
    """
    registry = registry if registry is not None else _NoLeaves()
    _preconditions(model, inputs, prefer)
    held = _attributes(model)
    try:
        with own_caches_apart(model):  # the model's memoised queries asked again, the user's caches kept
            recorded = _recorded(model, inputs) if inputs is not None and not has_meta(model, inputs) else None
            traced = _first_faithful(model, inputs, registry, prefer, reuse, shapes_too, recorded)
            if recorded is not None:
                traced.conditions = recorded.conditions
                traced.in_modes += _in_modes(traced.tracer, model, traced.module, inputs, registry, reuse,
                                             traced.graph_check, _environment_modes(recorded.environment_changing)
                                             + _answer_modes(recorded.answers_to_trace))
            return traced
    finally:
        _restore_attributes(model, held)


# --- 1. preconditions ------------------------------------------------------------------------------


def _preconditions(model: torch.nn.Module, inputs: Optional[tuple], prefer: Optional[str]) -> None:
    """What no tracer may be given (raises TraceFailure): a model whose ``__call__`` or instance
    ``forward`` is not the class's forward, a tracer that does not exist or needs inputs it does not
    have, a tensor subclass that redefines the ops it enters, parameters holding inf or nan."""
    # GraphModule's is torch's
    own_call = not (getattr(type(model).__call__, "__module__", "") or "").startswith("torch")
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
        raise TraceFailure(f"{redefined} is a tensor subclass that redefines the ops it enters (`__torch_function__` "
                           "or `__torch_dispatch__`): a graph of torch ops does not say what they compute; use plain "
                           "tensors")
    broken = non_finite_parameters(model) if inputs is not None else []
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise TraceFailure(f"the parameter `{broken[0]}` holds inf or nan{more}, so the graph cannot be checked "
                           "against the model's outputs; analyse the model with finite weights (a fresh init, or "
                           "--device meta)")


# --- 2. the eager record: one forward, what it reads and runs --------------------------------------


def _recorded(model: torch.nn.Module, inputs: tuple) -> eager_record.EagerRecord:
    """Two recorded eager forwards (:mod:`qlint.capture.eager_record`): refuse a read of a held float tensor's
    value in Python (every tracer would keep the path today's value took); the ops the second ran, which
    the graph must run too (a first call may fill a cache the traces then find: Mimi's paddings), and what
    they read from the process around the model (the certificate's conditions)."""
    saved, state = snapshot(model), torch.random.get_rng_state()
    try:
        with quiet(), grad_state(model.training):
            recorded = eager_record.record(model, inputs, calls=2)

            def again() -> eager_record.EagerRecord:
                restore(model, saved)
                torch.random.set_rng_state(state)
                return eager_record.record(model, inputs)

            changing = eager_record.environment_changing(recorded.conditions, again)
            recorded.answers_to_trace = eager_record.other_answers(recorded.two_valued, again)
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)
    read = recorded.read
    if read is not None:
        raise TraceFailure(f"{type(model).__name__} reads the value of {read.what} in Python at {read.where}: a graph "
                           "holds the value it had when traced and the path that value took, and training may change "
                           "it (qlint certifies for every value a float tensor the model holds may take); compute with "
                           "tensor ops (torch.where, a multiplication), or hold a constant as a Python number")
    refused = [family for family in eager_record.REFUSED_FACTS if family in recorded.facts_read]
    if refused:
        what, why = eager_record.REFUSED_FACTS[refused[0]]
        raise TraceFailure(f"{type(model).__name__} reads {what} at {recorded.facts_read[refused[0]]} ({why}): a "
                           "forward that branches on it can take a path at a value no check can try, so no graph "
                           "stands for every call; branch on values, shapes and modes only")
    recorded.environment_changing = changing
    recorded.conditions = [c for c in recorded.conditions if c not in recorded.answers_to_trace]
    return recorded


# --- 3-7. each tracer in turn: group, trace, expand, check, shape coverage -------------------------


def _first_faithful(model: torch.nn.Module, inputs: Optional[tuple], registry: Any, prefer: Optional[str],
                    reuse: bool, shapes_too: bool, eager: Optional[eager_record.EagerRecord]) -> TracedGraph:
    """Each tracer in turn (``prefer``: that one only) until one gives a graph the checks accept."""
    attempts: list[str] = []
    errors: list[tuple[str, BaseException]] = []
    for name in [prefer] if prefer else TRACERS:
        if name != "symbolic_trace" and inputs is None:
            attempts.append(f"{name}: needs example inputs")
            continue
        if name == "symbolic_trace" and not prefer and inputs is not None and is_hugging_face(model):
            attempts.append("symbolic_trace: skipped (Hugging Face models branch on tensor values; torch.export "
                            "follows them)")
            continue
        try:
            with quiet(), grad_state(model.training):
                module, check = _traced_and_checked(name, model, inputs, registry, reuse=reuse, eager=eager)
        except Exception as exc:  # every tracer failure is reported, none is fatal here
            attempts.append(f"{name}: {first_line(exc)}")
            errors.append((name, exc))
            continue
        coverage = shape_coverage(model, module, inputs, name) if shapes_too else None
        return TracedGraph(module=module, tracer=name, attempts=attempts, graph_check=check,
                           replayed=list(module.meta.get("qlint_replayed", [])),
                           reuse_abandoned=module.meta.get("qlint_reuse_abandoned", ""), shapes=coverage,
                           specialised=list(module.meta.get("qlint_specialised", [])),
                           in_modes=_in_modes(name, model, module, inputs, registry, reuse, check,
                                              module.meta.get("qlint_modes", [])))
    refused = eager_failure(model, inputs) if inputs is not None and not has_meta(model, inputs) else None
    if refused is not None:
        raise TraceFailure(f"{type(model).__name__} does not run on its example inputs {shapes_of(inputs)}: "
                           f"{_culprit(model, refused)} raised {first_line(refused)}; "
                           "give inputs the model accepts (--input-shape, or the factory's example inputs)"
                           ) from refused
    message = explain(model, errors, inputs)
    if prefer:
        message += f"; {prefer} was asked for (--tracer / tracer = ...), so no other tracer was tried"
    raise TraceFailure(message) from (_explained(errors)[1] if errors else None)


def _traced_and_checked(tracer: str, model: torch.nn.Module, inputs: Optional[tuple], registry: Any, *,
                        reuse: bool, other_modes: bool = True, grad: Optional[bool] = None,
                        eager: Optional[eager_record.EagerRecord] = None) -> tuple[fx.GraphModule, str]:
    """Stages 2-5 for one tracer: the graph and what its check against the eager model found (under
    every global mode too, unless ``other_modes`` is off: a graph traced in one stands for it only;
    ``grad``: compared in that grad mode, when not the analysed one; ``eager``: the recorded eager forward,
    whose ops the graph must run too)."""
    module = _traced(tracer, model, inputs, registry, reuse)
    check = dict(shape_only=tracer == "symbolic_trace", other_modes=other_modes, grad=grad, eager=eager)
    try:
        return module, compare_with_eager(model, module, inputs, **check)
    except GraphMismatch:
        if tracer != "export" or not module.meta.get("qlint_replayed"):
            raise
    module = exported(model, inputs, reuse=False)  # the copied layers are not the model's: trace each
    module.meta["qlint_reuse_abandoned"] = "the graph check refuted the copied layers"
    return module, compare_with_eager(model, module, inputs, **check)


def _traced(tracer: str, model: torch.nn.Module, inputs: Optional[tuple], registry: Any, reuse: bool) -> fx.GraphModule:
    """Stages 2-4 for one tracer: the graph, not yet checked; the module's attributes as they were (a
    Proxy a traced forward left in one would enter the next trace)."""
    held = _attributes(model)
    try:
        if tracer == "symbolic_trace":
            module = symbolic_trace_module(model, registry, inputs)
        elif tracer == "make_fx":
            module = make_fx_module(model, inputs)  # type: ignore[arg-type]
        else:
            module = exported(model, inputs, reuse=reuse)  # type: ignore[arg-type]
    finally:
        _restore_attributes(model, held)
    # custom ops whose body is known and that no rule bounds
    knows = getattr(registry, "knows", None)
    module.meta["qlint_inlined_ops"] = hops.inline_custom_ops(
        module, inputs, (lambda target: knows("call_function", target)) if knows else (lambda target: False))
    return module


def exported(model: torch.nn.Module, inputs: tuple, *, reuse: bool = True) -> fx.GraphModule:
    """Stages 2-4 under torch.export: group identical layers, export with the groups' copies
    recorded, expand the copies; when there are no groups or the copies are abandoned (a poison read,
    an open region, an export error), export in full and number the layers."""
    groups = layer_reuse.find_groups(model) if reuse else []
    abandoned = ""
    if groups:
        try:
            with layer_reuse.recording(model, groups) as plan:
                module = export_module(model, inputs, fatal=layer_reuse.abandoned)
            layer_reuse.expand(module, model, plan)
            module.meta["qlint_replayed"] = [name for group in plan.groups for name in group.replayed]
            return module
        except Exception as exc:  # noqa: BLE001  (a poison read, an open region, an export error: trace in full)
            abandoned = first_line(exc)
    module = export_module(model, inputs)
    layer_reuse.renumber(module)
    module.meta["qlint_reuse_abandoned"] = abandoned
    return module


# --- 8. the modes the forward reads, each traced again ---------------------------------------------


def _in_modes(tracer: str, model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple], registry: Any,
              reuse: bool, checked: str, modes: list[tuple[str, str, Any, Optional[str]]]) -> list[ModeGraph]:
    """The model traced again, by the same tracer, in the ``modes`` its forward may read, where that
    graph is another computation than the one analysed: its outputs may agree on every input
    compared (a branch whose term vanishes on random inputs), so the pipeline analyses it too.

    Which modes: the global modes :func:`qlint.capture.graph_check._compare_in_modes` chose
    (``module.meta["qlint_modes"]``: every mode the model runs in for a symbolic_trace graph, the modes
    the forward asks about for another tracer), and an environment variable's value under which the
    eager forward computes something else (:func:`_environment_modes`)."""
    out = []
    for what, family, mode, line in modes:
        try:
            with quiet(), grad_state(model.training), mode():
                found = _traced_in_mode(tracer, model, module, inputs, registry, reuse)
        except Exception as exc:  # noqa: BLE001  (reported: the mode's graph is then a gap)
            out.append(ModeGraph(what, line or "", None, first_line(exc)))
            continue
        if found is not None:
            used, other, check = found
            out.append(ModeGraph(what, line or "", TracedGraph(module=other, tracer=used,
                                                               graph_check=f"{checked}; traced {what}, it {check}")))
    return out


def _environment_modes(changing: dict[Any, str]) -> list[tuple[str, str, Any, Optional[str]]]:
    """Each environment variable's value that changes the forward, as a mode to trace the model in."""
    return [(f"with the environment variable {condition.name}={value!r}" if value is not None
             else f"with the environment variable {condition.name} unset", "environment",
             functools.partial(environment_set, condition.name, value), f"{condition.file}:{condition.line} "
             f"`{condition.code}`") for condition, value in changing.items()]


def _answer_modes(changing: dict[Any, tuple[Any, bool]]) -> list[tuple[str, str, Any, Optional[str]]]:
    """Each query of the process answered the other way, as a mode to trace the model in (the same graph there adds
    nothing: :func:`_traced_in_mode`)."""
    return [(f"with {condition.what.split(' (')[0]} answering {answer}", "process",
             functools.partial(answering, function, answer), f"{condition.file}:{condition.line} `{condition.code}`")
            for condition, (function, answer) in changing.items()]


def _traced_in_mode(tracer: str, model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple],
                    registry: Any, reuse: bool) -> Optional[tuple[str, fx.GraphModule, str]]:
    """In the mode the caller entered: None when ``tracer`` gives the same graph as ``module``, else the
    tracer, the graph and its check, the same tracer first and the others where it fails (a branch that
    writes in place, which symbolic_trace cannot follow). Checked in the grad mode the mode left (inference
    mode turns gradients off). Raises the first tracer's failure when none gives a faithful graph. The graph
    must run every op the eager model runs in the mode, the same graph as ``module`` too: a tracer's stand-ins
    may not see what the mode changes (a gradient hook on a parameter), and the graph would then be the
    analysed path again, not the mode's."""
    gradients = torch.is_grad_enabled()
    recorded = _recorded_in_mode(model, inputs)
    failures = []
    for name in [tracer] + [t for t in TRACERS if t != tracer and inputs is not None]:
        try:
            if name == tracer and _fingerprint(_traced(name, model, inputs, registry, reuse)) == _fingerprint(module):
                if recorded is not None:
                    require_every_op(module, inputs, recorded)
                return None  # the same ops: the graph analysed stands for this mode too
            other, check = _traced_and_checked(name, model, inputs, registry, reuse=reuse, other_modes=False,
                                               grad=gradients, eager=recorded)
            return name, other, check
        except Exception as exc:  # noqa: BLE001  (the next tracer; the first failure is the one reported)
            failures.append(exc)
    raise failures[0]


def _recorded_in_mode(model: torch.nn.Module, inputs: Optional[tuple]) -> Optional[eager_record.EagerRecord]:
    """One recorded eager forward in the mode the caller entered (the model's state and the RNG restored)."""
    if inputs is None or has_meta(model, inputs):
        return None
    saved, state = snapshot(model), torch.random.get_rng_state()
    try:
        with quiet():
            recorded = eager_record.record(model, inputs)
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)
    return recorded if recorded.ran else None


def _fingerprint(module: fx.GraphModule) -> list[tuple[str, ...]]:
    """The ops a graph runs, in order, with their arguments: two traces of one path through the forward
    give the same (a scale chosen by the mode is an argument)."""
    return [(n.op, str(n.target), str(n.args), str(n.kwargs)) for n in module.graph.nodes
            if n.op not in ("placeholder", "output")]


# --- what a traced or checked forward assigns, put back --------------------------------------------


def _attributes(model: torch.nn.Module) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each module's own attributes (its ``__dict__``, shallow) and the contents of the dicts and lists
    among them: what a forward may assign (``self.stats["tokens"] += n`` writes a Proxy there)."""
    held = {}
    for path, module in model.named_modules():
        own = dict(vars(module))
        held[path] = (own, {key: (dict(value) if isinstance(value, dict) else list(value))
                            for key, value in own.items() if type(value) in (dict, list)})
    return held


def _restore_attributes(model: torch.nn.Module, held: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """Tracing leaves nothing in the user's module: an attribute the forward assigned while being
    traced (symbolic_trace would leave an fx Proxy there, export a fake tensor) or checked (a counter)
    is put back, one it added is removed, and a dict or list it wrote into holds what it held."""
    for path, module in model.named_modules():
        if path not in held:
            continue
        before, contents = held[path]
        own = vars(module)
        for key in [k for k in own if k not in before]:
            del own[key]
        for key, value in before.items():
            if own.get(key) is not value:
                own[key] = value
        for key, saved in contents.items():
            container = before[key]
            if isinstance(container, dict):
                container.clear()
                container.update(saved)
            else:
                container[:] = saved


# --- when every tracer fails: one line that says why -----------------------------------------------


def shapes_of(inputs: tuple) -> str:
    """``(2, 4, 99) float32, (2, 4) int64``: each example input's shape and dtype (else its type)."""
    return ", ".join(f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}" if isinstance(x, torch.Tensor)
                     else type(x).__name__ for x in inputs)


# (phrases of a tracer's error, the Python construct they mean)
_CONSTRUCTS = (
    (
        ("data-dependent", "_local_scalar_dense", "control flow", "'Proxy'", "Proxy object", "Proxy)",
         "GuardOnDataDependent"),
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
        return (f"could not trace {type(model).__name__}: {subject} at {exc.where} {exc.what} (make_fx on the "
                "example's "
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
            f"check that the model runs on its example inputs{f' {shapes_of(inputs)}' if inputs else ''} (--traceback "
            "shows where)"
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
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if (not frame.filename.startswith(TORCH_DIR) and not any(f in frame.filename for f in ENGINE_FOLDERS)
            and "/qlint/analysis" not in frame.filename):
            return f"{frame.filename}:{frame.lineno} `{(frame.line or '').strip()}`"
    return None


__all__ = ["TRACERS", "capture", "explain", "exported", "shapes_of"]
