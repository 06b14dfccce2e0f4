"""What a forward reads from the process around it: facts the graph check cannot vary.

The graph check runs the model in every global mode torch offers and on several inputs, but an
environment variable, a thread-local or context-variable flag set by a serving loop, the call stack
or the clock are outside the model and its inputs: qlint sees them at the one value this process
has. A forward that reads one may take another path where it differs (``if os.environ.get("FAST")``),
so a certificate holds *for* that value only: a condition, named with the line that reads it
(:class:`Condition`), which the verdict prints ("certified for: ...") and QL109 puts before the gate.

This follows what the forward runs: a profile function sees every Python call of one eager forward.
An environment read is a call of ``os.environ``'s item lookup (``get``, ``in``, ``[]``, ``os.getenv``
all reach it); the stack is read by ``sys._getframe`` (what ``inspect.stack()`` calls); the clock,
the thread's identity, torch's thread count and Python's or NumPy's random generators by calls of
their functions. The objects the running code names are read too: a thread-local or context variable,
``os.environ`` itself (its raw ``_data``), ``sys.argv``, ``sys.modules``, a C library loaded with
ctypes, as a global, a closure cell, an argument (a default) or one attribute deep in a module or
class, and the attributes that walk frames (``tb_frame.f_back``) or ask whether a profiler watches.
What no running code shows stays unseen: a value read at import time (a copy of the environment, a
cache filled then) is a constant of the module, as qlint sees it. Reads by torch, the standard library,
qlint and installed packages are theirs, not the model's (transformers' output collector and kernel
switches are its configuration, as torch's global modes are torch's, which the graph check varies).
"""

from __future__ import annotations

import _thread
import builtins
import collections
import contextlib
import contextvars
import ctypes
import dis
import enum
import functools
import inspect
import linecache
import os
import random
import re
import reprlib
import sys
import sysconfig
import threading
import time
import types
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

from qlint.core.graph import TORCH_DIR
from qlint.core.installed import installed

_QLINT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB = sysconfig.get_paths()["stdlib"]
_ENVIRONMENT_LOOKUP = type(os.environ).__getitem__.__code__
_STACK_READS = {sys._getframe, getattr(sys, "_current_frames", None)} - {None}
# the standard library's readers of the stack for a caller (logging's and warnings' look for a line to print)
_STACK_READERS = ("inspect.py", "traceback.py")
_CLOCKS = {time.time, time.time_ns, time.monotonic, time.monotonic_ns, time.perf_counter, time.perf_counter_ns,
           time.process_time, time.process_time_ns, time.thread_time, time.thread_time_ns,
           *(getattr(time, name) for name in ("clock_gettime", "clock_gettime_ns") if hasattr(time, name))}
_THREAD_IDENTITY = {threading.get_ident, threading.get_native_id, threading.current_thread, _thread.get_ident}
_TORCH_SETTINGS = {torch.get_num_threads, torch.get_num_interop_threads}
_THREAD_STATE = (threading.local, contextvars.ContextVar)
MAX_ENVIRONMENT_NAMES = 5  # a forward that copies the whole environment is one condition, not hundreds

# The functions that read each global mode torch has, by family, named from ``torch`` (``Tensor.`` on the tensor
# class, ``_C.`` its builtins): capture/graph_check runs the model in each mode (or, for "functorch", refuses a
# forward that asks), so a call of one is no condition. A name imported before the check is no call of these, and
# is found where the model is traced in every mode (symbolic_trace) or by the outputs.
MODE_QUERIES = {
    "grad": ("is_grad_enabled", "_C.is_grad_enabled"),
    "inference": ("is_inference_mode_enabled", "_C.is_inference_mode_enabled", "is_inference", "Tensor.is_inference"),
    "autocast": ("is_autocast_enabled", "is_autocast_cpu_enabled", "get_autocast_dtype", "get_autocast_cpu_dtype",
                 "get_autocast_gpu_dtype", "is_autocast_cache_enabled", "_C.is_autocast_enabled",
                 "_C._is_any_autocast_enabled", "_C.get_autocast_dtype"),
    "dtype": ("get_default_dtype", "_C._get_default_dtype"),
    "deterministic": ("are_deterministic_algorithms_enabled", "is_deterministic_algorithms_warn_only_enabled",
                      "_C._get_deterministic_algorithms", "_C._get_deterministic_algorithms_warn_only"),
    "matmul": ("get_float32_matmul_precision", "_C._get_float32_matmul_precision"),
    "anomaly": ("is_anomaly_enabled", "is_anomaly_check_nan_enabled", "_C.is_anomaly_enabled",
                "_C.is_anomaly_check_nan_enabled"),
    "saved": ("_C._autograd._top_saved_tensors_default_hooks",),
    "compile": ("compiler.is_compiling", "compiler.is_dynamo_compiling", "_dynamo.is_compiling", "_utils.is_compiling",
                "_dynamo.external_utils.is_compiling"),
    "functorch": ("_C._functorch.is_batchedtensor", "_C._functorch.is_functorch_wrapped_tensor",
                  "_C._functorch.is_gradtrackingtensor", "_C._functorch.maybe_get_level",
                  "_C._functorch.maybe_get_bdim", "_C._functorch.peek_interpreter_stack",
                  "_C._are_functorch_transforms_active",
                  "_functorch.pyfunctorch.retrieve_current_functorch_interpreter"),
}


def mode_query_owner(name: str) -> tuple[Any, str]:
    """The object that holds the query ``name`` of :data:`MODE_QUERIES`, and its attribute; the owner is None where a
    module on the way is not imported (nothing the forward ran can have asked it)."""
    *path, attribute = name.split(".")
    owner: Any = torch.Tensor if path == ["Tensor"] else torch
    for step in path if path != ["Tensor"] else ():
        owner = vars(owner).get(step) if owner is not None else None
    return owner, attribute


def _mode_queries() -> frozenset[Any]:
    """The code objects (Python) and functions (builtins) of :data:`MODE_QUERIES` loaded now."""
    found = set()
    for names in MODE_QUERIES.values():
        for name in names:
            owner, attribute = mode_query_owner(name)
            function = getattr(owner, attribute, None) if owner is not None else None
            if function is not None:
                found.add(getattr(function, "__code__", function))
    return frozenset(found)


# What the model's own code may call outside itself without reading the process: builtins that compute on their
# arguments, and the standard library's pure modules (a call of anything else that takes no tensor and no module and
# returns a plain value -- a flag, a count, a device -- reads the process: ``torch.cuda.is_available()``,
# ``dist.is_initialized()``, ``os.cpu_count()``, a logger's level, a backend flag: a condition). A builtin method of
# an object (``dict.get``) reads that object, which the graph check follows as state.
_PURE_MODULES = frozenset({"builtins", "math", "cmath", "_operator", "operator", "itertools", "functools",
                           "_functools", "collections", "_collections", "_abc", "abc", "copy", "dataclasses", "enum",
                           "typing", "types", "re", "string", "textwrap", "numbers", "fractions", "decimal", "warnings",
                           "contextlib", "weakref", "_weakref", "_struct", "struct", "_bisect", "bisect", "_heapq",
                           "heapq", "einops", "numpy"})
_PROCESS_BUILTINS = frozenset({"open", "input", "id", "hash", "globals", "locals", "vars", "dir", "breakpoint", "exec",
                               "eval", "compile", "__import__"})
# how a call reaches qlint's own watchers (a torch-function mode, a watched flag): no query of the model's
_PLUMBING = frozenset({"torch.overrides", "qlint.capture.eager_record", "qlint.capture.module_state"})
# a builtin of the operating system that acts (output, a wait) and answers nothing the forward branches on
_ACTIONS = frozenset({"write", "writev", "pwrite", "fsync", "fdatasync", "sleep", "sched_yield"})
def _asks_torch(module: str) -> bool:
    """A builtin of ``module`` called by the model's code reads the process, unless it is torch's computation: the
    ops (``torch._C._VariableFunctions``, ``torch._C._nn``, ...) compute; a builtin of ``torch._C`` itself answers a
    question of the build or the process (``torch._C._cuda_getDeviceCount()``, ``torch.get_num_threads()``)."""
    return not module.startswith("torch") or module == "torch._C"


_PLAIN_VALUES = (bool, int, float, complex, str, bytes, torch.device, torch.dtype)
# objects whose builtin methods compute on the object's own contents (a thread-local's or a stream's read the
# process): the graph check follows a container the model holds as state
_PURE_RECEIVERS = (*_PLAIN_VALUES, dict, list, tuple, set, frozenset, collections.deque, bytearray, range, slice,
                   torch.Tensor, torch.Size, type(re.compile("")), type(re.match("", "")))


# the values a switch in the environment takes (unset, empty, the usual spellings of off and on): a forward that
# reads a variable is run at each, and traced too at one that changes what it computes; other values stay unknown
ENVIRONMENT_VALUES = (None, "", "0", "1", "false", "true")


@dataclass(frozen=True)
class Condition:
    """A fact outside the model and its inputs that the forward's own code reads, and where."""

    kind: str  # "environment", "thread state", "call stack", "clock"
    what: str  # "the environment variable FAST (unset here)"
    file: str
    line: int
    name: str = ""  # the environment variable's name

    @property
    def code(self) -> str:
        return linecache.getline(self.file, self.line).strip()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "what": self.what, "file": self.file, "line": self.line}


@functools.lru_cache(maxsize=4096)
def model_code(file: str) -> bool:
    """Code of the model's own (its package, a library it uses such as transformers), not of torch, the
    standard library or qlint."""
    if file.startswith(("<frozen", TORCH_DIR, _QLINT_DIR + os.sep)):
        return False
    return not standard_library(file)


def standard_library(file: str) -> bool:
    return file.startswith("<frozen") or (file.startswith(_STDLIB) and "site-packages" not in file
                                          and "dist-packages" not in file)


class ProcessReads:
    """A profile function over one forward that collects its :class:`Condition`s (first read of each)."""

    def __init__(self, model: Any) -> None:
        self.found: dict[tuple[str, str], Condition] = {}
        # a query's frame -> (the caller, its name, whether it was given a tensor or module, whether it is a method,
        # whether it is the standard library's)
        self.queries: dict[int, tuple[types.FrameType, str, bool, bool, bool]] = {}
        # a query that answered True or False: its function and answer (the other answer can be tried: answering)
        self.two_valued: dict[Condition, tuple[types.FunctionType, bool]] = {}
        self.mode_queries = _mode_queries()
        self.names_seen: dict[Any, list[tuple[str, str, Optional[int]]]] = {}  # code -> process state it names
        self.environment: list[str] = []
        # the globals the model's own code names, each with a function that reads it now: a call counter kept
        # there is state the graph check compares between calls
        self.state_roots: dict[str, Any] = {}
        self._held(model)

    def __enter__(self) -> "ProcessReads":
        import torch._dynamo  # noqa: F401  (torch imports it on a forward's first op: 2M profiled events, seconds)

        _clear_own_caches()  # a query memoised by the model's code is asked again, where this forward sees it
        self._previous = sys.getprofile()
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self._previous)

    @property
    def conditions(self) -> list[Condition]:
        """The first read of each; ``os.environ`` named on a line that looks a variable up is that variable."""
        named = {(c.file, c.line) for c in self.found.values() if c.kind == "environment" and c.name}
        return [c for c in self.found.values()
                if not (c.kind == "environment" and not c.name and (c.file, c.line) in named)]

    def note(self, kind: str, what: str, frame: Optional[types.FrameType], line: Optional[int] = None,
             name: str = "") -> None:
        """A condition (its first read of each kind and what), read by the code of ``frame``."""
        if frame is not None and (kind, what) not in self.found:
            self.found[(kind, what)] = Condition(kind, what, frame.f_code.co_filename, line or frame.f_lineno,
                                                 name=name)

    def _held(self, model: Any) -> None:
        """A thread-local or context variable a submodule holds as an attribute: its forward may read it."""
        for path, module in model.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, _THREAD_STATE) and not installed(_class_place(module)[0]):
                    # (an installed library's module: its state is its configuration)
                    self.found[("thread state", f"{path or 'model'}.{name}")] = Condition(
                        "thread state", _describe(value, f"{path + '.' if path else ''}{name}") + " the model holds",
                        *_class_place(module))

    def _event(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code is _ENVIRONMENT_LOOKUP:
                self._environment_read(frame)
            elif own_code(code.co_filename):  # the model's own code reads what it names (an installed package's
                for kind, what, line in self._state_named(frame):  # reads are its configuration)
                    self.note(kind, what, frame, line)
            elif frame.f_back is not None and own_code(frame.f_back.f_code.co_filename):
                self._called_out(frame)
        elif event == "return":
            query = self.queries.pop(id(frame), None) if self.queries else None
            if query is not None and _answers(arg, *query[2:]):
                caller, name = query[:2]
                what = f"the value of `{name}` ({_shown(arg)} here)"
                self.query(what, caller)
                function = _function_of(frame) if isinstance(arg, bool) else None
                if function is not None and ("process", what) in self.found:
                    self.two_valued.setdefault(self.found[("process", what)], (function, arg))
        elif event == "c_call":
            owner = getattr(arg, "__self__", None)
            if arg in _STACK_READS and (model_code(frame.f_code.co_filename)
                                        or frame.f_code.co_filename.endswith(_STACK_READERS)):
                self.note("call stack", "the call stack (who calls the model)", _reader(frame))
            elif arg in _CLOCKS:
                self.note("clock", f"the clock (`time.{arg.__name__}`)", _reader(frame))
            elif arg in _THREAD_IDENTITY:
                self.note("thread state", f"the thread running the model (`{arg.__name__}`)", _reader(frame))
            elif arg in _TORCH_SETTINGS:
                self.note("torch setting", f"torch's `{arg.__name__}()`, which qlint does not vary", _reader(frame))
            elif isinstance(owner, contextvars.ContextVar):
                self.note("thread state", _describe(owner, ""), _reader(frame))
            elif _draws(arg):
                self.note("random", f"a draw of a random generator other than torch's (`{arg.__name__}`)",
                          _reader(frame))
            elif not own_code(frame.f_code.co_filename):
                pass
            elif isinstance(owner, types.ModuleType) and (owner.__name__ not in _PURE_MODULES
                                                          or arg.__name__ in _PROCESS_BUILTINS) \
                    and _asks_torch(owner.__name__) and arg not in self.mode_queries \
                    and arg.__name__ not in _ACTIONS:
                self.query(f"the value of `{owner.__name__}.{arg.__name__}()`", frame)
            elif owner is not None and not _pure_receiver(owner):  # an object's state (a stream's)
                self.query(f"the value of `{type(owner).__name__}.{arg.__name__}()`", frame)

    def query(self, what: str, frame: types.FrameType) -> None:
        """A query of the process read at the line of ``frame``, unless a named read was noted there (the clock,
        an environment variable: the query that made it is that read); two queries on one line are both kept."""
        if not any(c.file == frame.f_code.co_filename and c.line == frame.f_lineno and c.kind != "process"
                   for c in self.found.values()):
            self.note("process", what, frame)

    def _called_out(self, frame: types.FrameType) -> None:
        """A function outside the model's own code that its code calls: a query of the process when it is passed
        no argument of its own (``dist.is_initialized()``, ``is_bf16_supported()`` at its defaults), asks an object
        (``logger.isEnabledFor(10)``, a backend flag's descriptor) or is a standard-library function (``find_spec``);
        a library's function of the plain arguments passed computes on them, one given a tensor computes on it (a
        True or False it answers is still a query: ``cudnn.is_acceptable(x)``), and pure modules and the modes the
        graph check enters are no query. What it returns decides (:meth:`_event`'s "return")."""
        code = frame.f_code
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] in _PURE_MODULES or code in self.mode_queries or module in _PLUMBING or (
                code.co_name.startswith("__") and code.co_name != "__get__"):
            return  # a protocol (a context's __exit__ answers whether it swallowed an error), not a question
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS)
                                 + bool(code.co_flags & inspect.CO_VARKEYWORDS)]
        arguments = [frame.f_locals.get(name) for name in names]
        values = [v for a in arguments for v in (a.values() if isinstance(a, dict) else a
                                                   if isinstance(a, (tuple, list)) else (a,))]
        computes = any(isinstance(value, (torch.Tensor, torch.nn.Module)) for value in values)
        method = bool(names) and names[0] in ("self", "cls") and not isinstance(arguments[0], _PLAIN_VALUES)
        passed = [value for name, value in zip(names, arguments) if not _default(frame, name, value)]
        if not computes and not method and passed and not standard_library(code.co_filename):
            return  # a library's function of the arguments passed
        self.queries[id(frame)] = (frame.f_back, f"{module}.{getattr(code, 'co_qualname', code.co_name)}",
                                   computes, method, standard_library(code.co_filename))

    def _environment_read(self, frame: types.FrameType) -> None:
        reader = _reader(frame)
        if reader is None:
            return
        key = frame.f_locals.get("key")
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name in self.environment:
            return
        self.environment.append(name)
        if len(self.environment) <= MAX_ENVIRONMENT_NAMES:
            state = "unset here" if os.environ.get(name) is None else "as set here"
            self.note("environment", f"the environment variable {name} ({state})", reader, name=name)
        elif len(self.environment) == MAX_ENVIRONMENT_NAMES + 1:
            self.note("environment", f"more environment variables (the first {MAX_ENVIRONMENT_NAMES} are named)",
                       reader)

    def _state_named(self, frame: types.FrameType) -> list[tuple[str, str, Optional[int]]]:
        """The process state the frame's code names, as (kind, what, line of the first load): thread-locals,
        context variables, ``os.environ`` read directly, ``sys.argv``, as globals, closure cells, its
        arguments (a default argument), one attribute deep in a module or class (``flags._STATE``,
        ``State.tls``); and the frame introspection it spells (``tb_frame.f_back``, ``sys.getprofile``).
        Cached per code and globals, arguments excepted."""
        code = frame.f_code
        key = (code, id(frame.f_globals))
        if key not in self.names_seen:
            found = []
            loaded = _loads(code)
            attributes = {name for name, _, kind in loaded if kind == "attribute"}
            for name, line, kind in loaded:
                if kind == "attribute":
                    if name in _INTROSPECTION:
                        found.append(("call stack", f"the call stack or qlint's instrumentation (`.{name}`)", line))
                    continue
                value = frame.f_locals.get(name) if kind == "cell" else frame.f_globals.get(name)
                self._root(code, frame.f_globals, name, kind, line)
                state = _state(value, name)
                if state is not None:
                    found.append((*state, line))
                elif isinstance(value, (types.ModuleType, type)):
                    held = vars(value)
                    found += [(*state, line) for other in sorted(attributes) if other in held
                              for state in [_state(held[other], f"{name}.{other}")] if state is not None]
            for root, kind, chain, line in _chains(code):
                value = frame.f_locals.get(root) if kind == "cell" else frame.f_globals.get(
                    root, vars(builtins).get(root))
                read = _platform_read(value, root, chain)
                if read is not None:
                    found.append(("platform", read, line))
            self.names_seen[key] = found
        arguments = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        return self.names_seen[key] + [(*state, frame.f_lineno) for name in arguments
                                       for state in [_state(frame.f_locals.get(name), name)] if state is not None]

    def _root(self, code: types.CodeType, names: dict[str, Any], name: str, kind: str, line: Optional[int]) -> None:
        """A global the model's own code names, kept with a function that reads it now. A closure cell is read
        through the function that holds it (call_state.python_state); code compiled at run time ("<string>")
        is torch.compile's, not the model's."""
        if kind == "global" and name in names and not code.co_filename.startswith("<"):
            where = f"{os.path.basename(code.co_filename)}:{line}"
            self.state_roots.setdefault(f"the global `{name}` ({where})", functools.partial(names.get, name))


def _state(value: Any, name: str) -> Optional[tuple[str, str]]:
    """(kind, what) when ``value`` is process state a forward may branch on."""
    if isinstance(value, _THREAD_STATE):
        return "thread state", _describe(value, name)
    if value is os.environ or value is getattr(os, "environb", None):
        return "environment", f"the environment (`{name}` read directly)"
    if value is sys.argv:
        return "command line", f"the command line (`{name}`)"
    if value is sys.modules:
        return "loaded modules", f"the modules this process has loaded (`{name}`: is qlint one of them?)"
    if isinstance(value, ctypes.CDLL):
        return "native code", f"a C library called through ctypes (`{name}`), whose reads qlint does not see"
    return None


# attributes that read frames (a traceback's, a frame's caller) or whether a profiler watches
_INTROSPECTION = frozenset({"tb_frame", "f_back", "f_code", "f_globals", "f_locals", "_getframe", "currentframe",
                            "getprofile", "gettrace", "extract_stack", "walk_stack"})


@functools.lru_cache(maxsize=4096)
def _loads(code: types.CodeType) -> tuple[tuple[str, Optional[int], str], ...]:
    """The globals, closure cells and attributes a code object loads (kind "global", "cell", "attribute"),
    with the line of the first load of each."""
    seen: dict[tuple[str, str], tuple[str, Optional[int], str]] = {}
    for instruction in dis.get_instructions(code):
        kind = _LOAD_KINDS.get(instruction.opname)
        if kind is None or (instruction.argval, kind) in seen:
            continue
        positions = getattr(instruction, "positions", None)  # Python 3.11
        line = positions.lineno if positions is not None else instruction.starts_line
        seen[(instruction.argval, kind)] = (instruction.argval, line, kind)
    return tuple(seen.values())


@functools.lru_cache(maxsize=4096)
def _chains(code: types.CodeType) -> tuple[tuple[str, str, tuple[str, ...], Optional[int]], ...]:
    """The attribute chains a code object reads off a global or a closure cell (``sys.platform``,
    ``torch.version.hip``, ``getattr(torch.version, "hip", None)``; ``hasattr(os, "name")`` as ``?name``):
    (root, its kind, the attributes, the line)."""
    chains: list[tuple[str, str, list[str], Optional[int]]] = []
    current: Optional[list[str]] = None
    getter = asked = None  # getattr / hasattr just loaded: a name given to it after the next chain ends it
    for instruction in dis.get_instructions(code):
        kind = _LOAD_KINDS.get(instruction.opname)
        if kind == "global" and instruction.argval in ("getattr", "hasattr"):
            getter, current = instruction.argval, None
        elif kind in ("global", "cell"):
            positions = getattr(instruction, "positions", None)
            current, asked, getter = [], getter, None
            chains.append((instruction.argval, kind, current,
                           positions.lineno if positions is not None else instruction.starts_line))
        elif kind == "attribute" and current is not None:
            current.append(instruction.argval)
        elif instruction.opname == "LOAD_CONST" and isinstance(instruction.argval, str) and current is not None \
                and asked is not None:
            current.append(("?" if asked == "hasattr" else "") + instruction.argval)
            current = asked = None
        else:
            current = asked = None
    return tuple((root, kind, tuple(chain), line) for root, kind, chain, line in chains if chain)


def _platform_read(value: Any, name: str, chain: tuple[str, ...]) -> Optional[str]:
    """What ``name.a.b`` reads when it reaches a plain value through modules and objects that are neither the
    model's own code, a pure module (``math.pi``) nor torch's values (``sys.platform``, ``torch.version.hip``,
    ``sys.flags.optimize``, a logger's level): a fact of the platform or the process, one value in every run
    here. Nothing is read past a callable: what a call answers is its return's (:meth:`ProcessReads._event`)."""
    path = name
    for place, attribute in enumerate(chain, 1):
        if not _outside(value):
            return None
        if attribute.startswith("?"):
            value, path = hasattr(value, attribute[1:]), f"hasattr({path}, {attribute[1:]!r})"
        else:
            try:
                value = getattr(value, attribute)
            except Exception:  # noqa: BLE001  (an attribute that fails here is read nowhere)
                return None
            path += f".{attribute}"
        if _plain_fact(value) or (place == len(chain) and isinstance(value, tuple) and value
                                  and all(map(_plain_fact, value))):  # a record of them too (sys.version_info)
            return f"`{path}` ({reprlib.repr(value)} here)"
    return None


def _plain_fact(value: Any) -> bool:
    return isinstance(value, (bool, int, str, bytes, type(None))) and not isinstance(value, enum.Enum)


def _outside(value: Any) -> bool:
    """A module or an object whose attributes the platform or a library sets, not the model's own code."""
    if isinstance(value, types.ModuleType):
        file = getattr(value, "__file__", None) or ""
        return value.__name__.split(".")[0] not in _PURE_MODULES and not (file and own_code(file))
    kind = type(value)
    place = getattr(sys.modules.get(kind.__module__), "__file__", None) or ""
    return not (callable(value) or isinstance(value, (torch.Tensor, torch.nn.Module, *_PLAIN_VALUES))
                or kind.__module__.split(".")[0] in ("torch", *_PURE_MODULES) or (place and own_code(place)))


_LOAD_KINDS = {"LOAD_GLOBAL": "global", "LOAD_NAME": "global", "LOAD_DEREF": "cell", "LOAD_CLASSDEREF": "cell",
               "LOAD_ATTR": "attribute", "LOAD_METHOD": "attribute"}


def own_code(file: str) -> bool:
    """The model's own source: neither torch, the standard library, qlint nor an installed package."""
    return model_code(file) and not installed(file)


@contextlib.contextmanager
def environment_set(name: str, value: Optional[str]) -> Iterator[None]:
    """The environment variable ``name`` at ``value`` (None: unset) for the block, then as it was."""
    before = os.environ.get(name)
    try:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


_APART: list[Any] = []  # the empty caches in place of the model's own while :func:`own_caches_apart` holds them


@contextlib.contextmanager
def own_caches_apart(model: Any) -> Iterator[None]:
    """The ``functools`` caches of the model's own code (its modules' functions and classes' methods, and those its
    submodules hold) swapped for empty ones of the same size while qlint runs the model: each watched forward
    empties them (:func:`_clear_own_caches`), and the user's own caches (a test's or a notebook's memoised results)
    are put back untouched."""
    swapped: list[tuple[Any, str, Any]] = []
    fresh: dict[int, Any] = {}
    owners = list(model.modules())
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and own_code(file):
            owners += [module, *(value for value in list(vars(module).values())
                                 if isinstance(value, type) and value.__module__ == module.__name__)]
    for owner in owners:
        for name, value in list(vars(owner).items()):
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if not isinstance(function, functools._lru_cache_wrapper):  # type: ignore[attr-defined]
                continue
            if id(function) not in fresh:
                fresh[id(function)] = functools.lru_cache(**function.cache_parameters())(function.__wrapped__)
            empty = fresh[id(function)]
            setattr(owner, name, empty if function is value else type(value)(empty))
            swapped.append((owner, name, value))
    _APART.extend(fresh.values())
    try:
        yield
    finally:
        del _APART[len(_APART) - len(fresh):]
        for owner, name, value in reversed(swapped):
            setattr(owner, name, value)


def _clear_own_caches() -> None:
    """Empty the caches :func:`own_caches_apart` put in place: a cached answer is a read made before the forward
    qlint watches, and answering a query the other way must reach it."""
    for cache in _APART:
        cache.cache_clear()


def _pure_receiver(owner: Any) -> bool:
    return isinstance(owner, (types.ModuleType, type, *_PURE_RECEIVERS)) or type(owner).__module__ == "numpy"


def _answers(value: Any, computes: bool, method: bool, standard: bool) -> bool:
    """Whether a query returned a fact of the process: True or False from a computation on a tensor; from anything
    else a plain value, an enum, a tuple of them (``platform.uname()``), or None from a standard-library function
    (``find_spec`` finding nothing; a library's or a method's None is an action done: a logger's call), or a
    torch-function or dispatch mode (which modes are active: qlint's own watchers while it checks, none in a plain
    run)."""
    if isinstance(value, _MODES):
        return True
    if computes:
        return isinstance(value, bool)
    if value is None:
        return standard and not method
    plain = (*_PLAIN_VALUES, enum.Enum)
    return isinstance(value, plain) or (isinstance(value, tuple) and all(isinstance(v, plain) for v in value))


_MODES = (torch.overrides.TorchFunctionMode, torch.utils._python_dispatch.TorchDispatchMode)


def _shown(answer: Any) -> str:
    """A query's answer as the condition names it: a mode by its class (qlint's own watchers differ per forward)."""
    if isinstance(answer, _MODES):
        return f"a {type(answer).__name__} mode" + (", qlint's own" if type(answer).__module__.startswith("qlint")
                                                     else "")
    return reprlib.repr(answer)


def _default(frame: types.FrameType, name: str, value: Any) -> bool:
    """Whether the argument ``name`` holds its default (not passed by the caller), for a function found by name."""
    function = _function_of(frame, closures=True)
    if function is None:
        return False
    defaults = dict(zip(function.__code__.co_varnames[function.__code__.co_argcount - len(function.__defaults__ or ()):
                                                      function.__code__.co_argcount], function.__defaults__ or ()))
    defaults.update(function.__kwdefaults__ or {})
    return name in defaults and defaults[name] is value


def _answer_true(*args: Any, **kwargs: Any) -> bool:
    return True


def _answer_false(*args: Any, **kwargs: Any) -> bool:
    return False


def _function_of(frame: types.FrameType, closures: bool = False) -> Optional[types.FunctionType]:
    """The module-level function or class method whose code the frame runs, found by its qualified name; None for
    a local function, or one with a closure unless ``closures`` (its answer cannot be swapped)."""
    owner: Any = frame.f_globals
    for part in getattr(frame.f_code, "co_qualname", frame.f_code.co_name).split("."):
        owner = owner.get(part) if isinstance(owner, dict) else vars(owner).get(part) if hasattr(owner, "__dict__") \
            else None
        owner = getattr(owner, "__func__", owner)  # a staticmethod's or classmethod's function
    return owner if isinstance(owner, types.FunctionType) and owner.__code__ is frame.f_code \
        and (closures or owner.__closure__ is None) else None


@contextlib.contextmanager
def answering(function: types.FunctionType, answer: bool) -> Iterator[None]:
    """``function`` answers ``answer`` for the block, wherever it is called from (its code swapped)."""
    code = function.__code__
    function.__code__ = (_answer_true if answer else _answer_false).__code__
    try:
        yield
    finally:
        function.__code__ = code


def _draws(function: Any) -> bool:
    """A method of Python's or NumPy's random generators (``random.random`` is one of ``random._inst``)."""
    owner = getattr(function, "__self__", None)
    return isinstance(owner, random.Random) or type(owner).__module__.startswith("numpy.random")


def _describe(value: Any, name: str) -> str:
    """A context variable by its own name (read by name or by ``get``), a thread-local by the name it is held by."""
    return f"the context variable `{value.name}`" if isinstance(value, contextvars.ContextVar) \
        else f"the thread-local `{name}`"


def _reader(frame: types.FrameType) -> Optional[types.FrameType]:
    """The frame of the model's own code that made a read through ``frame`` (the standard library's lookup
    itself, or the model's code), whoever called that code (torch.utils.checkpoint calls a block's function);
    None when the innermost frame outside the standard library is torch's, qlint's or an installed
    package's: their switches are their configuration (transformers' output collector, triton's
    cache folder read when torch loads it), as torch's own global modes are, which the graph check varies."""
    current: Optional[types.FrameType] = frame
    while current is not None:
        file = current.f_code.co_filename
        if model_code(file):
            return None if installed(file) else current
        if file.startswith((TORCH_DIR, _QLINT_DIR + os.sep)):
            return None
        current = current.f_back
    return None


def _class_place(module: Any) -> tuple[str, int]:
    try:
        return inspect.getsourcefile(type(module)) or "?", inspect.getsourcelines(type(module))[1]
    except (OSError, TypeError):
        return "?", 0


__all__ = ["Condition", "ENVIRONMENT_VALUES", "answering", "MAX_ENVIRONMENT_NAMES", "MODE_QUERIES", "ProcessReads",
           "environment_set", "mode_query_owner", "model_code", "own_code", "standard_library"]
