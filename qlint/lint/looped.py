"""QL301-QL303, QL306, QL307: looped (weight-shared) recurrences h <- Ā ⊙ h + f(h, e) (source 003).

A loop is a chain of sums h_{t+1} = Ā ⊙ h_t + f(h_t) (or their normalizations,
h_{t+1} = LN(h_t + f(h_t)): a Post-LN loop) whose steps read the same weights; the carry
Ā must stay in [0, 1) (003 §5; QL301 when shown out, QL306 when not proved), the
increment f must not contain h itself (003 §4), a unit carry leaves no spectral margin
(003 §5.4), and a Post-LN loop lacks the pre-LN block's gain control (003 §8, QL307).
QL304 / QL305 come from the loop probe (:mod:`qlint.probe.loops`), which measures the
recurrence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch
import torch.fx as fx

from qlint.core import domain
from qlint.core.domain import Growth
from qlint.growth.engine import Analysis, source_of
from qlint.core.graph import lifted_constant, module_path, run_cone
from qlint.core.ops import describe
from qlint.growth.propagate import is_buffer, leading
from qlint.core.results import Finding
from qlint.lint.rule import Rule, checker
from qlint.lint.graph_queries import (argument, carried, common_path, constant_value, is_normalizer, normalised_input,
                                     once_per_graph, op)

@dataclass(frozen=True)
class CarrySum:
    """Ā = offset + Σ sign · Π factors: a carry spread over several terms of the state
    (``A*h + B*h``, ``h - c*h``, ``-A*h``, ``A*h*2``); factors are nodes or numbers."""

    terms: tuple[tuple[int, tuple[Any, ...]], ...]
    offset: int

    def factors(self) -> list[Any]:
        return [factor for _, factors in self.terms for factor in factors]


@dataclass(frozen=True)
class Step:
    """One iteration h_{t+1} = Ā ⊙ h_t + f(h_t): its result, state, carry and weights."""

    root: fx.Node  # h_{t+1}
    state: fx.Node  # h_t
    carry: Any  # the factor Ā (a node, a number or a CarrySum); None when Ā = I
    identity: int  # copies of h_t inside the increment f (0 in the increment form)
    weights: frozenset[str]  # parameters and modules the step reads
    post_norm: bool = False  # h_{t+1} = LN(Ā ⊙ h_t + f(h_t)): the root normalises the step's sum


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
        inner = "h + f(h)" if self.step.carry is None else "Ā⊙h + f(h)"
        return f"h <- LN({inner})" if self.step.post_norm else f"h <- {inner}"


@once_per_graph
def find_loops(analysis: Analysis) -> list[Loop]:
    """Every weight-shared recurrence of two or more iterations, in execution order.

    Chain the steps whose state is the previous step's sum and whose weights are the same.

    A sum may read as a step from several of its terms (``h + (x + u)`` with
    ``x = h + e``): the state chosen is the one that continues a chain of equal
    weights, else the earliest computed. The first iteration's state h_0 is not a
    sum (zeros, or the prelude's output); that iteration counts when the first sum
    reads as a step with the chain's weights from one of its terms.
    """
    order = analysis.graph.order
    nodes = analysis.graph.nodes
    dependent = _structural(nodes)
    roots = [node for node in nodes if summed(node) is not None]
    links: dict[fx.Node, Step] = {}  # step root -> the step computing it from an earlier root
    for root in roots:
        terms = _scaled_terms(summed(root), dependent)
        states = {value for _, value, _ in terms if value in links or summed(value) is not None}
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


def summed(node: Any) -> Optional[fx.Node]:
    """The sum a step root adds up: a sum itself, or the sum a normalization wraps (Post-LN, LN(h + f(h))).

    A partial sum whose only use is a larger sum is part of that sum, not a root; a
    normalization is a root only when the sum has no other use (a pre-LN block's
    ``LN(h)`` reads a state that is carried on: not a Post-LN step).
    """
    if not isinstance(node, fx.Node):
        return None
    if _is_sum(node):
        return None if _folded(node) else node
    if is_normalizer(node):
        inner = normalised_input(node)
        if inner is not None and _is_sum(inner) and not _folded(inner) and len(inner.users) == 1:
            return inner
    return None


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
    """The step repeats the one that computed its state: same weights, same form (a final norm after a
    pre-LN loop is not a Post-LN iteration)."""
    previous = links.get(step.state)
    return previous is not None and previous.weights == step.weights and previous.post_norm == step.post_norm


def _opened(first: Step, dependent: set[fx.Node], order: dict) -> bool:
    """The chain's first state was itself computed by an iteration with the same weights."""
    root = first.state
    if summed(root) is None:
        return False
    terms = _scaled_terms(summed(root), dependent)
    steps = (_step(root, value, terms, order) for _, value, _ in terms)
    return any(step is not None and step.weights == first.weights and step.post_norm == first.post_norm
               for step in steps)


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
    """(sign, value, factors): the product of factors ⊙ value when they are computed from parameters only
    (a tuple), else factors None."""
    return [(sign, *_scaled(node, dependent)) for sign, node in _direct_terms(root)]


def _scaled(term: fx.Node, dependent: set[fx.Node]) -> tuple[fx.Node, Optional[tuple]]:
    """Peel parameter-only factors off a product, however nested (``A*h*2``, ``A*(2*h)``)."""
    factors: list[Any] = []
    while op(term) == "mul":
        left, right = argument(term, "input"), argument(term, "other")
        for value, factor in ((left, right), (right, left)):
            constant = isinstance(factor, fx.Node) and factor not in dependent
            number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
            if isinstance(value, fx.Node) and value in dependent and (constant or number):
                factors.append(factor)
                term = carried(value)
                break
        else:
            break
    return term, tuple(factors) if factors else None


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
    own = [(sign, factors) for sign, value, factors in terms if value is state]
    others = [(sign, value) for sign, value, _ in terms if value is not state]
    if not any(_depends_on(value, state, order) for _, value in others):
        return None
    scaled = tuple((sign, factors) for sign, factors in own if factors is not None)
    bare = sum(sign for sign, factors in own if factors is None)  # h itself, a term of the sum
    inner = sum(_copies(value, state, sign) for sign, value in others)  # copies of h inside the increment
    if scaled:
        simple = len(scaled) == 1 and scaled[0][0] == 1 and len(scaled[0][1]) == 1 and bare == 0
        carry, identity = (scaled[0][1][0] if simple else CarrySum(scaled, bare)), inner
    elif bare + inner >= 1:
        carry, identity = None, bare + inner - 1
    else:
        return None
    weights = _weights(cone(state, root, order))
    return Step(root, state, carry, identity, weights, post_norm=not _is_sum(root)) if weights else None


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
#
# The carry is the linear part of the loop map: 003's constrained discretisation keeps
# every entry in (0, 1), so rho(Ā) = max Ā < 1 for every value training gives the
# parameters. The check is made in three steps, on real arithmetic:
#   proved   the value domain (open bounds included) puts every entry in [0, 1);
#   shown    some parameter value (or the constant's own value) gives an entry with
#            |Ā| >= 1: a witness, evaluated on the graph (QL301, an error);
#   else     |Ā| < 1 proved but the sign is not (tanh), or nothing shown either way
#            (QL306, a warning: "cannot show" is not "shown unbounded").
# Buffers and requires_grad=False tensors are constants: checked by their value, and
# named as such. Trainable parameters are free: any real value.

# Each fills one free parameter in turn. Moderate values only: a witness must hold in real
# arithmetic, and float saturation (tanh(30) == 1.0 in float64) is not one.
WITNESS_VALUES = (1.0, 3.0, -1.0, -3.0, 0.0, 0.5, -0.5, 2.0, -2.0)


@dataclass(frozen=True)
class CarryCheck:
    """What qlint proved about a carry: ``verdict`` is proved / shown / negative / unproved."""

    verdict: str
    problem: str = ""


def check_carry(carry: Any, analysis: Analysis) -> CarryCheck:
    """Prove Ā in [0, 1) entrywise, or show a parameter value that puts |Ā| >= 1, or say neither."""
    if isinstance(carry, (int, float)):
        if 0 <= carry < 1:
            return CarryCheck("proved")
        verdict = "negative" if -1 < carry < 0 else "shown"
        return CarryCheck(verdict, f"the constant carry {carry:g} is not in [0, 1)")
    expression = _as_sum(carry)
    leaves: dict[fx.Node, str] = {}
    for factor in expression.factors():
        if isinstance(factor, fx.Node):
            leaves.update(_leaves(carried(factor), analysis))
    what = _what(carry, leaves)
    r = _sum_range(expression, analysis, leaves)
    if r is not None and r.nonneg and domain.strictly_below(r, 1.0):
        return CarryCheck("proved")
    witness = _witness(carry, analysis, leaves)
    if witness is not None:
        return CarryCheck("shown", f"{what} {witness}")
    bound = f" (qlint's bound: {_interval(r)})" if r is not None and r != domain.ANY else ""
    if r is not None and domain.strictly_above(r, -1.0) and domain.strictly_below(r, 1.0):
        return CarryCheck("negative", f"{what} lies in {_interval(r)}: |Ā| < 1, so the linear part contracts, "
                                      "but a negative carry flips the state's sign every step (003 keeps Ā in (0, 1))")
    return CarryCheck("unproved",
                      f"qlint cannot show {what} stays in [0, 1){bound}, nor find a parameter value that takes it out")


def _as_sum(carry: Any) -> CarrySum:
    return carry if isinstance(carry, CarrySum) else CarrySum(((1, (carry,)),), 0)


def carry_value(carry: Any, value_of: Callable[[fx.Node], Any]) -> Optional[torch.Tensor]:
    """Ā in float64 from its factors' values (``value_of`` maps a node to its tensor), None if one is missing."""
    expression = _as_sum(carry)
    total = torch.tensor(float(expression.offset), dtype=torch.float64)
    for sign, factors in expression.terms:
        product = torch.tensor(float(sign), dtype=torch.float64)
        for factor in factors:
            value = value_of(factor) if isinstance(factor, fx.Node) else torch.tensor(float(factor))
            if not isinstance(value, torch.Tensor) or value.is_meta or value.is_complex():
                return None
            product = product * value.detach().double()
        total = total + product
    return total


def _leaves(node: fx.Node, analysis: Analysis) -> dict[fx.Node, str]:
    """The carry's tensor leaves: "parameter" (requires_grad: free, whatever its class), "buffer" (of the
    user's model) or "frozen" (any other tensor with requires_grad=False); the last two are constants."""
    found: dict[fx.Node, str] = {}
    for leaf in _ancestors(node, analysis):
        if leaf.op != "get_attr":
            continue
        try:
            value = analysis.prop.fetch_attr(str(leaf.target))
        except (AttributeError, RuntimeError):
            continue
        if not isinstance(value, torch.Tensor) or lifted_constant(leaf.target):
            continue  # a constant the tracer lifted: the domain reads its value already
        if analysis.prop.is_trainable(str(leaf.target), value):
            found[leaf] = "parameter"
        else:
            found[leaf] = "buffer" if is_buffer(analysis.model, str(leaf.target)) else "frozen"
    return found


def _ancestors(node: fx.Node, analysis: Analysis) -> list[fx.Node]:
    """The nodes computing a parameter expression, in graph order (the input's shapes aside)."""
    data, seen, stack = analysis.graph.data, set(), [node]
    while stack:
        current = stack.pop()
        if current in seen or current in data:
            continue
        seen.add(current)
        stack.extend(current.all_input_nodes)
    return sorted(seen, key=analysis.graph.order.__getitem__)


def _sum_range(expression: CarrySum, analysis: Analysis, leaves: dict[fx.Node, str]) -> Optional[domain.Range]:
    """offset + Σ sign · Π range(factor), by the value domain."""
    total = domain.point(float(expression.offset))
    for sign, factors in expression.terms:
        product = domain.point(float(sign))
        for factor in factors:
            if isinstance(factor, fx.Node):
                r = _proved_range(carried(factor), analysis, leaves)
            else:
                r = domain.point(float(factor))
            if r is None:
                return None
            product = domain.mul(product, r)
        total = domain.add(total, product)
    return total


def _proved_range(node: fx.Node, analysis: Analysis, leaves: dict[fx.Node, str]) -> Optional[domain.Range]:
    """A factor's range from the value domain, with each constant leaf seeded by its own values."""
    ancestors = _ancestors(node, analysis)
    seeds = {}
    for leaf in ancestors:
        if leaves.get(leaf) not in ("buffer", "frozen"):
            continue
        value = analysis.prop.fetch_attr(str(leaf.target)).detach()
        if value.is_meta or value.is_complex() or value.numel() == 0:
            return None
        lo, hi = float(value.double().min()), float(value.double().max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        seeds[leaf] = Growth(0.0, depends=False, range=domain.Range(lo=lo, hi=hi))
    growth = leading(run_cone(analysis.prop, seeds, ancestors, analysis.base)[node])
    return growth.range if growth.known and growth.real is True else None


def _witness(carry: Any, analysis: Analysis, leaves: dict[fx.Node, str]) -> Optional[str]:
    """A parameter value at which some entry of the carry has |Ā| >= 1 (or is infinite), said in words.

    Evaluated in float64 with every leaf cast (a model's float32 or float16 sigmoid saturates to
    exactly 1.0 where the real one does not); NaN, a value outside some op's domain, is no witness.
    """
    free = [leaf for leaf, kind in leaves.items() if kind == "parameter"]
    own = {leaf: analysis.prop.fetch_attr(str(leaf.target)).detach() for leaf in leaves}
    trials: list[tuple[str, dict]] = [("", {})]
    trials += [(f"`{leaf.target}` = {number:g}", {leaf: torch.full_like(own[leaf], number)})
               for number in WITNESS_VALUES for leaf in free]
    for setting, overrides in trials:
        settings = {leaf: value.double() for leaf, value in {**own, **overrides}.items()}
        value = carry_value(carry, lambda node: analysis.graph.evaluate(carried(node), settings))
        if value is None or value.numel() == 0:
            continue
        bad = torch.isinf(value) | (value.abs() >= 1)
        if bool(bad.any()):
            reached = float(value[bad].flatten()[0])
            if not setting:
                return f"holds {reached:.3g} (|Ā| >= 1)"
            if isinstance(carry, fx.Node) and carried(carry) in free:
                return f"is a free parameter: nothing keeps it in [0, 1) (at {setting} it is {reached:.3g})"
            return f"reaches {reached:.3g} (|Ā| >= 1) at {setting}"
    return None


_LEAF_CARRY = {
    "parameter": "the carry `{}`",
    "buffer": "the carry, the buffer `{}` (a constant, checked by value),",
    "frozen": "the carry, the tensor `{}` (requires_grad=False: a constant, checked by value),",
}


def _what(carry: Any, leaves: dict[fx.Node, str]) -> str:
    node = carried(carry) if isinstance(carry, fx.Node) else None
    kind = leaves.get(node) if node is not None else None
    if kind is not None:
        return _LEAF_CARRY[kind].format(node.target)
    constants = [f"`{leaf.target}`" for leaf, k in leaves.items() if k != "parameter"]
    read = f" (the constants {', '.join(constants)} checked by value)" if constants else ""
    spelled = describe(node) if node is not None else _spell(carry)
    return f"the carry `{spelled}`{read}"


def _spell(expression: CarrySum) -> str:
    """offset ± factor·factor ...: the carry as the sum of its terms."""
    def factor(value: Any) -> str:
        return describe(carried(value)) if isinstance(value, fx.Node) else f"{value:g}"

    parts = [str(expression.offset)] if expression.offset else []
    for sign, factors in expression.terms:
        product = "·".join(map(factor, factors))
        parts.append(f"{'-' if sign < 0 else '+'} {product}" if parts else f"{'-' if sign < 0 else ''}{product}")
    return " ".join(parts)


def _interval(r: domain.Range) -> str:
    def end(value: float) -> str:
        return f"{value + 0.0:.6g}"  # + 0.0: no "-0"

    opening = "(" if r.lo_open or math.isinf(r.lo) else "["
    closing = ")" if r.hi_open or math.isinf(r.hi) else "]"
    return f"{opening}{end(r.lo)}, {end(r.hi)}{closing}"


def _carry_now(carry: Any, analysis: Analysis) -> str:
    value = carry_value(carry, lambda node: constant_value(node, analysis))
    if value is None or value.numel() == 0:
        return ""
    return f" (now in [{float(value.min()):.3g}, {float(value.max()):.3g}])"


def _describe(loop: Loop) -> str:
    return f"looped recurrence `{loop.path}` ({loop.iterations} iterations of {loop.form})"


def _carry_findings(analysis: Analysis, rule: Rule, verdicts: tuple[str, ...]) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        carry = loop.step.carry
        if carry is None:
            continue
        check = check_carry(carry, analysis)
        if check.verdict in verdicts:
            yield rule.finding(loop.path, source_of(loop.step.root), loop=_describe(loop), problem=check.problem,
                               now=_carry_now(carry, analysis))


@checker("QL301")
def unconstrained_carry(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    yield from _carry_findings(analysis, rule, ("shown",))


@checker("QL306")
def unproved_carry(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    yield from _carry_findings(analysis, rule, ("negative", "unproved"))


@checker("QL302")
def identity_in_increment(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        copies = loop.step.identity
        if copies > 0:
            carried_as = "Ā + I" if loop.step.carry is not None else f"{copies + 1}·I"
            yield rule.finding(loop.path, source_of(loop.step.root), loop=_describe(loop), carried=carried_as)


@checker("QL303")
def unit_carry(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        step = loop.step
        if step.carry is None and step.identity == 0 and not step.post_norm:
            yield rule.finding(loop.path, source_of(step.root), loop=_describe(loop))


@checker("QL307")
def post_norm_loop(analysis: Analysis, rule: Rule) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        if loop.step.post_norm:
            yield rule.finding(loop.path, source_of(loop.step.root), loop=_describe(loop))
