"""Resolve a model SPEC (``path/model.py:build_model``, ``pkg.module:attr``, or a catalogue spec such as ``hf:llama``).

Follows the uvicorn / Flask conventions: a ``.py`` path is imported with its folder
on sys.path; a dotted module is imported as is. The attribute is an nn.Module or a
zero-argument factory returning ``model`` or ``(model, example_inputs)``. An
ImportError raised inside the user's module is reported as such, not as a missing
module.

Model code is the user's, and a gate must survive it: a ``sys.exit()`` while the module is
imported or the factory runs is a :class:`LoadError` naming the spec (:class:`ModelExit`),
never the end of the run, and :func:`note_phase` tells a supervising process what the
model's code is doing (``importing models.py``), so a worker that dies (``os._exit``, a
segfault, the OOM killer) is reported with the phase it died in.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from qlint.core.errors import QlintError

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32")


class LoadError(QlintError):
    """The spec could not be turned into a model; the message is one line."""


class ModelExit(LoadError):
    """The model's own code called ``sys.exit()`` (raised ``SystemExit``) while qlint ran it."""


_phase_listener: Optional[Callable[[str], None]] = None
_phase = ""


def set_phase_listener(listener: Optional[Callable[[str], None]]) -> None:
    """Call ``listener(phase)`` whenever the model's code enters a phase (a --jobs worker sends
    it to the process that supervises it)."""
    global _phase_listener
    _phase_listener = listener


def note_phase(phase: str) -> None:
    """What the model's code is doing now (``importing models.py``, ``building the model``,
    ``tracing``): named in the one-line error when it exits or its process dies."""
    global _phase
    _phase = phase
    if _phase_listener is not None:
        _phase_listener(phase)


def current_phase() -> str:
    return _phase


def exit_message(exc: SystemExit, phase: str) -> str:
    """``the model's code called sys.exit(3) while importing models.py``: one line."""
    code = exc.code
    shown = "" if code is None else repr(code) if not isinstance(code, int) else str(code)
    return f"the model's code called sys.exit({shown}) while {phase}"


@dataclass
class LoadedModel:
    model: Any  # torch.nn.Module
    inputs: Optional[tuple]
    spec: str
    origin: Optional[tuple[str, int]] = None  # file and line of the factory (or the module) the spec names
    built: Optional[str] = None  # for a catalogue spec: what was built from which config, and what was changed


def split_spec(spec: str) -> tuple[str, str]:
    """The one spec grammar: ``'a/b.py:build'`` -> ``('a/b.py', 'build')``; ``'a/b.py'`` -> ``('a/b.py', '')``.

    The attribute is what follows the last colon, unless that colon belongs to a Windows
    drive (``C:\\m.py``) or what follows it is a path; the loader defaults a missing one to
    ``build_model``.
    """
    location, sep, attribute = spec.rpartition(":")
    if (not sep or not attribute or (len(location) == 1 and location.isalpha()) or "/" in attribute or "\\" in attribute
        or attribute.endswith(".py")):
        return spec, ""
    return location, attribute


def join_spec(location: str, attribute: str) -> str:
    return f"{location}:{attribute}" if attribute else location


def is_path_spec(location: str) -> bool:
    """A file (``model.py``, ``pkg/model``) rather than a dotted module name."""
    return location.endswith(".py") or "/" in location or "\\" in location


def _prefer(folder: str) -> None:
    """Put a spec's folder first on sys.path, and forget a module of the same name as one of its files
    that an earlier spec imported from another folder: ``import common`` in ``a/model.py`` and in
    ``b/model.py`` are two modules, as running each file on its own would make them."""
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    for sibling in Path(folder).glob("*.py"):
        loaded = sys.modules.get(sibling.stem)
        where = getattr(loaded, "__file__", None)
        if loaded is not None and where and Path(where).resolve().parent != Path(folder):
            del sys.modules[sibling.stem]


def import_target(location: str) -> Any:
    """Import a .py file (its folder on sys.path) or a dotted module name."""
    if is_path_spec(location):
        path = Path(location)
        if not path.is_file():
            raise LoadError(f"no such file: {location}")
        folder = str(path.resolve().parent)
        _prefer(folder)
        name = f"qlint_user_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        note_phase(f"importing {location}")
        try:
            spec.loader.exec_module(module)
        except SystemExit as exc:
            del sys.modules[name]
            raise ModelExit(exit_message(exc, f"importing {location}")) from None
        except ImportError as exc:
            del sys.modules[name]
            raise LoadError(f"{location}: import failed inside the module: {exc}") from exc
        except Exception as exc:
            del sys.modules[name]
            raise LoadError(f"{location}: {type(exc).__name__} while importing: {exc}") from exc
        return module
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, ".")
    note_phase(f"importing {location}")
    try:
        return importlib.import_module(location)
    except SystemExit as exc:
        raise ModelExit(exit_message(exc, f"importing {location}")) from None
    except ModuleNotFoundError as exc:
        if exc.name and (location == exc.name or location.startswith(exc.name + ".")):
            raise LoadError(f"module not found: {location}") from exc
        raise LoadError(f"{location}: import failed inside the module: {exc}") from exc
    except Exception as exc:
        raise LoadError(f"{location}: {type(exc).__name__} while importing: {exc}") from exc


def declared_name(cls: type) -> str:
    """How ``[tool.qlint.primitives]`` names a class: ``module.Class``, where a class from a
    file loaded by path (module ``qlint_user_<stem>_<hash>``) is ``<stem>.Class``."""
    module = cls.__module__
    if module.startswith("qlint_user_"):
        module = module[len("qlint_user_") :].rpartition("_")[0]
    return f"{module}.{cls.__qualname__}"


def check_spec(spec: str) -> tuple[str, str]:
    """The spec's location and attribute, or the LoadError a user should see before torch is
    imported (a folder, a file that does not exist, an attribute that is no Python name)."""
    from qlint import catalogue

    try:
        if catalogue.parse(spec) is not None:
            return spec, ""
    except catalogue.CatalogueError as exc:
        raise LoadError(str(exc)) from None
    location, attribute = split_spec(spec)
    if Path(location).is_dir():
        raise LoadError(f"{location} is a folder; give a Python file or module and its factory, e.g. "
                        f"{location.rstrip('/')}/model.py:build_model")
    if is_path_spec(location) and not Path(location).is_file():
        raise LoadError(f"no such file: {location}")
    attribute = attribute or "build_model"
    if not all(part.isidentifier() for part in attribute.split(".")):
        raise LoadError(f"invalid attribute {attribute!r} in {spec!r}; expected MODULE:ATTRIBUTE")
    return location, attribute


def load(spec: str) -> LoadedModel:
    """The model (and its example inputs if the factory gives them) for a spec."""
    import torch

    location, attribute = check_spec(spec)
    if not attribute:  # check_spec gives only a catalogue spec no attribute
        return _from_catalogue(spec)
    try:
        target: Any = import_target(location)
    except ModelExit as exc:
        raise ModelExit(f"{spec}: {exc}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise LoadError(f"{location} has no attribute {attribute!r}")
        target = getattr(target, part)
    origin = _origin(target, location)
    if isinstance(target, torch.nn.Module):
        return LoadedModel(target, None, spec, origin)
    if not callable(target):
        raise LoadError(f"{spec} is neither an nn.Module nor a factory")
    note_phase(f"building the model ({attribute}())")
    try:
        built = target()
    except SystemExit as exc:
        raise ModelExit(f"{spec}: {exit_message(exc, f'building the model ({attribute}())')}") from None
    except Exception as exc:
        raise LoadError(f"{spec}: the factory raised {type(exc).__name__}: {exc}") from exc
    model, inputs = (built if isinstance(built, tuple) and len(built) == 2 else (built, None))
    if not isinstance(model, torch.nn.Module):
        raise LoadError(f"{spec} returned {type(model).__name__}, expected an nn.Module or (model, example_inputs)")
    if isinstance(inputs, Mapping):
        inputs = keyword_inputs(model, inputs, spec)
    elif inputs is not None:
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    return LoadedModel(model, inputs, spec, origin)


def _from_catalogue(spec: str) -> LoadedModel:
    """A library's architecture built from its default config (qlint.catalogue)."""
    import inspect

    from qlint import catalogue

    note_phase("building the model from its library's config")
    try:
        built = catalogue.build(spec)
    except catalogue.CatalogueError as exc:
        raise LoadError(str(exc)) from None
    inputs = keyword_inputs(built.model, built.inputs, spec) if isinstance(built.inputs, Mapping) else built.inputs
    try:
        origin = (inspect.getsourcefile(type(built.model)), inspect.getsourcelines(type(built.model))[1])
    except (TypeError, OSError):
        origin = None
    return LoadedModel(built.model, tuple(inputs), spec, origin, built.description)


def keyword_inputs(model: Any, inputs: Mapping[str, Any], spec: str) -> tuple:
    """Example inputs given as a dict (``{"input_ids": ids, "attention_mask": mask}``, as Hugging
    Face models take them) are keyword arguments of ``forward``: bound by name to its parameters
    and passed in their order, a parameter the dict skips given its default, so the call is
    ``model(**inputs)``. A name ``forward`` does not take, or one it takes only by keyword,
    is a LoadError naming it."""
    import inspect

    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        raise LoadError(f"{spec}: example inputs given as a dict, but the signature of "
                        f"{type(model).__name__}.forward cannot be read to bind them by name") from None
    parameters = list(signature.parameters.values())
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in positional]
    for key in inputs:
        if key not in names:
            keyword_only = any(p.name == key and p.kind == p.KEYWORD_ONLY for p in parameters)
            var_keyword = any(p.kind == p.VAR_KEYWORD for p in parameters)
            why = ("takes it only by keyword" if keyword_only else "takes it only through **kwargs" if var_keyword
                   else "has no such parameter")
            raise LoadError(f"{spec}: example input {key!r} (a dict key) cannot be passed to "
                            f"{type(model).__name__}.forward, which {why}; give the inputs as a tuple "
                            f"in the order of forward{signature}")
    last = max(names.index(key) for key in inputs) if inputs else -1
    values = []
    for parameter in positional[: last + 1]:
        if parameter.name in inputs:
            values.append(inputs[parameter.name])
        elif parameter.default is not parameter.empty:
            values.append(parameter.default)
        else:
            raise LoadError(f"{spec}: the example inputs (a dict) give no value for {parameter.name!r}, "
                            f"which {type(model).__name__}.forward requires")
    return tuple(values)


def _origin(target: Any, location: str) -> Optional[tuple[str, int]]:
    """Where the spec's factory is defined (else line 1 of its file): the user's line that
    findings in library code are attributed to."""
    import inspect

    try:
        obj = inspect.unwrap(target)
        file = inspect.getsourcefile(obj)
        if file is not None:
            return file, inspect.getsourcelines(obj)[1]
    except (TypeError, OSError):
        pass
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    file = getattr(module, "__file__", None) if module is not None else None
    if file is None and is_path_spec(location):
        file = location
    return (file, 1) if file else None


def parse_shape(text: str) -> tuple[int, ...]:
    """The one shape grammar: ``"2,8,7"``, ``"2x8x7"`` or ``"(2, 8, 7)"`` -> ``(2, 8, 7)``; ``"8,"`` is 1-d.

    Raises ValueError; the command line and the configuration say which flag or key.
    """
    text = text.strip().strip("()[]").strip()
    if text.endswith(","):
        text = text[:-1]
    parts = [p.strip() for p in re.split(r"[,x]", text)] if text else []
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"invalid shape {text!r}")
    return tuple(int(p) for p in parts)


def make_inputs(shapes: Sequence[str], dtype: str = "float32", device: str = "cpu") -> tuple:
    """Example inputs from --input-shape/--input-dtype: random normal or small integers."""
    import torch

    if dtype not in DTYPES:
        raise LoadError(f"invalid --input-dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    torch_dtype = getattr(torch, dtype)
    tensors = []
    for text in shapes:
        try:
            shape = parse_shape(text)
        except ValueError:
            raise LoadError(f"invalid --input-shape {text!r}; expected comma-separated positive integers "
                            "like 2,96,7") from None
        if torch_dtype.is_floating_point:
            tensors.append(torch.randn(shape, dtype=torch_dtype, device=device))
        else:
            tensors.append(torch.randint(0, 2, shape, dtype=torch_dtype, device=device))
    return tuple(tensors)
