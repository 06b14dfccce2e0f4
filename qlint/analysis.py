"""The analysis pipeline: trace, find blocks, propagate exponents, certify, report.

:func:`analyze` is the Python API (``qlint.analyze(model, inputs)``); the CLI and
the other subcommands call :func:`run` for the full context (graph, blocks and
per-node growth), which probes and remedies reuse.
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
import torch.fx as fx

from qlint import algebra
from qlint.blocks import ResidualBlock, find_blocks
from qlint.growth import Growth
from qlint.loader import LoadedModel, load, make_inputs
from qlint.propagate import GrowthInterpreter, Step, leading
from qlint.report import Block, DerivationStep, Finding, ModelReport, Report, Source
from qlint.rules import checks as rule_checks
from qlint.rules.primitives import REGISTRY, USER_DECLARED, load as load_registry
from qlint.trace import TracedGraph, capture, user_frames


@dataclass
class Options:
    """How to analyse: the CLI flags and [tool.qlint] keys that affect the analysis."""

    mode: Optional[str] = None  # "train" | "eval" | None: the model's own mode
    tracer: Optional[str] = None
    device: Optional[str] = None
    threshold: float = 1.0
    input_shapes: Sequence[str] = ()
    input_dtype: str = "float32"
    remedies: bool = False  # propose re-checked remedies for failing blocks (re-analyses per candidate)


@dataclass
class Analysis:
    """Everything one model's analysis computed, for checks, probes and remedies."""

    model: torch.nn.Module
    inputs: Optional[tuple]
    traced: TracedGraph
    interpreter: GrowthInterpreter
    residual_blocks: list[ResidualBlock]
    envs: dict[str, dict[fx.Node, Any]]
    report: ModelReport
    options: Options = field(default_factory=Options)


def analyze(
    model: torch.nn.Module,
    example_inputs: Optional[tuple] = None,
    *,
    spec: Optional[str] = None,
    mode: Optional[str] = None,
    tracer: Optional[str] = None,
    threshold: float = 1.0,
) -> ModelReport:
    """Certify every residual block of ``model``; returns the report.

    >>> report = qlint.analyze(model, (torch.randn(2, 16, 32),))
    >>> assert report.verdict == "certified", report.findings
    """
    options = Options(mode=mode, tracer=tracer, threshold=threshold)
    return run(model, example_inputs, spec=spec or type(model).__name__, options=options).report


def run(
    model: torch.nn.Module, inputs: Optional[tuple], *, spec: str, options: Options, traced: Optional[TracedGraph] = None
) -> Analysis:
    """Trace and analyse one model (raises TraceFailure when no tracer succeeds).

    ``traced`` analyses that graph of ``model`` as it is, without tracing: remedies
    re-check an edited copy whose nodes keep their module paths.
    """
    load_registry()
    rule_checks.load_all()
    if options.mode is not None:
        model.train(options.mode == "train")
    mode = "train" if model.training else "eval"
    inputs = _on_model_device(model, inputs)
    if traced is None:
        traced = capture(model, inputs, prefer=options.tracer, leaf_classes=tuple(USER_DECLARED))
    interpreter = GrowthInterpreter(traced.module, REGISTRY, training=model.training)
    residual_blocks = find_blocks(traced.graph, root_name=type(model).__name__)
    blocks, envs = [], {}
    for index, residual in enumerate(residual_blocks):
        env = interpreter.propagate(residual.stream, residual.cone)
        envs[residual.name] = env
        blocks.append(_certify(index, residual, env, interpreter, options.threshold))
    report = ModelReport(spec=spec, tracer=traced.tracer, mode=mode, blocks=blocks, threshold=options.threshold)
    report.findings = [f for block in blocks for f in _block_findings(block, options.threshold)]
    if traced.attempts:
        report.extra["trace_attempts"] = traced.attempts
    analysis = Analysis(model, inputs, traced, interpreter, residual_blocks, envs, report, options)
    for code, check in rule_checks.CHECKS.items():
        report.findings.extend(check(analysis))
    if options.remedies:
        from qlint.remedies import attach

        attach(analysis)
    return analysis


def _on_model_device(model: torch.nn.Module, inputs: Optional[tuple]) -> Optional[tuple]:
    """Move example inputs to the model's device (a factory that built on meta)."""
    if inputs is None:
        return None
    parameter = next(iter(model.parameters()), None)
    if parameter is None:
        return inputs
    return tuple(x.to(parameter.device) if isinstance(x, torch.Tensor) else x for x in inputs)


def velocity_growth(residual: ResidualBlock, env: dict[fx.Node, Any]) -> Growth:
    """The velocity is the sum of the non-stream terms (Theorem 9(ii))."""
    growths = [leading(env[t]) for t in residual.terms if t in env]
    dependent = [g for g in growths if g.depends]
    q = algebra.parallel_sum(g.q for g in dependent)
    culprit = next((g.culprit for g in dependent if g.culprit and (g.q is None or math.isinf(g.q))), None)
    return Growth(q, culprit=culprit)


def _certify(index: int, residual: ResidualBlock, env: dict, interpreter: GrowthInterpreter, threshold: float) -> Block:
    growth = velocity_growth(residual, env)
    chain = _chain(residual, env, interpreter.steps)
    derivation = _compress(chain, env, interpreter.steps)
    if derivation:
        derivation[0].source = source_of(residual.root)
    q = growth.q
    if q is None:
        status = "uncertified"
    elif q > threshold:
        status = "supercritical"
    else:
        status = "ok"
    unknown = sorted({interpreter.unknown[n] for n in residual.cone if n in interpreter.unknown})
    return Block(
        name=residual.name,
        index=index,
        q=q,
        status=status,
        derivation=derivation,
        dominant=_dominant_primitive(derivation, growth),
        source=source_of(residual.root),
        form=residual.form,
        unknown_ops=unknown,
        extra={"culprit": growth.culprit} if growth.culprit else {},
    )


def _chain(residual: ResidualBlock, env: dict, steps: dict[fx.Node, Step]) -> list[fx.Node]:
    """Follow the dominant inputs back from the velocity to X_k."""
    terms = [t for t in residual.terms if t in env and leading(env[t]).depends]
    if not terms:
        return []
    node: Optional[fx.Node] = max(terms, key=lambda t: _rank(leading(env[t]).q))
    chain = []
    while node is not None and node not in chain:
        chain.append(node)
        if node is residual.stream:
            break
        step = steps.get(node)
        node = step.parent if step else None
    return chain[::-1]


def _rank(q: Optional[float]) -> float:
    return math.inf if q is None else q


def _compress(chain: list[fx.Node], env: dict, steps: dict[fx.Node, Step]) -> list[DerivationStep]:
    """Keep X_k, each node where q changed (and the input it rose from), and the output."""
    keep: list[int] = []
    for i, node in enumerate(chain):
        q = leading(env[node]).q
        previous = leading(env[chain[i - 1]]).q if i else None
        if i == 0 or i == len(chain) - 1 or q != previous:
            if i > 1 and q != previous:
                keep.append(_meaningful_before(chain, i - 1, steps))
            keep.append(i)
    result = []
    for i in sorted(set(keep)):
        node = chain[i]
        step = steps[node]
        result.append(
            DerivationStep(node=node.name, primitive=step.primitive, q=leading(env[node]).q, source=source_of(node), why=step.why)
        )
    return result


def _meaningful_before(chain: list[fx.Node], index: int, steps: dict[fx.Node, Step]) -> int:
    """Walk back over views and casts to the primitive that produced the value (Δ, not Δ[..., None])."""
    while index > 1 and steps[chain[index]].plumbing:
        index -= 1
    return index


def dominant_step(block: Block) -> Optional[DerivationStep]:
    """The step at which the block's exponent reached its final value (Section 4.2 step 3)."""
    for step in block.derivation[1:]:
        if step.q == block.q:
            return step
    return block.derivation[-1] if block.derivation else None


def _dominant_primitive(derivation: list[DerivationStep], growth: Growth) -> str:
    if growth.culprit and (growth.q is None or math.isinf(growth.q)):
        return growth.culprit
    step = dominant_step(Block("", 0, growth.q, "ok", derivation))
    return step.primitive if step else ""


def source_of(node: fx.Node) -> Optional[Source]:
    """The innermost frame of the user's code that created this node."""
    frames = user_frames(node)
    if not frames:
        return None
    file, line, _ = frames[-1]
    return Source(_relative(file), line)


def _relative(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _block_findings(block: Block, threshold: float) -> list[Finding]:
    """QL101-QL105 for one block."""
    findings = []
    where = f" at {block.source}" if block.source else ""
    if block.q is None:
        culprit = block.extra.get("culprit") or ", ".join(block.unknown_ops) or "an unbounded op"
        findings.append(Finding("QL102", "error", f"block `{block.name}` is uncertified: {culprit}", block.name, block.source))
    elif math.isinf(block.q):
        findings.append(
            Finding("QL103", "error", f"block `{block.name}` grows faster than any polynomial: {block.dominant}", block.name, block.source)
        )
    elif block.q > threshold:
        findings.append(
            Finding(
                "QL101",
                "error",
                f"block `{block.name}` is supercritical: q = {algebra.format_q(block.q)} > {threshold:g} (dominant: {block.dominant}{_step_source(block)}); run with --show-remedies for fixes qlint has re-checked",
                block.name,
                block.source,
            )
        )
    if block.form == "post-norm":
        findings.append(
            Finding("QL104", "info", f"block `{block.name}` is a Post-LN update LN(X + f(X)): outside the additive analysis; q is that of f{where}", block.name, block.source)
        )
    elif block.form == "post-activation":
        findings.append(
            Finding(
                "QL105",
                "info",
                f"block `{block.name}` applies ReLU after the add: ||relu(z)|| <= ||z||, so the additive bound with q = {algebra.format_q(block.q)} still holds",
                block.name,
                block.source,
            )
        )
    return findings


def _step_source(block: Block) -> str:
    step = dominant_step(block)
    return f" at {step.source}" if step and step.source else ""


# --- many models -----------------------------------------------------------------------


def load_model(spec: str, options: Options) -> LoadedModel:
    """Load a spec, building on ``options.device`` and making inputs from shapes."""
    context = torch.device(options.device) if options.device else nullcontext()
    with context:
        loaded = load(spec)
    if options.device:
        loaded.model.to(options.device)
    if loaded.inputs is None and options.input_shapes:
        device = options.device or _model_device(loaded.model)
        loaded.inputs = make_inputs(options.input_shapes, options.input_dtype, device)
    return loaded


def _model_device(model: torch.nn.Module) -> str:
    parameter = next(iter(model.parameters()), None)
    return str(parameter.device) if parameter is not None else "cpu"


def check(specs: Sequence[str], options: Optional[Options] = None) -> Report:
    """Load, trace and analyse each spec; raises LoadError / TraceFailure on the first failure."""
    options = options or Options()
    models = []
    for spec in specs:
        loaded = load_model(spec, options)
        models.append(run(loaded.model, loaded.inputs, spec=spec, options=options).report)
    return Report(models)
