"""Find the residual stream of a traced graph: its blocks and the transitions between them.

A **block** is a stream-to-stream map X_{k+1} = F_k(X_k) whose join combines the block
input X_k, through a skip path, with terms computed from X_k. The join is found by
meaning, not by spelling: any linear combination (``add``, ``sub``, ``addcmul``,
``lerp``, ``index_add``, ``addmm`` ...) is decomposed into signed, scaled terms through
the sums that only feed it, and a term that carries X_k through value-preserving copies
is the skip. When X_k enters with coefficient exactly 1 the block is *additive*,
X + v(X), and its velocity v (the join with the skip replaced by 0) keeps its own
exponent; otherwise (``alpha*x + f(x)``, ``lerp``, ``-x + f(x)``) the velocity is
F - id and q <= max(1, q(F)) (Theorem 9(ii), (iv)).

A join inside another block's velocity (the ``x + 0.044715 x^3`` of a tanh-GELU) is
part of that block: it is *nested* when the outer join post-dominates it (all of its
influence on the outputs goes through the outer block). The blocks that remain are
chained along stream paths (paths that do not enter another block's velocity); the ops
between consecutive blocks form a **transition** (a norm between Post-LN blocks, a
downsampling stage, a projection), analysed from the previous block's output.

Every value a block or a transition reads from outside (a *side input*) is either a
**condition** (an encoder output, a mask, an injected embedding: it does not depend on
the stream) or an **older stream value** (a dense skip): the latter is outside the
per-block analysis and reported, never certified.

The parts (:class:`~qlint.growth.stream.StreamBlock`, ...) are defined in :mod:`qlint.growth.stream`;
what a value holds by identity and the stretches of the stream no block covers are found on the
value dataflow (:mod:`qlint.growth.dataflow`).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

import torch.fx as fx

from qlint.core.graph import GraphFacts, facts, module_path, module_stack, shape_of
from qlint.core.ops import op_name
from qlint.growth.dataflow import carried, identity_source, uncovered_stretches
from qlint.growth.relations import Normalisation
from qlint.growth.stream import Post, Stream, StreamBlock, StreamTransition, Term

# Joins: the op ids (registry entries) that combine their arguments linearly, and the
# argument that carries a term in each.
_EXACT = {"add", "sub", "rsub", "addcmul", "addcdiv", "addmm", "write"}


# --- joins ---------------------------------------------------------------------------------------


def _arg(node: fx.Node, name: str, default=None):
    bound = facts(node).bound
    if bound is None:
        return default
    return bound.arguments.get(name, bound.defaults.get(name, default))


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _product(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else a * b


def join_terms(node: fx.Node, graph: GraphFacts, selections: bool = False) -> Optional[list[Term]]:
    """The terms of a linear combination (None when the node is not a join); ``selections``: writes
    and ``where`` too (:data:`_SELECTIONS`)."""
    stacked = _stack_sum(node, graph)
    if stacked is not None:
        return stacked
    if op_name(node) in ("cat", "concat", "concatenate"):
        parts = _arg(node, "tensors") or []
        if isinstance(parts, fx.Node):  # cat(x.split(k)): one node holds the parts, the join is not spelt out
            return None
        terms = [Term(p, 1.0, ((node, "tensors"),), p) for p in parts if isinstance(p, fx.Node) and p in graph.data]
        # with selections, a part's sums are terms of their own: cat([x[:, :k] + s, x[:, k:]]) moves X_k's
        # entries and adds s (ReXNet's channel-expanding shortcut), s is the only update
        return [t for term in terms for t in _written_terms(term, graph)] if selections else terms
    op = facts(node).op
    if selections and op in _SELECTIONS and not (op == "write" and _accumulates(node)):
        # likewise a written value's: ``x[:, :k] += s`` writes slice(x) + s
        return [t for term in _opaque(node, graph, _SELECTIONS[op], ())
                for t in (_written_terms(term, graph) if term.path[-1][1] != "input" else [term])]
    if "sum" not in facts(node).family and not (selections and op == "write"):
        return None
    return _terms(node, graph, 1.0, ())


# Joins that select rather than add: each output entry is an entry of one argument. A write
# (slice_scatter, index_put, scatter, masked_scatter ...: every slice or index assignment, in place
# or not, once functionalised) keeps its data where nothing is written; ``where`` picks per entry.
# Their terms have no coefficient, so such a block is analysed in the scaled form, q <= max(1, q(F)).
_SELECTIONS = {"write": ("input", "src", "source", "values", "value"), "where": ("input", "other")}


def _stack_sum(node: fx.Node, graph: GraphFacts) -> Optional[list[Term]]:
    """``torch.stack([a, b, ...]).sum(0)`` = a + b + ...: terms without a zeroable slot (the
    join is then analysed in the scaled form)."""
    if facts(node).op != "sum" or _arg(node, "keepdim", False):
        return None
    stack = _arg(node, "input")
    if not isinstance(stack, fx.Node) or op_name(stack) != "stack" or len(graph.children.get(stack, ())) != 1:
        return None
    dim, axis = _arg(node, "dim"), _arg(stack, "dim", 0)
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    if len(dims) != 1 or dims[0] != axis:
        return None
    parts = _arg(stack, "tensors") or []
    return [Term(p, None, (), p) for p in parts if isinstance(p, fx.Node) and p in graph.data]


def _terms(node: fx.Node, graph: GraphFacts, scale: Optional[float], path: tuple) -> list[Term]:
    op = facts(node).op
    out: list[Term] = []

    def operand(arg_name: str, coefficient: Optional[float]) -> None:
        value = _arg(node, arg_name)
        if not isinstance(value, fx.Node) or value not in graph.data:
            return
        expanded = _expand(value, graph, _product(scale, coefficient), path + ((node, arg_name),))
        out.extend(Term(t.node, t.coefficient, t.path, t.entry or value) for t in expanded)

    alpha = _number(_arg(node, "alpha", 1))
    if op == "add":
        operand("input", 1.0)
        operand("other", alpha)
    elif op == "sub":
        operand("input", 1.0)
        operand("other", None if alpha is None else -alpha)
    elif op == "rsub":
        operand("other", 1.0)
        operand("input", None if alpha is None else -alpha)
    elif op in ("addcmul", "addcdiv"):
        operand("input", 1.0)
        out.extend(_opaque(node, graph, ("tensor1", "tensor2"), path))
    elif op == "addmm":
        operand("input", _number(_arg(node, "beta", 1)))
        out.extend(_opaque(node, graph, ("mat1", "mat2", "batch1", "batch2", "mat", "vec", "vec1", "vec2"), path))
    elif op == "lerp":
        weight = _number(_arg(node, "weight"))
        operand("input", None if weight is None else 1.0 - weight)
        operand("end", weight)
        if weight is None:
            out.extend(_opaque(node, graph, ("weight",), path))
    elif op == "write" and _accumulates(node):
        operand("input", 1.0)
        out.extend(_opaque(node, graph, ("src", "source", "values"), path))
    return out


def _accumulates(node: fx.Node) -> bool:
    return op_name(node) in ("index_add", "scatter_add", "index_add_", "scatter_add_") or (
        op_name(node).startswith("index_put") and _arg(node, "accumulate", False) is True)


def _written_terms(term: Term, graph: GraphFacts) -> list[Term]:
    """The terms of a written value, through export's ``copy`` into the destination and copies."""
    value = term.node
    while facts(value).op == "copy_into" and isinstance(_arg(value, "src"), fx.Node):
        value = carried(_arg(value, "src"))
    return _expand(carried(value), graph, None, term.path) if value in graph.data else [term]


def _opaque(node: fx.Node, graph: GraphFacts, names: tuple[str, ...], path: tuple) -> list[Term]:
    """Arguments that enter a join through a product (addcmul's a * b): one term, no coefficient."""
    out = []
    for arg_name in names:
        value = _arg(node, arg_name)
        if isinstance(value, fx.Node) and value in graph.data:
            out.append(Term(value, None, path + ((node, arg_name),), value))
    return out


def _expand(node: fx.Node, graph: GraphFacts, scale: Optional[float], path: tuple) -> list[Term]:
    """Fold sums and constant scalings that feed only this join into its terms."""
    if len(graph.children.get(node, ())) == 1 and len(node.users) == 1:
        info = facts(node)
        if "sum" in info.family and info.op in ("add", "sub", "rsub"):
            return _terms(node, graph, scale, path)
        if info.op == "neg":
            return _expand(_arg(node, "input"), graph, _product(scale, -1.0), path + ((node, "input"),))
        if info.op in ("mul", "div"):
            a, b = _arg(node, "input"), _arg(node, "other")
            factor = _number(b)
            if factor is not None and isinstance(a, fx.Node) and (info.op == "mul" or factor != 0):
                factor = factor if info.op == "mul" else 1.0 / factor
                return _expand(a, graph, _product(scale, factor), path + ((node, "input"),))
            factor = _number(a)
            if info.op == "mul" and factor is not None and isinstance(b, fx.Node):
                return _expand(b, graph, _product(scale, factor), path + ((node, "other"),))
            # a factor that does not depend on the data (a learned scale, a carry): a scaled term
            if isinstance(a, fx.Node) and a in graph.data and not (isinstance(b, fx.Node) and b in graph.data):
                return _expand(a, graph, None, path + ((node, "input"),))
            if (info.op == "mul" and isinstance(b, fx.Node) and b in graph.data
                and not (isinstance(a, fx.Node) and a in graph.data)):
                return _expand(b, graph, None, path + ((node, "other"),))
    return [Term(node, scale, path)]


# --- the stream ----------------------------------------------------------------------------------


def find_stream(graph: GraphFacts, root_name: str = "model") -> Stream:
    """Every top-level block in execution order, the transitions between them, their names."""
    candidates = [b for b in (_as_block(j, graph) for j in graph.nodes if j in graph.data) if b is not None]
    _shift_input_norms(candidates, graph)
    for block in candidates:
        block.region = graph.region([block.stream], block.join)
    by_form = list(candidates)
    inside = {n for b in by_form for n in b.region}
    for block in (_as_block(j, graph, dataflow=True) for j in graph.nodes if j in graph.data and j not in inside):
        if block is None:
            continue
        block.region = graph.region([block.stream], block.join)
        if not _rewraps(block, by_form, graph):
            candidates.append(block)
    by_join = {b.join: b for b in candidates}
    nested, top = [], []
    for block in candidates:
        if not graph.reaches_output(block.join) or _is_nested(block, by_join, graph):
            nested.append(block)
        else:
            top.append(block)
    blocks = [b for b in top if not _readout(b, top, graph)]
    blocks.sort(key=lambda b: graph.order[b.join])
    transitions = _chain(blocks, graph)
    claimed = {n for b in blocks if b.norm_in is not None for n in b.region}
    for index, block in enumerate(blocks):
        block.index = index
        block.post, block.post_node, block.post_region = _post(block, graph, claimed)
        if block.norm_in is not None:
            block.post = "post-norm"
    _settle_top_level_norms(blocks, transitions)
    _name(blocks, root_name, graph)
    for transition in transitions:
        transition.name = _transition_name(transition)
    return Stream(blocks=blocks, transitions=transitions, nested=nested)


def _rewraps(block: StreamBlock, by_form: list[StreamBlock], graph: GraphFacts) -> bool:
    """An update found by dataflow that only re-wraps a block found by form: the same X_k, that block's
    join inside it, and every other term computed from that block's own values by moves and linear maps
    (ReXNet's cat([y[:, :k] + s, y[:, k:]]) around its y[:, :k] + s). The block found by form is the
    update, with its exact velocity; a term computed any other way (a g(s)^2 beside it) keeps the wider one."""
    region = set(block.region)
    return any(form.stream is block.stream and form.join in region
               and all(_derived(t.node, set(form.region), graph, linear=True) for t in block.terms)
               for form in by_form)


def _as_block(join: fx.Node, graph: GraphFacts, dataflow: bool = False) -> Optional[StreamBlock]:
    """The block rooted at this join, if one term carries X_k and another depends on it.

    ``dataflow``: the updates outside every block found by form (a stem, a head, between blocks),
    where a later norm would hide them: a write or a ``where`` is a join too, and a term that carries
    part of X_k by identity (:func:`~qlint.growth.dataflow.identity_source`) is a skip; such an update
    is analysed in the scaled form, q <= max(1, q(F))."""
    terms = join_terms(join, graph, selections=dataflow) if "qlint" in join.meta else None
    if not terms or len(terms) < 2:
        return None
    # cat([X_k, g(X_k)]) = [X_k; 0] + [0; g(X_k)]: an update of the augmented state (DenseNet, Next-ViT)
    concatenated = op_name(join) in ("cat", "concat", "concatenate")
    join_shape = shape_of(join)

    def whole(term: Term) -> Optional[fx.Node]:
        stream = carried(term.node)
        stream_shape = shape_of(stream)
        if join_shape is not None and stream_shape is not None and stream_shape != join_shape and not concatenated:
            return None  # a term broadcast up to the join is a bias, not X_k
        return stream

    best = _skip(terms, graph, whole, carriers_too=not dataflow)
    if best is None and dataflow:
        # a part of X_k carried by identity (a slice, a gather, the data of a write): a partial update
        def part(term: Term) -> Optional[fx.Node]:
            source = identity_source(term.node, graph)
            return None if source is carried(term.node) else source  # a broadcast bias carries no part of X_k

        best = _skip(terms, graph, part, carriers_too=False)
    if best is None:
        return _gated(join, terms, graph)
    skip, stream = best
    if dataflow and all(
            _derived(t.node, {stream}, graph, linear=True) for t in terms if t is not skip):
        # a linear rearrangement of X_k (rotate_half's cat(-x2, x1), a patch merge, a functionalised
        # write-back of X_k's own entries): no term computes anything, so there is no update
        return None
    velocity = [t for t in terms if t is not skip]
    if facts(join).op in ("add", "sub", "rsub") and _centring(velocity, stream, graph):
        return None  # x - mean(x): the numerator of a normalisation (RevIN) or a decomposition, not a residual branch
    repeated = any(carried(t.node) is stream for t in velocity)
    if concatenated:
        if all(_derived(t.node, {stream}, graph, linear=False) for t in velocity):
            return None  # padding by copies or averages of X_k (Autoformer's edges): no branch computes anything
        return StreamBlock(join=join, stream=stream, skip=skip, terms=velocity,
                           form="scaled" if repeated or dataflow else "additive", dataflow=dataflow)
    exact = not dataflow and facts(join).op in _EXACT and skip.coefficient == 1.0 and not repeated and all(
        facts(node).op in _EXACT or facts(node).op in ("neg", "mul", "div") for node, _ in skip.path)
    return StreamBlock(join=join, stream=stream, skip=skip, terms=velocity, form="additive" if exact else "scaled",
                       dataflow=dataflow)


def _skip(terms: list[Term], graph: GraphFacts, locate: Callable[[Term], Optional[fx.Node]],
          carriers_too: bool = True) -> Optional[tuple[Term, fx.Node]]:
    """The term that carries X_k (``locate`` finds the value a term carries), chosen so that the
    most other terms depend on it, the latest such X_k first; None when no term qualifies.
    ``carriers_too``: a term that only carries part of X_k by identity counts as depending on it."""
    best: Optional[tuple[int, int, Term, fx.Node]] = None
    for term in terms:
        stream = locate(term)
        if stream is None or stream not in graph.data:
            continue
        others = [t for t in terms if t is not term]
        dependent = [t for t in others if graph.depends_on(t.node, stream)
                     and (carriers_too or identity_source(t.node, graph) is not stream)]
        if not dependent or any(graph.is_ancestor(t.node, stream) for t in others):
            continue
        key = (len(dependent), graph.order[stream])
        if best is None or key > best[:2]:
            best = (*key, term, stream)
    return None if best is None else (best[2], best[3])


def _centring(velocity: list[Term], stream: fx.Node, graph: GraphFacts) -> bool:
    """Every velocity term is proved an average of X_k itself: a mean or an average pool of X_k
    alone, moved back to its shape (x - mean(x), RevIN's x - loc, Autoformer's series
    decomposition x - avg_pool(pad(x)), its layer norm's x - mean_t(x).repeat(...)). Such a join
    is linear in X_k, a centring, not a residual branch. Having fewer entries than the stream
    proves nothing: a scalar per token computed from X_k and broadcast back (additive
    squeeze-excite, a token-energy shift) is a velocity like any other."""
    return bool(velocity) and all(_average_of(t.node, stream, graph) for t in velocity)


_AVERAGES = frozenset({"mean", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                       "adaptive_avg_pool3d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d"})


def _average_of(node: fx.Node, stream: fx.Node, graph: GraphFacts) -> bool:
    """``node`` is computed from ``stream`` alone by averages (a mean, an average pool) and
    by moves of entries (views, copies, padding, concatenation of its own slices), one
    average at least: a moving or global mean of X_k."""
    return _derived(node, {stream}, graph, linear=False) == "averaged"


def _derived(node: fx.Node, sources: set[fx.Node], graph: GraphFacts, *, linear: bool) -> str:
    """How ``node`` is computed from ``sources`` alone: ``"averaged"`` (through an average at
    least once), ``"moved"`` (moves of entries only), or ``""`` (anything else: a weight layer,
    a product of two signals, a model input). ``linear`` also admits sums, differences and
    scales by an input-independent factor, and then follows input-dependent arguments only."""
    averaged, stack, seen = False, [node], set()
    while stack:
        current = stack.pop()
        if current in sources or current in seen:
            continue
        seen.add(current)
        info = facts(current)
        if op_name(current) in _AVERAGES:
            averaged = True
        elif not (info.plumbing or "concat" in info.family or info.op == "pad"
                  or (linear and (info.op in ("add", "sub", "neg") or _constant_scale(current, graph)))):
            return ""
        parents = [p for p in graph.parents.get(current, ()) if not linear or p in graph.data]
        if not parents:
            return ""  # a model input: the value is not the sources' alone
        stack.extend(parents)
    return "averaged" if averaged else "moved"


def _gated(join: fx.Node, terms: list[Term], graph: GraphFacts) -> Optional[StreamBlock]:
    """A gated skip g(x) * x + f(x) (highway networks): a term that is a product with X_k as
    a direct factor, every other term computed from X_k. The join is a stream map F(X_k),
    analysed in the scaled form (q <= max(1, q(F)))."""
    shape = shape_of(join)
    for term in terms:
        if facts(term.node).op != "mul":
            continue
        for name in ("input", "other"):
            factor = _arg(term.node, name)
            if not isinstance(factor, fx.Node):
                continue
            stream = carried(factor)
            if stream not in graph.data or (shape is not None and shape_of(stream) not in (None, shape)):
                continue
            others = [t for t in terms if t is not term]
            if others and all(graph.depends_on(t.node, stream) for t in others):
                return StreamBlock(join=join, stream=stream, skip=Term(stream, None, ()), terms=list(terms),
                                   form="scaled")
    return None


def _is_nested(block: StreamBlock, by_join: dict[fx.Node, StreamBlock], graph: GraphFacts) -> bool:
    """Inside the velocity of another join that post-dominates it."""
    for outer in by_join.values():
        if outer is block:
            continue
        if graph.is_ancestor(outer.stream, block.join) and outer.stream is not block.join and \
                graph.is_ancestor(block.join, outer.join) and graph.postdominates(outer.join, block.join):
            return True
    return False


def _readout(block: StreamBlock, top: list[StreamBlock], graph: GraphFacts) -> bool:
    """A sum of values read off the stream at several depths, not an update of it.

    Autoformer's decoder adds the trends of its three decompositions, trend1 + trend2 +
    trend3: trend2 depends on trend1 only through the seasonal stream and the blocks
    after it. Such a join's velocity holds whole blocks (their input and their join),
    whose outputs also go on past it (else they would be nested), and every velocity term
    is a linear readout of those stream values (averages, sums, constant scales, moves of
    entries): the join reads the stream, it does not carry it, and its growth is that of
    the values it reads. Anything more (``x + tail(b)**2`` of a residual-in-residual
    model that also returns b) stays a block and is bounded like any other.
    """
    region = block.region_set
    inner = [o for o in top if o is not block and o.join in region and o.stream in region]
    if not inner:
        return False
    read = {o.join for o in inner} | {o.stream for o in inner} | {block.stream}
    return all(_derived(t.node, read, graph, linear=True) for t in block.terms)


def _constant_scale(node: fx.Node, graph: GraphFacts) -> bool:
    """``x * c`` or ``x / c`` with c independent of the input (``b * b`` is a product, ``c / x`` no scale)."""
    op = facts(node).op
    if op not in ("mul", "div"):
        return False
    a, b = _arg(node, "input"), _arg(node, "other")
    dependent = [isinstance(v, fx.Node) and v in graph.data for v in (a, b)]
    return dependent == [True, False] or (op == "mul" and dependent == [False, True])


def _chain(blocks: list[StreamBlock], graph: GraphFacts) -> list[StreamTransition]:
    """Link blocks along stream paths; make a transition wherever ops lie between them; classify
    every side input as a condition or an older stream value."""
    interiors: set[fx.Node] = set()
    for block in blocks:
        interiors.update(n for n in block.region if n is not block.join)
    index = {node: i for i, node in enumerate(n for n in graph.nodes if n in graph.data)}
    bits: dict[fx.Node, int] = {}
    for node in graph.nodes:
        if node not in graph.data or node in interiors:
            continue
        value = 0
        for parent in graph.parents.get(node, ()):
            if parent in bits:
                value |= bits[parent] | (1 << index[parent])
        bits[node] = value

    def before(a: fx.Node, b: fx.Node) -> bool:  # a reaches b along a stream path (or is b)
        return a is b or (b in bits and a in index and bool((bits[b] >> index[a]) & 1))

    transitions: list[StreamTransition] = []
    for j, block in enumerate(blocks):
        if block.stream in interiors:
            continue
        candidates = [b for b in blocks[:j] if before(b.join, block.stream)]
        direct = [b for b in candidates if not any(c is not b and before(b.join, c.stream) for c in candidates)]
        block.predecessors = direct
        if not direct or (len(direct) == 1 and direct[0].join is block.stream):
            continue
        sources = [b.join for b in direct]
        mask = 0
        for s in sources:
            mask |= 1 << index[s]
        target_bits = bits.get(block.stream, 0) | (1 << index[block.stream])
        region = [n for n in graph.nodes if n in bits and n not in sources and (target_bits >> index[n]) & 1
                  and bits[n] & mask]
        transitions.append(StreamTransition(sources=sources, target=block.stream, region=region, after=direct,
                                            before=block))
    position = {id(b): i for i, b in enumerate(blocks)}
    chains: dict[int, set[int]] = {}
    for j, block in enumerate(blocks):
        chain: set[int] = set()
        for p in block.predecessors:
            chain.add(position[id(p)])
            chain |= chains.get(position[id(p)], set())
        chains[j] = chain
    for j, block in enumerate(blocks):
        block.side = graph.side_inputs(block.region, [block.stream])
        streams = [block.stream] + [blocks[i].stream for i in chains[j]]
        block.older = [u for u in block.side if any(graph.depends_on(u, s) for s in streams)]
    for transition in transitions:
        transition.side = graph.side_inputs(transition.region, transition.sources)
        streams = [blocks[i].stream for i in chains[position[id(transition.before)]]]
        transition.older = [u for u in transition.side if any(graph.depends_on(u, s) for s in streams)]
    stretches = uncovered_stretches(blocks, transitions, graph)
    for stretch in stretches:
        stretch.side = graph.side_inputs(stretch.region, stretch.sources)
        if stretch.before is None:
            continue  # a head or a readout is applied once: it may read the stream at several depths
        read = [s for s in stretch.sources if s not in graph.inputs]
        # the next block's input computed from a stream value and a later one computed from it:
        # a long skip into the recursion (U-Net)
        stretch.older = [s for s in read if any(t is not s and graph.is_ancestor(s, t) for t in read)]
    return sorted(transitions + stretches, key=lambda t: graph.order[t.target])


def _post(block: StreamBlock, graph: GraphFacts,
          claimed: set[fx.Node]) -> tuple[Post, Optional[fx.Node], list[fx.Node]]:
    """LN(X + f(X)) and relu(X + f(X)): the norm (a registry norm, or one written out and proved,
    through casts and its affine weight) or the ReLU that takes every use of the join, when it belongs
    to the block's own module (a model's final norm is not part of its last block) and no shifted
    block holds it. Returns the form, that node and, for a norm, the nodes up to its output."""
    if block.dataflow:
        return "", None, []  # a norm after an update found by dataflow is the next unit's: it must not hide it
    found = _norm_after(block.join, graph)
    if found is not None and found[0] not in claimed and _owns(block.join, found[0]):
        return "post-norm", found[0], found[1]
    users = graph.children.get(block.join, [])
    if len(users) == 1 and facts(users[0]).op == "relu" and _owns(block.join, users[0]):
        return "post-activation", users[0], []
    return "", None, []


_POST_NORMS = frozenset({"norm", "batch_norm"})  # after the join, as Post-LN has always been read
_INPUT_NORMS = frozenset({"norm"})  # on the skip: a per-sample normaliser (a BatchNorm there is a CNN's stem or stage)


def _owns(join: fx.Node, node: fx.Node) -> bool:
    """The module whose forward performs the join also runs ``node`` (always, at the top level)."""
    owner = module_path(join)
    return not owner or owner in {path for path, _ in module_stack(node)}


def _normalised_input(node: fx.Node, graph: GraphFacts, families: frozenset[str]) -> Optional[fx.Node]:
    """The value ``node`` normalises: a norm of the registry's ``families`` (its input) or a hand-written
    normalisation proved by :mod:`qlint.growth.relations` (its numerator, before centring; a factor that
    depends on the input proves nothing here). None when ``node`` is neither."""
    info = facts(node)
    relation = info.relation
    if isinstance(relation, Normalisation):
        if isinstance(relation.factor, fx.Node) and relation.factor in graph.data:
            return None
        value = relation.numerator
        if facts(value).op == "sub":
            value = _arg(value, "input")
    elif info.family & families:
        value = _arg(node, "input")
    else:
        return None
    return carried(value) if isinstance(value, fx.Node) else None


def _affine_input(node: fx.Node, graph: GraphFacts) -> Optional[fx.Node]:
    """The data argument of ``gamma * n``, ``n / c`` or ``n + beta`` with gamma, c, beta independent of
    the input (a norm's affine wrapper written out); None for anything else."""
    op = facts(node).op
    if not (_constant_scale(node, graph) or op in ("add", "sub")):
        return None
    values = [v for v in (_arg(node, "input"), _arg(node, "other")) if isinstance(v, fx.Node) and v in graph.data]
    if len(values) != 1 or (op == "sub" and values[0] is not _arg(node, "input")):
        return None
    return values[0]


def _norm_below(value: fx.Node, graph: GraphFacts, families: frozenset[str]) -> Optional[tuple[fx.Node, fx.Node]]:
    """(norm, Y) when ``value`` is a normaliser of Y behind casts and a constant affine wrapper
    (Hugging Face's ``weight * x.to(dtype)``)."""
    node = value
    for _ in range(8):
        node = carried(node)
        source = _normalised_input(node, graph, families)
        if source is not None:
            return node, source
        node = _affine_input(node, graph)
        if node is None:
            return None
    return None


def _norm_after(join: fx.Node, graph: GraphFacts) -> Optional[tuple[fx.Node, list[fx.Node]]]:
    """(norm, nodes): a normaliser of the join that every use of the join goes into, and the nodes from
    the join (excluded) to its output, through casts and a constant affine wrapper (included)."""
    frontier, seen, norm = [join], {join}, None
    for _ in range(4):  # a written-out norm reaches its normalising op within a few ops (a cast, a square)
        frontier = [c for n in frontier for c in graph.children.get(n, ()) if c not in seen and not seen.add(c)]
        norm = next((c for c in frontier if _normalised_input(c, graph, _POST_NORMS) is join), None)
        if norm is not None:
            break
    if norm is None:
        return None
    output = norm
    while (len(users := graph.children.get(output, ())) == 1
           and output in (carried(users[0]), _affine_input(users[0], graph))):
        output = users[0]
    nodes = graph.region([join], output)
    inside = set(nodes)
    if not all(set(graph.children.get(n, ())) <= inside for n in [join, *nodes[:-1]]):
        return None
    return norm, nodes


def _shift_input_norms(candidates: list[StreamBlock], graph: GraphFacts) -> None:
    """Post-LN with the norm moved to the next sublayer's input (MiniMax-01): ``h = LN(Y); a h + f(h)``.

    Stacked, ``h2 = LN(X'); X'' = a h2 + g(h2)`` is the Post-LN stream LN(a Z + f(Z)) re-bracketed: the
    norm sits on the identity path between two joins. Read with h as X_k, the norm-free f(h) would be
    measured on a free input although h is normalised; so such a block's input is Y and its map
    F(Y) = a LN(Y) + f(LN(Y)) (the scaled form, q = max(1, q(F)), with the norm inside). Accepted when
    the skip carries a normaliser of Y run by the join's module, whose values only this block reads,
    and that norm is not the plain Post-LN norm of the block whose join Y is (DETR's
    ``norm1(x + attn(x))`` read by ``x + ffn(x)`` in the same layer), unless that block is shifted
    itself. At the top level, where no module owns the norm, a lone one is a stem's norm (CLIP's
    ``ln_pre`` before Pre-LN blocks) and only a chain of two or more shifted blocks is read this way.
    """
    by_join = {b.join: b for b in candidates}
    shifted: dict[fx.Node, tuple[StreamBlock, fx.Node, fx.Node]] = {}
    for block in sorted(candidates, key=lambda b: graph.order[b.join]):
        found = _norm_below(block.stream, graph, _INPUT_NORMS)
        if found is None or not _owns(block.join, found[0]):
            continue
        norm, source = found
        previous = by_join.get(source)
        if source not in graph.data or previous is not None and source not in shifted and _owns(source, norm):
            continue
        inside = set(graph.region([source], block.join))
        if not all(set(graph.children.get(n, ())) <= inside for n in graph.region([source], block.stream)):
            continue  # the normalised value is read elsewhere too
        shifted[block.join] = (block, source, norm)
    sources = {source for _, source, _ in shifted.values()}
    for join, (block, source, norm) in shifted.items():
        if module_path(join) or source in shifted or join in sources:
            block.stream, block.form, block.norm_in = source, "scaled", norm


def _settle_top_level_norms(blocks: list[StreamBlock], transitions: list[StreamTransition]) -> None:
    """At the top level no module owns the norm, so ask the stream instead.

    In ``for layer: x = norm(x + f(x))`` each norm leads to the next block's X_k; after a
    pre-norm stack ``for layer: x = x + f(norm(x))`` the norm that follows the last block
    is the model's head, not part of that block. A lone ``norm(x + f(x))`` stays Post-LN.
    """
    feeding = {n for t in transitions if t.before is not None for n in t.region} | {b.stream for b in blocks}
    previous: Optional[StreamBlock] = None
    for block in blocks:
        lone = block.post_node not in feeding and block.norm_in is None
        if block.post_region and not module_path(block.join) and lone:
            if previous is not None and previous.post != "post-norm":
                block.post, block.post_node, block.post_region = "", None, []
        previous = block


# --- names ---------------------------------------------------------------------------------------


def _name(blocks: list[StreamBlock], root_name: str, graph: GraphFacts) -> None:
    """Module path of the module whose forward performs the join; disambiguated by branch.

    A ``cat`` join written in the model's own forward (``torch.cat((blk(x, cls), x))``, an
    augmented state) is named after the module that holds its whole velocity
    (``blocks_token_only``), when there is one.
    """
    for block in blocks:
        concatenated = op_name(block.join) in ("cat", "concat", "concatenate")
        block.name = module_path(block.join) or (_velocity_scope(block) if concatenated else "") or root_name
    counts = Counter(b.name for b in blocks)
    for base, count in counts.items():
        if count == 1:
            continue
        group = [b for b in blocks if b.name == base]
        for block in group:
            branches = _branches(block, base, graph)
            block.name = f"{base}:{'+'.join(branches)}" if branches else base
        if len({b.name for b in group}) < len(group):
            seen: Counter = Counter()
            for block in group:
                seen[block.name] += 1
                block.name = f"{block.name}#{seen[block.name]}"


def _velocity_scope(block: StreamBlock) -> str:
    """The deepest module path that every op of the velocity lies under ('' if none)."""
    paths = [module_path(n).split(".") for n in block.region if n is not block.join]
    common: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def _branches(block: StreamBlock, base: str, graph: GraphFacts) -> list[str]:
    """The direct children of the block's module whose output is added: ``mlp`` for
    ``x + drop_path(ls(post_norm(mlp(pre_norm(x)))))``.

    Walking back from each velocity term, the ops of the block's own module (a ``cat``,
    a gate) and the children that only wrap a branch (:func:`_wrapper`: norms, dropouts,
    drop-path, identities, LayerScale) are looked through; the first child that
    computes is a branch, and the walk stops there.
    """
    prefix = f"{base}." if base else ""
    region = block.region_set
    members: dict[str, list[fx.Node]] = {}
    for node in block.region:
        child = _child(node, prefix)
        if child:
            members.setdefault(child, []).append(node)
    wrappers = {child for child, nodes in members.items() if _wrapper(nodes, graph)}
    found: list[str] = []
    wrapping: list[str] = []  # the wrappers passed on the way: the name of a velocity that only normalises
    stack = [t.node for t in reversed(block.terms)]
    seen: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node in seen or node not in region:
            continue
        seen.add(node)
        child = _child(node, prefix)
        if child and child not in wrappers:
            if child not in found:
                found.append(child)
            continue
        if child and child not in wrapping:
            wrapping.append(child)
        stack.extend(sorted((p for p in graph.parents.get(node, ()) if p in region), key=graph.order.__getitem__))
    return found or wrapping


def _child(node: fx.Node, prefix: str) -> str:
    path = module_path(node)
    return path[len(prefix):].split(".")[0] if path.startswith(prefix) and len(path) > len(prefix) else ""


def _wrapper(nodes: list[fx.Node], graph: GraphFacts) -> bool:
    """A child that only wraps a branch: its ops pass a value on (dropout, drop-path,
    identity, casts), scale it by a factor computed outside the stream (LayerScale), or
    normalise it (a norm module or one written out, with no learned layer inside)."""
    def passes(node: fx.Node) -> bool:
        return "carrier" in facts(node).family or _constant_scale(node, graph)

    def normalises(node: fx.Node) -> bool:
        info = facts(node)
        return isinstance(info.relation, Normalisation) or bool(info.family & {"norm", "batch_norm"})

    if all(passes(n) for n in nodes):
        return True
    computes = any(facts(n).primitive is None or facts(n).declared is not None or facts(n).family & {"layer", "matmul"}
                   or facts(n).op in ("attention", "mha_functional", "mha_module", "recurrent", "embedding")
                   for n in nodes)
    return not computes and any(normalises(n) for n in nodes)


def _transition_name(transition: StreamTransition) -> str:
    paths = [module_path(n) for n in transition.region if module_path(n)]
    where = paths[0] if paths else ""
    before = transition.before.name if transition.before else "output"
    after = ", ".join(b.name for b in transition.after) or "input"
    return f"{after} -> {before}" + (f" ({where})" if where else "")


__all__ = ["find_stream", "join_terms"]
