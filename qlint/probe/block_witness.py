"""The witness behind every certificate: what ``qlint check`` is about to certify is measured
before it is.

The exponent arithmetic proves ``||v(x)|| <= c||x||^q + b`` with q <= 1; a bug in a rule, a
tracer or the block detector would prove it of a block that does not obey it. Two
measurements look for such a contradiction, in float64 where the code runs so:

* **The eager model.** A model whose blocks and transitions are all certified maps its input
  to its output with growth at most linear (the exponents compose: Theorem 9(i)), so the eager
  model itself, a float64 copy, is evaluated at inputs s·d for s from 1e4 to 1e6 times the
  example's norm, along the witness's directions (random, constant and alternating rows, one
  entry: :func:`qlint.probe.witness.directions`), for the parameters as built and redrawn
  (zero-initialised ones become nonzero). Redrawn parameters that overflow the dtype at the
  example itself (exp of a gate, in float32) say nothing of growth: that setting is not measured.
  This measures the model, not the graph: a branch on the dtype, a tensor subclass, a path the
  trace did not take all show here. It needs a floating input to scale (token ids cannot be);
  the other inputs keep their example values.
* **Each certified block**, on the traced graph: its region re-run with X_k := s·d, everything
  else as recorded (:class:`~qlint.velocity.field.VelocityField`), the same scales, directions
  and parameter settings. This tells *which* block a contradiction is in.

A measurement **refutes** when the value is inf or NaN there, or grows faster than the
threshold in both of the last two decades by more than :data:`MARGIN` (a q <= 1 map measures at
most ~1; rounding never adds a quarter of a decade per decade). A refuted block, or a model
whose eager output is refuted, is not certified, and QL107 reports it as a soundness bug with
the measurement.

Everything runs within a time budget (the model first, then the blocks in order) and the
report says what was measured. It needs values: on meta weights it is skipped, with a line in
the report.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from qlint.growth.engine import Analysis
from qlint.core.graph import facts
from qlint.capture.harness import tensor_outputs
from qlint.velocity.field import Trajectory, VelocityField, widen
from qlint.probe.spectral import log_norm
from qlint.probe.witness import AS_BUILT, directions, redraw

SCALES = [10.0 ** (4 + k / 2) for k in range(5)]  # 1e4 .. 1e6, two a decade
LATER = [10.0 ** (6 + k / 2) for k in range(1, 5)]  # to 1e8, where the growth measured is slowing down
BLOCK_DIRECTIONS = 3  # random, constant rows, alternating signs: per block (the model's output: every quick direction)
WIDE_LIMIT = 20_000_000  # parameters up to which the graph is copied to float64 (a larger one is measured in its dtype)
MARGIN = 0.25  # a refuting slope exceeds the threshold by this much in each of the last two decades
NEGLIGIBLE = 1e-6  # ... and the value at the largest scale exceeds this fraction of the input's norm there
DEFAULT_BUDGET = 10.0  # seconds for one model: GPT-2 small's 24 blocks took about 5 s on one core
SETTINGS = ((AS_BUILT, None), ("redrawn", redraw(1.0, 7)))  # the parameter settings measured, in turn
MODEL = "(the model)"  # the name a refutation of the eager model carries


@dataclass
class Refutation:
    """A certified block (or the model, :data:`MODEL`) the witness measured outgrowing the threshold."""

    block: str
    measurement: str  # what was measured, where (one line)


@dataclass
class Witnessed:
    """The witness's pass over one model."""

    measured: list[str] = field(default_factory=list)  # the certified blocks measured
    model: str = ""  # how the eager model was measured ("" when it was not)
    refuted: list[Refutation] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)  # certified blocks the budget left out
    skipped: str = ""  # why nothing was measured
    dtype: str = ""
    seconds: float = 0.0

    def summary(self) -> str:
        if self.skipped:
            return f"not run: {self.skipped}"
        parts = [self.model] if self.model else []
        parts.append(f"{len(self.measured)} certified block(s) on the graph ({self.dtype})")
        text = "; ".join(parts) + " (parameters as built and redrawn, inputs up to 1e6 x the example's): "
        text += f"{len(self.refuted)} refuted" if self.refuted else "none refuted"
        if self.unmeasured:
            text += (f"; {len(self.unmeasured)} block(s) not measured within the time budget "
                     f"({', '.join(self.unmeasured[:3])}{', ...' if len(self.unmeasured) > 3 else ''})")
        return text


def witness(analysis: Analysis, budget: float = DEFAULT_BUDGET) -> Witnessed:
    """Measure the model and every block the analysis certifies; what is refuted loses its certificate."""
    start = time.perf_counter()
    result = Witnessed()
    certified = [(residual, block) for residual, block in zip(analysis.stream.blocks, analysis.report.blocks)
                 if block.status == "ok"]
    if not certified:
        result.skipped = "no certified block"
        return result
    why = _unmeasurable(analysis)
    copied = _copy(analysis.traced.module) if not why else None
    if copied is None and not why:
        why = "the traced graph cannot be copied"
    if why:
        result.skipped = why
        return result
    declared = {n for n in analysis.graph.nodes if "qlint" in n.meta and facts(n).declared is not None}
    # the model's output is linear when every part is (exponents multiply: a threshold above 1 compounds,
    # so only the blocks are measured then). A declared primitive is measured as it runs: a refutation
    # of a block that holds one names it, since the declaration may be what is wrong
    if analysis.report.verdict == "certified" and analysis.threshold <= 1:
        result.model, refutation = _eager_model(analysis, 1.0)
        if refutation is not None:
            result.refuted.append(Refutation(MODEL, refutation))
            analysis.report.uncovered.append(f"the witness refutes the certificate: {refutation}")
    module, inputs = _graph_copy(copied, analysis.inputs)
    result.dtype = str(next((p.dtype for p in module.parameters()), torch.float32)).removeprefix("torch.")
    # one parameter setting at a time: a block is re-run against the module's current parameters,
    # so every block is measured on a setting before the next one is drawn
    for setting, perturb in SETTINGS:
        trajectory = _trajectory(analysis, module, inputs, perturb)
        for residual, block in certified:
            if block.status != "ok" or trajectory is None:
                continue
            if time.perf_counter() - start > budget:
                if block.name not in result.measured:
                    result.unmeasured.append(block.name)
                continue
            if block.name not in result.measured:
                result.measured.append(block.name)
            refutation = _refute_block(residual, setting, trajectory, analysis.threshold)
            if refutation is None:
                continue
            if held := sorted(n.name for n in declared & residual.region_set):
                refutation += (f" (the block holds declared primitive(s) {', '.join(held)}: "
                               "a declaration may be what fails)")
            result.refuted.append(Refutation(block.name, refutation))
            block.status = "uncertified"
            block.extra["witness"] = refutation
    result.seconds = time.perf_counter() - start
    return result


def _unmeasurable(analysis: Analysis) -> str:
    if analysis.inputs is None:
        return "no example inputs"
    inputs = [x for x in analysis.inputs if isinstance(x, torch.Tensor)]
    tensors = [*analysis.model.parameters(), *analysis.model.buffers(), *inputs]
    if any(t.is_meta for t in tensors):
        return "the weights are on the meta device (no values to measure)"
    return ""


def _wide(inputs: tuple) -> tuple:
    return tuple(x.to(torch.complex128 if x.is_complex() else torch.float64) if isinstance(x, torch.Tensor)
                 and (x.is_floating_point() or x.is_complex()) else x for x in inputs)


def _copy(module: torch.nn.Module) -> Optional[torch.nn.Module]:
    """A deep copy (a tensor the forward left attached to autograd, a monitor buffer written in
    train mode, copied detached), or None when the module cannot be copied."""
    attached = [t for t in _tensor_attributes(module) if not t.is_leaf]
    try:
        return copy.deepcopy(module, {id(t): t.detach().clone() for t in attached})
    except Exception:  # noqa: BLE001
        return None


def _tensor_attributes(module: torch.nn.Module) -> list[torch.Tensor]:
    """The buffers and plain tensor attributes of every submodule."""
    out = []
    for sub in module.modules():
        out += [t for t in sub._buffers.values() if isinstance(t, torch.Tensor)]
        out += [t for t in vars(sub).values() if isinstance(t, torch.Tensor)]
    return out


def _graph_copy(copied: torch.nn.Module, inputs: tuple) -> tuple[torch.nn.Module, tuple]:
    """The copy of the traced graph the witness perturbs, converted to float64 in place when it is
    small and runs so; else in its own dtypes (a large model, or a graph that fixed float32 in its casts)."""
    if sum(p.numel() for p in copied.parameters()) > WIDE_LIMIT:
        return copied, inputs
    dtypes = {name: t.dtype for name, t in [*copied.named_parameters(), *copied.named_buffers()]}
    wide = _wide(inputs)
    try:
        copied.to(torch.float64)
        with torch.no_grad():
            copied(*wide)
        return copied, wide
    except Exception:  # noqa: BLE001  (back to the dtypes it was traced in, exactly: float32 -> float64 -> float32)
        with torch.no_grad():
            for name, t in [*copied.named_parameters(), *copied.named_buffers()]:
                t.data = t.data.to(dtypes[name])
        return copied, inputs


def _trajectory(analysis: Analysis, module: torch.nn.Module, inputs: tuple,
                perturb: Optional[Callable[[torch.nn.Module], None]]) -> Optional[Trajectory]:
    """The graph copy's forward pass after ``perturb`` (in place), keyed by the analysed graph's
    nodes; None when the graph cannot run at that setting (nothing to measure there)."""
    if perturb is not None:
        with torch.no_grad():
            perturb(module)
    try:
        trajectory = Trajectory(module, inputs)
    except Exception:  # noqa: BLE001
        return None
    # the copy's nodes are new objects: the same names; its ops run against the copy's attributes
    original = {node.name: node for node in analysis.traced.module.graph.nodes}
    trajectory.values = {original[node.name]: value for node, value in trajectory.values.items()
                         if node.name in original}
    return trajectory


def _eager_model(analysis: Analysis, threshold: float) -> tuple[str, Optional[str]]:
    """Measure the eager model's output along its first floating input: (what was measured, a refutation)."""
    inputs = analysis.inputs
    index = next((i for i, x in enumerate(inputs)
                  if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) and x.numel()), None)
    if index is None:
        return "", None
    model = _copy(analysis.model)
    if model is None:  # a model that cannot be copied is not perturbed in place: not measured
        return "", None
    wide, dtype = _wide(inputs), "float64"
    try:
        model = model.to(torch.float64)
        _output(model, wide)
    except Exception:  # noqa: BLE001  (code that fixes its dtype: measured in its own)
        model, wide, dtype = _copy(analysis.model), inputs, str(inputs[index].dtype).removeprefix("torch.")

    def at(point: torch.Tensor) -> torch.Tensor:
        return _output(model, tuple(point if i == index else x for i, x in enumerate(wide)))

    x = wide[index]
    for name, perturb in SETTINGS:
        if perturb is not None:
            with torch.no_grad():
                perturb(model)
        refutation = _refute(at, x, threshold, f"the eager model's output, parameters {name}",
                             drawn=perturb is not None)
        if refutation is not None:
            return f"the eager model ({dtype}) along input {index}", refutation
    return f"the eager model ({dtype}) along input {index}", None


def _output(model: torch.nn.Module, inputs: tuple) -> torch.Tensor:
    """Every tensor the model returns, flattened into one (what grows is what is bounded)."""
    with torch.random.fork_rng(), torch.no_grad(), tensor_outputs(model):
        torch.manual_seed(0)
        outputs = model(*inputs)
    tensors = [t.detach().reshape(-1).to(torch.complex128 if t.is_complex() else torch.float64) for t in outputs
               if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    if any(t.is_complex() for t in tensors):
        tensors = [t.to(torch.complex128) for t in tensors]
    return torch.cat(tensors) if tensors else torch.zeros(0, dtype=torch.float64)


def _refute_block(residual: Any, setting: str, trajectory: Trajectory, threshold: float) -> Optional[str]:
    """Why the block's velocity outgrows the threshold at this parameter setting, or None."""
    field_ = VelocityField(trajectory, residual)
    stream = field_.stream
    if not isinstance(stream, torch.Tensor) or not (stream.is_floating_point() or stream.is_complex()):
        return None
    if not bool(torch.isfinite(stream).all()):
        return None  # an earlier block overflowed in this setting: nothing here is this block's
    what = f"its velocity, parameters {setting}"
    refutation = _refute(field_, stream, threshold, what, BLOCK_DIRECTIONS, drawn=setting != AS_BUILT)
    if refutation is None or " inf or NaN at " not in refutation or stream.dtype in (torch.float64, torch.complex128):
        return refutation
    # inf or NaN in a narrower dtype: its range, or the map? Measured again in float64 for this block alone
    # (redrawn weights multiply a ResNet's stream by ~50 a convolution: float32 overflows at 1e4 x the example)
    wide = VelocityField(trajectory, residual, wide=True)
    try:
        wide(stream)
    except Exception:  # noqa: BLE001  (a graph that fixed float32 in its casts: not measured wider, so it stands)
        return refutation
    return _refute(wide, widen(stream), threshold, what + " (in float64)", BLOCK_DIRECTIONS,
                   drawn=setting != AS_BUILT)


def _refute(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, threshold: float, what: str,
            count: Optional[int] = None, drawn: bool = False) -> Optional[str]:
    """Evaluate ``fn`` at s·d (||d|| = ||x||) along the witness's directions (the first ``count``);
    why it outgrows the threshold, or None. At ``drawn`` parameters (not the model's own) a value
    already inf or NaN at the example says the setting overflows the dtype (exp of a redrawn
    gate in float32), not that the map grows: nothing is measured there."""
    if drawn and not _finite(fn, x):
        return None  # drawn parameters that overflow the dtype at the example itself: not growth in x
    scale = float(x.detach().abs().double().norm()) or 1.0
    wide = torch.complex128 if x.is_complex() else torch.float64
    found = directions(x.detach().to(wide).contiguous(), [], random_count=1, quick=True)
    chosen = [d for d in found if d[0] in ("randn0", "ones", "alternating")] if count else found
    for label, unit in chosen[:count] if count else chosen:
        d = (unit * scale).to(x.dtype)
        logs = _logs(fn, d, SCALES)
        bad = next((s for s, value in zip(SCALES, logs) if value is None), None)
        if bad is not None:
            return f"{what}: inf or NaN at ||x|| = {bad:.0e} x the example's (direction {label})"
        if any(value == -math.inf for value in logs):
            continue
        slopes, last = _slopes(logs), math.log(SCALES[-1] * scale)
        if slopes[-1] < slopes[0] - MARGIN:  # slowing down: a transition (a softmax that saturates
            later = _logs(fn, d, LATER)      # after a cancellation) or growth: decided further out
            if all(value is not None and value > -math.inf for value in later):
                logs, slopes, last = [*logs, *later], _slopes([*logs, *later]), math.log(LATER[-1] * scale)
        # a value still below NEGLIGIBLE x ||x|| at the largest scale fits a linear bound with that
        # constant: its slope is rounding noise or a transition, no contradiction
        if logs[-1] > last + math.log(NEGLIGIBLE) and all(slope > threshold + MARGIN for slope in slopes):
            return (f"{what}: ||.|| grows like ||x||^{slopes[-1]:.2f} over the last decade measured "
                    f"(direction {label}), above the certified q <= {threshold:g}")
    return None


def _logs(fn: Callable[[torch.Tensor], torch.Tensor], d: torch.Tensor, scales: list[float]) -> list[Optional[float]]:
    """log ||fn(s d)|| for each scale s (None: inf, NaN or an arithmetic error there)."""
    out = []
    for s in scales:
        try:
            with torch.no_grad():
                value = fn(s * d)
            out.append(log_norm(value.abs() if value.is_complex() else value))
        except (ArithmeticError, RuntimeError):
            out.append(None)
    return out


def _slopes(logs: list[float]) -> list[float]:
    """The growth exponents over the last two decades (two points a decade)."""
    return [(logs[i + 2] - logs[i]) / math.log(10.0) for i in (len(logs) - 5, len(logs) - 3)]


def _finite(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
    try:
        with torch.no_grad():
            value = fn(x)
    except (ArithmeticError, RuntimeError):
        return False
    return log_norm(value.abs() if value.is_complex() else value) is not None


def attach(analysis: Analysis, budget: float = DEFAULT_BUDGET) -> Witnessed:
    """Run the witness on an analysis: what is refuted loses its certificate, QL107 reports it,
    and the report's ``witness`` line says what was measured."""
    from qlint.lint import run_checks

    analysis.witness = witness(analysis, budget)
    analysis.report.findings += run_checks(analysis, codes={"QL107"})
    analysis.report.extra["witness"] = analysis.witness.summary()
    return analysis.witness


__all__ = ["DEFAULT_BUDGET", "MARGIN", "MODEL", "Refutation", "Witnessed", "attach", "witness"]
