"""The per-model pipeline: load, declare, trace, analyse, lint.

:func:`run` takes one model and explicit :class:`Options` and returns the full
:class:`~qlint.core.engine.Analysis` (graph, stream, per-block values and the report
with every finding, before suppressions); probes and remedies build on it.
Configuration files, suppressions and baselines are applied one floor up, by
:mod:`qlint.api`, which the command line uses too.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import torch

from qlint.registry import Declared
from qlint.registry import default as default_registry
from qlint.core.engine import Analysis, analyse
from qlint.core.results import ModelReport
from qlint.core.trace import TracedGraph, capture
from qlint.lint import run_checks
from qlint.loader import LoadedModel, load, make_inputs


@dataclass
class Options:
    """How to analyse: the CLI flags and [tool.qlint] keys that affect the analysis."""

    mode: Optional[str] = None  # "train" | "eval" | None: the model's own mode
    tracer: Optional[str] = None
    device: Optional[str] = None
    threshold: float = 1.0
    input_shapes: Sequence[Any] = ()
    input_dtype: str = "float32"
    remedies: bool = False  # propose re-checked remedies for failing blocks (qlint.api attaches them)
    primitives: Mapping[type, Declared] = field(default_factory=dict)  # declared opaque modules
    layer_reuse: bool = True  # export traces identical layers once (qlint.core.reuse); off: every layer traced


def run(model: torch.nn.Module, inputs: Optional[tuple], *, spec: str, options: Options,
        traced: Optional[TracedGraph] = None) -> Analysis:
    """Trace and analyse one model (raises TraceFailure when no tracer is faithful).

    ``traced`` analyses that graph of ``model`` as it is, without tracing: remedies
    re-check an edited copy. The model's mode is restored afterwards.
    """
    registry = default_registry().with_declared(dict(options.primitives))
    modes = [(module, module.training) for module in model.modules()]  # per module: a layer may be in train mode alone
    try:
        if options.mode is not None:
            model.train(options.mode == "train")
        inputs = _on_model_device(model, inputs)
        if traced is None:
            traced = capture(model, inputs, registry, prefer=options.tracer, reuse=options.layer_reuse)
        analysis = analyse(model, inputs, traced, registry, spec=spec, threshold=options.threshold)
        analysis.options = options
        analysis.report.findings = run_checks(analysis)
        analysis.report.anchors = class_paths(model, analysis.report)
    finally:
        for module, training in modes:
            module.training = training
    return analysis


def class_paths(model: torch.nn.Module, report: ModelReport) -> dict[str, str]:
    """Each block's, transition's and finding's place as the classes on its module path.

    ``"layers.3:mlp"`` in a ``GPT`` -> ``"GPT>ModuleList>Block>MLP"``: the same after
    ``self.layers`` is renamed or a layer is inserted in front, so baselines keep matching.
    The path stops at the first part that is not a submodule; ``""`` is the model's class.
    """
    modules = dict(model.named_modules())
    names = {p.name for p in [*report.blocks, *report.transitions]} | {f.block for f in report.findings if f.block}
    paths = {"": type(model).__qualname__}
    for name in names:
        classes, parts = [type(model).__qualname__], name.replace(":", ".").split(".")
        for end in range(1, len(parts) + 1):
            module = modules.get(".".join(parts[:end]))
            if module is None:
                break
            classes.append(type(module).__qualname__)
        paths[name] = ">".join(classes)
    return paths


def analyze(model: torch.nn.Module, example_inputs: Optional[tuple] = None, *, spec: Optional[str] = None,
            mode: Optional[str] = None, tracer: Optional[str] = None, threshold: float = 1.0,
            primitives: Optional[Mapping[type, Any]] = None) -> Any:
    """Certify every residual block of ``model``; returns the ModelReport (no config, no suppressions).

    ``qlint.analyze`` (:mod:`qlint.api`) is the same with the project's configuration.
    """
    options = Options(mode=mode, tracer=tracer, threshold=threshold, primitives=declarations(primitives or {}))
    return run(model, example_inputs, spec=spec or type(model).__name__, options=options).report


def declarations(table: Mapping[Any, Any]) -> dict[type, Declared]:
    """``{MyGate: {"q": 0, "why": "..."}}`` (or Declared values) as registry declarations."""
    out = {}
    for cls, value in table.items():
        out[cls] = value if isinstance(value, Declared) else Declared(**dict(value))
    return out


def _on_model_device(model: torch.nn.Module, inputs: Optional[tuple]) -> Optional[tuple]:
    """Move example inputs to the model's device (a factory that built on meta)."""
    if inputs is None:
        return None
    parameter = next(iter(model.parameters()), None)
    if parameter is None:
        return inputs
    return tuple(x.to(parameter.device) if isinstance(x, torch.Tensor) else x for x in inputs)


def load_model(spec: str, options: Options) -> LoadedModel:
    """Load a spec, building on ``options.device``; given input shapes replace the factory's
    example inputs (an explicit setting wins over a default, as in mypy and ruff)."""
    context = torch.device(options.device) if options.device else nullcontext()
    with context:
        loaded = load(spec)
    if options.device:
        loaded.model.to(options.device)
    if options.input_shapes:
        device = options.device or _model_device(loaded.model)
        loaded.inputs = make_inputs(options.input_shapes, options.input_dtype, device)
    return loaded


def _model_device(model: torch.nn.Module) -> str:
    parameter = next(iter(model.parameters()), None)
    return str(parameter.device) if parameter is not None else "cpu"


def run_specs(specs: Sequence[str], options: Optional[Options] = None) -> Any:
    """Load and analyse each spec with the same options (no configuration file)."""
    from qlint.core.results import Report

    options = options or Options()
    models = []
    for spec in specs:
        loaded = load_model(spec, options)
        models.append(run(loaded.model, loaded.inputs, spec=spec, options=options).report)
    return Report(models)


__all__ = ["Options", "analyze", "declarations", "load_model", "run", "run_specs"]
