"""Facts about a traced graph, computed once per trace and shared by every pass.

:func:`annotate` writes the block-independent facts of each node into
``node.meta["qlint"]`` (a :class:`NodeFacts`: the registry entry, the bound arguments,
which arguments carry values and which only shapes). :class:`GraphFacts` then holds the
graph-wide facts the passes need: the execution order, which nodes depend on the data
(value dependence: ``zeros_like(x)`` and ``x.shape`` do not), ancestor sets,
post-dominators and regions between two nodes. :func:`run_cone` is the one helper that
seeds some nodes and runs an interpreter over a region, for the growth propagation and
for the probes' numeric re-runs alike.
"""

from __future__ import annotations

import collections
import operator
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import torch
import torch.fx as fx

from qlint.core.ops import Bound, bind, describe, op_name

SIZE_ARGUMENTS = frozenset({"size", "sizes", "shape", "repeats", "dims", "pad", "scale_factor", "output_size", "steps",
                            "split_size", "split_size_or_sections", "sections", "indices_or_sections", "length",
                            "num_classes", "minlength", "bins", "n", "k"})  # an argument that sets how many entries
SEQUENCES = frozenset({"arange", "range", "linspace", "logspace"})  # their start / end / step set the length too
META_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "is_sparse",
                             "is_quantized", "is_meta", "names", "grad_fn", "is_leaf", "itemsize", "nbytes"})


@dataclass
class NodeFacts:
    """What qlint knows about one node before any block is analysed."""

    label: str
    primitive: Any = None  # the registry entry, None for an op outside the registry
    module: Any = None  # the nn.Module of a call_module node
    declared: Any = None  # a user declaration (a leaf module, or the region of one under export)
    declared_class: str = ""  # the declared class's name
    region_inputs: tuple = ()  # the nodes outside a declared region that feed it
    bound: Optional[Bound] = None
    value_inputs: tuple = ()  # nodes whose values flow into this one (not shape-only uses)
    meta_output: bool = False  # the node computes metadata (a size, a dtype), not a value
    relation: Any = None  # a relational fact proved on the graph (a normalisation, x - max x)

    @property
    def family(self) -> frozenset[str]:
        return self.primitive.family if self.primitive is not None else frozenset()

    @property
    def op(self) -> str:
        """The registry entry's id: one vocabulary for every spelling of an op."""
        return self.primitive.id if self.primitive is not None else ""

    @property
    def plumbing(self) -> bool:
        return "plumbing" in self.family


def facts(node: fx.Node) -> NodeFacts:
    return node.meta["qlint"]


def annotate(module: fx.GraphModule, registry: Any, model: Optional[torch.nn.Module] = None) -> None:
    """Write NodeFacts into every node's meta (block-independent, once per trace).

    ``model`` names the classes torch.export records by qualified name in
    ``nn_module_stack`` (so declared classes are found under export too).
    """
    classes = {f"{type(m).__module__}.{type(m).__qualname__}": type(m) for m in (model or module).modules()}
    nodes = list(module.graph.nodes)
    regions = _declared_regions(nodes, registry, classes)
    for node in nodes:
        node.meta["qlint"] = _node_facts(node, module, registry, regions)


def _node_facts(node: fx.Node, module: fx.GraphModule, registry: Any, regions: dict) -> NodeFacts:
    if node.op in ("placeholder", "get_attr", "output"):
        return NodeFacts(label=node.op, value_inputs=tuple(node.all_input_nodes))
    submodule = module.get_submodule(node.target) if node.op == "call_module" else None
    label = describe(node, submodule)
    if node in regions:
        declared, inputs, name = regions[node]
        return NodeFacts(label=label, declared=declared, declared_class=name, region_inputs=inputs,
                         value_inputs=tuple(node.all_input_nodes))
    if submodule is not None:
        declaration = registry.declaration(type(submodule))
        if declaration is not None:
            return NodeFacts(label=label, module=submodule, declared=declaration,
                             declared_class=type(submodule).__name__,
                             value_inputs=tuple(node.all_input_nodes), bound=bind(node, submodule))
        primitive = registry.lookup("call_module", type(submodule))
    else:
        primitive = registry.lookup(node.op, node.target)
    if primitive is None:
        return NodeFacts(label=label, module=submodule, value_inputs=tuple(node.all_input_nodes))
    bound = bind(node, submodule, dict(primitive.aliases))
    meta = set(primitive.meta_args)
    if primitive.id == "getattr":
        name = bound.arguments.get("name")
        meta_output = name in META_ATTRIBUTES
    else:
        meta_output = primitive.meta_output
    value_inputs = () if meta_output else tuple(dict.fromkeys(n for name, value in bound.arguments.items()
                                                              if name not in meta
                                                              for n in Bound({name: value}, {}).nodes()))
    return NodeFacts(label=label, primitive=primitive, module=submodule, bound=bound, value_inputs=value_inputs,
                     meta_output=meta_output)


def _declared_regions(nodes: list[fx.Node], registry: Any,
                      classes: dict[str, type]) -> dict[fx.Node, tuple[Any, tuple, str]]:
    """Opaque-leaf semantics where module boundaries vanish (torch.export inlines modules).

    The ops whose ``nn_module_stack`` holds a call of a declared class form its region;
    each gets the declared transfer of the region's external inputs.
    """
    members: dict[str, list[fx.Node]] = {}
    declarations: dict[str, tuple[Any, str]] = {}
    for node in nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        for key, (_, cls) in (node.meta.get("nn_module_stack") or {}).items():
            cls = classes.get(cls, cls) if isinstance(cls, str) else cls
            declaration = registry.declaration(cls) if isinstance(cls, type) else None
            if declaration is not None:  # the outermost declared call contains this op
                members.setdefault(key, []).append(node)
                name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
                declarations[key] = (declaration, name)
                break
    regions: dict[fx.Node, tuple[Any, tuple, str]] = {}
    for key, nodes in members.items():
        inside = set(nodes)
        inputs = tuple(dict.fromkeys(p for n in nodes for p in n.all_input_nodes if p not in inside))
        declaration, name = declarations[key]
        for node in nodes:
            regions[node] = (declaration, inputs, name)
    return regions


_UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"})
RANDOM = frozenset({"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "normal", "normal_",
                     "bernoulli",
                     "bernoulli_", "multinomial", "randperm", "poisson", "uniform_", "exponential_", "geometric_",
                     "log_normal_", "cauchy_", "random_", "dropout", "alpha_dropout", "feature_alpha_dropout",
                     "native_dropout", "rrelu"})


def lifted_constant(target: str) -> bool:
    """An attribute fx registered for a tensor constant it lifted (``_tensor_constant0``, also inside
    an inlined cond branch: ``true_graph_0._tensor_constant0``), not a buffer of the model."""
    return str(target).rsplit(".", 1)[-1].startswith("_tensor_constant")


def indeterminate(node: fx.Node) -> bool:
    """A value that is not a function of the node's arguments: a random draw or uninitialised
    memory (``torch.empty``). Evaluating it once says nothing about the next call."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return (torch.Tag.nondeterministic_seeded in target.tags
                or target.overloadpacket.__name__ in _UNINITIALISED | RANDOM)
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return name in _UNINITIALISED or name in RANDOM


def storage_key(tensor: torch.Tensor) -> int:
    """The address of the memory a tensor's values live in, shared by its views and aliases; for a sparse
    tensor, that of its values (it has no storage of its own)."""
    if tensor.layout == torch.sparse_coo:
        tensor = tensor._values()
    elif tensor.layout != torch.strided:
        tensor = tensor.values()
    return tensor.untyped_storage().data_ptr()


def strided(tensor: torch.Tensor) -> torch.Tensor:
    """A sparse (COO, CSR, ...) tensor as its dense values, which comparisons and value reads take."""
    return tensor if tensor.layout == torch.strided else tensor.to_dense()


_BUILTIN_ARITHMETIC = frozenset({"int", "float", "bool", "abs", "round", "min", "max", "pow", "divmod", "len", "sum"})
_TORCH_NAMESPACES = frozenset({"torch", "torch.functional", "torch.nn.functional"})


def pure_call(node: fx.Node) -> bool:
    """A call whose value is a function of its arguments alone: a torch op (an aten overload, a ``torch.*``
    or ``F.*`` function, a tensor method) that draws nothing and reads no uninitialised memory, or Python's
    own arithmetic (``operator.add`` of two sizes, ``math.sqrt``, ``torch.sym_max``) that changes no
    argument. A function of the user's that an fx trace keeps whole (``fx.wrap``) may read anything."""
    if node.op not in ("call_function", "call_method") or indeterminate(node):
        return False
    target = node.target
    if node.op == "call_method" or isinstance(target, torch._ops.OpOverload) or target is operator.getitem:
        return True
    module, name = getattr(target, "__module__", None), getattr(target, "__name__", "")
    if module == "_operator":
        in_place = name.startswith("i") and hasattr(operator, name[1:])
        return not in_place and name not in ("setitem", "delitem")
    return (module in _TORCH_NAMESPACES or module == "math"
            or (module == "builtins" and name in _BUILTIN_ARITHMETIC))


def _dynamic_output_shape(node: fx.Node) -> bool:
    """An op whose output's length depends on its input's values (``bincount``: max(x) + 1 bins, ``nonzero``),
    as aten tags it: the overload itself, or every overload of the op a Python function or method names (not
    ``repeat_interleave``, dynamic only with a tensor of counts, which :data:`SIZE_ARGUMENTS` catches)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return torch.Tag.dynamic_output_shape in target.tags
    packet = getattr(torch.ops.aten, op_name(node), None) if op_name(node) else None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return False
    overloads = [name for name in packet.overloads() if "out" not in name.split("_")]
    return bool(overloads) and all(torch.Tag.dynamic_output_shape in getattr(packet, name).tags for name in overloads)


class GraphFacts:
    """Order, value dependence, ancestors and post-dominators of an annotated graph."""

    def __init__(self, module: fx.GraphModule, data_inputs: Optional[Sequence[fx.Node]] = None) -> None:
        self.module = module
        self.nodes: list[fx.Node] = list(module.graph.nodes)
        self.order = {node: i for i, node in enumerate(self.nodes)}
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.inputs: list[fx.Node] = list(data_inputs) if data_inputs is not None else placeholders
        self.data: set[fx.Node] = set(self.inputs)
        self.parents: dict[fx.Node, list[fx.Node]] = {}
        for node in self.nodes:
            if node in self.data or node.op in ("placeholder", "get_attr", "output"):
                continue
            info = facts(node)
            if info.meta_output:  # a size of its first argument, but one at a dim the input's values choose is data
                sources = () if info.bound is None else tuple(
                    value for name, argument in list(info.bound.arguments.items())[1:]
                    for value in Bound({name: argument}, {}).nodes())
            else:
                sources = info.region_inputs if info.declared is not None and info.region_inputs else info.value_inputs
            parents = [p for p in sources if p in self.data]
            if parents:
                self.data.add(node)
                self.parents[node] = list(dict.fromkeys(parents))
        for node in self.inputs:
            self.parents[node] = []
        self.children: dict[fx.Node, list[fx.Node]] = collections.defaultdict(list)
        for node, parents in self.parents.items():
            for parent in parents:
                self.children[parent].append(node)
        output = next((n for n in reversed(self.nodes) if n.op == "output"), None)
        self.sinks: list[fx.Node] = [n for n in (output.all_input_nodes if output is not None else [])
                                     if n in self.data]
        self._variable: Optional[set[fx.Node]] = None
        self._index = {node: i for i, node in enumerate(n for n in self.nodes if n in self.data)}
        self._ancestors: Optional[dict[fx.Node, int]] = None
        self._ipdom: Optional[dict[fx.Node, Optional[fx.Node]]] = None
        self._constants: Optional[fx.Interpreter] = None  # evaluates input-independent nodes, memoised
        self.example: Optional[tuple] = None  # the example inputs, whose shapes shape-derived values are read at

    @property
    def variable_length(self) -> set[fx.Node]:
        """Nodes whose shape may depend on the input's *values*, not only its shape: an op outside the
        registry (it may return anything), an op given a size, a count or a padding computed from the data
        (``zeros(int(x.max()))``, ``repeat_interleave(v, counts(x))``), an op that cannot compute its output
        on fake data inputs (:class:`~qlint.core.fake_run.FakeRun`: ``x[mask]``, ``eye(1, m)``), and everything
        computed from such a value. Every other size is a function of the input shapes: a constant as far as
        magnitude goes (:meth:`GrowthProp.sizes`). Computed once the example is known (a length read off its
        shape runs)."""
        if self._variable is None:
            self._variable = self._variable_length()
        return self._variable

    def _variable_length(self) -> set[fx.Node]:
        from qlint.core.fake_run import FakeRun

        out: set[fx.Node] = set()
        unread: set[fx.Node] = set()  # marked without a fake run: no stand-in, so what reads them is marked too
        run = FakeRun(self.module, self.data, self.constant, self._example_device())
        for node in self.nodes:
            if node.op in ("placeholder", "get_attr", "output") or "qlint" not in node.meta:
                continue
            data_inputs = [p for p in node.all_input_nodes if p in self.data]
            info = facts(node)
            if not data_inputs or info.meta_output:
                continue
            unknown_op = info.primitive is None and info.declared is None or _dynamic_output_shape(node)
            sized = info.bound is not None and any(
                value in self.data for name, argument in info.bound.arguments.items()
                if name in SIZE_ARGUMENTS or (info.bound.positional and name != "input") or op_name(node) in SEQUENCES
                for value in Bound({name: argument}, {}).nodes())
            if unknown_op or sized or any(p in unread for p in data_inputs):
                out.add(node)
                unread.add(node)
            elif run.values_set_length(node):
                out.add(node)
        return out

    # -- constants ----------------------------------------------------------------------------

    def constant(self, node: fx.Node) -> Any:
        """The value of a node that does not depend on the input (a parameter expression), or None.

        One interpreter for the whole trace: each node is evaluated at most once, and only
        the nodes ``node`` needs, in graph order (no walk of the node list per question).
        """
        if self._constants is None:
            self._constants = fx.Interpreter(self.module)
        return self._evaluate(node, self._constants)

    def evaluate(self, node: fx.Node, overrides: dict[fx.Node, Any]) -> Any:
        """A parameter expression's value with some of its leaves replaced (a witness search), or None."""
        interpreter = fx.Interpreter(self.module)
        interpreter.env.update(overrides)
        return self._evaluate(node, interpreter)

    def _evaluate(self, node: fx.Node, interpreter: fx.Interpreter) -> Any:
        """A value that does not depend on the input's values. Sizes and dtypes of an input are read
        off the example inputs (``example``), when there are some: such a value is the one at the
        example's shape."""
        if node in self.data:
            return None
        env = interpreter.env
        needed, stack = set(), [node]
        while stack:
            current = stack.pop()
            if current not in needed and current not in env:
                if current.op == "placeholder":
                    example = self._example_value(current)
                    if example is None:
                        return None  # an input with no example: no one value
                    env[current] = example
                    continue
                if indeterminate(current):
                    return None  # a random draw or uninitialised memory: no one value
                needed.add(current)
                stack.extend(current.all_input_nodes)
        try:
            with torch.no_grad():
                for current in sorted(needed, key=self.order.__getitem__):
                    env[current] = interpreter.run_node(current)
        except Exception:  # a parameter expression that cannot run here (meta tensors)
            return None
        return env[node]

    def _example_device(self) -> torch.device:
        """Where the example lies (the meta device for a model built there), else where the weights do."""
        tensors = [t for t in (self.example or ()) if isinstance(t, torch.Tensor)]
        tensors += list(self.module.parameters())[:1] + list(self.module.buffers())[:1]
        return tensors[0].device if tensors else torch.device("cpu")

    def _example_value(self, placeholder: fx.Node) -> Any:
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        if self.example is None or len(placeholders) != len(self.example) or placeholder not in placeholders:
            return None
        value = self.example[placeholders.index(placeholder)]
        return None if isinstance(value, torch.Tensor) and value.is_meta else value

    # -- ancestors ----------------------------------------------------------------------------

    def _ancestor_bits(self) -> dict[fx.Node, int]:
        if self._ancestors is None:
            bits: dict[fx.Node, int] = {}
            for node in self.nodes:
                if node not in self.data:
                    continue
                value = 0
                for parent in self.parents.get(node, ()):
                    value |= bits[parent] | (1 << self._index[parent])
                bits[node] = value
            self._ancestors = bits
        return self._ancestors

    def is_ancestor(self, ancestor: fx.Node, node: fx.Node) -> bool:
        """Whether ``node``'s value depends on ``ancestor``'s (strictly)."""
        if ancestor not in self.data or node not in self.data:
            return False
        return bool((self._ancestor_bits()[node] >> self._index[ancestor]) & 1)

    def ancestor_set(self, node: fx.Node) -> set[fx.Node]:
        """The data nodes ``node`` depends on, itself included."""
        if node not in self.data:
            return set()
        bits = self._ancestor_bits()[node] | (1 << self._index[node])
        data_nodes = self._data_nodes()
        return {data_nodes[i] for i in range(bits.bit_length()) if (bits >> i) & 1}

    def _data_nodes(self) -> list[fx.Node]:
        if not hasattr(self, "_data_list"):
            self._data_list = [n for n in self.nodes if n in self.data]
        return self._data_list

    def depends_on(self, node: fx.Node, source: fx.Node) -> bool:
        return node is source or self.is_ancestor(source, node)

    def region(self, sources: Iterable[fx.Node], target: fx.Node, *, exclude: Optional[set] = None) -> list[fx.Node]:
        """Nodes that depend on some source and feed ``target`` (target included), in order."""
        bits = self._ancestor_bits()
        sources = [s for s in sources if s in self.data]
        if target not in self.data or not sources:
            return []
        mask = 0
        for s in sources:
            mask |= 1 << self._index[s]
        feeding = bits[target] | (1 << self._index[target])
        low = min(self.order[s] for s in sources)
        out = []
        for node in self.nodes[low + 1 : self.order[target] + 1]:
            if node not in self.data or node in sources or (exclude and node in exclude):
                continue
            if (feeding >> self._index[node]) & 1 and bits[node] & mask:
                out.append(node)
        return out

    def side_inputs(self, region: Sequence[fx.Node], sources: Iterable[fx.Node]) -> list[fx.Node]:
        """Data nodes outside the region and the sources that feed a node of the region."""
        inside = set(region) | set(sources)
        out: dict[fx.Node, None] = {}
        for node in region:
            for parent in self.parents.get(node, ()):
                if parent not in inside:
                    out[parent] = None
        return sorted(out, key=self.order.__getitem__)

    # -- post-dominators ----------------------------------------------------------------------

    def _postdominators(self) -> dict[fx.Node, Optional[fx.Node]]:
        """Immediate post-dominators over data nodes, with a virtual sink after the outputs."""
        if self._ipdom is None:
            sink_set = set(self.sinks)
            ipdom: dict[fx.Node, Optional[fx.Node]] = {}
            order = self.order
            end = len(self.nodes)

            def rank(n: Optional[fx.Node]) -> int:
                return end if n is None else order[n]

            def intersect(a: Optional[fx.Node], b: Optional[fx.Node]) -> Optional[fx.Node]:
                while a is not b:
                    while rank(a) < rank(b):
                        a = ipdom[a]  # type: ignore[index]
                    while rank(b) < rank(a):
                        b = ipdom[b]  # type: ignore[index]
                return a

            for node in reversed(self.nodes):
                if node not in self.data:
                    continue
                successors: list[Optional[fx.Node]] = [c for c in self.children.get(node, ()) if c in ipdom]
                if node in sink_set:
                    successors.append(None)
                if not successors:
                    continue  # reaches no output
                current = successors[0]
                for other in successors[1:]:
                    current = intersect(current, other)
                ipdom[node] = current
            self._ipdom = ipdom
        return self._ipdom

    def reaches_output(self, node: fx.Node) -> bool:
        return node in self._postdominators()

    def postdominates(self, later: fx.Node, node: fx.Node) -> bool:
        """Whether every path from ``node`` to an output passes through ``later``."""
        ipdom = self._postdominators()
        if node not in ipdom:
            return False
        current: Optional[fx.Node] = ipdom[node]
        target = self.order[later]
        while current is not None and self.order[current] < target:
            current = ipdom.get(current)
        return current is later


def run_cone(interpreter: fx.Interpreter, seeds: dict[fx.Node, Any], nodes: Iterable[fx.Node],
             base: Any) -> dict[fx.Node, Any]:
    """Seed some nodes, run the interpreter over ``nodes`` in order, return the new values.

    Every other node reads its value from ``base`` (a whole-graph pass), so only the
    region is evaluated: propagation, the probe and the loop probe all use this.
    """
    local: dict[fx.Node, Any] = dict(seeds)
    previous = interpreter.env
    interpreter.env = collections.ChainMap(local, base)  # type: ignore[assignment]
    try:
        for node in nodes:
            if node not in local:
                local[node] = interpreter.run_node(node)
    finally:
        interpreter.env = previous
    return local


def tensor_meta(node: Any) -> Optional[torch.Tensor]:
    """The traced example value of a node (a FakeTensor under export), if recorded."""
    if not isinstance(node, fx.Node):
        return None
    value = node.meta.get("val", node.meta.get("example_value"))
    if isinstance(value, torch.Tensor):
        return value
    meta = node.meta.get("tensor_meta")
    return meta if meta is not None and hasattr(meta, "shape") else None


def size_term(size: Any) -> Any:
    """An axis length as the analysis compares it: an int, or on a dynamic export the length's
    symbol (a sympy expression, equal only to itself). Never ``int()`` of a symbolic length:
    that would specialise the traced graph to the example's shape."""
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    if node is None:
        return None
    expr = node.expr
    return int(expr) if getattr(expr, "is_number", False) else expr


def shape_of(node: Any) -> Optional[tuple[Any, ...]]:
    """The node's shape as size terms (:func:`size_term`): two shapes are equal when every axis
    is the same number or the same symbol. None when not recorded."""
    value = tensor_meta(node)
    if value is None:
        return None
    terms = tuple(size_term(s) for s in value.shape)
    return None if any(t is None for t in terms) else terms


def sizes(node: Any) -> Optional[tuple[int, ...]]:
    """The node's shape when every length is a number (None when one is symbolic or unknown)."""
    shape = shape_of(node)
    return shape if shape is not None and all(isinstance(s, int) for s in shape) else None


def least_size(size: Any) -> int:
    """The smallest length an axis can have on the inputs the graph covers (its own value when fixed)."""
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    try:
        lower = node.shape_env.bound_sympy(node.expr).lower
        return int(lower) if getattr(lower, "is_number", False) and lower >= 0 else 0
    except Exception:  # noqa: BLE001  (no shape environment: assume nothing)
        return 0


def dtype_of(node: Any) -> Optional[torch.dtype]:
    value = tensor_meta(node)
    return getattr(value, "dtype", None) if value is not None else None


# floating dtypes each one holds every value of (a cast up is exact; bfloat16 and float16 hold each other's not)
_WIDER = {torch.float16: {torch.float16, torch.float32, torch.float64},
          torch.bfloat16: {torch.bfloat16, torch.float32, torch.float64},
          torch.float32: {torch.float32, torch.float64}, torch.float64: {torch.float64}}


def keeps_values(source: Any, result: Any) -> bool:
    """Whether ``result``'s dtype holds every value of ``source``'s (both known, real floating, the same or
    wider): a cast, or a reduction's own ``dtype=``, that keeps them (an int8 sum wraps, a bfloat16 copy
    rounds)."""
    before, after = dtype_of(source), dtype_of(result) or _values_dtype(result)
    return before is not None and after in _WIDER.get(before, ())


def _values_dtype(node: Any) -> Optional[torch.dtype]:
    """The dtype of the values a (values, indices) reduction returns (``max(dim)``, ``topk``): its first output."""
    if not isinstance(node, fx.Node):
        return None
    value = node.meta.get("val", node.meta.get("example_value", node.meta.get("tensor_meta")))
    first = value[0] if isinstance(value, (tuple, list)) and value else None
    return getattr(first, "dtype", None)


__all__ = ["GraphFacts", "NodeFacts", "annotate", "dtype_of", "facts", "keeps_values", "least_size", "run_cone",
           "shape_of", "sizes", "tensor_meta"]


# --- where a node came from ----------------------------------------------------------------------

import re as _re

_FRAME = _re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
TORCH_DIR = torch.__file__.rsplit("/", 1)[0] + "/"  # with the separator: torchvision/ is not torch's
_QLINT_DIR = __file__.rsplit("/", 2)[0] + "/"
# the floors of qlint's engine (base, capture, growth): a frame in one is not the user's construct
ENGINE_FOLDERS = ("/qlint/core/", "/qlint/capture/", "/qlint/growth/")


def module_path(node: fx.Node) -> str:
    """The path of the innermost module whose forward created this node ('' at top)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    return clean_path(path)


def module_stack(node: fx.Node) -> list[tuple[str, Any]]:
    """(path, class or class name) from the outermost to the innermost module."""
    stack = node.meta.get("nn_module_stack") or {}
    return [(clean_path(path), cls) for path, cls in stack.values()]


def clean_path(path: str) -> str:
    """export writes ``L['self'].layers[0]`` style paths in some versions."""
    path = _re.sub(r"^L\['self'\]\.?", "", path)
    return _re.sub(r"\[(\d+)\]", r".\1", path).strip(".")


def user_frames(node: fx.Node) -> list[tuple[str, int, str]]:
    """(file, line, function) frames of the node's stack trace outside torch and qlint's engine."""
    trace = node.meta.get("stack_trace") or getattr(node, "stack_trace", None) or ""
    frames = []
    for match in _FRAME.finditer(trace):
        file = match.group("file")
        if (file.startswith(TORCH_DIR)
            or (file.startswith(_QLINT_DIR) and "/qlint/zoo/" not in file and "/qlint/verify/" not in file)):
            continue
        frames.append((file, int(match.group("line")), match.group("func")))
    return frames
