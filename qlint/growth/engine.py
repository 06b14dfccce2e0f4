"""Analyse one traced graph: annotate, find the stream, propagate, certify.

:func:`analyse_graph` is the engine's whole data flow for one model. It takes the registry
as an argument (the engine never imports it) and returns an :class:`Analysis`: the
graph facts, the whole-graph pass, the stream and, per block and transition, the
propagated values and the result (q, status, derivation). Findings are not made
here; the lint rules read an Analysis and emit them.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx as fx

from qlint.core import algebra
from qlint.growth import canonical, relations
from qlint.growth.blocks import find_stream
from qlint.growth.dataflow import dataflow, escapes, stream_carrying
from qlint.growth.stream import Stream, StreamBlock, StreamTransition
from qlint.core.domain import CONSTANT, Growth, point
from qlint.core.graph import GraphFacts, annotate, facts, user_frames
from qlint.growth.propagate import GrowthProp, apply, joint, leading
from qlint.core.results import Block, DerivationStep, ModelReport, Source, Transition
from qlint.capture.trace import TracedGraph, trainable_attributes

ZERO = Growth(0.0, depends=False, range=point(0.0))


@dataclass
class Analysis:
    """Everything one model's analysis computed, for the lint rules, probes and remedies."""

    model: torch.nn.Module
    inputs: Optional[tuple]
    traced: TracedGraph
    registry: Any
    graph: GraphFacts
    prop: GrowthProp
    base: dict[fx.Node, Any]  # the whole-graph pass: every node relative to the model's inputs
    stream: Stream
    envs: dict[str, Any]  # per block / transition name: the values of its pass (over the whole-graph pass)
    report: ModelReport
    threshold: float = 1.0
    options: Any = None
    velocities: dict[str, Growth] = field(default_factory=dict)
    gaps: list["Gap"] = field(default_factory=list)
    witness: Any = None  # the eager witness's pass over the certified blocks (qlint.probe.block_witness), once run

    @property
    def module(self) -> fx.GraphModule:
        return self.traced.module

    @property
    def blocks(self) -> list[StreamBlock]:
        return self.stream.blocks

    def block(self, name: str) -> StreamBlock:
        for block in self.stream.blocks:
            if block.name == name:
                return block
        raise KeyError(name)


def analyse_graph(model: torch.nn.Module, inputs: Optional[tuple], traced: TracedGraph, registry: Any, *, spec: str,
                  threshold: float = 1.0, assume_real: bool = True) -> Analysis:
    """The engine's pass over one traced model (block-independent facts are computed once)."""
    module = traced.module
    annotate(module, registry, model)
    if canonical.simplify(module):  # all-ones masked averages read as the means they are
        annotate(module, registry, model)
    graph = GraphFacts(module, traced.data_inputs)
    graph.example = inputs
    relations.find(graph.nodes)
    prop = GrowthProp(module, graph, training=model.training, assume_real=assume_real,
                      trainable=trainable_attributes(module, model))
    base = prop.run_graph()
    stream = find_stream(graph, root_name=type(model).__name__)
    envs: dict[str, Any] = {}
    velocities: dict[str, Growth] = {}
    for block in stream.blocks:
        seeds = {block.stream: prop.seed(block.stream, base, stream=True)}
        seeds.update({u: prop.seed(u, base, stream=False) for u in block.side})
        envs[block.name] = collections.ChainMap(prop.propagate(seeds, block.region + block.post_region, base), base)
        velocities[block.name] = velocity_of(block, envs[block.name], prop)
    for transition in stream.transitions:
        envs[transition.name] = _transition_pass(transition, prop, base, graph)
    gaps = coverage_gaps(stream, graph, envs, threshold)
    gapped = {gap.part for gap in gaps}
    blocks = [_block_result(b, velocities[b.name], envs[b.name], graph, threshold, b.name in gapped)
              for b in stream.blocks]
    transitions = [_transition_result(i, t, envs[t.name], graph, threshold, t.name in gapped)
                   for i, t in enumerate(stream.transitions)]
    report = ModelReport(spec=spec, tracer=traced.tracer, mode="train" if model.training else "eval", blocks=blocks,
                         threshold=threshold, transitions=transitions, uncovered=[gap.reason for gap in gaps])
    report.extra["graph_check"] = traced.graph_check
    if traced.attempts:
        report.extra["trace_attempts"] = list(traced.attempts)
    if traced.replayed:
        report.extra["layers_replayed"] = len(traced.replayed)
    if traced.reuse_abandoned:
        report.extra["layer_reuse_abandoned"] = traced.reuse_abandoned
    if traced.specialised:
        report.extra["specialised"] = "the graph holds for the example's " + "; ".join(traced.specialised) + \
            ": the certificate is for those values"
    if (assume_real
        and any(n.op == "placeholder" and "val" not in n.meta and "tensor_meta" not in n.meta for n in graph.inputs)):
        report.extra["assumed"] = "input dtypes unknown (no example inputs): inputs taken as real"
    return Analysis(model, inputs, traced, registry, graph, prop, base, stream, envs, report, threshold,
                    velocities=velocities,
                    gaps=gaps)


def _transition_pass(transition: StreamTransition, prop: GrowthProp, base: dict, graph: GraphFacts) -> Any:
    """A transition's values from its sources. A head or a readout is applied once, to stream
    values: each is taken at its growth in the model's inputs when that is known and at most
    linear (a RevIN head multiplies a normalised output by the input's spread: q = 0 + 1), else as a
    free value (the blocks answer for it). A stem reading several model inputs is measured in each
    input with the others held fixed, as the model is scaled along one input (a value times an
    observed-values mask is linear in each): the worst input's pass is kept."""
    once = transition.before is None
    inputs = [s for s in transition.sources if s in graph.inputs]
    passes = [inputs] if len(inputs) <= 1 or len(inputs) != len(transition.sources) else [[i] for i in inputs]
    worst: Any = None
    for scaled in passes:
        seeds = {s: prop.seed(s, base, stream=True, composite=once) if s in scaled or s not in inputs
                 else Growth(0.0, depends=False, real=leading(base[s]).real) for s in transition.sources}
        seeds.update({u: prop.seed(u, base, stream=False) for u in transition.side})
        env = collections.ChainMap(prop.propagate(seeds, transition.region, base), base)
        q = joint(tuple(leading(env.get(n, CONSTANT)) for n in transition.exits)).q
        if worst is None or _rank(q) > worst[0]:
            worst = (_rank(q), env)
    return worst[1]


def velocity_of(block: StreamBlock, env: dict, prop: GrowthProp) -> Growth:
    """An additive block's velocity is its join with the skip replaced by 0 (the exact
    X + v(X)); any other join's velocity is F - id, with q <= max(1, q(F)). A Post-LN block
    LN(X + f(X)) is the stream map F = LN o (id + f), so its velocity is F - id as well: q(F) = 0
    when the norm bounds its input (Theorem 9(v)), so q = max(1, 0) = 1 whatever f is (the norm's
    output is what the next block reads); a norm that does not bound (BatchNorm on running
    statistics) passes q(f) through. Only a known polynomial f is normalised: a super-polynomial f
    overflows before the norm (QL103, f's own result), an unknown one stays unknown."""
    if block.post_region:
        normalised = joint(env[block.output])
        if normalised.known:
            return Growth(algebra.residual(normalised.q), culprit=normalised.culprit)
        own = _join_velocity(block, env, prop)
        return own if own.q is not None and math.isinf(own.q) else normalised
    return _join_velocity(block, env, prop)


def _join_velocity(block: StreamBlock, env: dict, prop: GrowthProp) -> Growth:
    join = leading(env[block.join])
    if block.form != "additive":
        q = algebra.residual(join.q)
        return Growth(q, culprit=join.culprit)
    if block.skip.path and block.skip.path[0][1] == "tensors":  # cat([X_k, g]): X_k's slot zeroed
        parts = facts(block.join).bound.arguments["tensors"]
        zeroed = [ZERO if part is block.skip.node else env[part] if isinstance(part, fx.Node) else part
                  for part in parts]
        return joint(apply(block.join, facts(block.join), env, prop.training, overrides={"tensors": zeroed}))
    value: Any = ZERO
    for node, argument in reversed(block.skip.path):
        value = apply(node, facts(node), env, prop.training, overrides={argument: value})
    return joint(value)


@dataclass(frozen=True)
class Gap:
    """A part of the stream the analysis does not cover (QL106): what, where, and why."""

    part: Optional[str]  # the block or transition it concerns (None: the whole model)
    kind: str  # "block", "transition" or "model"
    node: Optional[fx.Node]
    reason: str


def coverage_gaps(stream: Stream, graph: GraphFacts, envs: dict[str, Any], threshold: float) -> list[Gap]:
    """The accounting behind "certified": every node on the stream (a path from an input to an
    output through a block input, or computed from the input the stream starts from) is computed
    by a block or a transition from that unit's own inputs, and every value that leaves a unit
    other than through its output is known to grow at most linearly in the unit's input.
    Anything else is a gap.

    The first clause is checked on the dataflow graph itself (networkx), not by asking the block
    detector, so a stretch the detector and the chain both miss is reported by name. An older
    value of the stream that a unit reads (a dense skip, FPN fusion, a key shared from an earlier
    layer) is not a gap: it is a component of the augmented state Z_k = (X_k, X_j, ...), seeded
    as a free variable like X_k, so the unit's q is its exponent in the joint state; the other
    components move by the identity (they are copied along), q = 1 (Theorem 9(ii), (iv)).
    """
    gaps: list[Gap] = []
    if not stream.blocks:
        return [Gap(None, "model", None,
                    "no residual block was found: nothing on the path from input to output is certified")]
    parts: list[tuple[str, Any, set]] = [("block", b, {b.join}) for b in stream.blocks]
    parts += [("transition", t, set(t.exits)) for t in stream.transitions]
    covered = set(graph.inputs)
    for kind, part, _ in parts:
        covered.update(part.region)
        if kind == "transition":
            covered.update(part.sources)
    dag = dataflow(graph)
    for node in sorted(stream_carrying(dag, {b.stream for b in stream.blocks}) - covered, key=graph.order.__getitem__):
        gaps.append(Gap(None, "model", node,
                        f"`{node.name}`{_at(node)} is on the stream, and no block or transition computes it"))
    for kind, part, outputs in parts:
        for value in escapes(part.region, outputs, graph):
            growth = joint(envs[part.name].get(value, CONSTANT))
            if growth.depends and not algebra.is_certified(growth.q, threshold):
                gaps.append(Gap(part.name, kind, value,
                                f"`{value.name}`{_at(value)} leaves {kind} `{part.name}` besides its output "
                                f"and grows with q = {algebra.format_q(growth.q)} in its input: an update the analysis "
                                "does not cover"))
    return gaps


def _at(node: fx.Node) -> str:
    source = source_of(node)
    return f" ({source})" if source else ""


# --- results -------------------------------------------------------------------------------------


def _status(q: Optional[float], threshold: float, uncovered: bool) -> str:
    if q is None or uncovered:
        return "uncertified"
    if q > threshold:
        return "supercritical"
    return "ok"


def _block_result(block: StreamBlock, velocity: Growth, env: dict, graph: GraphFacts, threshold: float,
                  gapped: bool) -> Block:
    start = _velocity_output(block, env)
    derivation = derive(start, block.stream, env, graph, velocity.q if block.form == "additive" else None,
                        older=set(block.older))
    if derivation:
        derivation[0].source = source_of(block.join)
    form = block.post or block.form
    extra: dict[str, Any] = {"join": block.form}
    if velocity.culprit and not velocity.known:
        extra["culprit"] = velocity.culprit
    if block.side:
        extra["reads"] = [u.name for u in block.side]
    if block.older:
        extra["augmented_state"] = [u.name for u in block.older]  # older stream values: q is in the joint state
    q = velocity.q
    result = Block(
        name=block.name,
        index=block.index,
        q=q,
        status=_status(q, threshold, gapped),
        derivation=derivation,
        dominant=_dominant(derivation, velocity),
        source=source_of(block.join),
        form=form,  # type: ignore[arg-type]
        unknown_ops=sorted({facts(n).label for n in block.region if _unknown_here(n, env)}),
        extra=extra,
    )
    if result.status != "ok":  # what the HTML report draws (qlint.ci.html); certified blocks need no picture
        extra["derivation_graph"] = derivation_graph(block, env, graph, threshold, dominant_step(result))
    return result


def _transition_result(index: int, transition: StreamTransition, env: dict, graph: GraphFacts, threshold: float,
                       gapped: bool) -> Transition:
    value = joint(tuple(leading(env.get(node, CONSTANT)) for node in transition.exits))
    sources = transition.sources
    start = max(transition.exits, key=lambda node: _rank(joint(env.get(node, CONSTANT)).q))
    derivation = derive(start, sources[0], env, graph, None, sources=set(sources))
    extra: dict[str, Any] = {"kind": transition.kind, "from": [b.name for b in transition.after] or ["input"],
                             "to": transition.before.name if transition.before else "output"}
    if value.culprit and not value.known:
        extra["culprit"] = value.culprit
    if transition.older:
        extra["augmented_state"] = [u.name for u in transition.older]
    return Transition(
        name=transition.name,
        index=index,
        q=value.q,
        status=_status(value.q, threshold, gapped),
        derivation=derivation,
        dominant=_dominant(derivation, value),
        source=source_of(transition.target),
        unknown_ops=sorted({facts(n).label for n in transition.region if _unknown_here(n, env)}),
        extra=extra,
    )


def _unknown_here(node: fx.Node, env: dict) -> bool:
    """The node made the value unknown itself (its inputs were known)."""
    if node not in env or joint(env[node]).q is not None:
        return False
    return all(joint(env[p]).q is not None for p in node.all_input_nodes if p in env)


def _velocity_output(block: StreamBlock, env: dict) -> fx.Node:
    """The velocity term whose growth decides the block (for the derivation); a Post-LN block's norm."""
    if block.post_region or block.form != "additive" or not block.terms:
        return block.output
    return max(block.terms, key=lambda t: _rank(joint(env.get(t.node, CONSTANT)).q)).node


def _rank(q: Optional[float]) -> float:
    return math.inf if q is None else q


def dominant_parent(node: fx.Node, env: dict, graph: GraphFacts) -> Optional[fx.Node]:
    """The input with the largest exponent: the one a derivation follows back."""
    best, best_q = None, -1.0
    for parent in graph.parents.get(node, ()):
        if parent not in env:
            continue
        growth = joint(env[parent])
        if growth.depends and _rank(growth.q) > best_q:
            best, best_q = parent, _rank(growth.q)
    return best


def derive(start: fx.Node, stream: fx.Node, env: dict, graph: GraphFacts, final_q: Optional[float],
           sources: Optional[set] = None, older: Optional[set] = None) -> list[DerivationStep]:
    """Follow the dominant inputs back from ``start`` to the block input (or an older stream value
    it reads, a component of the augmented state); keep that start, every node where q changed (and
    the primitive it rose from), and the output."""
    older = older or set()
    ends = (sources or {stream}) | older
    chain: list[fx.Node] = []
    node: Optional[fx.Node] = start
    while node is not None and node not in chain:
        chain.append(node)
        if node in ends:
            break
        node = dominant_parent(node, env, graph)
    chain.reverse()
    if not chain or chain[0] not in ends:
        chain.insert(0, stream)
    qs = [joint(env[n]).q if n in env else None for n in chain]
    keep: list[int] = []
    for i in range(len(chain)):
        if i == 0 or i == len(chain) - 1 or qs[i] != qs[i - 1]:
            if i > 1 and qs[i] != qs[i - 1]:
                j = i - 1
                while j > 1 and facts(chain[j]).plumbing:
                    j -= 1
                keep.append(j)
            keep.append(i)
    steps = []
    for i in sorted(set(keep)):
        n = chain[i]
        if i == 0:
            if n in older:
                steps.append(DerivationStep(node=n.name, primitive="older stream value X_j", q=1.0, source=source_of(n),
                                            why="a component of the augmented state (X_k, X_j): a free variable like "
                                                "X_k"))
            else:
                steps.append(DerivationStep(node=n.name, primitive="block input X_k", q=1.0, source=source_of(n),
                                            why="the residual stream entering the block"))
            continue
        steps.append(DerivationStep(node=n.name, primitive=primitive_name(n), q=qs[i], source=source_of(n),
                                    why=_why(n, env, graph)))
    return steps


def derivation_graph(block: StreamBlock, env: dict, graph: GraphFacts, threshold: float,
                     dominant: Optional[DerivationStep]) -> dict[str, Any]:
    """The block's data flow from X_k, small enough to draw and to keep in the JSON report.

    The chain of :func:`derive` shows one path; this shows every op that depends on X_k, one node
    per (op, exponent, source line): an unrolled loop's copies are one node with their ``count``, and
    plumbing (views, getitem) is contracted into the edges. Edges run in graph order only (a loop's
    way back would close a cycle), so the record is a DAG; an edge is listed once per operand it feeds.
    ``dominant``: the index of the node where q reached the block's value.
    """
    inputs = {block.stream: "block input X_k", **{node: "older stream value X_j" for node in block.older}}
    keys: dict[fx.Node, tuple] = {node: (label, "1", source_of(block.join if node is block.stream else node))
                                  for node, label in inputs.items()}
    inside = {*block.region, *block.post_region}
    for node in inside:
        info = facts(node)
        if node in env and joint(env[node]).depends and not info.plumbing and not info.meta_output:
            keys[node] = (primitive_name(node), algebra.format_q(joint(env[node]).q), source_of(node))
    index: dict[tuple, int] = {}
    nodes: list[dict[str, Any]] = []
    for node in sorted(keys, key=graph.order.__getitem__):
        key = keys[node]
        if key not in index:
            index[key] = len(nodes)
            q = 1.0 if node in inputs else joint(env[node]).q
            nodes.append({"op": key[0], "q": key[1], "status": _status(q, threshold, False),
                          "source": key[2].to_dict() if key[2] else None, "count": 0})
        nodes[index[key]]["count"] += 1
    feeding: dict[fx.Node, set[fx.Node]] = {}

    def kept_parents(node: fx.Node) -> set[fx.Node]:
        """The kept nodes whose values reach ``node`` through contracted plumbing only."""
        if node not in feeding:
            feeding[node] = set()
            for parent in graph.parents.get(node, ()):
                if parent in keys:
                    feeding[node].add(parent)
                elif parent in inside:
                    feeding[node] |= kept_parents(parent)
        return feeding[node]

    def operand_counts(node: fx.Node) -> collections.Counter:
        """How many of ``node``'s operands each kept node feeds: x * x takes x twice, and is drawn with two
        edges (a Hadamard product adds its operands' exponents, so both must be seen)."""
        occurrences: list[fx.Node] = []
        fx.node.map_arg((node.args, node.kwargs), occurrences.append)
        values, counts = set(graph.parents.get(node, ())), collections.Counter(kept_parents(node))
        fed = collections.Counter()
        for operand in occurrences:
            if operand in values:
                fed.update([operand] if operand in keys else kept_parents(operand) if operand in inside else [])
        return counts | fed

    multiplicity: dict[tuple[int, int], int] = {}
    for node in keys:
        if node not in inputs:
            drawn = collections.Counter()  # per drawn parent: two ops on one line are one node, a(x) * b(x) too
            for parent, count in operand_counts(node).items():
                drawn[index[keys[parent]]] += count
            for parent_index, count in drawn.items():
                edge = (parent_index, index[keys[node]])
                if edge[0] < edge[1]:  # an unrolled loop's copies are one node: their edges are one edge
                    multiplicity[edge] = max(multiplicity.get(edge, 0), count)
    edges = [edge for edge in sorted(multiplicity) for _ in range(multiplicity[edge])]
    dominant_index = next((index[key] for node, key in keys.items() if dominant and node.name == dominant.node), None)
    return {"nodes": nodes, "edges": [list(edge) for edge in edges], "dominant": dominant_index}


def primitive_name(node: fx.Node) -> str:
    info = facts(node)
    if isinstance(info.relation, relations.Normalisation):
        return info.relation.description
    if info.declared is not None:
        return info.declared.name or info.declared_class or info.label
    if info.primitive is not None:
        return info.primitive.name
    return info.label


def _why(node: fx.Node, env: dict, graph: GraphFacts) -> str:
    inputs = [joint(env[p]) for p in graph.parents.get(node, ()) if p in env and joint(env[p]).depends]
    if not inputs:
        return "independent of X_k"
    return "from q = " + ", ".join(algebra.format_q(g.q) for g in inputs)


def _dominant(derivation: list[DerivationStep], growth: Growth) -> str:
    if growth.culprit and not growth.known:
        return growth.culprit
    for step in derivation[1:]:
        if step.q == growth.q:
            return step.primitive
    return derivation[-1].primitive if derivation else ""


def dominant_step(block: Block) -> Optional[DerivationStep]:
    """The step at which the block's exponent reached its final value (Section 4.2 step 3)."""
    for step in block.derivation[1:]:
        if step.q == block.q:
            return step
    return block.derivation[-1] if block.derivation else None


def source_of(node: fx.Node) -> Optional[Source]:
    """The innermost frame of the user's code that created this node, in a real file: a
    ``<string>`` (``python -c``, a worker's bootstrap), ``<stdin>`` or generated-code frame
    names no line anyone can open, so it is skipped (None when no other frame is left)."""
    frames = [frame for frame in user_frames(node) if not frame[0].startswith("<")]
    if not frames:
        return None
    file, line, _ = frames[-1]
    return Source(relative(file), line)


def relative(path: str) -> str:
    import os

    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


__all__ = ["Analysis", "analyse_graph", "derivation_graph", "derive", "dominant_step", "primitive_name", "source_of",
           "velocity_of"]
