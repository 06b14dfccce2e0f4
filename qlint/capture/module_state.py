"""What a forward's code reads off its modules rather than off tensors: the hooks registered on them and their
training flags.

A training loop, a profiler or a feature extractor registers hooks qlint never sees, and a frozen-BatchNorm
recipe puts one submodule in eval mode while the rest trains: a forward that branches on either takes a path the
graph, traced on the module as given, does not hold. Neither read reaches a torch-function mode (they are plain
Python attributes), so they are watched where they live while one recorded forward runs:

* every hook registry (each module's ``_forward_hooks`` and its kin, and ``torch.nn.modules.module``'s global ones)
  is swapped for a copy that notes a read from the model's code (:func:`hook_reads`); torch's own dispatch of the
  hooks is not the model's read. No run can try every hook a user may register, so such a read is refused;
* ``training`` gets a class-level property on every module class while the forward runs (:func:`flag_reads`), and
  each module's ``__dict__`` a copy that notes a read of it (``module.__dict__["training"]`` passes the class): a
  read from the model's code is noted with the module whose code reads it (the innermost ``self`` on the Python
  stack that is a module), so a forward that reads another module's flag is known, with the flags it combines.
"""

from __future__ import annotations

import contextlib
import linecache
import sys
from collections import OrderedDict
from typing import Any, Callable, Iterator, Optional

import torch

from qlint.capture.process_state import model_code, standard_library

_HOOK_REGISTRIES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                    "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
                    "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                    "_load_state_dict_post_hooks")


def reading_frame(depth: int, whose: Callable[[str], bool] = model_code) -> Optional[Any]:
    """The frame ``depth`` above the caller, past the standard library's (``len``, ``any`` are builtins and
    leave no frame), when its file is ``whose`` (the model's code; ``own_code``: not an installed library's); else
    None."""
    frame = sys._getframe(depth + 1)
    while frame is not None and standard_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame if frame is not None and whose(frame.f_code.co_filename) else None


def line_of(frame: Any) -> str:
    file = frame.f_code.co_filename
    return f"{file}:{frame.f_lineno} `{linecache.getline(file, frame.f_lineno).strip()}`"


class NotingReads:
    """A mapping that calls ``self._read(key)`` on every read of its contents (an item, membership, its length,
    iteration, keys, values, items, comparison): what the model's code reads of a registry or a ``__dict__`` no
    torch-function mode sees. Mixed in before ``dict`` or ``OrderedDict``."""

    def _read(self, key: Any) -> None:
        raise NotImplementedError

    def get(self, key: Any, default: Any = None) -> Any:
        self._read(key)
        return super().get(key, default)  # type: ignore[misc]

    def __getitem__(self, key: Any) -> Any:
        self._read(key)
        return super().__getitem__(key)  # type: ignore[misc]

    def __contains__(self, key: object) -> bool:
        self._read(key)
        return super().__contains__(key)  # type: ignore[misc]

    def __len__(self) -> int:
        self._read(None)
        return super().__len__()  # type: ignore[misc]

    def __iter__(self) -> Iterator[Any]:
        self._read(None)
        return super().__iter__()  # type: ignore[misc]

    def keys(self) -> Any:
        self._read(None)
        return super().keys()  # type: ignore[misc]

    def values(self) -> Any:
        self._read(None)
        return super().values()  # type: ignore[misc]

    def items(self) -> Any:
        self._read(None)
        return super().items()  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        self._read(None)
        return super().__eq__(other)  # type: ignore[misc]

    def __ne__(self, other: object) -> bool:
        self._read(None)
        return super().__ne__(other)  # type: ignore[misc]

    __hash__ = None  # type: ignore[assignment]  (a dict's)


class _WatchedRegistry(NotingReads, OrderedDict):
    """A hook registry that notes the first read by the model's code."""

    def _read(self, key: Any) -> None:
        lines = self.watch_lines  # type: ignore[attr-defined]
        if lines is not None and "hooks" not in lines:
            frame = reading_frame(2)
            if frame is not None:
                lines["hooks"] = line_of(frame)


def _held(model: torch.nn.Module, wanted: dict[int, Any], skip: tuple[str, ...] = ()) -> Iterator[tuple[str, str, Any]]:
    """(holder's path, attribute, ``wanted``'s value) for each attribute of the model's modules that is one of
    ``wanted`` (by identity), or a list, tuple or dict holding one: a reference taken when the model was built,
    which a swap of the original's own slot leaves unwatched (and whose reads and writes a swap would split). A
    module's ``__dict__`` held is not looked into: the swaps replace the slots in it, so reads through it are seen."""
    namespaces = {id(vars(module)) for module in model.modules()}
    for path, module in model.named_modules():
        for name, value in vars(module).items():
            if name in skip:
                continue
            inner = (() if id(value) in namespaces else value.values() if isinstance(value, dict)
                     else value if isinstance(value, (list, tuple)) else ())
            for item in (value, *inner):
                if id(item) in wanted:
                    yield path, name, wanted[id(item)]


@contextlib.contextmanager
def hook_reads(model: torch.nn.Module, facts_read: dict[str, str]) -> Iterator[None]:
    """While the block runs, a read of any hook registry by the model's code goes to ``facts_read["hooks"]``
    (its line), and so does a module that holds one under another name. Hooks registered meanwhile are kept."""
    import torch.nn.modules.module as module_module

    owners: list[tuple[Any, str, Any]] = [
        (vars(m), name, vars(m)[name]) for m in model.modules() for name in _HOOK_REGISTRIES
        if isinstance(vars(m).get(name), dict)]
    owners += [(vars(module_module), name, value) for name, value in list(vars(module_module).items())
               if name.startswith("_global_") and name.endswith("hooks") and isinstance(value, dict)]
    registries = {id(value): f"`{name}`" for _, name, value in owners}
    held = next((f"`{path or 'model'}.{name}` (holding {registry})"
                 for path, name, registry in _held(model, registries, skip=_HOOK_REGISTRIES)), None)
    if held is not None:  # a registry held under another name is read where no swap can watch it
        facts_read.setdefault("hooks", held)
    swapped = []
    try:
        for namespace, name, original in owners:
            watched = _WatchedRegistry(dict.items(original))
            watched.watch_lines = facts_read  # type: ignore[attr-defined]
            namespace[name] = watched
            swapped.append((namespace, name, original, watched))
        yield
    finally:
        for namespace, name, original, watched in reversed(swapped):
            watched.watch_lines = None  # type: ignore[attr-defined]
            original.clear()
            original.update(dict.items(watched))
            namespace[name] = original


class _WatchedFlag:
    """``training`` on a module class while the forward runs: the value the class gives (the instance's own, or
    what a ``training`` the class defines returns), a read by the model's code noted against the module whose
    forward reads it."""

    def __init__(self, reads: dict[Any, dict[int, str]], names: dict[int, str], inner: Any) -> None:
        self.reads, self.names, self.inner = reads, names, inner

    def __get__(self, module: Any, owner: Any = None) -> Any:
        if module is None:
            return self
        value = (self.inner.__get__(module, owner) if hasattr(self.inner, "__get__")
                 else dict.__getitem__(vars(module), "training"))
        if id(module) in self.names:
            frame = reading_frame(1)
            if frame is not None:
                self.reads.setdefault(_reading_module(frame, self.names), {}).setdefault(id(module), line_of(frame))
        return value

    def __set__(self, module: Any, value: Any) -> None:
        if hasattr(self.inner, "__set__"):
            self.inner.__set__(module, value)
        else:
            vars(module)["training"] = value


def _reading_module(frame: Any, names: dict[int, str]) -> str:
    """The module whose code reads: the innermost ``self`` up the stack that is one of the model's modules (a
    helper function such as an attention kernel reads for the module that called it); else the model. A module's
    own method reading its own flag is its own read, whoever calls the method."""
    while frame is not None:
        candidate = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if id(candidate) in names:
            return names[id(candidate)]
        frame = frame.f_back
    return ""


class _FlagHoldingDict(NotingReads, dict):
    """A module's ``__dict__`` while the forward runs: ``module.__dict__["training"]`` (or the whole of it read)
    passes the class-level watch, so the model's code reading it there is noted here."""

    def _read(self, key: Any) -> None:
        if key is None or (isinstance(key, str) and key == "training"):
            frame = reading_frame(2)
            reads, names, owner = self.watch  # type: ignore[attr-defined]
            if frame is not None:
                reads.setdefault(_reading_module(frame, names), {}).setdefault(owner, line_of(frame))


@contextlib.contextmanager
def flag_reads(model: torch.nn.Module, groups: dict[str, dict[str, str]]) -> Iterator[None]:
    """While the block runs, each module that reads training flags (by name, "" the model) goes to ``groups``
    with the modules whose flags it read (name -> the first line); a class that defines ``training`` itself (a
    property) is watched through it, and each module's ``__dict__`` is watched too. A ``__dict__`` another module
    holds (``self.state = self.w3.__dict__``) is left in place and counted as read by its holder: the holder's
    reads of it are out of sight, and a swapped copy would split the two."""
    names = {id(m): name for name, m in model.named_modules()}
    reads: dict[Any, dict[int, str]] = {}
    held = {id(vars(m)): m for m in model.modules()}
    for holder, attribute, owner in _held(model, held):
        reads.setdefault(holder, {}).setdefault(
            id(owner), f"`{holder or 'model'}.{attribute}` (holding the __dict__ of `{names[id(owner)] or 'model'}`)")
    left = {identity for owners in reads.values() for identity in owners}
    classes = list(dict.fromkeys(type(m) for m in model.modules()))
    own = {cls: vars(cls).get("training") for cls in classes}
    inner = {cls: next((vars(base)["training"] for base in cls.__mro__ if "training" in vars(base)), None)
             for cls in classes}
    swapped = []
    try:
        for cls in classes:
            setattr(cls, "training", _WatchedFlag(reads, names, inner[cls]))
        for module in dict.fromkeys(m for m in model.modules() if id(m) not in left):
            original = module.__dict__
            watched = _FlagHoldingDict(original)
            watched.watch = (reads, names, id(module))  # type: ignore[attr-defined]
            module.__dict__ = watched
            swapped.append((module, original, watched))
        yield
    finally:
        for module, original, watched in reversed(swapped):
            original.clear()
            original.update(dict.items(watched))
            module.__dict__ = original
        for cls in reversed(classes):
            if own[cls] is not None:
                setattr(cls, "training", own[cls])
            elif "training" in vars(cls):
                delattr(cls, "training")
        for reader, owners in reads.items():
            groups[reader] = {names[identity]: line for identity, line in owners.items()}


def cross_reads(groups: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The readers that read a training flag other than their own: their path depends on a combination of
    modes (a model that trains while one submodule is in eval), which one flip of the model does not show."""
    return {reader: owners for reader, owners in groups.items() if set(owners) - {reader}}


__all__ = ["NotingReads", "cross_reads", "flag_reads", "hook_reads", "line_of", "reading_frame"]
