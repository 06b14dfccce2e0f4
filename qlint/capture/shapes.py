"""Which input shapes a traced graph stands for, and inputs of the shapes it does not.

symbolic_trace records no shape: a forward that branches on a size stops it. torch.export
runs the forward on the example, so a graph it returns may hold only the path the example's
shapes took: a fast path for long sequences (``if x.shape[1] > 64``), a loop unrolled over
the length, a branch on ``T % 2``. qlint exports with every axis of every input tensor
dynamic (``Dim.AUTO``: an axis the model fixes is specialised, not an error), then checks the
graph against the eager model on other shapes, as the graph check does on other values: the
example's axes at n + 1 and 2n + 1, and either side of each size the export's guards name
(``size()[1] <= 16`` gives 15, 16 and 17), and at size 1 (see :func:`candidates`). A shape the eager
model rejects is no input; a shape where the graph fails or computes something else is not covered by
the graph, and the pipeline analyses the model traced there too (:func:`qlint.analysis.run`).

An axis of size 1 in the example is specialised by export (0/1 specialisation): it is tried at
size 2, and where the model takes that, the graph must compute it or the model is traced there too.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

# shapes compared with the graph (each costs one eager and one graph forward); the rest are uncovered
MAX_CANDIDATES = 24


@dataclass
class Other:
    """Example inputs of a shape the graph was found not to compute the model on."""

    inputs: tuple
    unrolled: bool  # it changes an axis the graph fixed although the model takes other sizes (a loop over it)
    where: str = ""  # the sizes it stands for ("input 0 axis 2 of size 17..32")
    collapse: bool = False  # only export's own size assumptions (0/1 specialisation, duck sizing) separate it


@dataclass
class ShapeCoverage:
    """What the graph check found about shapes."""

    scope: str  # one line for the report
    uncovered: list[Other] = field(default_factory=list)  # most telling first


def automatic(model: torch.nn.Module, inputs: tuple) -> Optional[Any]:
    """A ``dynamic_shapes`` spec with every axis of every top-level input tensor ``Dim.AUTO``; None
    on a torch without it, and for a ``forward(*args)`` (a keyword adapter), whose spec export
    would read per parameter: such a model is exported static, and its shapes probed as such."""
    auto = getattr(getattr(torch.export, "Dim", None), "AUTO", None)
    if auto is None or not any(isinstance(x, torch.Tensor) and x.dim() for x in inputs):
        return None
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        parameters = []
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    return tuple({d: auto for d in range(x.dim())} if isinstance(x, torch.Tensor) and x.dim() else None for x in inputs)


_SIZE = re.compile(r"size\(\)\[(\d+)\]")
_NUMBER = re.compile(r"(?<![\w\]])(\d+)(?![\w\[])")
_ZERO_ONE = re.compile(r"(==|!=)\s*1\)*$|(>=|<)\s*2\)*$|(>|<=)\s*1\)*$")
SCAN_LIMIT = 8192  # sizes a guard is evaluated at, per axis


def guard_sizes(guards: list[str]) -> dict[int, set[int]]:
    """Per axis index, the integers the export's guards compare it with (``L['x'].size()[1] <= 16``
    gives {1: {16}}); the axis is matched by index only, on every input (a conservative reading)."""
    out: dict[int, set[int]] = {}
    for guard in guards:
        axes = {int(a) for a in _SIZE.findall(guard)}
        numbers = {int(n) for n in _NUMBER.findall(_SIZE.sub("", guard))}
        for axis in axes:
            out.setdefault(axis, set()).update(numbers)
    return out


_SIZED_MODULO = re.compile(r"%\s*\(.*size\(\).*\)\)*\s*(==|!=)\s*0\)*$")


def _specialisation(guard: str) -> bool:
    """A guard of export's own size assumptions: an inner size compared with 1 (0/1 specialisation,
    also spelled ``n < n*m``),
    two size expressions kept distinct because they were in the example (duck sizing), or a size
    divisible by another size expression (a reshape's check; a literal modulus, ``T % 2``, is the
    model's own dispatch)."""
    guard = guard.strip()
    if _ZERO_ONE.search(guard) or _SIZED_MODULO.search(guard):
        return True
    for op, small_first in ((" < ", True), (" > ", False)):  # n < n*m: the size m is not 1
        left, found, right = guard.partition(op)
        small, product = (left, right) if small_first else (right, left)
        if found and "size()" in small and (product.startswith(small + "*") or product.endswith("*" + small)):
            return True
    left, _, right = guard.partition(" != ")
    return bool(right) and "size()" in left and "size()" in right


@dataclass
class Region:
    """A maximal run of sizes of one input axis on which every shape guard of the export has the
    same truth value: one region of the graph (the example's, or another side of a dispatch)."""

    index: int
    axis: int
    lo: int
    hi: int  # the last size scanned when the run reaches the scan's end
    representative: int  # the size nearest the example's
    collapse: bool  # only export's own size assumptions (0/1 specialisation, duck sizing) separate it from the example
    open_end: bool = False

    def describe(self) -> str:
        sizes = f"{self.lo}.." if self.open_end else (f"{self.lo}" if self.lo == self.hi else f"{self.lo}..{self.hi}")
        return f"input {self.index} axis {self.axis} of size {sizes}"


class _Sized:
    """What a guard reads of an input tensor: its sizes and contiguous strides."""

    def __init__(self, shape: list[int]):
        self.shape = shape

    def size(self, dim: Optional[int] = None) -> Any:
        return torch.Size(self.shape) if dim is None else self.shape[dim]

    def stride(self, dim: Optional[int] = None) -> Any:
        strides, step = [], 1
        for size in reversed(self.shape):
            strides.append(step)
            step *= max(size, 1)
        strides.reverse()
        return tuple(strides) if dim is None else strides[dim]

    def dim(self) -> int:
        return len(self.shape)


class Guards:
    """export's shape guards, evaluated at other sizes of the example inputs.

    A guard is Python over ``L['<argument>'].size()[axis]``; one that reads more than sizes and
    strides (or does not compile) is unreadable here, and its numbers are tried the old way."""

    def __init__(self, inputs: tuple, names: list[str], guards: list[str]):
        self.inputs, self.names, self.texts = inputs, names, guards
        self.checks, self.unreadable = [], []
        for guard in guards:
            try:
                self.checks.append((guard, compile(guard, "<guard>", "eval")))
            except SyntaxError:
                self.unreadable.append(guard)
        self.failed: set[str] = set()
        self.own = self.truth({})

    def truth(self, change: dict[tuple[int, int], int]) -> tuple:
        """Each guard's truth with ``{(input, axis): size}`` changed."""
        shapes = {j: _Sized([change.get((j, d), int(n)) for d, n in enumerate(x.shape)])
                  for j, x in enumerate(self.inputs) if isinstance(x, torch.Tensor)}
        scope = {"L": {name: shapes.get(j, self.inputs[j] if j < len(self.inputs) else None)
                       for j, name in enumerate(self.names)},
                 "math": math, "torch": torch}
        values = []
        for text, code in self.checks:
            try:
                values.append(bool(eval(code, scope)))  # noqa: S307  (export's own guard code)
            except Exception:  # noqa: BLE001  (reads something besides sizes: tried by its numbers)
                self.failed.add(text)
                values.append(None)
        return tuple(values)

    def specialised_only(self, value: tuple) -> bool:
        """Only export's own size assumptions tell these guard values from the example's, an inner
        size of 1 among them (the rest follow from it)."""
        differing = [text.strip() for (text, _), a, b in zip(self.checks, value, self.own) if a != b]
        return any(_ZERO_ONE.search(t) for t in differing) and all(_specialisation(t) for t in differing)

    def unread(self) -> list[str]:
        return self.unreadable + sorted(self.failed)


def regions(guards: Guards, symbolic: dict[int, set[int]]) -> list[Region]:
    """Per symbolic axis, the regions its guards cut the sizes >= 2 into, other than the example's:
    one axis set to each size from 2 to past every number the guards name (at least 4n + 1), the
    others as in the example."""
    out: list[Region] = []
    numbers = guard_sizes(guards.texts)
    for i, axes in sorted(symbolic.items()):
        for axis in sorted(axes):
            example = int(guards.inputs[i].shape[axis])
            top = min(SCAN_LIMIT, max([4 * example + 1] + [2 * k + 2 for k in numbers.get(axis, ())]))
            runs: list[list[Any]] = []  # [lo, hi, truth]
            for size in range(2, top + 1):
                value = guards.own if size == example else guards.truth({(i, axis): size})
                if runs and runs[-1][2] == value:
                    runs[-1][1] = size
                else:
                    runs.append([size, size, value])
            for lo, hi, value in runs:
                if not lo <= example <= hi:
                    out.append(Region(i, axis, lo, hi, lo if lo > example else hi,
                                      collapse=guards.specialised_only(value), open_end=hi == top))
    return out


JOINT_LIMIT = 48  # sizes per axis scanned for guards that read two axes together (B * T == 12)


def joint_regions(guards: Guards, symbolic: dict[int, set[int]],
                  seen: set[tuple]) -> list[tuple[dict[tuple[int, int], int], bool]]:
    """Guard values reached only by changing two symbolic axes together (a dispatch on B * T): for
    each truth vector not in ``seen`` (those one axis reaches), the pair of sizes nearest the
    example, and whether only export's own size assumptions separate it."""
    axes = [(i, a) for i, group in sorted(symbolic.items()) for a in sorted(group)]
    found: dict[tuple, tuple[int, dict[tuple[int, int], int]]] = {}
    for n, first in enumerate(axes):
        for second in axes[n + 1:]:
            example = (int(guards.inputs[first[0]].shape[first[1]]), int(guards.inputs[second[0]].shape[second[1]]))
            for a in range(2, JOINT_LIMIT + 1):
                for b in range(2, JOINT_LIMIT + 1):
                    if a == example[0] or b == example[1]:
                        continue  # one axis changed alone: the single-axis scan's
                    value = guards.truth({first: a, second: b})
                    distance = abs(a - example[0]) + abs(b - example[1])
                    if value not in seen and (value not in found or distance < found[value][0]):
                        found[value] = (distance, {first: a, second: b})
    return [(change, guards.specialised_only(value))
            for value, (_, change) in sorted(found.items(), key=lambda item: item[1][0])]


def candidates(inputs: tuple, symbolic: dict[int, set[int]], unrolled: dict[int, set[int]],
               guards: Guards) -> list[Other]:
    """Inputs of other shapes to try, most telling first: one size in each region the export's guards
    cut a symbolic axis into (a dispatch on the size: each is another region of the graph), those
    above the example before those below, nearest first, then the pairs of sizes of two axes that
    reach guard values no one axis reaches (``B * T == 12``); the numbers of guards that cannot be
    evaluated, either side; every free axis at 2n + 1 and n + 1 (a loop unrolled over an axis: the
    longest first); and of all these, the shapes that only export's own size assumptions separate
    from the example's (an inner size of 1, two sizes equal) last, so that a model with many such
    regions (a CNN's feature map shrinking to 1 at each stage) still has its other shapes
    compared within :data:`MAX_CANDIDATES`. Each symbolic or unrolled axis is also tried at size
    1, first among export's own assumptions: export assumes every dynamic axis is at least 2 (0/1
    specialisation), so a branch on ``x.shape[1] == 1`` (a decode step, a batch of one) leaves no
    guard, and only running the model there shows it. Like the other shapes of export's own
    assumptions, a size of 1 the pipeline cannot analyse any more (a CNN on an image one pixel
    high) is named in the report's scope, not a gap."""
    found = regions(guards, symbolic)

    def order(region: Region) -> tuple:
        example = int(inputs[region.index].shape[region.axis])
        return (region.collapse, region.representative < example, abs(region.representative - example))

    changes: list[tuple[int, dict[int, int], bool, str, Optional[bool]]] = [
        (r.index, {r.axis: r.representative}, False, r.describe(), r.collapse) for r in sorted(found, key=order)]
    if len([a for group in symbolic.values() for a in group]) > 1 and guards.checks:
        seen = {guards.own} | {guards.truth({(r.index, r.axis): r.representative}) for r in found}
        for change, collapse in joint_regions(guards, symbolic, seen):
            if len({i for i, _ in change}) == 1:  # one input's axes (inputs are resized one at a time)
                index = next(iter(change))[0]
                where = f"input {index} axes " + ", ".join(f"{a} of size {size}" for (_, a), size in change.items())
                changes.append((index, {a: size for (_, a), size in change.items()}, False, where, collapse))
        changes.sort(key=lambda change: bool(change[4]))  # a dispatch before export's own assumptions (stable)
    for i in sorted(set(symbolic) | set(unrolled)):  # a decode step, a batch of one: the other side of `== 1`
        for axis in sorted(symbolic.get(i, set()) | unrolled.get(i, set())):
            if int(inputs[i].shape[axis]) != 1:
                changes.append((i, {axis: 1}, axis in unrolled.get(i, set()), f"input {i} axis {axis} of size 1",
                                True))
    for i, axes in symbolic.items():
        shape = inputs[i].shape
        for axis in sorted(axes):
            for k in sorted(guard_sizes(guards.unread()).get(axis, ())):
                for size in (k - 1, k, k + 1):
                    if size >= 2 and size != shape[axis]:
                        changes.append((i, {axis: size}, False, "", None))
    for i in sorted(set(symbolic) | set(unrolled)):
        shape = inputs[i].shape
        axes = symbolic.get(i, set()) | unrolled.get(i, set())
        for rule in (lambda n: 2 * n + 1, lambda n: n + 1):
            change = {axis: rule(int(shape[axis])) for axis in axes if rule(int(shape[axis])) != shape[axis]}
            if change:
                changes.append((i, change, bool(set(change) & unrolled.get(i, set())), "", None))
    seen, out = set(), []
    for n, (i, change, loop, where, collapse) in enumerate(changes):
        key = (i, tuple(sorted(change.items())))
        if key in seen:
            continue
        seen.add(key)
        if collapse is None:  # a joint change: what the guards say of it
            value = guards.truth({(i, axis): size for axis, size in change.items()})
            collapse = not guards.unread() and guards.specialised_only(value)
            where = where or ", ".join(f"input {i} axis {axis} of size {size}" for axis, size in change.items())
        out.append(Other(resized(inputs, i, change, seed=100 + n), loop, where, collapse))
    # export's own assumptions last (stable), a size of 1 first among them: a branch on it leaves no guard
    return sorted(out, key=lambda other: (bool(other.collapse), not other.where.endswith("of size 1")))


def resized(inputs: tuple, index: int, change: dict[int, int], seed: int) -> tuple:
    """The example inputs with one tensor redrawn at a new shape: floats from randn at the
    example's spread, integers and booleans within the example's range."""
    x = inputs[index]
    shape = [change.get(d, s) for d, s in enumerate(x.shape)]
    g = torch.Generator().manual_seed(seed)
    if x.is_floating_point() or x.is_complex():
        spread = float(x.detach().abs().max()) if x.numel() else 1.0
        new = torch.randn(shape, generator=g, dtype=torch.float64).to(x.dtype) * max(spread, 1e-3)
    elif x.dtype == torch.bool:
        new = torch.rand(shape, generator=g) < 0.5
    else:
        lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 1)
        new = torch.randint(lo, hi + 1, shape, generator=g).to(x.dtype)
    return tuple(new.to(x.device) if j == index else y for j, y in enumerate(inputs))


def other_ranks(inputs: tuple) -> list[tuple[tuple, str]]:
    """The example as an unbatched input (the leading axis dropped), with what it stands for: every tensor
    input whose leading size is the first tensor's loses it together (input ids and their mask). A graph
    is traced at one rank; a forward may branch on another (``if x.dim() == 2``: nn.MultiheadAttention's
    unbatched path), which no size of the example's rank shows. (A leading axis added is not tried: a
    tokenizer's ids of rank 3 run through an embedding eagerly and fail in every tracer.)"""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor) and x.dim()]
    if not tensors:
        return []
    lead = tensors[0].shape[0]
    changes = [isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == lead for x in inputs]
    if not all(x.dim() >= 2 for x, change in zip(inputs, changes) if change):
        return []
    return [(tuple(x[0].clone() if change else x for x, change in zip(inputs, changes)),
             "unbatched inputs (the leading axis dropped)")]


def probe(model: torch.nn.Module, inputs: tuple, dynamic: bool, guards: list[str], symbolic: dict[int, set[int]],
          runs: Callable[[tuple], bool], agrees: Callable[[tuple], bool], names: list[str],
          same_path: Callable[[tuple], bool] = lambda other: True) -> ShapeCoverage:
    """Try other shapes: ``runs(inputs)`` says whether the eager model accepts them, ``agrees(inputs)``
    whether the graph computes the eager model's output there; ``names`` are the forward's argument
    names, which the guards use. Inputs of another rank (:func:`other_ranks`) the graph cannot run:
    where the model accepts them and ``same_path`` says it runs other ops there than on the example,
    they are uncovered.

    ``symbolic`` are the axes the exported graph keeps symbolic; every other axis of size >= 2
    is tried at n + 1 on the eager model alone first: if the model accepts it, the graph fixed
    an axis the model does not (a loop unrolled over it), and that axis is varied too. Shapes the
    model takes past :data:`MAX_CANDIDATES` are not compared, so they are uncovered (the samples of
    an unrolled loop excepted).
    """
    unrolled: dict[int, set[int]] = {}
    fixed_to_one: list[str] = []
    widened: list[Other] = []  # an axis of size 1 in the example (export fixes it) the model takes at 2
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or not x.dim():
            continue
        for axis, size in enumerate(x.shape):
            if axis in symbolic.get(i, set()):
                continue
            if size == 1:
                if runs(resized(inputs, i, {axis: 2}, seed=axis)):
                    widened.append(Other(resized(inputs, i, {axis: 2}, seed=axis), False,
                                         f"input {i} axis {axis} of size 2 (1 in the example)", collapse=True))
                else:
                    fixed_to_one.append(f"input {i} axis {axis}")
            elif runs(resized(inputs, i, {axis: int(size) + 1}, seed=axis)):
                unrolled.setdefault(i, set()).add(axis)
    uncovered: list[Other] = []
    tried = 0
    others = candidates(inputs, symbolic, unrolled, Guards(inputs, names, guards))
    first_assumed = next((n for n, other in enumerate(others) if other.collapse), len(others))
    # an example axis of 1 is export's own assumption too: tried first among them (a batch of one)
    for other in others[:first_assumed] + widened + others[first_assumed:]:
        if not runs(other.inputs):
            continue
        if tried >= MAX_CANDIDATES:
            if not other.unrolled:
                uncovered.append(other)  # not compared, so not known to be covered
            continue
        tried += 1
        if not agrees(other.inputs):
            uncovered.append(other)
    ranks = []
    for other_inputs, where in other_ranks(inputs):
        if runs(other_inputs):
            ranks.append(where)
            if not same_path(other_inputs):  # first: analysed among the first MAX_SHAPES, not left a gap
                uncovered.insert(0, Other(other_inputs, False, where))
    parts = [f"{'dynamic' if dynamic else 'static'} export, checked against the model on {tried} other input shape(s) "
             "(size 1 and sizes >= 2)"]
    if ranks:
        parts.append(f"the model runs the example's ops on {' and '.join(ranks)}" if not any(
            o.where in ranks for o in uncovered) else f"the model takes {' and '.join(ranks)} too")
    if any(symbolic.values()):
        parts.append("symbolic: " + ", ".join(f"input {i} axes {sorted(a)}" for i, a in symbolic.items() if a))
    if unrolled:
        parts.append("fixed by the graph though the model takes other sizes (a loop over them): "
                     + ", ".join(f"input {i} axes {sorted(a)}" for i, a in unrolled.items()))
    if fixed_to_one:
        parts.append(f"size 1 as in the example, the only size the model takes, on {', '.join(fixed_to_one)}")
    return ShapeCoverage(scope="; ".join(parts), uncovered=uncovered)


def symbolic_axes(module: Any, inputs: tuple) -> dict[int, set[int]]:
    """Per top-level input tensor, the axes the graph's placeholders keep symbolic."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    values = [n.meta.get("val") for n in placeholders]
    tensors = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    out: dict[int, set[int]] = {}
    graph_tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if len(graph_tensors) != len(tensors):
        return out
    for i, value in zip(tensors, graph_tensors):
        out[i] = {axis for axis, size in enumerate(value.shape) if not is_concrete_int(size)}
    return out


__all__ = ["Guards", "Other", "Region", "ShapeCoverage", "automatic", "candidates", "guard_sizes", "other_ranks",
           "probe", "regions", "resized", "symbolic_axes"]
