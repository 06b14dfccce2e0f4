"""QL202-QL206: where the norms and branch scales sit in the stack (source 001, Parts III-V)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional

from qlint.core.algebra import format_q
from qlint.growth.stream import StreamBlock
from qlint.growth.engine import Analysis, source_of
from qlint.core.graph import module_path
from qlint.growth.propagate import leading
from qlint.core.results import Finding
from qlint.lint.branch_scale import branch_scales
from qlint.lint.rule import Rule, checker
from qlint.lint.graph_queries import (common_path, is_normalizer, normalised_input, once_per_graph, stacks,
                                     uses_running_stats)

DEEP_STACK = 8  # residual blocks (branches) from which an unscaled stack is reported


# --- QL202, QL206 ------------------------------------------------------------------------------

ALPHA_TOLERANCE = 0.1  # |ln(found / expected)|: alpha is a number written in the code
BETA_TOLERANCE = math.log(1.25)  # beta is measured on random weights next to a base init that varies by layer


@dataclass(frozen=True)
class DeepNorm:
    """A Post-LN stack LN(alpha·x + f(x)) with alpha > 1 against DeepNet's constants (source 001, Part V).

    N is DeepNet's layer count for an encoder-only (or decoder-only) stack: each layer is
    two sublayers (attention and FFN), each a Post-LN block here, so 2N is the number of
    blocks; alpha = (2N)^(1/4) and the branches' init beta = (8N)^(-1/4). In an
    encoder-decoder (a stack whose blocks read another Post-LN stack's output) the decoder's M
    layers have three sublayers (self-attention, cross-attention, FFN): the encoder's alpha =
    0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16), the decoder's alpha = (3M)^(1/4), beta =
    (12M)^(-1/4). beta is read as the branches' scale next to the model's unscaled layers
    (:mod:`qlint.lint.branch_scale`).
    """

    sublayers: int  # the stack's Post-LN blocks
    alpha: float  # the skip coefficient (median over the stack)
    beta: Optional[float]  # the branches' relative scale (median); None when the weights cannot be read
    role: str = ""  # "encoder" or "decoder" of an encoder-decoder; "" for a stack on its own
    partner: int = 0  # the other stack's Post-LN blocks in an encoder-decoder

    @property
    def layers(self) -> float:
        return self.sublayers / (3 if self.role == "decoder" else 2)

    @property
    def _nm(self) -> float:
        """N^4 M for the encoder of an encoder-decoder."""
        return self.layers ** 4 * (self.partner / 3)

    @property
    def alpha_expected(self) -> float:
        if self.role == "encoder":
            return 0.81 * self._nm ** (1 / 16)
        return (3 * self.layers) ** 0.25 if self.role == "decoder" else self.sublayers ** 0.25

    @property
    def beta_expected(self) -> float:
        if self.role == "encoder":
            return 0.87 * self._nm ** (-1 / 16)
        return (12 * self.layers) ** -0.25 if self.role == "decoder" else (4 * self.sublayers) ** -0.25

    @property
    def correct(self) -> bool:
        """alpha, and beta where the weights can be read, within their tolerances in log scale."""
        alpha_ok = abs(math.log(self.alpha / self.alpha_expected)) <= ALPHA_TOLERANCE
        beta_ok = self.beta is None or (self.beta > 0
                                        and abs(math.log(self.beta / self.beta_expected)) <= BETA_TOLERANCE)
        return alpha_ok and beta_ok

    def describe(self) -> dict[str, str]:
        """The QL206 message's role, layer count and formulas."""
        if self.role == "encoder":
            return {"role": "encoder ", "layers": f"N = {self.layers:g} layers, decoder M = {self.partner / 3:g}",
                    "alpha_formula": "0.81 (N^4 M)^1/16", "beta_formula": "0.87 (N^4 M)^-1/16"}
        if self.role == "decoder":
            return {"role": "decoder ", "layers": f"M = {self.layers:g} layers of three sublayers",
                    "alpha_formula": "(3M)^1/4", "beta_formula": "(12M)^-1/4"}
        return {"role": "", "layers": f"N = {self.layers:g} layers", "alpha_formula": "(2N)^1/4",
                "beta_formula": "(8N)^-1/4"}


def _post(blocks: list[StreamBlock]) -> list[StreamBlock]:
    return [b for b in blocks if b.post == "post-norm"]


@once_per_graph
def deepnorm_stacks(analysis: Analysis) -> list[tuple[list[StreamBlock], DeepNorm]]:
    """Every Post-LN stack read as DeepNorm (its Post-LN blocks and its constants): two or more post-norm
    blocks, each with a constant skip coefficient alpha > 1. A learned alpha is plain Post-LN whatever its
    initial value: training moves it, and DeepNet's bound holds for the constant it derives."""
    post = [p for p in (_post(stack) for stack in stacks(analysis)) if len(p) >= 2]
    scales = {s.block: s.relative_std for s in branch_scales(analysis)}
    found = []
    for blocks in post:
        alphas = [b.skip.coefficient for b in blocks]
        if any(a is None or a <= 1 for a in alphas):
            continue
        decoder_of = next((other for other in post if other is not blocks and _reads(blocks, other, analysis)), None)
        encoder_of = next((other for other in post if other is not blocks and _reads(other, blocks, analysis)), None)
        role, partner = ("decoder", decoder_of) if decoder_of else ("encoder", encoder_of) if encoder_of else ("", None)
        betas = [scales.get(b.name) for b in blocks]
        beta = statistics.median(betas) if None not in betas else None
        found.append((blocks, DeepNorm(len(blocks), statistics.median(alphas), beta, role, len(partner or []))))
    return found


def _reads(reader: list[StreamBlock], source: list[StreamBlock], analysis: Analysis) -> bool:
    """Some block of ``reader`` reads ``source``'s output besides its own stream (cross-attention over
    an encoder's memory)."""
    last = source[-1].output
    return any(analysis.graph.depends_on(u, last) for b in reader for u in b.side)


def deepnorm(analysis: Analysis) -> Optional[DeepNorm]:
    """The first stack read as DeepNorm (None when there is none)."""
    found = deepnorm_stacks(analysis)
    return found[0][1] if found else None


@checker("QL202")
def post_ln_stack(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    """Once per stack (an encoder-decoder's encoder and decoder are two); a DeepNorm stack is QL206's."""
    deep = {id(blocks[0]) for blocks, _ in deepnorm_stacks(analysis)}
    for blocks in stacks(analysis):
        post = _post(blocks)
        if len(post) >= 2 and id(post[0]) not in deep:
            stack = _stack_name(post, analysis)
            yield rule.finding(stack, source_of(post[0].join), stack=stack, count=len(post))


@checker("QL206")
def deepnorm_constants(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for post, found in deepnorm_stacks(analysis):
        if found.correct:
            continue
        stack = _stack_name(post, analysis)
        beta = "unknown (weights not readable)" if found.beta is None else f"{found.beta:.2f}"
        yield rule.finding(stack, source_of(post[0].join), stack=stack, count=found.sublayers,
                           alpha=f"{found.alpha:.3g}", alpha_expected=f"{found.alpha_expected:.3g}",
                           beta=beta, beta_expected=f"{found.beta_expected:.2f}", **found.describe())


# --- QL203 ------------------------------------------------------------------------------------


def pre_norm(block: StreamBlock) -> bool:
    """The velocity starts with a normalization of the stream X_k that the skip does not pass through
    (a LN(X) + f(LN(X)) is Post-LN with its norm moved to the block's input)."""
    return block.norm_in is None and any(is_normalizer(node) and normalised_input(node) is block.stream
                                         for node in block.region)


@checker("QL203")
def missing_final_norm(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for stack in stacks(analysis):
        blocks = [b for b in stack if pre_norm(b)]
        if len(blocks) < 2:
            continue
        last = max(blocks, key=lambda b: analysis.graph.order[b.join])
        if _reaches_output_unnormalised(last.join, analysis):
            name = _stack_name(blocks, analysis)
            yield rule.finding(name, source_of(last.join), stack=name, count=len(blocks), last=last.name)


def _reaches_output_unnormalised(node, analysis: Analysis) -> bool:
    """A value path from ``node`` to an output that passes no normalizer (the graph's
    value edges: a dtype reference such as the ``x`` of ``norm(x).type_as(x)`` is none)."""
    graph = analysis.graph
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in graph.sinks:
            return True
        stack.extend(c for c in graph.children.get(current, ()) if not is_normalizer(c))
    return False


def _stack_name(blocks: list[StreamBlock], analysis: Analysis) -> str:
    return common_path([module_path(b.join) for b in blocks]) or type(analysis.model).__name__


# --- QL204 ------------------------------------------------------------------------------------


@checker("QL204")
def unscaled_deep_residual(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    """Once per deep stack. A DeepNorm stack is QL206's: its branches' init is checked against DeepNet's
    own beta for the stack's role, which in an encoder-decoder's encoder is above N^(-1/4) (0.87 (N^4
    M)^(-1/16)); a missing beta is reported there."""
    scales = {s.block: s for s in branch_scales(analysis)}
    deep = {id(b) for blocks, _ in deepnorm_stacks(analysis) for b in blocks}
    for blocks in stacks(analysis):
        if len(blocks) < DEEP_STACK or any(id(b) in deep for b in blocks):
            continue
        unscaled = [scales[b.name] for b in blocks if b.name in scales and scales[b.name].scaled is False]
        if not unscaled:
            continue
        first = unscaled[0]
        name = _stack_name(blocks, analysis)
        yield rule.finding(name, source_of(analysis.block(first.block).join), stack=name, unscaled=len(unscaled),
                           count=len(blocks), limit=f"{first.limit:.2f}", expected=f"{first.expected:.2f}",
                           first=first.block, scale=f"{first.relative_std:.2f}")


# --- QL205 ------------------------------------------------------------------------------------


@checker("QL205")
def batchnorm_eval(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    if analysis.report.mode != "eval":
        return
    for residual, block in zip(analysis.stream.blocks, analysis.report.blocks):
        if block.q is not None and block.q == 0:
            continue
        env = analysis.envs[residual.name]
        affine = [module_path(node) or str(node.target) for node in residual.region
                  if uses_running_stats(node) and _carries_signal(env.get(node))]
        if affine:
            yield rule.finding(block.name, block.source, name=block.name, norm=affine[0], q=format_q(block.q))


def _carries_signal(value) -> bool:
    growth = leading(value) if value is not None else None
    return growth is not None and growth.depends and (growth.q is None or growth.q > 0)
