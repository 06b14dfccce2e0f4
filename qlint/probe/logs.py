"""The cheap logs of sources 001 and 003, measured at init and reported as findings (QL401-QL405).

001 (Part XII) closes on "the cheap logs are the whole game": every failure it describes
shows in a trace that costs one forward pass, long before the loss. The probe records
that pass (float64, the example inputs) and reads off, with a threshold each:

* per softmax over attention scores, the largest |logit| (QL401) and the mean row
  entropy relative to log(keys) (QL402): logit growth and entropy collapse (001 Part VI);
* per LayerNorm / RMSNorm, the smallest per-token spread of its input relative to the
  input's RMS (QL403): the normalizer's Jacobian is gamma / s(x), so one imploded token
  spikes the gain (003 Sections 4 and 6);
* per looped recurrence, the largest channel of its carry Ā (QL404): a single slow
  channel pins the worst-axis margin (003 Section 5.4, Table 5);
* the residual stream's RMS after each block over its RMS after the first, against
  sqrt(L) (QL405, 001 Part III), from the stack diagnostics of :mod:`qlint.probe.init`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch
import torch.fx as fx

from qlint.growth.engine import Analysis, source_of
from qlint.core.graph import facts, module_path
from qlint.core.ops import op_name
from qlint.growth.annotated import strip
from qlint.growth.relations import Normalisation
from qlint.core.results import Finding, Source
from qlint.lint.attention import softmax_attentions  # QL201's search: both rules see the same attentions
from qlint.lint.graph_queries import argument, is_normalizer, normalised_input, op
from qlint.lint.looped import carry_value, find_loops
from qlint.lint.rule import rule
from qlint.probe.init import StackLayer, rms
from qlint.probe.measure import ModelProbe, significant
from qlint.velocity.field import Trajectory

CODES = ("QL401", "QL402", "QL403", "QL404", "QL405")

# QL401. A logit gap of ln(1e3 (n - 1)) leaves 1 - max p < 1e-3, where 001 Part VI says the
# softmax gradient dies: 15 for 4096 keys, 28 for 10^9. A logit of 30 saturates the softmax over
# any realistic context; it is Gemma 2's cap on output logits (50 on attention logits, 001 Part VI).
# A 1/sqrt(d_head)-scaled init gives logits of order 1, so 30 at init is a scale bug, not noise.
MAX_LOGIT = 30.0
# QL402. A row's effective number of keys is exp(H); at H = 0.1 log n that is n^0.1 (1.3 of 16
# keys, 2 of 1024): the head attends to one or two keys before any training. 001 Part VI's head
# "attending to essentially one key" sits at 0.05 / 2.77 = 0.02.
ENTROPY_FLOOR = 0.1
# QL403. The normalizer's gain on a token is gamma / s(x) (003 Section 4): a token whose spread
# is a hundredth of the stream's RMS gets a hundred times the typical gain, far past the Lipschitz
# excess 003 Section 6 shows a healthy margin absorbs. Not 0.1: timm's ViT class token (std 1e-6
# plus a std-0.02 position embedding) sits at 0.033 at init, the same for every input, and DeiT
# trains from it; an imploded token (std 1e-6 alone) is at 1e-6.
SPREAD_FLOOR = 0.01
# QL404. 003 Table 5: one channel at 0.99 pins the worst-axis margin to ~0.01 whatever the other
# channels (0.011 with 31 at 0.5, mean 0.515); "monitor max(Ā), not the mean" (Section 5.4).
CARRY_CEILING = 0.99
# QL405. Branches adding a fixed variance v each grow the stream as sqrt(1 + L v / sigma_0^2)
# (001 Part III). 2 sqrt(L) admits branches adding up to ~4x the initial variance each; a stream
# that outgrows it has geometric growth (branches that scale with the stream: no normalization
# in front of them), which crosses c sqrt(L) at a finite depth for every c.
STREAM_GROWTH = 2.0
# A logit at or below this is a mask, not a score (additive masks use -1e4, -1e9, finfo.min or
# -inf; e^-1e4 is 0 in every float format): such keys are not keys of the row.
MASKED = -1e4
# So is a logit more than this below its row's maximum: its weight is under e^-50 = 2e-22 of the
# top key's, absent from the row as a masked key is (timm's Swin masks its shifted windows with
# -100 added to logits of order 0.1; a real logit gap that large is QL401's top logit anyway).
MASK_GAP = 50.0

_CENTRED = frozenset({"layer_norm", "native_layer_norm"})  # divide by the per-token std
_UNCENTRED = frozenset({"rms_norm", "_fused_rms_norm"})  # divide by the per-token RMS


@dataclass
class AttentionLog:
    """One attention's softmax on the trajectory: its largest logit and how spread its rows are."""

    name: str  # the module path, with #k when the module runs more than once
    path: str
    max_logit: float  # max |logit| over the keys a row can attend to
    entropy: Optional[float]  # mean over rows of H(row) / log(keys), rows of two keys or more
    keys: int  # the most keys a row attends to
    source: Optional[Source] = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_logit": significant(self.max_logit),
                "normalised_entropy": significant(self.entropy), "keys": self.keys}


@dataclass
class SpreadLog:
    """The input of one per-token normalization: its smallest per-token spread and its RMS."""

    name: str
    path: str
    statistic: str  # "std" (LayerNorm) or "rms" (RMSNorm): what the normalizer divides by
    min_spread: float
    token: tuple[int, ...]  # where the smallest spread is
    rms: float
    source: Optional[Source] = None

    @property
    def ratio(self) -> float:
        return self.min_spread / self.rms if self.rms else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "statistic": self.statistic, "min_spread": significant(self.min_spread),
                "token": list(self.token), "rms": significant(self.rms), "ratio": significant(self.ratio)}


@dataclass
class CarryLog:
    """A looped recurrence's carry Ā on the trajectory: its largest and mean channel."""

    path: str
    max: float
    mean: float
    channels: int
    source: Optional[Source] = None

    def to_dict(self) -> dict[str, Any]:
        return {"loop": self.path, "max": significant(self.max), "mean": significant(self.mean),
                "channels": self.channels}


@dataclass
class StreamGrowth:
    """The stream's RMS after each block over its RMS after the first (unit-variance input).

    Measured from the first block's output, not its input: an additive stream has
    sigma_k^2 = sigma_0^2 + k v, so sigma_k / sigma_1 <= sqrt(k) whatever v / sigma_0^2 (a
    small embedding, std 0.02, makes sigma_k / sigma_0 large without any geometric growth).
    """

    blocks: list[str]
    ratios: list[float]
    sources: list[Optional[Source]]  # each block's join

    @staticmethod
    def threshold(depth: int) -> float:
        return STREAM_GROWTH * math.sqrt(depth)

    @property
    def final(self) -> float:
        return self.ratios[-1]

    @property
    def crossing(self) -> Optional[int]:
        """The first block k (0-based) after which the ratio exceeds 2 sqrt(k + 1)."""
        return next((k for k, ratio in enumerate(self.ratios) if ratio > self.threshold(k + 1)), None)

    def to_dict(self) -> dict[str, Any]:
        crossing = self.crossing
        return {"blocks": len(self.blocks),
                "ratios": {name: significant(r) for name, r in zip(self.blocks, self.ratios)},
                "final": significant(self.final), "threshold": significant(self.threshold(len(self.blocks))),
                "crossing": None if crossing is None else self.blocks[crossing]}


@dataclass
class InitLogs:
    attentions: list[AttentionLog] = field(default_factory=list)
    spreads: list[SpreadLog] = field(default_factory=list)
    carries: list[CarryLog] = field(default_factory=list)
    stream: Optional[StreamGrowth] = None
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attention": [log.to_dict() for log in self.attentions],
            "token_spread": [log.to_dict() for log in self.spreads],
            "carry": [log.to_dict() for log in self.carries],
            "stream_growth": None if self.stream is None else self.stream.to_dict(),
            "thresholds": {"max_logit": MAX_LOGIT, "entropy": ENTROPY_FLOOR, "token_spread": SPREAD_FLOOR,
                           "carry": CARRY_CEILING, "stream_growth": STREAM_GROWTH},
        }



# --- attention -------------------------------------------------------------------------


def attention_stats(logits: torch.Tensor, probs: torch.Tensor) -> tuple[float, Optional[float], int]:
    """(max |logit|, mean H(row) / log(keys), keys) of attention weights with the key axis last.

    A key whose logit is masked (at or below ``MASKED``, or ``MASK_GAP`` below the row's top)
    is not one of the row's keys;
    rows with fewer than two keys have no entropy to lose and are left out.
    """
    logits, probs = logits.detach().double(), probs.detach().double()
    live = (logits > MASKED) & (logits > logits.amax(-1, keepdim=True) - MASK_GAP)
    keys = live.sum(-1)
    max_logit = float(logits[live].abs().max()) if bool(live.any()) else 0.0
    entropy = -torch.xlogy(probs, probs).sum(-1)
    rows = keys >= 2
    normalised = float((entropy[rows] / keys[rows].double().log()).mean()) if bool(rows.any()) else None
    return max_logit, normalised, int(keys.max()) if keys.numel() else 0


def _sdpa_weights(node: fx.Node, values: dict) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The logits and weights F.scaled_dot_product_attention computes inside, by its documented
    reference formula (dropout aside: the weights it drops from)."""
    def value(name: str, default: Any = None) -> Any:
        found = argument(node, name, default)
        return values.get(found) if isinstance(found, fx.Node) else found

    query, key, mask, scale = value("query"), value("key"), value("attn_mask"), value("scale")
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor):
        return None
    if value("enable_gqa", False):
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
    logits = query @ key.transpose(-2, -1) * (1 / math.sqrt(query.size(-1)) if scale is None else scale)
    if value("is_causal", False):
        causal = torch.ones(logits.shape[-2:], dtype=torch.bool, device=logits.device).tril()
        logits = logits.masked_fill(~causal, -math.inf)
    if isinstance(mask, torch.Tensor):
        logits = logits.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else logits + mask
    return logits, logits.softmax(-1)


def _softmax_weights(node: fx.Node, values: dict) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """A softmax's input and output on the trajectory, the softmax axis moved last."""
    logits, probs = values.get(argument(node, "input")), values.get(node)
    if (not isinstance(logits, torch.Tensor) or not isinstance(probs, torch.Tensor)
            or logits.shape != probs.shape or logits.dim() == 0):
        return None
    if op_name(node) == "softmin":  # softmin(x) = softmax(-x): its logits are -x
        logits = -logits
    dim = argument(node, "dim")
    dim = -1 if dim is None else dim
    return logits.movedim(dim, -1), probs.movedim(dim, -1)


def attention_logs(analysis: Analysis, trajectory: Trajectory) -> list[AttentionLog]:
    """Every softmax over attention scores: a softmax whose logits reach a Q·K product (QL201's
    search), and F.scaled_dot_product_attention; an attention kept opaque (nn.MultiheadAttention as
    one module) holds its weights inside and is not measured."""
    root = type(analysis.model).__name__
    found: list[tuple[fx.Node, tuple[torch.Tensor, torch.Tensor]]] = []
    for node in analysis.graph.nodes:
        kind = op(node)
        if kind == "softmax" and any(softmax_attentions(node, analysis.graph.data, root)):
            weights = _softmax_weights(node, trajectory.values)
        elif kind == "attention":
            weights = _sdpa_weights(node, trajectory.values)
        else:
            continue
        if weights is not None:
            found.append((node, weights))
    names = _names([module_path(node) or root for node, _ in found])
    return [
        AttentionLog(name, module_path(node) or root, *attention_stats(*weights), source=source_of(node))
        for name, (node, weights) in zip(names, found)
    ]


# --- per-token spread at each normalization ---------------------------------------------


def _spread_input(node: fx.Node, values: dict) -> Optional[tuple[str, torch.Tensor, torch.Tensor, int]]:
    """(statistic, the tensor the normalizer reads, the tensor whose per-token RMS it divides by,
    how many trailing axes a token spans) for LayerNorm and RMSNorm, built in or written out."""
    kind = op(node)
    if kind in _CENTRED or kind in _UNCENTRED:
        x = values.get(argument(node, "input"))
        if not isinstance(x, torch.Tensor):
            return None
        shape = argument(node, "normalized_shape")
        axes = tuple(range(-len(shape), 0)) if isinstance(shape, (tuple, list)) else (-1,)
        if kind in _UNCENTRED:
            return "rms", x, x, len(axes)
        return "std", x, x - x.mean(dim=axes, keepdim=True), len(axes)
    relation = facts(node).relation
    if not isinstance(relation, Normalisation):
        return None
    # written out, x * rsqrt(mean(x^2) + eps) or (x - mean) / std: the numerator is x or x - mean,
    # and the factor's shape tells whether the statistic is per token over the last axis
    raw = normalised_input(node)
    operands = [argument(node, "input"), argument(node, "other")]
    divisor = operands[1] if op(node) == "div" else next(
        (a for a in operands if isinstance(a, fx.Node) and strip(a) is not relation.numerator), None)
    x, numerator, factor = values.get(raw), values.get(relation.numerator), values.get(divisor)
    if not (isinstance(x, torch.Tensor) and isinstance(numerator, torch.Tensor) and isinstance(factor, torch.Tensor)):
        return None
    if numerator.dim() == 0 or numerator.shape[-1] < 2 or factor.shape != (*numerator.shape[:-1], 1):
        return None
    return ("rms" if raw is relation.numerator else "std"), x, numerator, 1


def spread_logs(analysis: Analysis, trajectory: Trajectory) -> list[SpreadLog]:
    """The smallest per-token spread at the input of every LayerNorm and RMSNorm (003 Section 6:
    the binding quantity is min over tokens of s(h), not the global norm)."""
    root = type(analysis.model).__name__
    found: list[tuple[fx.Node, str, float, tuple[int, ...], float]] = []
    for node in analysis.graph.nodes:
        if not is_normalizer(node):
            continue
        measured = _spread_input(node, trajectory.values)
        if measured is None:
            continue
        statistic, x, divided, axes = measured
        per_token = divided.detach().double().pow(2).mean(dim=tuple(range(-axes, 0))).sqrt()
        if per_token.numel() == 0:
            continue
        index = int(per_token.argmin())
        token = tuple(int(i) for i in torch.unravel_index(torch.tensor(index), per_token.shape))
        found.append((node, statistic, float(per_token.min()), token, rms(x)))
    names = _names([module_path(node) or root for node, *_ in found])
    return [SpreadLog(name, module_path(node) or root, statistic, spread, token, scale, source_of(node))
            for name, (node, statistic, spread, token, scale) in zip(names, found)]


# --- the carry of a looped recurrence ---------------------------------------------------


def carry_logs(analysis: Analysis, trajectory: Trajectory) -> list[CarryLog]:
    """max and mean |Ā| over the channels of each looped recurrence's carry (a unit carry is QL303's)."""
    logs = []
    for loop in find_loops(analysis):
        carry = loop.step.carry
        if carry is None:
            continue
        value = carry_value(carry, trajectory.values.get)
        if value is None or value.numel() == 0:
            continue
        magnitude = value.detach().double().abs()
        logs.append(CarryLog(loop.path, float(magnitude.max()), float(magnitude.mean()), magnitude.numel(),
                             source_of(loop.step.root)))
    return logs


# --- the residual stream ------------------------------------------------------------------


def stream_growth(
    stack: list[StackLayer], joins: Optional[dict[str, Optional[Source]]] = None
) -> Optional[StreamGrowth]:
    """Each block's output RMS over the first block's output RMS, from the init diagnostics;
    ``joins``: the source line of each block's residual sum, by block name."""
    if not stack or not stack[0].rms_out:
        return None
    return StreamGrowth([layer.name for layer in stack], [layer.rms_out / stack[0].rms_out for layer in stack],
                        [(joins or {}).get(layer.name) for layer in stack])


# --- findings -------------------------------------------------------------------------------


def _names(paths: list[str]) -> list[str]:
    """A path that occurs more than once (a looped or reused module) gets #1, #2, ..."""
    counts: dict[str, int] = {}
    for path in paths:
        counts[path] = counts.get(path, 0) + 1
    seen: dict[str, int] = {}
    names = []
    for path in paths:
        seen[path] = seen.get(path, 0) + 1
        names.append(f"{path}#{seen[path]}" if counts[path] > 1 else path)
    return names


def _worst(logs: Iterable[Any], key: Callable[[Any], float], crosses: Callable[[Any], bool]) -> list[tuple[Any, int]]:
    """Per module path, the log that crosses its threshold worst, and the path's number of calls."""
    by_path: dict[str, list[Any]] = {}
    for log in logs:
        by_path.setdefault(log.path, []).append(log)
    worst = [(min(group, key=key), len(group)) for group in by_path.values()]
    return [(log, calls) for log, calls in worst if crosses(log)]


def _calls(calls: int) -> str:
    return f" (the worst of its {calls} calls)" if calls > 1 else ""


def findings(logs: InitLogs) -> list[Finding]:
    """One finding per attention, normalization and loop past its threshold, and one for the stream."""
    found = []
    for log, calls in _worst(logs.attentions, lambda log: -log.max_logit, lambda log: log.max_logit > MAX_LOGIT):
        found.append(rule("QL401").finding(log.path, log.source, path=log.path, value=log.max_logit,
                                           threshold=MAX_LOGIT, calls=_calls(calls)))
    entropies = [log for log in logs.attentions if log.entropy is not None]
    for log, calls in _worst(entropies, lambda log: log.entropy, lambda log: log.entropy < ENTROPY_FLOOR):
        found.append(rule("QL402").finding(log.path, log.source, path=log.path, value=log.entropy,
                                           threshold=ENTROPY_FLOOR, keys=log.keys, calls=_calls(calls)))
    for log, calls in _worst(logs.spreads, lambda log: log.ratio, lambda log: log.ratio < SPREAD_FLOOR):
        found.append(rule("QL403").finding(log.path, log.source, path=log.path, statistic=log.statistic,
                                           spread=log.min_spread, token=log.token, rms=log.rms, ratio=log.ratio,
                                           gain=1 / log.ratio if log.ratio else math.inf,
                                           threshold=SPREAD_FLOOR, calls=_calls(calls)))
    for log in logs.carries:
        if log.max >= CARRY_CEILING:
            found.append(rule("QL404").finding(log.path, log.source, loop=log.path, max=log.max, mean=log.mean,
                                               channels=log.channels, threshold=CARRY_CEILING))
    stream = logs.stream
    if stream is not None and stream.final > stream.threshold(len(stream.blocks)):
        k = stream.crossing
        assert k is not None  # the last block crosses if no earlier one does
        found.append(rule("QL405").finding(stream.blocks[k], stream.sources[k], ratio=stream.final,
                                           depth=len(stream.blocks), threshold=stream.threshold(len(stream.blocks)),
                                           where=stream.blocks[k], k=k + 1, at=stream.ratios[k],
                                           bound=stream.threshold(k + 1)))
    return found


def measure(analysis: Analysis, trajectory: Trajectory, stack: list[StackLayer]) -> InitLogs:
    """Every log on one recorded forward pass, and the findings past the thresholds."""
    joins = {block.name: source_of(block.join) for block in analysis.stream.blocks}
    logs = InitLogs(attention_logs(analysis, trajectory), spread_logs(analysis, trajectory),
                    carry_logs(analysis, trajectory), stream_growth(stack, joins))
    logs.findings = findings(logs)
    return logs


def attach(result: ModelProbe) -> InitLogs:
    """Measure the logs on the probe's own float64 forward pass and add them to its report:
    the findings to its findings, the figures under ``init_logs`` in its JSON."""
    logs = measure(result.analysis, result.trajectory, result.init.stack)
    result.report.findings.extend(logs.findings)
    result.report.extra["init_logs"] = logs.to_dict()
    return logs
