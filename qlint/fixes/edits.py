"""Remedies as concrete-syntax edits of the user's file (libcst: comments and formatting kept).

A graph remedy (:mod:`qlint.remedies.plans`) names fx nodes; each node remembers the line of the
user's ``forward`` that created it. A source edit finds, at that line, the one expression that
built the node (``self.mixer(x)`` for a call of submodule ``mixer``, ``F.silu(z)``, ``h ** 3``)
and rewrites it; a norm a remedy adds becomes a submodule assigned at the end of the enclosing
class's ``__init__``, its width written as the constructor argument that gave a layer of the class the
traced width. Where the expression cannot be found exactly once, the edit is not made and the reason is
kept: nothing here is trusted to be right,
every patched file is re-analysed (:mod:`qlint.fixes.recheck`) before anyone sees it.

One ``@source_edit("kind")`` function per remedy kind, keyed like the planners; a kind without
one is reported as "no source edit for this kind yet".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import libcst as cst
import torch
import torch.fx as fx
from libcst.metadata import MetadataWrapper, PositionProvider

from qlint.growth.engine import source_of
from qlint.core.graph import facts, module_path
from qlint.core.ops import op_name
from qlint.remedies.context import BlockContext
from qlint.remedies.surgery import NotApplicable


class EditError(Exception):
    """A remedy that cannot be written as a source edit; the message says why."""


Rewrite = Callable[[cst.BaseExpression, "Names"], cst.BaseExpression]


@dataclass(frozen=True)
class Names:
    """How the edited module spells torch, torch.nn and torch.nn.functional."""

    torch: str
    nn: str
    functional: str


@dataclass(frozen=True)
class ExpressionEdit:
    """Rewrite the expression that built ``node`` at ``line`` of ``file``."""

    file: Path
    line: int
    node: fx.Node
    rewrite: Rewrite


@dataclass(frozen=True)
class Submodule:
    """``self.<attr> = <norm>(<width>)`` at the end of ``__init__`` of the class that holds ``line``. The
    width is written as the constructor argument that gave one of ``layers`` (the class's own layers whose
    width is the traced one: (attribute of the layer, attribute holding the width, argument position)),
    so every instantiation of the class gets its own width."""

    file: Path
    line: int
    attr: str
    norm: str
    width: int
    layers: tuple[tuple[str, str, int], ...]

    def constructor(self, names: Names, init: cst.FunctionDef) -> str:
        return f"{names.nn}.{self.norm}({_width_argument(init, self)})"


@dataclass
class FileEdit:
    """Every change a remedy makes to one file."""

    expressions: list[ExpressionEdit] = field(default_factory=list)
    submodules: list[Submodule] = field(default_factory=list)

    def __add__(self, other: FileEdit) -> FileEdit:
        """Both remedies' changes, made in one pass (their lines are the original file's)."""
        return FileEdit(self.expressions + other.expressions, self.submodules + other.submodules)


Planner = Callable[[BlockContext, Path], list]
SOURCE_EDITS: dict[str, Planner] = {}


def source_edit(kind: str) -> Callable[[Planner], Planner]:
    """Register the decorated function as the source edit of remedy ``kind``."""

    def register(planner: Planner) -> Planner:
        SOURCE_EDITS[kind] = planner
        return planner

    return register


def edits_for(context: BlockContext, kind: str, root: Path) -> dict[Path, FileEdit]:
    """The edits of remedy ``kind`` for the block, grouped by file; EditError says why there are none."""
    if kind not in SOURCE_EDITS:
        raise EditError(f"no source edit for remedy kind {kind!r} yet")
    try:
        changes = SOURCE_EDITS[kind](context, root)
    except NotApplicable as exc:
        raise EditError(str(exc)) from None
    grouped: dict[Path, FileEdit] = {}
    for change in changes:
        edit = grouped.setdefault(change.file, FileEdit())
        (edit.expressions if isinstance(change, ExpressionEdit) else edit.submodules).append(change)
    return grouped


# --- where a node was written ---------------------------------------------------------------


INSTALLED = {"site-packages", "dist-packages"}  # the folders installed packages live in


def place(node: fx.Node, root: Path) -> tuple[Path, int]:
    """The file (absolute) and line of the user's code that created ``node``; EditError for library code."""
    source = source_of(node)
    if source is None:
        raise EditError(f"`{node.name}` has no source line")
    path = Path(source.file)
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    installed = [i for i, part in enumerate(path.parts) if part in INSTALLED]
    if installed or not path.is_relative_to(root):  # a virtual environment inside the repository is not yours
        shown = "/".join(path.parts[installed[-1] + 1 :]) if installed else source.file
        raise EditError(f"`{shown}` is library code: qlint patches only files in your repository ({root})")
    return path, source.line


def _expression(context: BlockContext, node: fx.Node, root: Path, rewrite: Rewrite) -> ExpressionEdit:
    file, line = place(node, root)
    return ExpressionEdit(file, line, node, rewrite)


def _submodule(context: BlockContext, node: fx.Node, root: Path, attr: str, width_of: fx.Node) -> Submodule:
    file, line = place(node, root)
    width = context.size(width_of)
    if not width.isdigit():
        raise EditError(f"the width of `{width_of.name}` is unknown (no traced shape)")
    owner = _owner(context.analysis.model, module_path(node) or "", file, line)
    held = list(owner.named_children())  # and the layers of an nn.Sequential it holds
    held += [(f"{name}.{inner}", layer) for name, child in owner.named_children()
             if isinstance(child, torch.nn.Sequential) for inner, layer in child.named_children()]
    layers = tuple((name, attribute, position) for name, child in held
                   for attribute, position in _WIDTH_ARGUMENTS.items()
                   if _last(getattr(child, attribute, None)) == int(width))
    return Submodule(file, line, attr, context.norm, int(width), layers)


# the attribute of a torch.nn layer that holds a width, and the position of the constructor argument that sets it
_WIDTH_ARGUMENTS = {"in_features": 0, "out_features": 1, "in_channels": 0, "out_channels": 1, "embedding_dim": 1,
                    "num_features": 0, "normalized_shape": 0, "num_channels": 1}


def _last(width: object) -> object:
    return width[-1] if isinstance(width, (tuple, list)) and width else width


def _owner(model: Any, path: str, file: Path, line: int) -> Any:
    """The module on ``path`` (innermost first) whose class is written around ``line`` of ``file``."""
    import inspect

    parts = path.split(".") if path else []
    for end in range(len(parts), -1, -1):
        module = model.get_submodule(".".join(parts[:end]))
        try:
            lines, start = inspect.getsourcelines(type(module))
            source = Path(inspect.getsourcefile(type(module)) or "").resolve()
        except (OSError, TypeError):
            continue
        if source == file and start <= line < start + len(lines):
            return module
    raise EditError(f"no module of the model has its class written around {file.name}:{line}")


def _width_argument(init: cst.FunctionDef, sub: Submodule) -> str:
    """The expression of ``__init__``'s arguments that one of ``sub.layers`` was built with (a number only
    when ``__init__`` takes no argument: then every instance has the same widths); EditError otherwise."""
    parameters = [*init.params.params, *init.params.kwonly_params, *init.params.posonly_params]
    names = {p.name.value for p in parameters[1:]}
    fixed = not names and not isinstance(init.params.star_arg, cst.Param) and init.params.star_kwarg is None
    built = _layers_built(init)
    code = cst.Module([]).code_for_node
    for layer, attribute, position in sub.layers:
        call = built.get(layer)
        arguments = [a for a in call.args if a.keyword is None] if call is not None else []
        keyword = next((a for a in call.args if a.keyword is not None and a.keyword.value == attribute), None) \
            if call is not None else None
        argument = keyword or (arguments[position] if position < len(arguments) else None)
        if argument is None:
            continue
        used = {n.value for n in _names_in(argument.value)}
        if (used and used <= names) or (not used and fixed):
            return code(argument.value)
    raise EditError(f"the norm's width {sub.width} is not written from `__init__`'s arguments in any layer the class "
                    "builds: a number would break every other instantiation of the class")


def _layers_built(init: cst.FunctionDef) -> dict[str, cst.Call]:
    """``self.<name> = <call>`` (also ``self.a, self.b = A(...), B(...)``) at the top level of ``__init__``;
    the layers an ``nn.Sequential(...)`` call lists as ``<name>.<i>``."""
    built: dict[str, cst.Call] = {}
    body = init.body.body if isinstance(init.body, cst.IndentedBlock) else ()
    for line in body:
        for small in getattr(line, "body", ()) if isinstance(line, cst.SimpleStatementLine) else ():
            if not isinstance(small, cst.Assign) or len(small.targets) != 1:
                continue
            target, value = small.targets[0].target, small.value
            pairs = (zip(target.elements, value.elements) if isinstance(target, cst.Tuple)
                     and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements)
                     else [(target, value)])
            for left, right in pairs:
                left, right = (e.value if isinstance(e, cst.Element) else e for e in (left, right))
                if (isinstance(left, cst.Attribute) and isinstance(left.value, cst.Name)
                        and left.value.value == "self" and isinstance(right, cst.Call)):
                    built[left.attr.value] = right
                    if _callee(right) == "Sequential":
                        built.update({f"{left.attr.value}.{i}": a.value for i, a in enumerate(right.args)
                                      if a.keyword is None and isinstance(a.value, cst.Call)})
    return built


def _names_in(expression: cst.BaseExpression) -> list[cst.Name]:
    found: list[cst.Name] = []

    class Collect(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            found.append(node)

    expression.visit(Collect())
    return found


# --- the rewrites ---------------------------------------------------------------------------


def _call(function: str, *arguments: cst.BaseExpression, keywords: str = "") -> cst.BaseExpression:
    """``function(arguments..., keywords)`` built around existing expressions (their comments stay)."""
    call = cst.parse_expression(f"{function}(_{', ' + keywords if keywords else ''})")
    assert isinstance(call, cst.Call)
    args = [cst.Arg(a) for a in arguments] + list(call.args[1:])
    return call.with_changes(args=args)


def _operand(expression: cst.BaseExpression, names: Names) -> cst.BaseExpression:
    """The value an elementwise primitive acts on: ``h`` of ``h ** 3``, ``f(h)``, ``h.f()`` or ``h.pow(3)``."""
    if isinstance(expression, cst.BinaryOperation):
        return expression.left
    if isinstance(expression, cst.Call):
        if isinstance(expression.func, cst.Attribute) and _is_method(expression, names):
            return expression.func.value
        if expression.args:
            return expression.args[0].value
    raise EditError("the primitive's operand is not a plain call or power")


def wrap_with(attr: str) -> Rewrite:
    return lambda expression, names: _call(f"self.{attr}", expression)


def wrap_argument(reader: fx.Node, index: int, function: Callable[[Names], str], keywords: str = "") -> Rewrite:
    """Wrap the ``index``-th tensor operand of the call that built ``reader`` (the receiver of a
    method call is operand 0)."""
    operand = reader.args[index]

    def rewrite(expression: cst.BaseExpression, names: Names) -> cst.BaseExpression:
        def wrap(value: cst.BaseExpression) -> cst.BaseExpression:
            return _wrap_traced(value, operand, lambda v: _call(function(names), v, keywords=keywords))

        if isinstance(expression, cst.BinaryOperation):
            side = "left" if index == 0 else "right"
            return expression.with_changes(**{side: wrap(getattr(expression, side))})
        if not isinstance(expression, cst.Call):
            raise EditError("the reader is not a call")
        receiver = isinstance(expression.func, cst.Attribute) and _is_method(expression, names)
        if receiver and index == 0:
            func = expression.func
            assert isinstance(func, cst.Attribute)
            return expression.with_changes(func=func.with_changes(value=wrap(func.value)))
        position = index - 1 if receiver else index
        if position >= len(expression.args) or expression.args[position].keyword is not None:
            raise EditError("the stream is not a positional argument of the call")
        args = list(expression.args)
        args[position] = args[position].with_changes(value=wrap(args[position].value))
        return expression.with_changes(args=args)

    return rewrite


def _wrap_traced(value: cst.BaseExpression, operand: object,
                 wrap: Callable[[cst.BaseExpression], cst.BaseExpression]) -> cst.BaseExpression:
    """``wrap(value)``; of a conditional ``a if c else b`` only the branch the trace ran, so the
    other branch stays as written (and two branches made equal fold into one: :func:`_folded`)."""
    if isinstance(value, cst.IfExp) and isinstance(operand, fx.Node):
        taken = _taken_branch(value, operand)
        if taken is not None:
            return _folded(value.with_changes(**{taken: _wrap_traced(getattr(value, taken), operand, wrap)}))
    return wrap(value)


def _taken_branch(conditional: cst.IfExp, operand: fx.Node) -> Optional[str]:
    """The branch that computed ``operand``: the one expression that can have built it, else the one
    plain variable when neither branch built it (an op there would be ``operand`` itself)."""
    branches = {"body": conditional.body, "orelse": conditional.orelse}
    built = [side for side, branch in branches.items() if _matches(branch, operand)]
    plain = [side for side, branch in branches.items() if isinstance(branch, (cst.Name, cst.Attribute))]
    if len(built) == 1:
        return built[0]
    return plain[0] if not built and len(plain) == 1 else None


def _is_method(call: cst.Call, names: Names) -> bool:
    """``x.transpose(1, 2)`` or ``self.up(x).pow(3)`` (a method of a value), not ``self.linear(x)`` /
    ``F.silu(x)`` / ``torch.exp(x)`` under whatever names the file gives torch and its modules
    (``import torch.nn.functional as nnf``)."""
    func = call.func
    assert isinstance(func, cst.Attribute)
    dotted = _dotted(func.value)
    if dotted is None:  # a computed value
        return True
    modules = {"torch", "F", "nn", names.torch, names.nn, names.functional}
    return dotted.split(".")[0] != "self" and dotted not in modules and not dotted.startswith(
        tuple(f"{m}." for m in modules))


def _dotted(expression: cst.BaseExpression) -> Optional[str]:
    """``a.b.c`` as text; None for anything else (a call, a subscript)."""
    if isinstance(expression, cst.Name):
        return expression.value
    if isinstance(expression, cst.Attribute):
        inner = _dotted(expression.value)
        return f"{inner}.{expression.attr.value}" if inner else None
    return None


def replace_by(template: Callable[[Names, cst.BaseExpression], cst.BaseExpression]) -> Rewrite:
    return lambda expression, names: template(names, _operand(expression, names))


# --- the kinds ------------------------------------------------------------------------------


@source_edit("preln")
def norm_the_input(context: BlockContext, root: Path) -> list:
    return _norm_readers(context, root, "qlint_preln")


@source_edit("periln")
def norm_the_input_and_output(context: BlockContext, root: Path) -> list:
    changes = _norm_readers(context, root, "qlint_periln_in")
    for term in context.offending_terms():
        changes.append(_expression(context, term, root, wrap_with("qlint_periln_out")))
        changes.append(_submodule(context, term, root, "qlint_periln_out", term))
    return changes


def _norm_readers(context: BlockContext, root: Path, attr: str) -> list:
    stream = context.residual.stream
    readers = context.stream_readers()
    if not readers:
        raise EditError("the offending branch does not read the block input")
    changes: list = []
    for reader in readers:
        index = next((i for i, a in enumerate(reader.args) if a is stream), None)  # a method's receiver first
        if index is None:
            raise EditError(f"the block input reaches `{reader.name}` inside a list or tuple: no one argument to wrap")
        changes.append(_expression(context, reader, root, wrap_argument(reader, index, lambda names: f"self.{attr}")))
        changes.append(_submodule(context, reader, root, attr, stream))
    return changes


@source_edit("norm_primitive")
def norm_the_dominant_primitive(context: BlockContext, root: Path) -> list:
    node = context.dominant()
    return [_expression(context, node, root, wrap_with("qlint_norm")),
            _submodule(context, node, root, "qlint_norm", node)]


@source_edit("gate_sigmoid")
def sigmoid_gate(context: BlockContext, root: Path) -> list:
    return [_sigmoid(context, gate, root) for gate in context.gates()]


def _sigmoid(context: BlockContext, gate: fx.Node, root: Path) -> ExpressionEdit:
    return _expression(context, gate, root, replace_by(lambda names, z: _call(f"{names.torch}.sigmoid", z)))


@source_edit("lipschitz_activation")
def gelu_for_the_power(context: BlockContext, root: Path) -> list:
    node = context.dominant()
    if "power" not in facts(node).family and facts(node).op != "square":
        raise EditError("the highest-q primitive is not a power x**p")
    return [_expression(context, node, root, replace_by(lambda names, h: _call(f"{names.functional}.gelu", h)))]


@source_edit("bounded_exp")
def contracting_exp(context: BlockContext, root: Path) -> list:
    node = context.dominant()

    def template(names: Names, a: cst.BaseExpression) -> cst.BaseExpression:
        softplus = _call(f"{names.functional}.softplus", a)
        return _call(f"{names.torch}.exp", cst.UnaryOperation(cst.Minus(), softplus))

    return [_expression(context, node, root, replace_by(template))]


@source_edit("linear_growth")
def normalised_selection(context: BlockContext, root: Path) -> list:
    projection = context.selective_projection()
    changes: list = [_expression(context, projection, root,
                                 wrap_argument(projection, 0, lambda names: f"{names.functional}.normalize",
                                               "dim=-1"))]
    try:
        changes += [_sigmoid(context, gate, root) for gate in context.gates()]
    except NotApplicable:
        pass
    return changes


# --- applying the edits to one file -----------------------------------------------------------


def apply(text: str, edit: FileEdit) -> str:
    """``text`` with ``edit`` made; EditError when an expression is not found exactly once."""
    module = cst.parse_module(text)
    names = _names(module)
    wrapper = MetadataWrapper(module)
    positions = wrapper.resolve(PositionProvider)
    targets: dict[cst.CSTNode, list[Rewrite]] = {}
    for change in edit.expressions:
        targets.setdefault(_find(wrapper.module, positions, change), []).append(change.rewrite)
    classes: dict[cst.ClassDef, list[Submodule]] = {}
    for sub in edit.submodules:
        classes.setdefault(_enclosing_class(wrapper.module, positions, sub.line), []).append(sub)
    new = wrapper.module.visit(_Rewriter(targets, classes, names))
    return _with_imports(new, names).code


def _names(module: cst.Module) -> Names:
    """The module's own aliases (``import torch.nn.functional as F``, ``from torch import nn``)."""
    aliases = {"torch": None, "torch.nn": None, "torch.nn.functional": None}
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    full = cst.Module([]).code_for_node(alias.name)
                    if full in aliases:
                        aliases[full] = alias.asname.name.value if alias.asname else full  # type: ignore[union-attr]
            elif isinstance(small, cst.ImportFrom) and small.module is not None and not isinstance(
                    small.names, cst.ImportStar):
                base = cst.Module([]).code_for_node(small.module)
                for alias in small.names:
                    full = f"{base}.{alias.name.value}"
                    if full in aliases:
                        aliases[full] = alias.asname.name.value if alias.asname else alias.name.value  # type: ignore
    torch = aliases["torch"] or "torch"
    nn = aliases["torch.nn"] or f"{torch}.nn"
    functional = aliases["torch.nn.functional"] or f"{nn}.functional"
    return Names(torch, nn, functional)


def _with_imports(module: cst.Module, names: Names) -> cst.Module:
    """Add ``import torch`` when an edit spells ``torch.…`` and the module never imported it."""
    code = module.code
    needs_torch = any(n.startswith("torch") for n in (names.torch, names.nn, names.functional))
    imported = any(isinstance(s, cst.Import) and any(cst.Module([]).code_for_node(a.name) == "torch"
                                                     for a in s.names)
                   for line in module.body if isinstance(line, cst.SimpleStatementLine) for s in line.body)
    if not needs_torch or imported or "torch." not in code:
        return module
    index = max((i + 1 for i, line in enumerate(module.body) if isinstance(line, cst.SimpleStatementLine)
                 and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body)), default=0)
    body = list(module.body)
    body.insert(index, cst.parse_statement("import torch\n"))
    return module.with_changes(body=body)


def _matches(expression: cst.CSTNode, node: fx.Node) -> bool:
    """Could ``expression`` be the source of ``node``? By the submodule it calls (``self.x_proj(...)``
    for a call of module ``x_proj``, or for an op an exporting tracer recorded inside it) or by the op."""
    path = (str(node.target) if node.op == "call_module" else module_path(node) or "").split(".")
    if isinstance(expression, cst.Call) and _callee(expression) and _callee(expression) in path:
        return True  # the submodule or a container of it (``self.mlp(x)`` for ``mlp.0``, an nn.Sequential)
    if node.op == "call_module":
        return False
    name = (op_name(node) or "").rstrip("_")
    if isinstance(expression, cst.BinaryOperation):
        operator = {cst.Multiply: "mul", cst.Power: "pow", cst.Add: "add", cst.MatrixMultiply: "matmul"}
        return operator.get(type(expression.operator)) == name
    return isinstance(expression, cst.Call) and _callee(expression).rstrip("_") == name


def _callee(call: cst.Call) -> str:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""


def _find(module: cst.Module, positions, change: ExpressionEdit) -> cst.CSTNode:
    """The one expression at the change's line that can have built its node."""
    found = [n for n, span in positions.items() if isinstance(n, (cst.Call, cst.BinaryOperation))
             and span.start.line <= change.line <= span.end.line and _matches(n, change.node)]
    starting = [n for n in found if positions[n].start.line == change.line] or found
    if len(starting) != 1:
        what = "no expression" if not starting else f"{len(starting)} expressions"
        raise EditError(f"{what} at {change.file.name}:{change.line} match `{change.node.name}`")
    return starting[0]


def _enclosing_class(module: cst.Module, positions, line: int) -> cst.ClassDef:
    classes = [n for n, span in positions.items() if isinstance(n, cst.ClassDef)
               and span.start.line <= line <= span.end.line]
    if not classes:
        raise EditError(f"line {line} is not inside a class: nowhere to add a submodule")
    innermost = max(classes, key=lambda c: positions[c].start.line)
    init = [s for s in innermost.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"]
    if not init:
        raise EditError(f"class `{innermost.name.value}` defines no __init__ to add the norm to")
    if not isinstance(init[0].body, cst.IndentedBlock):
        raise EditError(f"`{innermost.name.value}.__init__` is written on one line: no place for the norm's line")
    return innermost


def _folded(conditional: cst.IfExp) -> cst.BaseExpression:
    """``a if flag else a`` -> ``a`` when an edit made both branches the same (``torch.sigmoid(z) if
    self.linear_growth else F.silu(z)`` once the gate is swapped); a test that calls something stays."""
    code = cst.Module([]).code_for_node
    if not isinstance(conditional.test, (cst.Name, cst.Attribute)) or code(conditional.body) != code(
            conditional.orelse):
        return conditional
    body = conditional.body
    return body.with_changes(lpar=conditional.lpar, rpar=conditional.rpar) if conditional.lpar else body


class _Rewriter(cst.CSTTransformer):
    """Make every expression rewrite and submodule assignment in one pass."""

    def __init__(self, targets, classes, names: Names) -> None:
        super().__init__()
        self.targets, self.classes, self.names = targets, classes, names
        self.current_class: list[cst.ClassDef] = []

    def on_leave(self, original: cst.CSTNode, updated):  # type: ignore[override]
        updated = super().on_leave(original, updated)
        for rewrite in self.targets.get(original, ()):
            updated = rewrite(updated, self.names)
        if isinstance(updated, cst.IfExp) and not updated.deep_equals(original):
            return _folded(updated)
        return updated

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.current_class.append(node)
        return True

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.current_class.pop()
        return updated

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        owner = self.current_class[-1] if self.current_class else None
        if owner is None or original.name.value != "__init__" or owner not in self.classes:
            return updated
        existing = cst.Module([]).code_for_node(updated)
        lines: list[Submodule] = []
        for sub in self.classes[owner]:
            if f"self.{sub.attr} =" not in existing and all(s.attr != sub.attr for s in lines):
                lines.append(sub)
        statements = [cst.parse_statement(f"self.{s.attr} = {s.constructor(self.names, original)}\n") for s in lines]
        body = updated.body
        assert isinstance(body, cst.IndentedBlock)
        return updated.with_changes(body=body.with_changes(body=[*body.body, *statements]))
