"""Find the residual blocks X_{k+1} = X_k + v(X_k) of a traced graph.

A block is a sum whose one term is the stream value X_k and whose other terms are
computed from X_k. Sums of several branches onto the same X_k
(``x + attn(n1(x)) + ssm(n2(x))``) form ONE block whose velocity is their sum: an
add whose only user is another add is folded into it. A residual sum that lies
inside another block's velocity (``x + 0.044715 * x**3`` inside a GELU) is part of
that block, not a block of its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Optional

import networkx as nx
import torch.fx as fx

from qlint.rules.primitives.handwritten_norms import op_name
from qlint.trace import module_path, module_stack

_ADDS = {"add", "add_", "iadd"}
_CARRIERS = {"to", "float", "double", "half", "bfloat16", "type_as", "contiguous", "clone", "_to_copy", "view", "reshape", "_unsafe_view", "alias", "detach"}
_NORMS = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm", "native_group_norm", "normalize"}
_NORM_MODULES = ("LayerNorm", "RMSNorm", "GroupNorm")
_NONEXPANSIVE = {"relu", "relu_"}  # ||relu(z)|| <= ||z||: keeps the additive bound

Form = Literal["additive", "post-norm", "post-activation"]


@dataclass
class ResidualBlock:
    """One residual update found in the graph."""

    root: fx.Node
    stream: fx.Node
    terms: list[fx.Node]
    cone: list[fx.Node]
    name: str = ""
    form: Form = "additive"
    after: Optional[fx.Node] = None  # the norm or activation applied after the add
    cone_set: set = field(default_factory=set, repr=False)


def is_add(node: fx.Node) -> bool:
    if node.op not in ("call_function", "call_method") or op_name(node) not in _ADDS:
        return False
    operands = [a for a in node.args[:2] if isinstance(a, fx.Node)]
    return len(operands) == 2


def _carried(node: fx.Node) -> fx.Node:
    """The value a term carries through casts and reshapes (``residual.to(dtype)``)."""
    while node.op in ("call_function", "call_method") and op_name(node) in _CARRIERS and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


class _Graph:
    """Topological order and bounded ancestor queries over an fx graph."""

    def __init__(self, graph: fx.Graph) -> None:
        self.nodes = list(graph.nodes)
        self.order = {node: i for i, node in enumerate(self.nodes)}

    def ancestors_after(self, targets: list[fx.Node], floor: int) -> set[fx.Node]:
        """Ancestors of ``targets`` (inclusive) whose position is above ``floor``."""
        seen: set[fx.Node] = set()
        stack = [t for t in targets if self.order[t] > floor]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            stack.extend(p for p in node.all_input_nodes if self.order[p] > floor and p not in seen)
        return seen

    def depends_on(self, node: fx.Node, source: fx.Node) -> bool:
        return source in self.ancestors_after([node], self.order[source] - 1)

    def cone(self, source: fx.Node, targets: list[fx.Node]) -> list[fx.Node]:
        """Nodes after ``source`` that depend on it and feed ``targets``, in order."""
        region = sorted(self.ancestors_after(targets, self.order[source]), key=self.order.__getitem__)
        reached = {source}
        cone = []
        for node in region:
            if any(parent in reached for parent in node.all_input_nodes):
                reached.add(node)
                cone.append(node)
        return cone


def find_blocks(graph: fx.Graph, root_name: str = "model") -> list[ResidualBlock]:
    """Every top-level residual block, in execution order, with unique names."""
    g = _Graph(graph)
    adds = [n for n in g.nodes if is_add(n)]
    add_set = set(adds)
    folded = {a for a in adds if len(a.users) == 1 and next(iter(a.users)) in add_set}
    candidates = []
    for root in adds:
        if root in folded:
            continue
        block = _as_block(g, root, folded)
        if block is not None:
            candidates.append(block)
    nested = set()
    for outer in candidates:
        for inner in candidates:
            if inner is not outer and inner.root in outer.cone_set:
                nested.add(inner.root)
    blocks = [b for b in candidates if b.root not in nested]
    for block in blocks:
        block.form, block.after = _form(block.root, module_path(block.root))
    _settle_top_level_norms(blocks)
    _name(blocks, root_name)
    return blocks


def _settle_top_level_norms(blocks: list[ResidualBlock]) -> None:
    """At the top level no module owns the norm, so ask the stream instead.

    In ``for layer: x = norm(x + f(x))`` each norm's output is the next block's X_k;
    in ``for layer: x = x + f(norm(x))`` followed by a final norm only the last add
    feeds a norm, and after a pre-norm block that norm is the model's head, not part
    of the block. A lone ``norm(x + f(x))`` stays a Post-LN update.
    """
    streams = {b.stream for b in blocks}
    previous: Optional[Form] = None  # form of the previous top-level block
    for block in blocks:
        if module_path(block.root):
            continue
        if block.form == "post-norm" and block.after not in streams and previous == "additive":
            block.form, block.after = "additive", None
        previous = block.form


def _terms(node: fx.Node, folded: set[fx.Node]) -> list[fx.Node]:
    terms = []
    for operand in node.args[:2]:
        if operand in folded:
            terms.extend(_terms(operand, folded))
        else:
            terms.append(operand)
    return terms


def _as_block(g: _Graph, root: fx.Node, folded: set[fx.Node]) -> Optional[ResidualBlock]:
    """The block rooted at this sum, if one term is X_k and another depends on it."""
    terms = _terms(root, folded)
    best: Optional[tuple[int, int, fx.Node, fx.Node]] = None
    for term in terms:
        if _broadcast(term, root):
            continue
        stream = _carried(term)
        others = [t for t in terms if t is not term]
        dependent = [t for t in others if g.depends_on(t, stream)]
        if not dependent or any(g.depends_on(stream, t) for t in others):
            continue
        key = (len(dependent), g.order[stream])
        if best is None or key > best[:2]:
            best = (*key, term, stream)
    if best is None:
        return None
    _, _, stream_term, stream = best
    velocity = [t for t in terms if t is not stream_term]
    cone = g.cone(stream, velocity)
    return ResidualBlock(root=root, stream=stream, terms=velocity, cone=cone, cone_set=set(cone))


def _broadcast(term: fx.Node, root: fx.Node) -> bool:
    """A term broadcast up to the sum's shape is a bias (RevIN's ``y * scale + loc``), not X_k.

    X_{k+1} replaces X_k, so the stream has the sum's own shape. Shapes are known on
    export and make_fx graphs (``meta["val"]``); without them every term qualifies.
    """
    term_shape = getattr(term.meta.get("val"), "shape", None)
    root_shape = getattr(root.meta.get("val"), "shape", None)
    return term_shape is not None and root_shape is not None and tuple(term_shape) != tuple(root_shape)


def _form(root: fx.Node, owner: str) -> tuple[Form, Optional[fx.Node]]:
    """Post-LN (LN(X + f(X))) and post-activation (relu(X + f(X))) updates.

    Only a norm or activation applied by the block's own module counts: a model's
    final norm after its last block is not part of that block.
    """
    if len(root.users) != 1:
        return "additive", None
    user = next(iter(root.users))
    if owner and owner not in {path for path, _ in module_stack(user)}:
        return "additive", None
    name = op_name(user)
    if name in _NORMS or (user.op == "call_module" and _module_class_name(user).endswith(_NORM_MODULES)):
        return "post-norm", user
    if name in _NONEXPANSIVE or (user.op == "call_module" and _module_class_name(user) == "ReLU"):
        return "post-activation", user
    return "additive", None


def _module_class_name(node: fx.Node) -> str:
    for path, cls in reversed(module_stack(node)):
        if path == str(node.target):
            return getattr(cls, "__name__", str(cls).rsplit(".", 1)[-1])
    return ""


def _name(blocks: list[ResidualBlock], root_name: str) -> None:
    """Module path of the module whose forward performs the add; disambiguated."""
    for block in blocks:
        block.name = module_path(block.root) or root_name
    counts = Counter(b.name for b in blocks)
    for base, count in counts.items():
        if count == 1:
            continue
        group = [b for b in blocks if b.name == base]
        for block in group:
            child = _branch_child(block, base)
            block.name = f"{base}:{child}" if child else base
        if len({b.name for b in group}) < len(group):
            seen: Counter = Counter()
            for block in group:
                seen[block.name] += 1
                block.name = f"{block.name}#{seen[block.name]}"


def _branch_child(block: ResidualBlock, base: str) -> str:
    """The direct child module of the block's module that produced the velocity."""
    prefix = f"{base}." if base else ""
    for term in block.terms:
        path = module_path(term)
        if path.startswith(prefix) and len(path) > len(prefix):
            return path[len(prefix) :].split(".")[0]
    return ""


def to_networkx(graph: fx.Graph) -> nx.DiGraph:
    """The dataflow graph as a networkx DiGraph (for checks that need graph queries)."""
    dag = nx.DiGraph()
    for node in graph.nodes:
        dag.add_node(node)
        for parent in node.all_input_nodes:
            dag.add_edge(parent, node)
    return dag
