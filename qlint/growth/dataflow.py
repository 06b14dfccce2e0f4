"""The value dataflow of a traced graph, read by the block detector and the coverage proof.

What a value holds by identity: the value a skip term carries (:func:`carried`: copies, casts,
identity reshapes) and the earliest value whose entries a value still holds in whole or in part
(:func:`identity_source`: slices, gathers, the data a write writes into), which finds the updates
outside the blocks found by form, whatever their spelling. The dataflow graph itself
(:func:`dataflow`, networkx): which nodes carry the stream (:func:`stream_carrying`), the stretches
of it that no block and no transition between blocks covers (:func:`uncovered_stretches`: the stem,
a head, a readout), and the values that leave a unit other than through its outputs
(:func:`escapes`). Coverage is decided here without asking the block detector.
"""

from __future__ import annotations

from typing import Optional

import networkx as nx
import torch.fx as fx

from qlint.core.graph import GraphFacts, facts, shape_of
from qlint.core.ops import op_name
from qlint.growth.annotated import strip
from qlint.growth.stream import StreamBlock, StreamTransition


def _arg(node: fx.Node, name: str, default=None):
    bound = facts(node).bound
    if bound is None:
        return default
    return bound.arguments.get(name, bound.defaults.get(name, default))


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# --- what a value holds by identity --------------------------------------------------------------


def carried(node: fx.Node) -> fx.Node:
    """The value a skip term carries: through copies, floating casts, identity reshapes and
    multiplications by exactly 1 (``x[..., :] * 1.0``)."""
    while True:
        stripped = strip(node)
        if stripped is not node:
            node = stripped
            continue
        info = facts(node) if "qlint" in node.meta else None
        if info is not None and info.op == "view":
            source = _arg(node, "input")
            if isinstance(source, fx.Node) and _same_values(node, source):
                node = source
                continue
        if (info is not None and info.op in ("mul", "div") and _number(_arg(node, "other")) == 1.0
            and isinstance(_arg(node, "input"), fx.Node)):
            node = _arg(node, "input")
            continue
        return node


def identity_source(node: fx.Node, graph: GraphFacts) -> fx.Node:
    """The earliest value whose entries ``node`` still holds by identity, in whole or in part:
    through copies, casts, views, slices, selections and gathers (the registry's ``carrier`` ops),
    ``copy_``'s source, and the data a write (``x[..., :k] = ...``, ``index_put``, ``scatter``)
    writes into. A partial residual update (``x[..., :k] + f(x)``, ``cat([x[..., :k] + f, x[..., k:]])``)
    is found through this, whatever its spelling."""
    while True:
        node = carried(node)
        info = facts(node) if "qlint" in node.meta else None
        if info is None:
            return node
        name = "src" if info.op == "copy_into" else "input" if "carrier" in info.family or info.op == "write" else None
        source = _arg(node, name) if name else None
        if not isinstance(source, fx.Node) or source not in graph.data:
            return node
        node = source


def _same_values(view: fx.Node, source: fx.Node) -> bool:
    """A view whose output provably equals its input: same shape, and an op that keeps the
    order of entries (reshape / view / expand / contiguous-like, or a full slice)."""
    shape_out, shape_in = shape_of(view), shape_of(source)
    if shape_out is None or shape_in is None or shape_out != shape_in:
        return False
    name = op_name(view)
    if name in ("view", "reshape", "_unsafe_view", "expand", "expand_as", "view_as", "reshape_as", "flatten",
                "unflatten", "squeeze", "unsqueeze", "broadcast_to", "alias", "_reshape_alias"):
        return True
    if name in ("slice", "narrow"):
        return True  # a slice with the input's shape is the whole input
    if name == "getitem":
        index = _arg(view, "index")
        parts = index if isinstance(index, tuple) else (index,)
        return all(p is Ellipsis or p is None or (isinstance(p, slice) and p.step in (None, 1)) for p in parts)
    return False


# --- the dataflow graph --------------------------------------------------------------------------


SOURCE, SINK = "model inputs", "model outputs"  # the virtual ends of the dataflow graph


def dataflow(graph: GraphFacts) -> "nx.DiGraph":
    """The value dataflow of the traced graph as a networkx DiGraph: data nodes (values that
    depend on a model input), parent -> child, with SOURCE -> every input and every output -> SINK."""
    dag = nx.DiGraph()
    dag.add_nodes_from(n for n in graph.nodes if n in graph.data)
    dag.add_edges_from((p, n) for n, parents in graph.parents.items() for p in parents)
    dag.add_edges_from((SOURCE, n) for n in graph.inputs)
    dag.add_edges_from((n, SINK) for n in graph.sinks)
    return dag


def stream_carrying(dag: "nx.DiGraph", streams: set[fx.Node]) -> set[fx.Node]:
    """The nodes that reach an output and are computed from a model input the stream starts from:
    ancestors of some block input (the stem), its descendants (everything computed from the
    stream), and whatever else is computed from such an input (an injected condition g(x), a long
    skip from x, a step size computed from x: a value that scales with the stream's own input)."""
    if not streams:
        return set()
    mark = object()
    dag.add_edges_from((s, mark) for s in streams)
    upstream = nx.ancestors(dag, mark)
    dag.remove_node(mark)
    origins = streams | {n for n in upstream if n is not SOURCE and dag.has_edge(SOURCE, n)}
    dag.add_edges_from((mark, s) for s in origins)
    downstream = nx.descendants(dag, mark)
    dag.remove_node(mark)
    reaching = nx.ancestors(dag, SINK)
    return ((downstream | upstream | streams) & reaching) - {SOURCE, SINK}


def uncovered_stretches(blocks: list[StreamBlock], transitions: list[StreamTransition],
               graph: GraphFacts) -> list[StreamTransition]:
    """Every stretch of the stream that no block and no transition between blocks covers becomes a
    transition of its own: the stem (from the model's inputs to the first block input, whatever
    the widths), a head (to an output), a readout (the stream read into a condition, a value that
    leaves a block besides its output), ops on a branch no chain of blocks passes.

    Coverage is decided here without asking the block detector: the stream is every node on a path
    from an input to an output that passes through a block input (:func:`stream_carrying`); what
    no unit covers is split into weakly connected stretches, and each is analysed from its
    boundary: the stream values it reads (block inputs and outputs, model inputs, values leaving a
    block) are its sources, everything else it reads is a condition.
    """
    if not blocks:
        return []
    dag = dataflow(graph)
    streams = {b.stream for b in blocks}
    carrying = stream_carrying(dag, streams)
    covered = set(graph.inputs)  # a block's input is computed by the unit before it, or by a stretch here
    for block in blocks:
        covered.update(block.region)
    for transition in transitions:
        covered.update(transition.region)
        covered.update(transition.sources)
    loose = carrying - covered
    downstream = {n for n in carrying if any(graph.depends_on(n, s) for s in streams)}
    by_stream = {b.stream: b for b in blocks}
    by_member: dict[fx.Node, StreamBlock] = {}
    for block in blocks:
        for node in block.region:
            by_member.setdefault(node, block)
    sinks = set(graph.sinks)
    out: list[StreamTransition] = []
    # what leads into a block input (a stem) and what only reads the stream (a head) are analysed
    # apart, though they may share values (RevIN's statistics normalise the input and rescale the output)
    leading_in = {n for n in loose if any(graph.is_ancestor(n, s) for s in streams)}
    components = [c for part in (leading_in, loose - leading_in)
                  for c in nx.weakly_connected_components(dag.subgraph(part))]
    for component in components:
        region = sorted(component, key=graph.order.__getitem__)
        parents = sorted({p for n in region for p in graph.parents.get(n, ()) if p not in component},
                         key=graph.order.__getitem__)
        sources = [p for p in parents if p in carrying or p in graph.inputs]
        exits = [n for n in region if n in sinks
                 or any(c not in component and graph.reaches_output(c) for c in graph.children.get(n, ()))]
        if not sources or not exits:
            continue
        before = next((by_stream[c] for n in exits for c in [n, *graph.children.get(n, ())] if c in by_stream), None)
        after = list({id(by_member[p]): by_member[p] for p in sources if p in by_member}.values())
        computed_from_inputs = not any(p in downstream for p in sources)
        kind = ("stem" if before is not None else "condition") if computed_from_inputs else \
            "head" if any(n in sinks for n in exits) else "between" if before is not None else "readout"
        target = before.stream if before is not None and before.stream in component else exits[-1]
        out.append(StreamTransition(sources=sources, target=target, region=region, after=after, before=before,
                                    kind=kind, exits=exits))
    return out


def escapes(region: list[fx.Node], outputs: set[fx.Node], graph: GraphFacts) -> list[fx.Node]:
    """Values computed inside a unit that leave it other than through its outputs: read by
    another unit or returned by the model (a coupling's first half, a key cached for later)."""
    inside = set(region)
    sinks = set(graph.sinks)
    return [n for n in region if n not in outputs and (n in sinks or any(
        c not in inside and graph.reaches_output(c) for c in graph.children.get(n, ())))]


__all__ = ["SINK", "SOURCE", "carried", "dataflow", "escapes", "identity_source", "stream_carrying",
           "uncovered_stretches"]
