"""QL301-QL303: looped (weight-shared) recurrences h <- Ā ⊙ h + f(h, e) (source 003).

A loop is a chain of sums h_{t+1} = Ā ⊙ h_t + f(h_t) whose steps read the same weights;
the carry Ā must stay in (0, 1) (003 §5), the increment f must not contain h itself
(003 §4), and a unit carry leaves no spectral margin (003 §5.4). QL304 / QL305 come from
the loop probe (:mod:`qlint.probe.loops`), which measures the recurrence.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch.fx as fx

from qlint.core.engine import Analysis, source_of
from qlint.core.graph import module_path
from qlint.core.ops import describe
from qlint.core.propagate import leading
from qlint.core.results import Finding
from qlint.lint.rule import checker, rule
from qlint.lint.graph_queries import argument, carried, common_path, constant_value, family, op

@dataclass(frozen=True)
class Step:
    """One iteration h_{t+1} = Ā ⊙ h_t + f(h_t): its result, state, carry and weights."""

    root: fx.Node  # h_{t+1}
    state: fx.Node  # h_t
    carry: Any  # the factor Ā (a node or a number); None when Ā = I
    identity: int  # copies of h_t inside the increment f (0 in the increment form)
    weights: frozenset[str]  # parameters and modules the step reads


@dataclass
class Loop:
    """A chain of steps sharing their weights: one looped recurrence.

    ``steps[-1]`` is read from the previous iteration's sum, so its state, carry and
    increment are unambiguous: the checks and the probe use it.
    """

    path: str  # module path of the shared body
    steps: list[Step]
    iterations: int

    @property
    def step(self) -> Step:
        return self.steps[-1]

    @property
    def form(self) -> str:
        return "h <- h + f(h)" if self.step.carry is None else "h <- Ā⊙h + f(h)"


_FOUND: "weakref.WeakKeyDictionary[fx.Graph, list[Loop]]" = weakref.WeakKeyDictionary()


def find_loops(analysis: Analysis) -> list[Loop]:
    """Every weight-shared recurrence of two or more iterations, in execution order (once per graph)."""
    graph = analysis.traced.graph
    if graph not in _FOUND:
        _FOUND[graph] = _find_loops(analysis)
    return _FOUND[graph]


def _find_loops(analysis: Analysis) -> list[Loop]:
    """Chain the steps whose state is the previous step's sum and whose weights are the same.

    A sum may read as a step from several of its terms (``h + (x + u)`` with
    ``x = h + e``): the state chosen is the one that continues a chain of equal
    weights, else the earliest computed. The first iteration's state h_0 is not a
    sum (zeros, or the prelude's output); that iteration counts when the first sum
    reads as a step with the chain's weights from one of its terms.
    """
    order = analysis.graph.order
    nodes = analysis.graph.nodes
    dependent = _structural(nodes)
    sums = [node for node in nodes if _is_sum(node) and not _folded(node)]
    links: dict[fx.Node, Step] = {}  # sum -> the step computing it from an earlier sum
    for root in sums:
        terms = _scaled_terms(root, dependent)
        states = {value for _, value, _ in terms if value in links or _is_sum(value)}
        options = [step for step in (_step(root, state, terms, order) for state in states) if step is not None]
        if options:
            links[root] = max(options, key=lambda step: (_continues(step, links), -order[step.state]))
    following = {links[step.state].root: step for step in links.values() if _continues(step, links)}
    loops = []
    for root in sorted(set(links) - {step.root for step in following.values()}, key=order.__getitem__):
        chain = [links[root]]
        while chain[-1].root in following:
            chain.append(following[chain[-1].root])
        iterations = len(chain) + _opened(chain[0], dependent, order)
        if iterations >= 2:
            body = _body_path(cone(chain[-1].state, chain[-1].root, order))
            loops.append(Loop(body or type(analysis.model).__name__, chain, iterations))
    return loops


def _structural(nodes: list[fx.Node]) -> set[fx.Node]:
    """Nodes computed from the inputs along any edge but shape queries.

    Structure, not values: the loop's first state ``zeros_like(e)`` carries no value of
    the input, but it is the state the first iteration reads.
    """
    dependent: set[fx.Node] = set()
    for node in nodes:
        if "qlint" in node.meta and node.meta["qlint"].meta_output:
            continue
        if node.op == "placeholder" or any(parent in dependent for parent in node.all_input_nodes):
            dependent.add(node)
    return dependent


def _continues(step: Step, links: dict[fx.Node, Step]) -> bool:
    previous = links.get(step.state)
    return previous is not None and previous.weights == step.weights


def _opened(first: Step, dependent: set[fx.Node], order: dict) -> bool:
    """The chain's first state was itself computed by an iteration with the same weights."""
    root = first.state
    if not _is_sum(root):
        return False
    terms = _scaled_terms(root, dependent)
    steps = (_step(root, value, terms, order) for _, value, _ in terms)
    return any(step is not None and step.weights == first.weights for step in steps)


def _is_sum(node: fx.Node) -> bool:
    return op(node) in ("add", "sub")


def _folded(node: fx.Node) -> bool:
    """A partial sum or negation whose only use is a larger sum: part of that sum's terms."""
    return len(node.users) == 1 and _is_sum(next(iter(node.users)))


def _direct_terms(root: fx.Node) -> list[tuple[int, fx.Node]]:
    """The signed terms of a sum, through its folded partial sums, casts and reshapes."""
    if "alpha" in root.kwargs:
        return []
    terms = []
    for operand, sign in zip((argument(root, "input"), argument(root, "other")), (1, -1 if op(root) == "sub" else 1)):
        if not isinstance(operand, fx.Node):
            continue
        operand = carried(operand)
        if _folded(operand) and _is_sum(operand):
            terms.extend((sign * inner, node) for inner, node in _direct_terms(operand))
        elif _folded(operand) and op(operand) == "neg":
            terms.append((-sign, carried(argument(operand, "input"))))
        else:
            terms.append((sign, operand))
    return terms


def _scaled_terms(root: fx.Node, dependent: set[fx.Node]) -> list[tuple[int, fx.Node, Any]]:
    """(sign, value, factor): factor ⊙ value when the factor is computed from parameters only, else factor None."""
    return [(sign, *_scaled(node, dependent)) for sign, node in _direct_terms(root)]


def _scaled(term: fx.Node, dependent: set[fx.Node]) -> tuple[fx.Node, Any]:
    if op(term) == "mul":
        for value, factor in ((argument(term, "input"), argument(term, "other")), (argument(term, "other"), argument(term, "input"))):
            constant = isinstance(factor, fx.Node) and factor not in dependent
            number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
            if isinstance(value, fx.Node) and value in dependent and (constant or number):
                return carried(value), factor
    return term, None


def _copies(node: Any, state: fx.Node, sign: int = 1) -> int:
    """How many times ``state`` enters ``node`` additively (through every sum, with signs)."""
    if not isinstance(node, fx.Node):
        return 0
    node = carried(node)
    if node is state:
        return sign
    if _is_sum(node) and "alpha" not in node.kwargs:
        second = -sign if op(node) == "sub" else sign
        return _copies(argument(node, "input"), state, sign) + _copies(argument(node, "other"), state, second)
    if op(node) == "neg":
        return _copies(argument(node, "input"), state, -sign)
    return 0


def _step(root: fx.Node, state: Any, terms: list, order: dict) -> Optional[Step]:
    """``root`` read as Ā ⊙ state + f(state): some other term depends on the state, and weights are read."""
    if not isinstance(state, fx.Node):
        return None
    own = [(sign, factor) for sign, value, factor in terms if value is state]
    others = [(sign, value) for sign, value, _ in terms if value is not state]
    if not any(_depends_on(value, state, order) for _, value in others):
        return None
    factors = [factor for _, factor in own if factor is not None]
    bare = sum(sign for sign, factor in own if factor is None) + sum(_copies(value, state, sign) for sign, value in others)
    if factors:
        carry, identity = factors[0], bare
    elif bare >= 1:
        carry, identity = None, bare - 1
    else:
        return None
    weights = _weights(cone(state, root, order))
    return Step(root, state, carry, identity, weights) if weights else None


def _depends_on(node: fx.Node, source: fx.Node, order: dict) -> bool:
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current is source:
            return True
        if current in seen or order[current] <= order[source]:
            continue
        seen.add(current)
        stack.extend(current.all_input_nodes)
    return False


def cone(state: fx.Node, root: fx.Node, order: dict) -> list[fx.Node]:
    """The nodes that compute ``root`` from ``state``, in execution order (state excluded)."""
    region, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node in region or order[node] <= order[state]:
            continue
        region.add(node)
        stack.extend(node.all_input_nodes)
    reached, result = {state}, []
    for node in sorted(region, key=order.__getitem__):
        if any(parent in reached for parent in node.all_input_nodes):
            reached.add(node)
            result.append(node)
    return result


def _weights(nodes: list[fx.Node]) -> frozenset[str]:
    """The parameters and modules a step reads (get_attr and call_module targets)."""
    found = set()
    for node in nodes:
        if node.op == "call_module":
            found.add(str(node.target))
        found.update(str(p.target) for p in node.all_input_nodes if p.op == "get_attr")
    return frozenset(found)


def _body_path(nodes: list[fx.Node]) -> str:
    """The module applied at every iteration: the common prefix of the step's module paths.

    Nodes of the loop's own module (the sums, the carry product) have no path of
    their own and do not count.
    """
    return common_path([path for path in map(module_path, nodes) if path])


# --- the carry ------------------------------------------------------------------------------

def carry_problem(carry: Any, analysis: Analysis) -> Optional[str]:
    """Why the carry can leave (0, 1), or None when its parameterization keeps it there."""
    if isinstance(carry, (int, float)):
        return None if 0 <= carry < 1 else f"the constant carry {carry:g} is not in [0, 1)"
    node = carried(carry)
    kind = op(node)
    if node.op in ("get_attr", "placeholder"):
        return f"the carry `{node.target}` is a free parameter: nothing keeps it in (0, 1)"
    if "squashing" in family(node):
        return None
    if kind == "exp" and isinstance(argument(node, "input"), fx.Node):
        if leading(analysis.base[argument(node, "input")]).range.nonpos:
            return None
        return "the carry is exp of an argument qlint cannot show is <= 0"
    if kind == "mul" and all(isinstance(a, (fx.Node, int, float)) for a in (argument(node, "input"), argument(node, "other"))):
        if all(carry_problem(a, analysis) is None for a in (argument(node, "input"), argument(node, "other"))):
            return None
    return f"qlint cannot show the carry (`{describe(node)}`) stays in (0, 1)"


def _carry_range(carry: Any, analysis: Analysis) -> str:
    value = constant_value(carry, analysis)
    if value is None or value.numel() == 0:
        return ""
    return f" (now in [{float(value.min()):.3g}, {float(value.max()):.3g}])"


def _describe(loop: Loop) -> str:
    return f"looped recurrence `{loop.path}` ({loop.iterations} iterations of {loop.form})"


@checker("QL301")
def unconstrained_carry(analysis: Analysis) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        carry = loop.step.carry
        problem = None if carry is None else carry_problem(carry, analysis)
        if problem:
            yield rule("QL301").finding(loop.path, source_of(loop.step.root), loop=_describe(loop), problem=problem,
                                        now=_carry_range(carry, analysis))


@checker("QL302")
def identity_in_increment(analysis: Analysis) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        copies = loop.step.identity
        if copies > 0:
            carried_as = "Ā + I" if loop.step.carry is not None else f"{copies + 1}·I"
            yield rule("QL302").finding(loop.path, source_of(loop.step.root), loop=_describe(loop), carried=carried_as)


@checker("QL303")
def unit_carry(analysis: Analysis) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        step = loop.step
        if step.carry is None and step.identity == 0:
            yield rule("QL303").finding(loop.path, source_of(step.root), loop=_describe(loop))
