"""What one eager forward shows that a traced graph cannot: reads of held values into Python, and
the ops the model runs.

A graph records tensor ops; a value read into Python (``if float(self.mix) != 0``, ``w.item()``,
``.tolist()``) is not an op: the graph holds the value the tensor had while it was traced, and the
path that value took. For an input, a tracer sees the read (symbolic_trace and export stop there,
make_fx names it). For a tensor the model holds -- a parameter reached around fx's proxies, a
floating-point buffer, a tensor in a closure, a global or a plain attribute -- symbolic_trace and
export read the real value silently. A float buffer or held tensor is a parameter (a training loop
may ramp a mixing weight from 0 to 1), so such a read certifies one value only.

This follows values, not spellings: one eager forward under a dispatch mode marks every tensor
computed from a held float tensor, whatever ops it went through, and a read of a marked value is
reported with its line. Shapes, literals, integer and bool tensors (sizes, masks, counters) are
constants; a float computed from them only (Mimi's padding from integer buffers) is one too.

The same forward counts the ops the model runs. A forward that notices it is traced (``is_fx_tracing()``,
a Proxy or fake tensor argument, ``torch.compiler.is_compiling()``) can leave a term out of the graph
that is 0 on every input compared; the graph, run on the example, must then run every op the model
ran (:func:`missing_ops`).
"""

from __future__ import annotations

import contextlib
import sys
import types
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from qlint.core.graph import ENGINE_FOLDERS, RANDOM, TORCH_DIR, storage_key
from qlint.capture.process_state import (ENVIRONMENT_VALUES, Condition, ProcessReads, answering, environment_set,
                                         model_code, own_code, standard_library)
from qlint.capture.harness import tensor_outputs
from qlint.capture.module_state import NotingReads, cross_reads, flag_reads, hook_reads, line_of, reading_frame

_INPUT = "input"  # an input's value: the tracers see those reads themselves
_DRAWN = "a draw"  # a value of torch's random generator: a read of one is a condition
# ops whose result is a tensor's value in Python (item, float(), bool(), int(), torch.equal)
_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.equal.default,
          torch.ops.aten.is_nonzero.default}
# ops whose output's size is set by their first argument's values (for the rest of the ops whose size
# depends on values, by a mask, an index or a count: index, masked_select, repeat_interleave)
_SIZE_FROM_DATA = {"nonzero", "argwhere", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                   "nonzero_static"}
# torch.tensor(0.5) in a forward: a literal, lifted
_LITERALS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}
# reads without an aten op: the values as Python or NumPy objects, raw memory, text
_READING_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.__dlpack__,
                    torch.Tensor.data_ptr, torch.Tensor.untyped_storage, torch.Tensor.storage, torch.Tensor.__repr__,
                    torch.Tensor.__str__, torch.Tensor.__format__}


@dataclass(frozen=True)
class HeldRead:
    """A read of a held float tensor's value: what was read and where."""

    what: str  # "the buffer `mix`"
    where: str  # "model.py:40 `if float(self.mix) != 0:`"


@dataclass
class EagerRecord:
    """What one eager forward showed: the first read of a held value, the ops whose results reach the
    outputs (by :func:`op_key`)."""

    read: Optional[HeldRead] = None
    ops: Counter = field(default_factory=Counter)
    ran: bool = False  # the forward finished
    conditions: list[Condition] = field(default_factory=list)  # what it read from the process around it
    outputs: list[torch.Tensor] = field(default_factory=list)  # the last forward's output tensors
    environment_changing: dict[Condition, str] = field(default_factory=dict)  # a value that changes the forward
    # a query of the process that answered True or False, with its function and answer (process_state.answering)
    two_valued: dict[Condition, tuple[types.FunctionType, bool]] = field(default_factory=dict)
    answers_to_trace: dict[Condition, tuple[types.FunctionType, bool]] = field(default_factory=dict)  # other_answers()
    # what the model's code read of a tensor beyond its value, by family (:data:`HISTORY_READS`, and "dtype"),
    # with the first line that read it: the paths those facts can choose are checked (capture/graph_check)
    facts_read: dict[str, str] = field(default_factory=dict)
    # per module whose code reads training flags (by name, "" the model): the modules whose flags it read, each with
    # the first line (capture/module_state)
    flags_read: dict[str, dict[str, str]] = field(default_factory=dict)
    # the globals the model's own code names, each with a function that reads it now
    state_roots: dict[str, Callable[[], Any]] = field(default_factory=dict)

    @property
    def reads_dtype(self) -> bool:
        """The model's own code read a tensor's dtype (it may branch on float16)."""
        return "dtype" in self.facts_read


class _Dataflow(TorchDispatchMode):
    """Records each op run with the ops whose results it read (through its arguments, and through every
    earlier write into an argument's memory, so a write through a view counts), to count at the end the
    ops whose results reach the outputs (:meth:`live_ops`): a mask computed only to be read into Python
    (Hugging Face's ``mask.all()`` that an export skips) is not a path to the output."""

    supports_higher_order_operators = True  # torch.cond eagerly: one opaque op here (its branches run unseen)

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, list[int]]] = []  # (op key, the events it read)
        self.producers: dict[int, tuple[weakref.ref, int]] = {}  # id(tensor) -> (tensor, the event that made it)
        self.writes: dict[int, list[int]] = {}  # storage -> the events that wrote into it

    def producer(self, tensor: torch.Tensor) -> Optional[int]:
        mark = self.producers.get(id(tensor))
        return mark[1] if mark is not None and mark[0]() is tensor else None

    def reads(self, tensors: list[torch.Tensor]) -> list[int]:
        found = [self.producer(t) for t in tensors]
        return [e for e in found if e is not None] + [e for t in tensors for e in self.writes.get(_storage(t), ())]

    def made(self, tensor: torch.Tensor, event: int) -> None:
        key = id(tensor)
        self.producers[key] = (weakref.ref(tensor, lambda _, key=key: self.producers.pop(key, None)), event)

    def run(self, func: Any, args: tuple, kwargs: dict, arguments: list[torch.Tensor]) -> Any:
        self.events.append((op_key(func) + ("+add" if _adds_a_bias(func, args, kwargs) else ""),
                            self.reads(arguments)))
        event = len(self.events) - 1
        out = func(*args, **kwargs)
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.made(tensor, event)
        for written in _written(func, args, kwargs):
            self.writes.setdefault(_storage(written), []).append(event)
            self.made(written, event)
        return out

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        return self.run(func, args, kwargs, [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)])

    def live_ops(self, outputs: Any) -> Counter:
        """The ops, by :func:`op_key`, whose results reach a tensor of ``outputs``."""
        stack = self.reads([t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)])
        live: set[int] = set()
        while stack:
            event = stack.pop()
            if event not in live:
                live.add(event)
                stack.extend(self.events[event][1])
        return Counter(key for e in live if self.events[e][0] for key in self.events[e][0].split("+"))


def _written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensor arguments an op writes in place (``add_``'s self, an ``out=``), by its schema."""
    out = []
    for i, argument in enumerate(getattr(getattr(func, "_schema", None), "arguments", ())):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            out += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return out


# ops that compute nothing a tracer could leave out: copies, casts, allocation, metadata, and the reads
# a graph traced on values drops (make_fx); views are left out by their schema
_NOT_COMPUTE = {"clone", "copy", "detach", "_to_copy", "to", "lift_fresh", "lift_fresh_copy", "_assert_tensor_metadata",
                "_assert_scalar", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                "_local_scalar_dense", "item", "is_nonzero", "equal", "set", "resize", "contiguous", "sym_size",
                "sym_numel", "sym_stride", "sym_storage_offset", "_functional_assert_scalar", "zeros_like",
                "zeros", "ones", "ones_like", "full", "full_like", "scalar_tensor", "arange", "fill", "new_zeros",
                "new_ones", "new_full", "_unsafe_view", "alias", "lift", "as_strided"}
# one kind of computation in several kernels, of which a traced model may take another (Hugging Face's
# experts run one grouped matmul eagerly and a loop of matmuls when compiled; attention runs a fused
# kernel eagerly and its matmuls traced): counted together, so a graph's other kernel is no missing op
_KINDS = {**{name: "matmul" for name in ("mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "einsum",
                                           "dot", "mv", "addmv", "_grouped_mm", "_scaled_grouped_mm", "_int_mm",
                                           "grouped_mm_fallback",  # transformers' custom op
                                           "_scaled_dot_product_flash_attention_for_cpu",
                                           "_scaled_dot_product_efficient_attention",
                                           "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention",
                                           "_scaled_dot_product_attention_math", "scaled_dot_product_attention",
                                           "_scaled_dot_product_fused_attention_overrideable")},
          **{name: "convolution" for name in ("convolution", "_convolution", "conv2d", "conv1d", "conv3d",
                                                "mkldnn_convolution", "_mkldnn_convolution", "cudnn_convolution",
                                                "_slow_conv2d_forward", "slow_conv3d_forward", "thnn_conv2d",
                                                "slow_conv_dilated2d", "slow_conv_transpose2d", "conv_transpose2d")}}


def op_key(func: Any) -> str:
    """The op's name as both an eager run and a functionalised graph spell it (``add_`` is ``add``; the
    functional and no-training batch norms are one; the kernels of one kind, :data:`_KINDS`, are one),
    or "" for an op that computes nothing (a view, a copy, an allocation)."""
    if getattr(func, "is_view", False) or not isinstance(func, torch._ops.OpOverload):
        return ""  # a view, or a higher-order op (torch.cond), whose branches are counted where traced
    name = func.name().split("::")[-1].split(".")[0].rstrip("_")
    if "batch_norm" in name:
        return "batch_norm"
    return "" if name in _NOT_COMPUTE else _KINDS.get(name, name)


# kernels that add their bias in the same op (addmm's self, a convolution's bias): counted as their kind and
# an add, as ``x @ W.T + b`` written out is, so the one spelling is not missing from the other
_WITH_BIAS = {"addmm": 0, "addbmm": 0, "baddbmm": 0, "addmv": 0, "addr": 0, "convolution": 2, "_convolution": 2,
              "mkldnn_convolution": 2, "_mkldnn_convolution": 2, "cudnn_convolution": 2, "_slow_conv2d_forward": 2}


def _adds_a_bias(func: Any, args: tuple, kwargs: dict) -> bool:
    name = func.name().split("::")[-1].split(".")[0].rstrip("_") if isinstance(func, torch._ops.OpOverload) else ""
    if name not in _WITH_BIAS or kwargs.get("beta", 1) == 0:
        return False
    position = _WITH_BIAS[name]
    bias = args[position] if position < len(args) else kwargs.get("bias")
    return isinstance(bias, torch.Tensor)


def missing_ops(eager: Counter, graph: Counter) -> list[str]:
    """The ops the model ran more often than the graph, with the counts missing (``mul x2``)."""
    return [f"`{op}` x{count - graph.get(op, 0)}" for op, count in sorted(eager.items()) if count > graph.get(op, 0)]


def ops_run(module: torch.nn.Module, inputs: tuple) -> Counter:
    """The ops one call of ``module`` (a graph) runs whose results reach its outputs, by :func:`op_key`.
    Under a torch-function mode as :func:`record` is: a fast path taken only without one (nn.MultiheadAttention's
    fused kernel) is then not taken in either."""
    flow = _Dataflow()
    with flow, _PassThrough():
        outputs = module(*inputs)
    return flow.live_ops(outputs)


class _PassThrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        return func(*args, **(kwargs or {}))


class _Origins(_Dataflow):
    """Records the ops run (:class:`_Dataflow`), and marks each tensor an op returns with the held float
    tensors it was computed from."""

    def __init__(self, model: torch.nn.Module, inputs: tuple, process: ProcessReads) -> None:
        super().__init__()
        self.process = process
        self.marks: dict[int, tuple[weakref.ref, frozenset[str]]] = {}
        self.inputs = {_storage(x) for x in tree_leaves(inputs) if isinstance(x, torch.Tensor)}
        self.held = {}
        for kind, named in (("buffer", model.named_buffers()), ("parameter", model.named_parameters())):
            for name, tensor in named:
                self.held.setdefault(_storage(tensor), f"the {kind} `{name}`")
        self.read: Optional[HeldRead] = None

    def origins(self, tensor: torch.Tensor) -> frozenset[str]:
        mark = self.marks.get(id(tensor))
        if mark is not None and mark[0]() is tensor:
            return mark[1]
        storage = _storage(tensor)
        if storage in self.inputs:
            return frozenset({_INPUT})
        if not (tensor.is_floating_point() or tensor.is_complex()):
            return frozenset()  # a size, a mask, a counter: a constant (the graph check sees it move)
        return frozenset({self.held.get(storage, "a float tensor held outside the module's parameters and buffers "
                                                 "(a closure, a global, a plain attribute)")})

    def note_read(self, tensors: list[torch.Tensor], into_python: bool = False) -> None:
        """A read of a value computed from held tensors alone: one computed from an input too is a
        proxy or a fake tensor while traced, and the tracer sees the read itself (a router's top-k)."""
        origins = {o for t in tensors for o in self.origins(t)}
        if _DRAWN in origins and into_python:  # a path chosen by a draw (not indices drawn): another call may
            frame = _user_frame()              # draw the other one
            if frame is not None:
                self.process.note("random", "a draw of torch's random generator, read into Python", frame)
        origins.discard(_DRAWN)
        if origins and _INPUT not in origins and self.read is None:
            self.read = HeldRead(sorted(origins)[0], _user_line())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        arguments = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func in _READS:
            self.note_read(arguments, into_python=True)
        elif torch.Tag.dynamic_output_shape in getattr(func, "tags", ()):  # a size set by values: a mask's, data's
            self.note_read([t for i, t in enumerate(arguments)
                            if not (t.is_floating_point() or t.is_complex())
                            or (i == 0 and func.name().split("::")[-1] in _SIZE_FROM_DATA)])
        origins = frozenset() if func in _LITERALS else frozenset().union(*(self.origins(t) for t in arguments))
        if getattr(getattr(func, "overloadpacket", None), "__name__", "") in RANDOM:  # a draw (not an op that may)
            origins |= {_DRAWN}
        out = self.run(func, args, kwargs, arguments)
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                key = id(tensor)
                self.marks[key] = (weakref.ref(tensor, lambda _, key=key: self.marks.pop(key, None)), origins)
        return out


class _Methods(torch.overrides.TorchFunctionMode):
    """The reads that reach no aten op (``tolist``, ``numpy``), and the facts about a tensor other than its
    value that the model's code reads (:data:`HISTORY_READS`, a dtype)."""

    def __init__(self, origins: _Origins, process: ProcessReads) -> None:
        super().__init__()
        self.origins_mode, self.process = origins, process
        self.facts_read: dict[str, str] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if func in _READING_METHODS and args and isinstance(args[0], torch.Tensor) and not _torch_calls():
            self.origins_mode.note_read([args[0]])
        family = HISTORY_READS.get(func)
        if family is not None:
            caller = _reader()
            # a library's own upcast reads a dtype without branching the model; any other fact counts from any
            # code but torch's (transformers' too)
            if caller is not None and (own_code if family == "dtype" else model_code)(caller.f_code.co_filename):
                if family == "device":  # no run here can put it elsewhere: the certificate holds for the CPU
                    self.process.note("device", "the device its tensors lie on (the CPU here)", caller)
                for read in ("dtype", "autograd") if family == "printed" else () if family == "device" else (family,):
                    self.facts_read.setdefault(read, line_of(caller))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _torch_function_disabling(facts_read: dict[str, str]) -> Iterator[None]:
    """Notes (as the fact "hidden") where the model's code enters ``torch._C.DisableTorchFunction`` (or its
    Subclass twin): inside it a torch-function mode sees none of its reads."""
    originals = {name: getattr(torch._C, name) for name in ("DisableTorchFunction", "DisableTorchFunctionSubclass")}

    def watching(original: Any) -> Any:
        def disabling(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if model_code(caller.f_code.co_filename):
                facts_read.setdefault("hidden", line_of(caller))
            return original(*args, **kwargs)
        return disabling

    try:
        for name, original in originals.items():
            setattr(torch._C, name, watching(original))
        yield
    finally:
        for name, original in originals.items():
            setattr(torch._C, name, original)


@contextlib.contextmanager
def _input_grad_reads(facts_read: dict[str, str]) -> Iterator[None]:
    """Notes (as the fact "autograd") where the model's code reads ``ctx.needs_input_grad`` in a custom autograd
    Function: autograd fills it in C from each input's ``requires_grad``, so no tensor attribute is read there, yet
    a forward may branch on it (a frozen weight's inference kernel)."""
    context = torch.autograd.function.BackwardCFunction
    given = vars(torch._C._FunctionBase)["needs_input_grad"]

    def read(ctx: Any) -> Any:
        caller = sys._getframe(1)
        if model_code(caller.f_code.co_filename):
            facts_read.setdefault("autograd", line_of(caller))
        return given.__get__(ctx, type(ctx))

    context.needs_input_grad = property(read)
    try:
        yield
    finally:
        del context.needs_input_grad


class _WatchedAttributes(NotingReads, dict):
    """A given tensor's ``__dict__`` while the forward runs: a read of it by the model's own code is noted."""

    def _read(self, key: Any) -> None:
        notes = self.notes  # type: ignore[attr-defined]
        if "attribute" not in notes:
            frame = reading_frame(2, own_code)  # a library's duck typing is its own
            if frame is not None:
                notes["attribute"] = f"{line_of(frame)} (`{'__dict__' if key is None else key}`)"


@contextlib.contextmanager
def _attributes_missed(model: torch.nn.Module, inputs: tuple, facts_read: dict[str, str]) -> Iterator[None]:
    """Notes (as the fact "attribute") where the model's own code asks a tensor it did not hold for a Python attribute
    the tensor lacks here (``getattr(x, "packed", False)``), or reads a given tensor's ``__dict__``: a caller can set
    one on its inputs, and no torch-function mode sees the read. A parameter's or buffer's attributes are the
    model's own."""
    held = {id(t) for t in [*model.parameters(), *model.buffers()]}
    given = [x for x in tree_leaves(inputs) if isinstance(x, torch.Tensor) and id(x) not in held]

    def missing(tensor: torch.Tensor, name: str) -> Any:
        if id(tensor) not in held and "attribute" not in facts_read and not name.startswith("__"):
            frame = reading_frame(1, own_code)
            if frame is not None:
                facts_read["attribute"] = f"{line_of(frame)} (`{name}`)"
        raise AttributeError(f"'{type(tensor).__name__}' object has no attribute '{name}'")

    patched = "__getattr__" not in vars(torch.Tensor)
    if patched:
        torch.Tensor.__getattr__ = missing  # type: ignore[method-assign]
    originals = [x.__dict__ for x in given]
    for x, original in zip(given, originals):
        watched = _WatchedAttributes(original)
        watched.notes = facts_read  # type: ignore[attr-defined]
        x.__dict__ = watched
    try:
        yield
    finally:
        for x, original in zip(given, originals):
            original.update(dict.items(x.__dict__))
            x.__dict__ = original
        if patched:
            del torch.Tensor.__getattr__


def record(model: torch.nn.Module, inputs: tuple, calls: int = 1) -> EagerRecord:
    """``calls`` eager forwards on ``inputs``: the first read of a value computed from held float tensors
    alone, in any of them, the ops the last one ran (``ran`` is False when a forward fails: the
    tracers report that), and what they read from the process (:mod:`qlint.capture.process_state`). The
    caller runs it in the analysed grad mode and restores the model's state."""
    read, ops, facts_read, flags = None, Counter(), {}, {}
    process = ProcessReads(model)
    for _ in range(calls):
        origins = _Origins(model, inputs, process)
        methods = _Methods(origins, process)
        try:
            # called as the tracers call it (no cache built)
            with tensor_outputs(model), origins, methods, process, _torch_function_disabling(methods.facts_read), \
                    _input_grad_reads(methods.facts_read), hook_reads(model, methods.facts_read), \
                    flag_reads(model, flags), _attributes_missed(model, inputs, methods.facts_read):
                outputs = model(*inputs)
        except Exception:  # noqa: BLE001  (a forward that fails here fails in the tracers too, with its reason)
            return EagerRecord(read or origins.read, conditions=process.conditions)
        read, ops, facts_read = read or origins.read, origins.live_ops(outputs), {**methods.facts_read, **facts_read}
    crossing = cross_reads(flags)
    if crossing:  # a path on a combination of modes (capture/graph_check._other_histories runs them)
        facts_read.setdefault("training", next(iter(next(iter(crossing.values())).values())))
    return EagerRecord(read, ops, ran=True, conditions=process.conditions, facts_read=facts_read,
                       flags_read=flags, state_roots=process.state_roots, two_valued=process.two_valued,
                       outputs=[t.detach() for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)])


def environment_changing(conditions: list[Condition], again: Callable[[], EagerRecord]) -> dict[Condition, str]:
    """For each environment variable the model's own code read (``conditions``), the first value of
    :data:`~qlint.capture.process_state.ENVIRONMENT_VALUES` under which the forward runs other ops or reaches
    other outputs than at its value here (the model is traced there too); ``again`` records one forward
    from the same model state and random state. Every read stays a condition: a value not tried may
    take another path still."""
    variables = [c for c in conditions if c.kind == "environment" and c.name]
    here = again() if variables else None
    changing = {}
    for condition in variables:
        for value in ENVIRONMENT_VALUES:
            with environment_set(condition.name, value):
                other = again()
            if here is not None and here.ran and other.ran and not (
                    other.ops == here.ops and _same(other.outputs, here.outputs)):
                changing[condition] = value
                break
    return changing


def other_answers(two_valued: dict[Condition, tuple[types.FunctionType, bool]], again: Callable[[], EagerRecord]
                  ) -> dict[Condition, tuple[types.FunctionType, bool]]:
    """For each query of the process that answered True or False (``torch.cuda.is_available()``, a backend flag),
    the other answer where the forward runs with it: the model is traced there too, and the graph, not the ops on
    one example, tells whether it computes something else. A query where the forward fails on the other answer
    stays a condition."""
    changing = {}
    for condition, (function, answer) in two_valued.items():
        with answering(function, not answer):
            if again().ran:
                changing[condition] = (function, not answer)
    return changing


def _same(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(
        a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
        for a, b in zip(first, second))


_T = torch.Tensor
# What a forward can read of a tensor besides its value, by what sets it. Constants: its shape, device, kind and
# views of its values. "autograd": the grad mode, which parameters are frozen, whether an input requires grad or was
# computed, a backward's gradients and hooks; "layout": how an input lies in memory (a transposed, channels-last,
# sliced or expanded batch); "inference": an inference tensor. Those have histories the graph check runs the model
# with (capture/graph_check._other_histories). A version counter and an address take every value training gives
# them (in-place steps, new batches), which no run can try: a read of one is refused (:data:`REFUSED_FACTS`).
_CONSTANT_ATTRIBUTES = {"H", "T", "mH", "mT", "real", "imag", "data", "device", "layout", "ndim", "shape", "name",
                        "volatile", "_has_symbolic_sizes_strides", "_python_dispatch", "is_meta", "is_mkldnn",
                        "is_nested", "is_quantized", "is_sparse", "is_sparse_csr"}
# whether a tensor lies on an accelerator: qlint runs the model on the CPU, so a branch on it is a condition
_DEVICE_PREDICATES = ("is_cpu", "is_cuda", "is_ipu", "is_maia", "is_mps", "is_mtia", "is_vulkan", "is_xla", "is_xpu")
_ATTRIBUTE_FAMILIES = {
    **dict.fromkeys(("dtype", "itemsize", "nbytes"), "dtype"),  # a size in bytes is the dtype's times the numel
    **dict.fromkeys(("requires_grad", "grad_fn", "_grad_fn", "is_leaf", "grad", "_grad", "retains_grad", "output_nr",
                     "_base", "_backward_hooks", "_post_accumulate_grad_hooks", "grad_dtype"), "autograd"),
    "_version": "version", "_cdata": "address", **dict.fromkeys(_DEVICE_PREDICATES, "device"),
}
HISTORY_READS = {
    # every attribute of a tensor that is no constant; one torch adds later and qlint does not know is refused
    **{getattr(_T, name).__get__: _ATTRIBUTE_FAMILIES.get(name, "unknown")
       for name, attribute in vars(torch._C.TensorBase).items()
       if isinstance(attribute, types.GetSetDescriptorType) and name not in _CONSTANT_ATTRIBUTES},
    **dict.fromkeys((_T.type, _T.element_size), "dtype"),
    **dict.fromkeys((_T.is_contiguous, _T.stride, _T._is_view, _T.is_set_to), "layout"),
    **dict.fromkeys((_T.data_ptr, _T.untyped_storage, _T.storage, _T._typed_storage, _T.storage_offset, _T.is_shared,
                     _T.is_pinned), "address"),
    _T.get_device: "device",
    _T.is_inference: "inference",
    # a tensor's text shows its dtype and autograd state
    **dict.fromkeys((_T.__repr__, _T.__str__, _T.__format__), "printed"),
}
# the facts no run of the check can vary: what, and why
REFUSED_FACTS = {
    "version": ("a tensor's version counter", "every in-place write (an optimizer step) moves it on through every "
                                              "count"),
    "address": ("where a tensor lies in memory (its address, storage or offset)", "every new batch and allocation "
                                                                                    "changes it"),
    "unknown": ("an attribute of a tensor that qlint does not know", "its histories are not known"),
    "hidden": ("torch state with torch-function modes disabled", "qlint cannot see what is read there"),
    "attribute": ("a Python attribute of a tensor it was given, which the tensor lacks here", "a caller can set it "
                                                                                              "on its inputs"),
    "hooks": ("the hooks registered on a module", "a training loop, profiler or feature extractor registers others, "
                                                  "which no run of the check can try"),
}
_PLUMBING = ("/torch/overrides.py", "/torch/_tensor.py")  # how a Tensor method reaches a torch-function mode


def _torch_calls() -> bool:
    """Whether the method was called by torch's own code (its use of memory or text), not the model's."""
    frame = _caller(3)
    return frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR)


def _caller(depth: int) -> Any:
    """The frame that called the method a torch-function mode sees (past torch's dispatch plumbing), from
    ``depth`` frames above this one (2 from the mode's ``__torch_function__``)."""
    frame = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.endswith(_PLUMBING):
        frame = frame.f_back
    return frame


def _reader() -> Any:
    """The frame whose code read a fact off a tensor: the method's caller (from the mode's ``__torch_function__``,
    past torch's plumbing), and past the standard library's frames (``string.Formatter`` reading
    ``{0.requires_grad}`` reads for its caller)."""
    frame = _caller(3)
    while frame is not None and standard_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _storage(tensor: torch.Tensor) -> int:
    try:
        return storage_key(tensor)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
        return -id(tensor)


def _user_frame() -> Any:
    """The innermost frame outside torch and qlint."""
    frame = sys._getframe(1)
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith(TORCH_DIR) and not any(folder in file for folder in ENGINE_FOLDERS):
            return frame
        frame = frame.f_back
    return None


def _user_line() -> str:
    """The innermost frame outside torch and qlint: ``file.py:40 `code```."""
    frame = _user_frame()
    return line_of(frame) if frame is not None else "an unknown line"


__all__ = ["EagerRecord", "HeldRead", "environment_changing", "missing_ops", "op_key", "ops_run", "other_answers",
           "record"]
