"""QL301-QL305: looped (weight-shared) recurrences h <- Ā ⊙ h + f(h, e) (source 003).

A looped transformer applies one block, with the same parameters, to its own
output: the state h_t goes through the same map G(h) = Ā ⊙ h + f(h, e) at every
iteration. In the graph that is a chain of *steps*, sums whose terms are the
state (bare, or scaled by a factor computed from parameters only: the carry Ā)
and an increment computed from that state, each step's state being the previous
step's result and every step reading the same parameters. The plain weight-shared
residual h <- h + f(h) is the case Ā = I.

The static checks look at the linear part of G: a carry that can leave (0, 1)
(QL301), an increment that contains h itself so the carry becomes Ā + I (QL302),
and the unit carry Ā = I (QL303). Whether the full map contracts is measured by
``qlint probe --loop`` (:mod:`qlint.loop_probe`), which reports QL304 and QL305.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch.fx as fx

from qlint.analysis import Analysis, source_of
from qlint.growth import NONPOS
from qlint.propagate import describe, leading
from qlint.report import Finding
from qlint.rules.checks import Rule, check, define
from qlint.rules.checks.placement import carried, common_path, constant_value, data_dependent
from qlint.rules.primitives.handwritten_norms import op_name
from qlint.trace import module_path

UNCONSTRAINED_CARRY = define(
    Rule(
        code="QL301",
        name="unconstrained-carry",
        severity="error",
        summary="""
            A looped recurrence h <- Ā ⊙ h + f(h, e) whose carry Ā is not constrained
            to (0, 1): a raw parameter (or a constant outside (0, 1), or an expression
            qlint cannot bound) instead of a parameterization such as
            exp(-Δ·exp(log_A)), sigmoid(a) or tanh(a).
        """,
        rationale="""
            The carry is the linear part of the loop map; rho(Ā) < 1 is what Parcae's
            constrained discretization guarantees by construction (source 003,
            Sections 3 and 7.1). A free carry is fine at a small learning rate, but
            gradient descent drives it past 1 at higher ones: in 003's Table 6 a free
            scalar carry reached rho = 1.20 at lr = 3e-2 and 1.84 at lr = 1e-1, with the
            state norm exploding to ~9,570 while the loss stayed finite (the coda's
            LayerNorm hides it). The constraint is low-cost: training leaves the carry
            at rest (003, Section 7).
        """,
        example="""
            self.A = nn.Parameter(torch.full((d,), 0.5))
            for _ in range(n_loops):
                h = self.A * h + self.block(h + e)
        """,
        remedy="""
            Parameterize the carry so it stays in (0, 1) whatever the optimizer does:

                self.log_A = nn.Parameter(torch.full((d,), math.log(-math.log(0.5))))
                A = torch.exp(-dt * torch.exp(self.log_A))      # Parcae / S4 discretization
        """,
    )
)

IDENTITY_IN_INCREMENT = define(
    Rule(
        code="QL302",
        name="identity-in-increment",
        severity="error",
        summary="""
            A looped recurrence whose increment f contains the state itself,
            f(h) = h + u(h) (typically the whole block output Block(h + e)), so the
            recurrence carries (Ā + I) ⊙ h instead of Ā ⊙ h.
        """,
        rationale="""
            Folding the block's own residual path into f puts the identity in twice:
            the diagonal of the carried part becomes Ā + I, with entries above 1, an
            expansive linear part. Its Jacobian I + ∂u/∂h has norm >= ||∂u/∂h|| - 1 and is
            generically non-contractive (source 003, Section 3 and Appendix A). The
            increment form f(h, e) = Block(h + e) - (h + e) is what keeps the recurrence
            contractive: the block's identity path is carried by Ā ⊙ h alone.
        """,
        example="""
            for _ in range(n_loops):
                h = A * h + self.block(h + e)         # block returns x + attn(...) + mlp(...)
        """,
        remedy="""
            Feed the recurrence the block's increment, not its output:

                x = h + e
                h = A * h + (self.block(x) - x)       # or have the block return only its updates
        """,
    )
)

UNIT_CARRY = define(
    Rule(
        code="QL303",
        name="unit-carry-loop",
        severity="warning",
        summary="""
            A plain weight-shared residual loop h <- h + f(h, e) (ALBERT / Universal
            Transformer style): the carry is Ā = I, rho(Ā) = 1.
        """,
        rationale="""
            The spectral margin 1 - rho_spec(J_G) of a looped recurrence shrinks as the
            carry approaches 1: 0.159 at rho = 0.3 down to 0.012 at rho = 0.95 over
            10 random seeds (source 003, Table 4), and 2 in 10 initializations never
            settle from rho = 0.7. With Ā = I the linear part gives no margin at all;
            convergence rests entirely on the block's LayerNorm gain control.
        """,
        example="""
            for _ in range(n_loops):
                h = h + self.block(h + e)
        """,
        remedy="""
            Add a constrained carry below 1:

                A = torch.exp(-torch.exp(self.log_A))
                h = A * h + self.block(h + e)

            and measure the margin with `qlint probe --loop`.
        """,
    )
)

THIN_SPECTRAL_MARGIN = define(
    Rule(
        code="QL304",
        name="thin-spectral-margin",
        severity="warning",
        summary="""
            Reported by `qlint probe --loop`: at the fixed point the loop reaches from
            the example input, the spectral radius of the loop map's Jacobian leaves a
            margin 1 - rho_spec(J_G) below 0.05 (or none at all).
        """,
        rationale="""
            The asymptotic convergence rate of the loop is rho_spec(J_G), not the carry
            and not the operator norm: J_G is non-normal, ||J_G||_2 > 1 at every
            converged instance at low carry while rho_spec < 1 (source 003, Tables 3
            and 4). The true stability budget is the spectral margin; when it is thin,
            each extra iteration refines h by a factor close to 1, and a small drift in
            training tips it over.
        """,
        example="""
            A = torch.exp(-torch.exp(self.log_A))     # initialised at rho = 0.99
            h = A * h + self.block(h + e)
        """,
        remedy="""
            Lower the carry's initialization (003: the margin is widest at low carry),
            monitor max(Ā) during training, not its mean (003, Section 5.4), and keep
            the block pre-normalised (its LayerNorm supplies the gain control).
        """,
    )
)

UNSETTLED_LOOP = define(
    Rule(
        code="QL305",
        name="unsettled-loop",
        severity="warning",
        summary="""
            Reported by `qlint probe --loop`: iterating the loop map from the example
            input does not settle; the residual ||G(h) - h|| neither reaches the
            tolerance nor keeps shrinking (a bounded non-convergent orbit), or the
            state diverges.
        """,
        rationale="""
            A constrained carry bounds the linear part of G but does not certify that
            the full recurrence converges: 1 to 2 of 10 random initializations of a
            constrained pre-LN looped block stay on a bounded orbit with relative
            residual 1e-4 to 1e-1 after 2e4 iterations (source 003, Table 4). The
            right diagnostic is the loop's own convergence, not rho(Ā) < 1 alone.
        """,
        example="""
            A = self.A                                # free carry grown past 1
            h = A * h + self.block(h + e)
        """,
        remedy="""
            Constrain the carry (QL301), keep the increment form (QL302), and check the
            block's initialization: re-run `qlint probe --loop` with other seeds.
        """,
    )
)


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
        _FOUND[graph] = _find_loops(graph, analysis)
    return _FOUND[graph]


def _find_loops(graph: fx.Graph, analysis: Analysis) -> list[Loop]:
    """Chain the steps whose state is the previous step's sum and whose weights are the same.

    A sum may read as a step from several of its terms (``h + (x + u)`` with
    ``x = h + e``): the state chosen is the one that continues a chain of equal
    weights, else the earliest computed. The first iteration's state h_0 is not a
    sum (zeros, or the prelude's output); that iteration counts when the first sum
    reads as a step with the chain's weights from one of its terms.
    """
    order = {node: i for i, node in enumerate(graph.nodes)}
    dependent = data_dependent(graph)
    sums = [node for node in graph.nodes if _is_sum(node) and not _folded(node)]
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
    return node.op in ("call_function", "call_method") and op_name(node) in ("add", "sub", "iadd")


def _folded(node: fx.Node) -> bool:
    """A partial sum or negation whose only use is a larger sum: part of that sum's terms."""
    return len(node.users) == 1 and _is_sum(next(iter(node.users)))


def _direct_terms(root: fx.Node) -> list[tuple[int, fx.Node]]:
    """The signed terms of a sum, through its folded partial sums, casts and reshapes."""
    if "alpha" in root.kwargs:
        return []
    terms = []
    for operand, sign in zip(root.args[:2], (1, -1 if op_name(root) == "sub" else 1)):
        if not isinstance(operand, fx.Node):
            continue
        operand = carried(operand)
        if _folded(operand) and _is_sum(operand):
            terms.extend((sign * inner, node) for inner, node in _direct_terms(operand))
        elif _folded(operand) and op_name(operand) == "neg":
            terms.append((-sign, carried(operand.args[0])))
        else:
            terms.append((sign, operand))
    return terms


def _scaled_terms(root: fx.Node, dependent: set[fx.Node]) -> list[tuple[int, fx.Node, Any]]:
    """(sign, value, factor): factor ⊙ value when the factor is computed from parameters only, else factor None."""
    return [(sign, *_scaled(node, dependent)) for sign, node in _direct_terms(root)]


def _scaled(term: fx.Node, dependent: set[fx.Node]) -> tuple[fx.Node, Any]:
    if op_name(term) == "mul" and len(term.args) == 2:
        for value, factor in (term.args, term.args[::-1]):
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
        second = -sign if op_name(node) == "sub" else sign
        return _copies(node.args[0], state, sign) + _copies(node.args[1], state, second)
    if op_name(node) == "neg":
        return _copies(node.args[0], state, -sign)
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

_VIEWS = {"view", "reshape", "_unsafe_view", "expand", "expand_as", "unsqueeze", "squeeze", "to", "float", "double",
          "type_as", "_to_copy", "contiguous", "clone", "alias", "detach", "flatten", "unflatten", "getitem", "select", "t"}
_SQUASHING = {"sigmoid", "tanh"}  # |output| < 1 whatever the input


def carry_problem(carry: Any, analysis: Analysis) -> Optional[str]:
    """Why the carry can leave (0, 1), or None when its parameterization keeps it there."""
    if isinstance(carry, (int, float)):
        return None if 0 <= carry < 1 else f"the constant carry {carry:g} is not in [0, 1)"
    node = carry
    while op_name(node) in _VIEWS and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    name = op_name(node)
    if node.op in ("get_attr", "placeholder"):
        return f"the carry `{node.target}` is a free parameter: nothing keeps it in (0, 1)"
    if name in _SQUASHING:
        return None
    if name == "exp" and isinstance(node.args[0], fx.Node):
        if leading(analysis.interpreter.constants[node.args[0]]).sign == NONPOS:
            return None
        return "the carry is exp of an argument qlint cannot show is <= 0"
    if name == "mul" and all(isinstance(a, (fx.Node, int, float)) for a in node.args[:2]):
        if all(carry_problem(a, analysis) is None for a in node.args[:2]):
            return None
    return f"qlint cannot show the carry (`{describe(node)}`) stays in (0, 1)"


def _carry_range(carry: Any, analysis: Analysis) -> str:
    value = constant_value(carry, analysis)
    if value is None or value.numel() == 0:
        return ""
    return f" (now in [{float(value.min()):.3g}, {float(value.max()):.3g}])"


def _describe(loop: Loop) -> str:
    return f"looped recurrence `{loop.path}` ({loop.iterations} iterations of {loop.form})"


@check("QL301")
def unconstrained_carry(analysis: Analysis) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        carry = loop.step.carry
        problem = None if carry is None else carry_problem(carry, analysis)
        if problem:
            yield Finding(
                "QL301",
                "error",
                f"{_describe(loop)}: {problem}{_carry_range(carry, analysis)}; use Ā = exp(-Δ·exp(log_A))",
                loop.path,
                source_of(loop.step.root),
            )


@check("QL302")
def identity_in_increment(analysis: Analysis) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        copies = loop.step.identity
        if copies > 0:
            carried_as = "Ā + I" if loop.step.carry is not None else f"{copies + 1}·I"
            yield Finding(
                "QL302",
                "error",
                f"{_describe(loop)}: the increment contains h itself, so the state is carried by {carried_as} "
                "(expansive); feed the recurrence Block(x) - x",
                loop.path,
                source_of(loop.step.root),
            )


@check("QL303")
def unit_carry(analysis: Analysis) -> Iterable[Finding]:
    for loop in find_loops(analysis):
        step = loop.step
        if step.carry is None and step.identity == 0:
            yield Finding(
                "QL303",
                "warning",
                f"{_describe(loop)}: the carry is I (rho = 1), no spectral margin from the linear part; "
                "add a constrained carry and measure with `qlint probe --loop`",
                loop.path,
                source_of(step.root),
            )
