"""The per-model pipeline: load, declare, trace, analyse, lint.

:func:`run` takes one model and explicit :class:`Options` and returns the full
:class:`~qlint.growth.engine.Analysis` (graph, stream, per-block values and the report
with every finding, before suppressions); probes and remedies build on it.
Configuration files, suppressions and baselines are applied one floor up, by
:mod:`qlint.api`, which the command line uses too.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import torch

from qlint.registry import Declared
from qlint.registry import default as default_registry
from qlint.growth.engine import Analysis, Gap, analyse_graph
from qlint.core.results import ModelReport
from qlint.capture.pipeline import capture, shapes_of
from qlint.capture.graph_check import computes
from qlint.core.ops import declared_name
from qlint.capture.trace import TraceFailure, TracedGraph
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
    primitives: Mapping[type, Declared] = field(default_factory=dict)  # declared opaque modules, by class
    # [tool.qlint.primitives]: opaque modules by class name, matched against the model's classes by `run`
    declared_by_name: Mapping[str, tuple[float, str]] = field(default_factory=dict)
    layer_reuse: bool = True  # export traces identical layers once (qlint.capture.reuse); off: every layer traced
    # measure every certified block before certifying it (qlint.probe.block_witness, qlint.api runs it)
    witness: bool = True
    witness_budget: float = 10.0  # seconds the witness may spend on one model


def run(model: torch.nn.Module, inputs: Optional[tuple], *, spec: str, options: Options,
        traced: Optional[TracedGraph] = None) -> Analysis:
    """Trace and analyse one model (raises TraceFailure when no tracer is faithful).

    ``traced`` analyses that graph of ``model`` as it is, without tracing: remedies
    re-check an edited copy. The model's mode is restored afterwards.
    """
    registry = default_registry().with_declared({**declared_in(model, options.declared_by_name), **options.primitives})
    modes = [(module, module.training) for module in model.modules()]  # per module: a layer may be in train mode alone
    try:
        if options.mode is not None:
            model.train(options.mode == "train")
        inputs = _on_model_device(model, inputs)
        if traced is None:
            traced = capture(model, inputs, registry, prefer=options.tracer, reuse=options.layer_reuse)
        analysis = analyse_graph(model, inputs, traced, registry, spec=spec, threshold=options.threshold)
        if traced.shapes is not None:
            analysis = _over_shapes(model, analysis, registry, spec, options)
        if traced.in_modes:
            analysis = _over_modes(model, analysis, registry, spec, options)
        if traced.conditions:  # read by the forward on every shape and in every mode: the model's conditions
            analysis.report.extra["conditions"] = [condition.to_dict() for condition in traced.conditions]
        analysis.options = options
        analysis.report.findings = run_checks(analysis)
        analysis.report.anchors = class_paths(model, analysis.report)
    finally:
        for module, training in modes:
            module.training = training
    return analysis


MAX_SHAPES = 2  # other input shapes traced and analysed when the first graph does not cover them
_VERDICT_RANK = {"certified": 0, "supercritical": 1, "uncertified": 2, "failed": 3}


def _over_shapes(model: torch.nn.Module, analysis: Analysis, registry: Any, spec: str, options: Options) -> Analysis:
    """The analysis of the worst input shape the model runs on, when the first graph (an export,
    traced on the example) does not compute the model on every shape tried (:mod:`qlint.capture.shapes`).

    Uncovered shapes are traced again and analysed, most telling first; a later one that an
    analysed graph computes is covered by it. The report is the one with the worst verdict (then
    the largest q) and says which shapes were analysed. An uncovered shape on an axis the graph
    keeps symbolic (another side of a dispatch on a size) that no analysed graph computes, or one
    that cannot be traced, is a coverage gap: not certified. Shapes along an axis a loop is
    unrolled over are analysed as a sample (the longest and the shortest tried), and the report
    says the certificate holds for the lengths analysed; so are, past the first two, the regions
    that only the export's own size assumptions separate (an inner size becomes or stops being 1,
    two sizes become equal: the scope size-1 inputs already have), and the report names them.
    """
    coverage = analysis.traced.shapes
    notes = [coverage.scope]
    worst, graphs, loops, collapsed = analysis, [], [], []
    for other in coverage.uncovered:
        shapes = shapes_of(other.inputs)
        if any(computes(model, g.module, other.inputs) for g in graphs):
            continue
        if len(graphs) >= MAX_SHAPES:
            if other.unrolled:
                loops.append(shapes)
            elif other.collapse:
                collapsed.append(other.where)
            else:
                _gap(worst, f"on inputs {shapes} the graph traced on the example does not compute the model "
                            f"(the model dispatches on a size), and {MAX_SHAPES} other shapes were analysed already")
            continue
        try:
            traced = capture(model, other.inputs, registry, prefer=analysis.traced.tracer, reuse=options.layer_reuse,
                             shapes_too=False)
        except TraceFailure as exc:
            _gap(worst, f"on inputs {shapes} the graph traced on the example does not compute the model, and the model "
                        f"traced there was refused ({exc})")
            continue
        traced.example = other.inputs
        graphs.append(traced)
        alternative = analyse_graph(model, other.inputs, traced, registry, spec=spec, threshold=options.threshold)
        notes.append(f"the graph differs from the model on inputs {shapes}: traced and analysed there too "
                     f"({alternative.report.verdict})")
        if _severity(alternative) > _severity(worst):
            alternative.gaps += [g for g in worst.gaps if g.part is None]
            alternative.report.uncovered += [g.reason for g in worst.gaps if g.part is None]
            worst = alternative
    if any(other.unrolled for other in coverage.uncovered):
        analysed = [shapes_of(analysis.inputs), *(shapes_of(g.example) for g in graphs)]
        notes.append("a loop is unrolled over an axis: the certificate holds for the lengths analysed "
                     f"({'; '.join(analysed)})"
                     + (f", not for {', '.join(loops)}" if loops else ""))
    if collapsed:
        notes.append(f"not analysed: {', '.join(collapsed)}, where an inner size becomes or stops being 1 or two sizes "
                     "become equal (the export specialises those, as it does inputs of size 1): the certificate holds "
                     "for the sizes analysed")
    worst.report.extra["shapes"] = "; ".join(notes)
    return worst


def _over_modes(model: torch.nn.Module, analysis: Analysis, registry: Any, spec: str, options: Options) -> Analysis:
    """The analysis of the worst graph among the one analysed and those the model gives in the global
    modes its forward may read (:func:`qlint.capture.pipeline._in_modes`): a certificate holds in every
    mode the model can be run in, and a mode it cannot be traced in is a gap."""
    worst, notes = analysis, []
    for other in analysis.traced.in_modes:
        reads = f"the forward reads the mode at {other.line}" if other.line else "the forward takes another path"
        if other.traced is None:
            _gap(worst, f"{reads}, and the model could not be traced {other.what} ({other.failure})")
            continue
        alternative = analyse_graph(model, analysis.inputs, other.traced, registry, spec=spec,
                                    threshold=options.threshold)
        notes.append(f"{reads} {other.what}: traced and analysed there too ({alternative.report.verdict})"
                     if not other.line else
                     f"{reads}: traced and analysed {other.what} too ({alternative.report.verdict})")
        if _severity(alternative) > _severity(worst):
            alternative.gaps += [g for g in worst.gaps if g.part is None]
            alternative.report.uncovered += [g.reason for g in worst.gaps if g.part is None]
            alternative.report.extra.update({k: v for k, v in worst.report.extra.items()
                                             if k not in alternative.report.extra})
            worst = alternative
    if notes:
        worst.report.extra["modes"] = "; ".join(notes)
    return worst


def _severity(analysis: Analysis) -> tuple[int, float, float]:
    """The verdict's rank, then the largest q of any part, then of any block: a frozen BatchNorm's graph, whose
    blocks are q 1 where the training one's are q 0 behind transitions of q 1, is the worse."""
    report = analysis.report

    def largest(parts: list) -> float:
        return max((p.q if p.q is not None else math.inf for p in parts), default=0.0)

    return _VERDICT_RANK.get(report.verdict, 3), largest([*report.blocks, *report.transitions]), largest(report.blocks)


def _gap(analysis: Analysis, reason: str) -> None:
    analysis.gaps.append(Gap(None, "model", None, reason))
    analysis.report.uncovered.append(reason)


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


def declared_in(model: torch.nn.Module, table: Mapping[str, tuple[float, str]]) -> dict[type, Declared]:
    """The classes of ``table`` (``[tool.qlint.primitives]``) that occur in ``model``, as declarations.

    A key ``"pkg.mod.Class"`` names a class by module and qualified name; for a model
    loaded from a file (``path/mod.py:build``) ``"mod.Class"`` names a class of that file.
    """
    if not table:
        return {}
    found = {}
    for cls in {type(m) for m in model.modules()}:
        for name in (f"{cls.__module__}.{cls.__qualname__}", declared_name(cls)):
            if name in table:
                q, why = table[name]
                found[cls] = Declared(q=q, why=why)
                break
    return found


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


__all__ = ["Options", "declarations", "declared_in", "load_model", "run", "run_specs"]
