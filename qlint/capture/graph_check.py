"""Check a traced graph against the model it stands for: the graph must compute what the eager model
computes, on the example inputs, on them scaled, with the parameters redrawn, and on other input shapes.

The analysis reads the graph, not the model, so a graph that agrees on today's values only (a branch
on a parameter's value, state kept across calls) would certify what the model does not compute.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import sys
import types
from collections import Counter
from copy import deepcopy
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from qlint.capture import eager_record, histories, shapes
from qlint.capture.call_state import first_change, python_state
from qlint.capture.eager_record import missing_ops, ops_run
from qlint.capture.module_state import cross_reads
from qlint.capture.process_state import MODE_QUERIES, mode_query_owner
from qlint.core.graph import TORCH_DIR, indeterminate, storage_key, strided
from qlint.capture.harness import (argument_names, compiling_mode, cuda_autocast_mode, deterministic_mode,
                                   first_line, float64_default_mode, grad_state, has_meta, medium_matmul_mode, quiet,
                                   restore, snapshot, tensor_outputs, tensors)

def shape_coverage(model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple],
                   tracer: str) -> Optional[shapes.ShapeCoverage]:
    """The shapes the graph computes the model on (:mod:`qlint.capture.shapes`); None for symbolic_trace,
    whose graph records no shape (a branch on a size stops it), or without values to compare."""
    if tracer == "symbolic_trace" or inputs is None or has_meta(model, inputs):
        return None

    def runs(other: tuple) -> bool:
        return eager_failure(model, other) is None

    def same_path(other: tuple) -> bool:  # the same ops, as often (a fused bias counts as its add)
        theirs, here = _ops_recorded(model, other), _ops_recorded(model, inputs)
        return theirs is not None and here is not None and theirs == here

    return shapes.probe(model, inputs, bool(module.meta.get("qlint_dynamic")),
                        list(module.meta.get("qlint_shape_guards", [])),
                        shapes.symbolic_axes(module, inputs), runs, lambda other: computes(model, module, other),
                        argument_names(model, len(inputs)), same_path)


def _ops_recorded(model: torch.nn.Module, inputs: tuple, history: Optional[Callable[[tuple], Any]] = None,
                  given: Optional[list] = None) -> Optional[Counter]:
    """The ops one eager forward runs to its outputs (:func:`qlint.capture.eager_record.record`), by kind, in the
    analysed grad mode, or under ``history``: a context given the inputs that gives the model another history
    and yields the inputs to run on (appended to ``given``), and takes it back. The model's state and the RNG are
    restored."""
    saved, state = snapshot(model), torch.random.get_rng_state()
    try:
        with quiet(), grad_state(model.training), (history or contextlib.nullcontext)(inputs) as run_on:
            run_on = inputs if history is None else run_on
            if given is not None:
                given.append(run_on)
            recorded = eager_record.record(model, run_on)
        return recorded.ops if recorded.ran else None
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)


def computes(model: torch.nn.Module, module: fx.GraphModule, inputs: tuple) -> bool:
    """Whether the graph runs on ``inputs`` and gives the eager model's output there (in the
    analysed mode's grad state; the model's state and the RNG are restored). Not run where an input
    has size 1 on an axis the graph fixed to another size, or another size where it fixed 1: sizes
    baked into its ops (a padding, an LSTM's initial state for a batch of one) can abort the process
    there instead of raising, and such a graph does not stand for that size."""
    if _crosses_one_on_a_fixed_axis(module, inputs):
        return False
    saved, state = snapshot(model), torch.random.get_rng_state()
    try:
        with quiet(), grad_state(model.training):
            _compare_again(module, model, inputs, "on inputs of another shape")
        return True
    except GraphMismatch:
        return False
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)


def _crosses_one_on_a_fixed_axis(module: fx.GraphModule, inputs: tuple) -> bool:
    placeholders = [n.meta.get("val") for n in module.graph.nodes if n.op == "placeholder"]
    values = [x for x in inputs if isinstance(x, torch.Tensor)]
    traced = [v for v in placeholders if isinstance(v, torch.Tensor)]
    if len(traced) != len(values):
        return False
    return any(isinstance(fixed, int) and size != fixed and 1 in (size, fixed)
               for value, graph_value in zip(values, traced) for size, fixed in zip(value.shape, graph_value.shape))


def eager_failure(model: torch.nn.Module, inputs: tuple) -> Optional[BaseException]:
    """What the eager model raises on ``inputs``, if anything (no gradients; the parameters,
    buffers and RNG state are restored). Not on meta tensors: there a value read raises too,
    so a tracer's failure could not be told from inputs the model does not accept."""
    saved = snapshot(model)
    state = torch.random.get_rng_state()
    try:
        with quiet(), torch.no_grad():
            _eager(model, inputs)
    except Exception as exc:  # noqa: BLE001  (returned: the caller reports it)
        return exc
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)
    return None


class GraphMismatch(Exception):
    """The traced graph does not compute what the eager model computes."""


def compare_with_eager(model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple], *,
                       shape_only: bool = False, other_modes: bool = True, grad: Optional[bool] = None,
                       eager: Optional[eager_record.EagerRecord] = None) -> str:
    """Run the graph and the eager model and compare their outputs: on the example inputs,
    on them scaled up, and with the parameters redrawn.

    The analysis reads the graph, so the graph must compute what the model computes for
    every input size and every parameter value, not only today's: a forward that
    branches on a parameter's value (``if self.gate.item():``), bakes one in
    (``x ** float(self._parameters["p"])``), notices the tracer, or keeps state across
    calls gives a graph that matches on the example and differs here. Also records each
    node's shape and dtype on symbolic_trace graphs (ShapeProp), which the shape-dependent
    proofs use. Raises GraphMismatch when the outputs differ; the model's parameters,
    buffers and RNG state are restored afterwards. ``other_modes``: also under every global mode the
    forward can observe (not for a graph traced in one of them, which stands for that mode only).
    ``grad``: the grad mode to compare in, when not the analysed mode's (a graph traced without gradients).
    ``eager``: the recorded eager forward on the example (:mod:`qlint.capture.eager_record`): the graph must run
    each op it ran as often, or it left out a path the model takes when not traced.
    """
    if inputs is None:
        return "not compared: no example inputs"
    from torch.fx.passes.shape_prop import ShapeProp

    if has_meta(model, inputs):
        if shape_only:
            ShapeProp(module).propagate(*inputs)
        return "not compared: meta tensors have no values"
    saved = snapshot(model)
    state = torch.random.get_rng_state()
    try:
        gradients = model.training if grad is None else grad
        with grad_state(gradients):
            torch.manual_seed(0)
            graph_out = ShapeProp(module).propagate(*inputs) if shape_only else module(*inputs)
            first = _eager(model, inputs)
            roots = eager.state_roots if eager is not None else {}
            plain = python_state(model, roots)  # after one call: a value set once (a flag, a lazy cache) is no state
            # buffers the forward writes (BatchNorm's statistics in training)
            module.meta["qlint_written_buffers"] = frozenset(
                storage_key(b) for name, b in model.named_buffers()
                if b.numel() and not _same_tensor(b, saved[name]))
            _require_same(graph_out, first, "on the example inputs")
            _require_stateless(model, inputs, first, plain, module.meta["qlint_written_buffers"], roots)
            if eager is not None:
                require_every_op(module, inputs, eager)
            floats = any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs)
            if gradients and floats:  # in training every block after the first reads a value that requires grad
                wanting = tuple(x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
                                else x
                                for x in inputs)
                if _eager_runs(model, wanting):  # a model that cannot take them (no CPU backward) never runs so
                    _compare_again(module, model, wanting, "on inputs that require grad (as in training)")
            for scale in SCALES if floats else ():
                scaled = tuple(x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                               for x in inputs)
                _compare_again(module, model, scaled, f"on the inputs scaled by {scale:g}", scaled=True)
            if not shares_parameters(module, model):  # redrawing the model's would not redraw the graph's
                raise GraphMismatch("the graph holds its own copy of the parameters: it cannot be checked with redrawn "
                                    "ones")
            for redraw in _redraws(model, saved):  # each redraw overwrites every float parameter
                _compare_again(module, model, inputs, f"with the parameters {redraw}")
                restore(model, saved, buffers_only=True)  # what the forward may have updated (BatchNorm's statistics)
        modes = (_compare_in_modes(module, model, inputs, model.training, every_mode=shape_only,
                                   facts_read=None if eager is None else eager.facts_read,
                                   flags_read=None if eager is None else eager.flags_read) if other_modes else [])
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)
    count = len(tensors(graph_out))
    return (f"matches the eager model on the example inputs, scaled by {', '.join(f'{s:g}' for s in SCALES)}, "
            f"with redrawn parameters, over {CALLS} successive calls"
            + (f", and {', '.join(modes)}" if modes else "")
            + f" ({count} output{'s' if count != 1 else ''})")


def require_every_op(module: fx.GraphModule, inputs: tuple, eager: eager_record.EagerRecord) -> None:
    """The graph, run on the example, runs every op the eager model ran there (``eager``), as often: a forward
    that notices the tracer can leave out a term that is 0 on every input compared (gated by a padding
    marker), and only the ops it runs show it. A custom op the graph runs as its body is not missing."""
    if not eager.ran:
        return
    inlined = Counter({op: eager.ops[op] for op in module.meta.get("qlint_inlined_ops", ())})
    eager_ops = eager.ops - inlined
    torch.manual_seed(0)
    missing = missing_ops(eager_ops, ops_run(module, inputs))
    if missing:
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise GraphMismatch(f"the model runs ops on the example that the graph does not ({', '.join(missing[:4])}"
                            f"{more}): the forward takes another path while it is traced (a test of fx tracing, of a "
                            "Proxy or fake tensor, or of torch.compiler.is_compiling())")


CALLS = 3  # successive identical calls compared: state kept across calls shows from the second one


def _require_stateless(model: torch.nn.Module, inputs: tuple, first: Any, before: dict[str, Any],
                       written: frozenset[int], roots: Mapping[str, Callable[[], Any]]) -> None:
    """One traced call stands for every call only if the forward keeps no state: the same output over
    successive identical calls, no plain Python value of a module that the calls after the first go on
    changing (a step counter, a depth unlocked after N calls), none that a backward changes (a step count kept
    by a gradient hook), and no integer or bool buffer written (a step count read into Python with
    ``int(self.step)``; BatchNorm's own ``num_batches_tracked`` excepted)."""
    for call in range(2, CALLS + 1):
        if not _agree(first, _eager(model, inputs)):
            raise GraphMismatch(f"the model's output changes between identical calls (call {call} differs from the "
                                "first: state kept across calls, or unseeded randomness): no graph can stand for it")
    for what in ("the forward", "a backward"):
        if what == "a backward":
            _backward(model, inputs)
        after = python_state(model, roots)
        for name, value in before.items():
            if after.get(name, value) != value:
                raise GraphMismatch(f"{what} changes `{name}` ({first_change(value, after[name])}): state kept across "
                                    "calls, which one traced call cannot stand for")
    for name, buffer in model.named_buffers():
        if (not (buffer.is_floating_point() or buffer.is_complex()) and not name.endswith("num_batches_tracked")
                and buffer.numel() and storage_key(buffer) in written):
            raise GraphMismatch(f"the forward writes the integer buffer `{name}`: a count kept across calls, which "
                                "one traced call cannot stand for")


def _backward(model: torch.nn.Module, inputs: tuple) -> None:
    """One backward through a forward of ``inputs``, the parameters' gradients put back (what a training step
    runs besides the forward: the model's own gradient hooks with it)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    held = [p.grad for p in trained]
    try:
        with torch.enable_grad():
            outputs = [t for t in tree_leaves(_eager(model, inputs)) if isinstance(t, torch.Tensor) and t.requires_grad]
            if outputs:
                sum(t.real.float().sum() for t in outputs).backward()
    except Exception:  # noqa: BLE001  (a model without a backward: training cannot move anything there)
        pass
    finally:
        for p, grad in zip(trained, held):
            p.grad = grad


def _observed_modes(training: bool, compiling: bool) -> list[tuple[str, str, Any, bool]]:
    """The global modes a forward can read (``torch.is_grad_enabled()``, ``is_inference_mode_enabled()``,
    ``is_autocast_enabled()``, ``get_default_dtype()``, ``are_deterministic_algorithms_enabled()``,
    ``is_anomaly_enabled()``, the saved-tensor hooks on top of autograd's stack):
    (what, which query family reads it, context factory, whether it rounds, so outputs agree only to
    its rounding). A model analysed in train mode is also run without gradients (a calibration pass);
    one analysed in eval mode is inference, run without gradients, and is not run with them: that
    check refused a sound PatchTST mid-training (nn.MultiheadAttention takes another kernel with
    gradients, which is the likely reason). A graph traced by torch.export was traced compiling, as
    ``torch.compile`` runs the forward (``compiling``); another tracer's is also run as if compiled. CUDA autocast
    casts no CPU tensor: only a forward that asks about it (``is_autocast_enabled("cuda")``) takes another path."""
    return [
        *([("with gradients off", "grad", lambda: grad_state(False), False)] if training else []),
        *([("as torch.compile runs it (torch.compiler.is_compiling() True)", "compile", compiling_mode, False)]
          if not compiling else []),
        ("in inference mode", "inference", torch.inference_mode, False),
        ("under CPU autocast (bfloat16)", "autocast", lambda: torch.autocast("cpu", dtype=torch.bfloat16), True),
        ("under CUDA autocast (float16)", "cuda autocast", cuda_autocast_mode, False),
        ("with float64 as the default dtype", "dtype", float64_default_mode, False),
        ("with deterministic algorithms", "deterministic", deterministic_mode, False),
        ("with float32 matmul precision 'medium'", "matmul", medium_matmul_mode, True),
        ("with anomaly detection", "anomaly", lambda: torch.autograd.set_detect_anomaly(True), False),
        ("with saved tensors offloaded (saved-tensor hooks)", "saved", torch.autograd.graph.save_on_cpu, False),
    ]


# asked about, a mode the check does not enter: what the forward asks, and why that refuses it
_UNENTERED = {"functorch": ("whether it runs under a functorch transform (vmap, grad, jacrev)",
                            "per-sample gradients run it under vmap, which qlint does not")}


def asked_modes(model: torch.nn.Module, inputs: tuple) -> dict[str, str]:
    """The mode families one forward asks torch about, each with the first line outside torch that asks
    (``torch.autocast`` regions inside the model ask about autocast too). A query from inside torch is
    torch's own business (a dtype default for a factory), not a branch of the model's."""
    asked: dict[str, str] = {}
    patched: list[tuple[Any, str, Any, bool]] = []  # (owner, name, original, owned before)

    def recording(family: str, function: Any) -> Any:
        def query(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if family not in asked and not caller.f_code.co_filename.startswith(TORCH_DIR):
                code = linecache.getline(caller.f_code.co_filename, caller.f_lineno).strip()
                asked[family] = f"{caller.f_code.co_filename}:{caller.f_lineno} `{code}`"
            return function(*args, **kwargs)
        return query

    try:
        for family, names in MODE_QUERIES.items():
            for name in names:
                owner, attribute = mode_query_owner(name)
                if owner is not None and hasattr(owner, attribute):
                    original = getattr(owner, attribute)
                    patched.append((owner, attribute, original, attribute in vars(owner)))
                    setattr(owner, attribute, recording(family, original))
        _eager_runs(model, inputs)
    finally:
        for owner, attribute, original, owned in reversed(patched):
            if owned:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)
    return asked


# a branch that adds a small superlinear term shows at the larger scale; a mode that rounds is compared at
# the example only: bfloat16's drift grows with the inputs' scale (a VOLO: 9 % at the example, 39 % at 10x)
MODE_SCALES, ROUNDING_SCALES = (1.0, 1e3), (1.0,)


def _compare_in_modes(module: fx.GraphModule, model: torch.nn.Module, inputs: tuple, training: bool, *,
                      every_mode: bool, facts_read: Optional[Mapping[str, str]] = None,
                      flags_read: Optional[Mapping[str, Mapping[str, str]]] = None) -> list[str]:
    """Compare the graph as analysed with the eager model run under every global mode the forward can
    observe, and on its floating inputs in every form a forward can read (bfloat16, float16, not
    contiguous, channels-last) where the model accepts them: the two agree unless
    the forward reads the mode (up to its rounding, for a mode that rounds). The graph stays in the
    analysed mode: an export's graph checks its input dtypes and may not run in another grad mode.
    A mode the model cannot run in (an op without a bfloat16 kernel) is skipped. Reduced-precision copies
    of the model are run where the model's own code reads a dtype, and the other histories of a tensor where its
    code reads one (:func:`_other_histories`); ``facts_read``: what it read (None: unknown, all are run).
    Returns what ran.

    Outputs agree on random inputs also where a branch the mode takes adds a term that vanishes there
    (a correction for repeated tokens), and differ where the mode's branch is another safe computation
    (a fused MLP): so where it can, the capture traces the model in the mode instead
    (:func:`qlint.capture.pipeline._in_modes`), and the graph there is analysed too if it differs. Those
    modes, with the line that asks about each if the forward does, go to ``module.meta["qlint_modes"]``:
    every mode the eager model runs in for a symbolic_trace graph (``every_mode``: cheap to trace again,
    and a name imported before this check or a behaviour such as a factory's dtype reads a mode without
    a query), and for another tracer the modes the forward asks about, autocast excepted (export writes
    its casts into the graph, which cannot then be run under autocast again). The other modes are
    compared by outputs."""
    checked = []
    draws = any(n.op == "call_function" and indeterminate(n) for n in module.graph.nodes)
    # a mode read off a tensor (``x.is_inference()``, however bound) is asked about too
    asked = {**{family: line for family, line in (facts_read or {}).items() if family == "inference"},
             **asked_modes(model, inputs)}
    for family, (what, why) in _UNENTERED.items():
        if family in asked:
            raise GraphMismatch(f"the forward asks {what} at {asked[family]}: {why}")
    module.meta["qlint_modes"] = []
    by_path: list[tuple[str, str, Any, Optional[str]]] = []  # modes compared by outputs, whose path is compared too
    for what, family, mode, rounds in _observed_modes(training, compiling=bool(module.meta.get("qlint_compiling"))):
        if draws and mode is float64_default_mode:
            continue  # a seeded draw in float64 is another draw: the outputs cannot be compared
        line = asked.get("autocast" if family == "cuda autocast" else family)  # one query asks about both
        if family == "compile" and line is None:
            continue  # torch's own code asks too and runs other kernels: only the model's question is a branch
        # an export under autocast writes its casts (CPU) or sees CUDA's switched on around a CPU region: compared
        traced_there = every_mode or (line is not None and family not in ("autocast", "cuda autocast"))
        if rounds and line is None and not traced_there:
            continue  # no branch can read a mode the forward never asks about; rounding alone is no branch
        with mode():
            if not _eager_runs(model, inputs):
                continue  # the model does not run there (an op without a bfloat16 kernel): nothing to stand for
        if traced_there:
            module.meta["qlint_modes"].append((what, family, mode, line))
            checked.append(f"{what} (traced there)")
            continue
        for scale in ROUNDING_SCALES if rounds else MODE_SCALES:
            scaled = _scaled(inputs, scale)
            if scale != 1.0:
                with mode():
                    if not _eager_runs(model, scaled):
                        continue  # an index out of range at this scale: nothing to stand for
            _compare_again(module, model, scaled, what + (f", inputs scaled by {scale:g}" if scale != 1.0 else ""),
                           scaled=scale != 1.0, rounding=rounds, mode=mode)
        checked.append(what)
        if not rounds and family not in _OWN_KERNELS:
            by_path.append((what, family, mode, line))
    # the ops the model runs as analysed, recorded once for the path comparisons below
    here: Callable[[], Optional[Counter]] = functools.cache(lambda: _ops_recorded(model, inputs))
    checked += _modes_by_path(model, inputs, here, by_path, module.meta["qlint_modes"])
    for what, recast in _INPUT_FORMS:
        recast_inputs = tuple(recast(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                              for x in inputs)
        if all(x is y for x, y in zip(recast_inputs, inputs)) or not _eager_runs(model, recast_inputs):
            continue  # no input takes the form, or the model does not accept it: nothing to stand for
        # the graph on the same values in the example's dtype and layout (an export's graph checks them); to a
        # reduced precision's rounding, for a layout too: it changes the order of sums (a CNN in channels-last,
        # an autocast region in a model), and a branch on it changes the output by its own size
        same_values = tuple(r.to(x.dtype).contiguous() if r is not x else x for r, x in zip(recast_inputs, inputs))
        _compare_again(module, model, same_values, f"on {what} (which the model accepts)", rounding=True,
                       eager_inputs=recast_inputs)
        checked.append(f"on {what}")
    if facts_read is None or "dtype" in facts_read:  # a branch on float16 is the model's own reading of a dtype
        checked += _reduced_precision_copies(model, inputs, here)
    return checked + _other_histories(model, inputs, here, facts_read, flags_read, module.meta["qlint_modes"])


# modes under which torch itself runs other kernels for the same computation: inference mode leaves composite
# ops undecomposed (``linear`` where autograd's dispatch gives ``addmm``), so its path is not compared
_OWN_KERNELS = {"inference", "autocast"}


def _modes_by_path(model: torch.nn.Module, inputs: tuple, analysed: Callable[[], Optional[Counter]],
                   modes: list[tuple[str, str, Any, Optional[str]]], traced_there: list) -> list[str]:
    """Outputs agree under a mode also where the branch it takes differs on a thin set of inputs (a gated
    term), and however the forward reads the mode (a query bound at import, a tensor's state): so the ops the
    model runs under the modes compared by outputs are compared too, all of them at once (a branch on two of them
    together is seen) and, where those differ, each alone. A mode whose path differs goes to ``traced_there``: the
    model is traced in it and that graph analysed too (where only the combination differs, in all of them).
    ``analysed``: the ops the model runs as analysed. Returns what was checked."""
    if not modes:
        return []
    here = analysed()
    together = _ops_recorded(model, inputs, functools.partial(_entered, [mode for _, _, mode, _ in modes]))
    if here is None or together is None or together == here:
        return ["the same ops under all of them at once"] if here is not None and together is not None else []
    other = [(what, family, mode, line) for what, family, mode, line in modes
             if _ops_recorded(model, inputs, functools.partial(_entered, [mode])) not in (None, here)]
    if not other:
        combined = [mode for _, _, mode, _ in modes]
        other = [("under all those modes at once", "modes", lambda: _entered(combined, ()), None)]
    traced_there += other
    return [f"{what} (traced there: it runs other ops)" for what, *_ in other]


@contextlib.contextmanager
def _entered(modes: list[Any], given: tuple) -> Iterator[tuple]:
    with contextlib.ExitStack() as stack:
        for mode in modes:
            stack.enter_context(mode())
        yield given


MAX_COPIED_ELEMENTS = 50_000_000  # a reduced-precision copy of a larger model is not made (memory, time)


def _reduced_precision_copies(model: torch.nn.Module, inputs: tuple, analysed: Callable[[], Optional[Counter]]
                              ) -> list[str]:
    """A model is often run as a reduced-precision copy on inputs of that dtype (``model.half()``), where a
    forward may branch on the dtype (a fused kernel for float16). Where the model does not take such inputs
    itself, a copy in bfloat16 and one in float16 are run on them, and must run the ops the model runs, as
    often (casts and kernels of one computation are alike; a bias a kernel adds counts as its add): their
    outputs differ from the graph's by the copy's rounding of every weight, which no tolerance separates
    from a branch, but their ops do not.
    Returns what was checked; raises GraphMismatch where a copy runs other ops."""
    floats = [x for x in inputs if isinstance(x, torch.Tensor) and x.dtype == torch.float32]
    parameters = [p for p in [*model.parameters(), *model.buffers()] if p.is_floating_point()]
    if not floats or not parameters or any(p.dtype != torch.float32 for p in parameters):
        return []
    if sum(p.numel() for p in parameters) > MAX_COPIED_ELEMENTS:
        return [f"not on a reduced-precision copy (over {MAX_COPIED_ELEMENTS:,} parameter values)"]
    checked = []
    for dtype in (torch.bfloat16, torch.float16, torch.float64):  # float64: the witness's copy
        recast = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x for x in inputs)
        if _eager_runs(model, recast):
            continue  # the model takes them itself: compared above
        try:
            copy = deepcopy(model).to(dtype)
        except Exception as exc:  # noqa: BLE001  (an attribute that cannot be copied)
            checked.append(f"not on a {dtype} copy ({first_line(exc)})")
            continue
        theirs = _ops_recorded(copy, recast)
        if theirs is None:
            continue  # the copy does not run (an op without a kernel in that dtype): nothing to stand for
        name = str(dtype).replace("torch.", "")
        _require_same_ops(analysed(), theirs, f"a {name} copy of the model on inputs of that dtype",
                          f"the forward takes another path in that dtype, which the graph does not show; trace the "
                          "model in the dtype it runs in")
        checked.append(f"a {name} copy running the same ops")
    return checked


def _require_same_ops(here: Optional[Counter], theirs: Counter, what: str, why: str) -> None:
    if here is not None and theirs != here:
        extra = sorted(f"{op} x{n}" for op, n in (theirs - here).items())
        missing = sorted(f"{op} x{n}" for op, n in (here - theirs).items())
        raise GraphMismatch(f"{what} runs other ops than the model as analysed (more: {', '.join(extra) or 'none'}; "
                            f"fewer: {', '.join(missing) or 'none'}): {why}")


def _other_histories(model: torch.nn.Module, inputs: tuple, analysed: Callable[[], Optional[Counter]],
                     facts_read: Optional[Mapping[str, str]], flags_read: Optional[Mapping[str, Mapping[str, str]]],
                     traced_there: list) -> list[str]:
    """A forward that reads what a tensor has been through rather than its value (``u.requires_grad``,
    ``x.is_contiguous()``: :data:`qlint.capture.eager_record.HISTORY_READS`) takes the path that history gives,
    and training gives it others (no gradients in a calibration pass, frozen layers, a sliced batch). The model
    is run with each other history of what it read, and must run the ops it runs as analysed, as often: by
    outputs, a path that differs only on a thin set of inputs (a gated term) would agree. A history that only
    sets state (a grad mode, frozen parameters) and runs other ops goes to ``traced_there`` (the capture's
    ``qlint_modes``): the model is traced in it and that graph analysed too (a fused kernel without gradients
    is another spelling of the same map); one that changes the inputs cannot be traced so, and is refused.
    ``facts_read``: family -> the line that read it (None: unknown, every history is run). Returns what was
    checked; raises GraphMismatch where an input history runs other ops. ``flags_read``: the modules whose code
    reads training flags, with the flags each read: a module that reads another's is run in every combination of
    their modes (:func:`qlint.capture.histories.mode_histories`)."""
    families = [family for family in histories.HISTORIES if facts_read is None or family in facts_read]
    owners = len(histories.parameter_owners(model))
    if "autograd" in families and owners > histories.MAX_FROZEN_ALONE:
        raise GraphMismatch(f"the forward reads a tensor's autograd state, and its {owners} modules with parameters "
                            f"are more than the {histories.MAX_FROZEN_ALONE} qlint freezes one at a time: the path a "
                            "partly frozen model takes is not checked")
    combined = [sorted(owners) for owners in cross_reads(flags_read or {}).values()]
    for names in combined:
        if len(names) > histories.MAX_FLAGS_COMBINED:
            raise GraphMismatch(f"the forward reads the training flags of {len(names)} modules together (at "
                                f"{(facts_read or {}).get('training')}): more than the {histories.MAX_FLAGS_COMBINED} "
                                "whose every combination of modes qlint tries")
    runs = {family: functools.partial(histories.HISTORIES[family], model, inputs) for family in families}
    if combined:
        runs["training"] = functools.partial(histories.mode_histories, model, combined)
    checked = []
    for what, history, _ in histories.frozen_norm_histories(model) if model.training else ():
        # traced there whatever ops run: one kind of op computes batch and running statistics alike
        traced_there.append((what, "frozen", functools.partial(history, inputs), None))
        checked.append(f"{what} (traced there: its norms compute another map)")
    here = analysed() if runs else None
    if here is None:
        return checked
    for family, run in runs.items():
        line = (facts_read or {}).get(family)
        for what, history, same_inputs in run():
            given: list[tuple] = []
            theirs = _ops_recorded(model, inputs, history, given)
            if theirs is None:
                continue  # the model does not run so (no backward for an op): nothing to stand for
            reference = (here if histories.same_values(given[0], inputs)
                         else _ops_recorded(model, histories.contiguous(given[0])))
            if theirs != reference and same_inputs:
                traced_there.append((what, family, functools.partial(history, inputs), line))
                checked.append(f"{what} (traced there: it runs other ops)")
                continue
            _require_same_ops(reference, theirs, f"the model {what}",
                              f"the forward reads {histories.FACTS[family]}{f' at {line}' if line else ''} and takes "
                              "another path there, which the graph does not show")
            checked.append(what)
    return checked


_INPUT_FORMS = (
    ("bfloat16 inputs", lambda x: x.to(torch.bfloat16)),
    ("float16 inputs", lambda x: x.to(torch.float16)),
    ("non-contiguous inputs", histories.transposed),
    ("channels-last inputs", histories.channels_last),
)


def _scaled(inputs: tuple, scale: float) -> tuple:
    return tuple(x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)


SCALES = (1e3, 1e6)


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


def _compare_again(module: fx.GraphModule, model: torch.nn.Module, inputs: tuple, where: str, *,
                   scaled: bool = False, rounding: bool = False, mode: Any = contextlib.nullcontext,
                   eager_inputs: Optional[tuple] = None) -> None:
    """The graph on ``inputs`` against the eager model on ``eager_inputs`` (the same by default), run
    under ``mode``; any difference, or either failing, is a GraphMismatch naming ``where``."""
    try:
        graph_out = _run(module, inputs)
        with mode():
            eager_out = _eager(model, inputs if eager_inputs is None else eager_inputs)
    except Exception as exc:  # e.g. an assert in the model on other values: fail closed
        raise GraphMismatch(f"the graph and the model could not be compared {where}: {first_line(exc)}") from exc
    _require_same(graph_out, eager_out, where, scaled=scaled, rounding=rounding)


def _agree(a: Any, b: Any, *, scaled: bool = False, rounding: bool = False) -> bool:
    mine, theirs = tensors(a), tensors(b)
    if len(mine) != len(theirs):
        return False
    for x, y in zip(mine, theirs):
        if x.shape != y.shape:
            return False
        if (scaled and (x.is_floating_point() or x.is_complex())
            and not (torch.isfinite(x).all() and torch.isfinite(y).all())):
            continue  # overflow at this scale: inconclusive, not a mismatch
        if not (_close_to_rounding(x, y) if rounding else _close(x, y)):
            return False
    return True


def _require_same(graph_out: Any, eager_out: Any, where: str, *, scaled: bool = False, rounding: bool = False) -> None:
    mine, theirs = tensors(graph_out), tensors(eager_out)
    if len(mine) != len(theirs):
        raise GraphMismatch(f"the graph returns {len(mine)} tensors, the model {len(theirs)} {where}")
    if not _agree(graph_out, eager_out, scaled=scaled, rounding=rounding):
        raise GraphMismatch(f"the traced graph's output differs from the eager model's {where}")


# bfloat16 keeps 8 bits: at the example a deep network's output drifts by up to about a tenth of its norm
# (0.9 % for a MaxViT, 1.4 % for an EfficientNet, 9 % for a VOLO), while a branch the mode switches on
# changes it by its own size; a branch whose effect at the example is smaller is not seen
ROUNDING = 0.25


def _close_to_rounding(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to a reduced precision's rounding, measured on the whole tensor's norm (an entry near 0
    carries the rounding of its larger neighbours); inf and NaN where the other has them too."""
    if not (a.is_floating_point() or a.is_complex()) or not (b.is_floating_point() or b.is_complex()):
        return _close(a, b)
    x, y = a.detach().double(), b.detach().double()
    finite = torch.isfinite(y)
    if not torch.equal(torch.isfinite(x), finite):
        return False
    return float((x[finite] - y[finite]).norm()) <= ROUNDING * float(y[finite].norm()) + 1e-3


def shares_parameters(module: fx.GraphModule, model: torch.nn.Module) -> bool:
    """Whether every parameter of the graph is a parameter of the model (same storage), so that
    redrawing the model's redraws the graph's (symbolic_trace, export and make_fx all share)."""
    owned = {storage_key(p) for p in model.parameters()}
    return all(storage_key(p) in owned for p in module.parameters())


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
    if a.layout != b.layout:
        return False
    a, b = strided(a), strided(b)
    return (a.shape == b.shape and a.dtype == b.dtype
            and bool(torch.equal(a, b)
                     or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True, rtol=0, atol=0))))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = strided(a), strided(b)
    if a.dtype != b.dtype and not (a.is_floating_point() and b.is_floating_point()):
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a.to(b.dtype), b, rtol=1e-4, atol=1e-5, equal_nan=True))
    return bool(torch.equal(a, b))


__all__ = ["GraphMismatch", "compare_with_eager", "computes", "eager_failure", "python_state", "require_every_op",
           "shape_coverage", "shares_parameters"]
